"""Every host-key and login decision of the console against OpenSSH's own, on the same config.

Each case runs real OpenSSH sshd servers on 127.0.0.1 (host keys, CAs and certificates made with
`ssh-keygen` per test), writes one ssh config and its known_hosts files, asks the real
`ssh -F CONFIG -o BatchMode=yes HOST true` first and the console's `connect` second, on separate
copies of the files, and compares the two answers: both connect, or both refuse (and the
console's state says why, naming the file). No stand-in for the SSH layer.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import subprocess
from pathlib import Path

import asyncssh
import pytest
from ssh_judge import (
    USER,
    Rig,
    agree,
    console_answer,
    host_block,
    judged,
    make_ca,
    needs_openssh,
    no_agent_fixture,  # noqa: F401 - the fixture `no_agent`, found by pytest here
    public_line,
    rig_fixture,  # noqa: F401 - the fixture `rig`
)
from sshd import SSH_KEYGEN, keygen

from gpuconsole.core.model import HostState
from gpuconsole.hosts.ssh_config import read_ssh_config

pytestmark = [needs_openssh, pytest.mark.usefixtures("no_agent")]


# --- the known_hosts files ssh reads ---------------------------------------------------------


def test_a_key_in_the_users_known_hosts_connects(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    ssh, console, *_ = judged(
        rig,
        lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/kh"),
        {"kh": f"{rig.name('a')} {rig.public('a')}\n"},
    )
    agree(ssh, console)
    assert console.connected


def test_a_key_in_the_second_user_file_connects(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    ssh, console, *_ = judged(
        rig,
        lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/one {f}/two"),
        {"one": "", "two": f"{rig.name('a')} {rig.public('a')}\n"},
    )
    agree(ssh, console)
    assert console.connected


def test_a_key_only_in_the_global_file_connects(rig: Rig) -> None:
    """The main today passed ~/.ssh/known_hosts alone and refused this host."""
    rig.server("a")
    rig.start()
    ssh, console, *_ = judged(
        rig,
        lambda f: host_block(
            rig, "a", f, f"UserKnownHostsFile {f}/user", f"GlobalKnownHostsFile {f}/global"
        ),
        {"user": "", "global": f"{rig.name('a')} {rig.public('a')}\n"},
    )
    agree(ssh, console)
    assert console.connected


def test_the_defaults_include_the_system_wide_file() -> None:
    """Where neither keyword is set, ssh reads /etc/ssh/ssh_known_hosts too: so does the console."""
    config = read_ssh_config("gpu", config_file=Path(os.devnull))
    assert Path("/etc/ssh/ssh_known_hosts") in config.global_known_hosts
    home = pwd.getpwuid(os.getuid()).pw_dir
    assert config.user_known_hosts[0] == Path(home, ".ssh", "known_hosts")


def test_user_known_hosts_none_refuses_as_unknown(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    ssh, console, state, *_ = judged(
        rig,
        lambda f: host_block(
            rig, "a", f, "UserKnownHostsFile none", f"GlobalKnownHostsFile {f}/empty"
        ),
        {"empty": ""},
    )
    agree(ssh, console)
    assert state is HostState.HOST_KEY_UNKNOWN
    assert "ssh-keyscan" not in console.words  # no user file to add it to
    assert "asks once" in console.words


def test_a_hashed_entry_connects(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    plain = rig.file("plain", f"{rig.name('a')} {rig.public('a')}\n")
    subprocess.run([SSH_KEYGEN, "-q", "-H", "-f", str(plain)], check=True, capture_output=True)
    hashed = plain.read_text()
    assert hashed.startswith("|1|")
    ssh, console, *_ = judged(
        rig, lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/kh"), {"kh": hashed}
    )
    agree(ssh, console)
    assert console.connected


def test_a_negated_pattern_keeps_a_line_from_the_host(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    line = f"[127.0.0.1]:*,!{rig.name('a')} {rig.public('a')}\n"
    ssh, console, state, *_ = judged(
        rig, lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/kh"), {"kh": line}
    )
    agree(ssh, console)
    assert state is HostState.HOST_KEY_UNKNOWN


# --- the name ssh looks up ------------------------------------------------------------------


def test_host_key_alias_is_the_name_looked_up(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    ssh, console, *_ = judged(
        rig,
        lambda f: host_block(rig, "a", f, "HostKeyAlias gpu-alias", f"UserKnownHostsFile {f}/kh"),
        {"kh": f"gpu-alias {rig.public('a')}\n"},
    )
    agree(ssh, console)
    assert console.connected


def test_with_an_alias_the_address_line_does_not_count(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    ssh, console, state, *_ = judged(
        rig,
        lambda f: host_block(rig, "a", f, "HostKeyAlias gpu-alias", f"UserKnownHostsFile {f}/kh"),
        {"kh": f"{rig.name('a')} {rig.public('a')}\n"},
    )
    agree(ssh, console)
    assert state is HostState.HOST_KEY_UNKNOWN
    assert "gpu-alias" in console.words


def test_a_changed_key_behind_a_host_alias_is_a_mismatch_naming_file_and_line(rig: Rig) -> None:
    """The main today said "host key unknown" and `down` for an aliased host."""
    rig.server("a")
    rig.start()
    other = keygen(rig.root / "other")
    stale = public_line(other)
    ssh, console, state, _, folder, _ = judged(
        rig,
        lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/kh"),
        {"kh": f"# fleet keys\n{rig.name('a')} {stale}\n"},
    )
    agree(ssh, console)
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in ssh.words
    assert state is HostState.HOST_KEY_MISMATCH
    assert f"{folder}/kh:2" in console.words
    assert "REFUSED" in console.words


# --- markers -----------------------------------------------------------------------------------


def test_a_revoked_key_is_refused_even_where_a_plain_line_lists_it(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    ssh, console, state, _, folder, _ = judged(
        rig,
        lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/kh"),
        {"kh": f"{rig.name('a')} {rig.public('a')}\n@revoked * {rig.public('a')}\n"},
    )
    agree(ssh, console)
    assert "REVOKED" in ssh.words
    assert state is HostState.HOST_KEY_REVOKED
    assert f"{folder}/kh:2" in console.words


def test_a_host_certificate_from_a_trusted_ca_connects(rig: Rig) -> None:
    """The main today refused it as "host key unknown"."""
    ca = make_ca(rig.root / "ca")
    rig.server("a", ca=ca, principals="127.0.0.1")
    rig.start()
    ca_public = public_line(ca)
    ssh, console, *_ = judged(
        rig,
        lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/kh"),
        {"kh": f"@cert-authority {rig.name('a')} {ca_public}\n"},
    )
    agree(ssh, console)
    assert console.connected


def test_a_certificate_for_another_name_is_not_accepted(rig: Rig) -> None:
    ca = make_ca(rig.root / "ca")
    rig.server("a", ca=ca, principals="some-other-host")
    rig.start()
    ca_public = public_line(ca)
    ssh, console, state, *_ = judged(
        rig,
        lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/kh"),
        {"kh": f"@cert-authority {rig.name('a')} {ca_public}\n"},
    )
    agree(ssh, console)
    assert state is HostState.HOST_KEY_UNKNOWN


def test_a_certificate_principal_is_checked_against_the_alias(rig: Rig) -> None:
    ca = make_ca(rig.root / "ca")
    rig.server("a", ca=ca, principals="gpu-alias")
    rig.start()
    ca_public = public_line(ca)
    ssh, console, *_ = judged(
        rig,
        lambda f: host_block(rig, "a", f, "HostKeyAlias gpu-alias", f"UserKnownHostsFile {f}/kh"),
        {"kh": f"@cert-authority gpu-* {ca_public}\n"},
    )
    agree(ssh, console)
    assert console.connected


def test_a_revoked_ca_is_refused(rig: Rig) -> None:
    ca = make_ca(rig.root / "ca")
    rig.server("a", ca=ca, principals="127.0.0.1")
    rig.start()
    ca_public = public_line(ca)
    ssh, console, state, *_ = judged(
        rig,
        lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/kh"),
        {"kh": f"@cert-authority * {ca_public}\n@revoked * {ca_public}\n"},
    )
    agree(ssh, console)
    assert state is HostState.HOST_KEY_REVOKED


# --- StrictHostKeyChecking -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["yes", "ask"])
def test_strict_checking_refuses_an_unknown_key(rig: Rig, mode: str) -> None:
    rig.server("a")
    rig.start()
    ssh, console, state, *_ = judged(
        rig,
        lambda f: host_block(
            rig, "a", f, f"StrictHostKeyChecking {mode}", f"UserKnownHostsFile {f}/kh"
        ),
        {"kh": ""},
    )
    agree(ssh, console)
    assert state is HostState.HOST_KEY_UNKNOWN
    port = rig.servers["a"].port
    assert f"ssh-keyscan -p {port} 127.0.0.1 >> " in console.words


@pytest.mark.parametrize("hashed", [False, True])
def test_accept_new_adds_the_key_as_ssh_does_and_audits_it(rig: Rig, hashed: bool) -> None:
    rig.server("a")
    rig.start()
    ssh, console, _, ssh_folder, folder, notices = judged(
        rig,
        lambda f: host_block(
            rig,
            "a",
            f,
            "StrictHostKeyChecking accept-new",
            f"HashKnownHosts {'yes' if hashed else 'no'}",
            f"UserKnownHostsFile {f}/kh",
        ),
        {},
    )
    agree(ssh, console)
    assert console.connected
    for added in (ssh_folder / "kh", folder / "kh"):
        found = subprocess.run(
            [SSH_KEYGEN, "-F", rig.name("a"), "-f", str(added)], capture_output=True, text=True
        )
        assert rig.public("a") in found.stdout, (added, added.read_text())
        assert added.read_text().startswith("|1|") is hashed
    # ssh creates the file as its umask allows (0644 here); the console creates it 0600
    assert (folder / "kh").stat().st_mode & 0o777 == 0o600
    assert len(notices) == 1 and str(folder / "kh") in notices[0]
    log = Path(os.environ["XDG_STATE_HOME"], "gpuconsole", "audit.jsonl").read_text()
    entry = json.loads(log.splitlines()[-1])
    assert entry["action"] == "host-key-added" and entry["file"] == str(folder / "kh")
    # a second connection finds the key it added
    again, _, notices = console_answer(folder / "config", "gpu")
    assert again.connected and not notices


def test_accept_new_into_a_folder_that_does_not_exist_connects_without_adding(rig: Rig) -> None:
    """ssh creates ~/.ssh when it is missing, and no other folder: it connects, and says it
    could not add the key."""
    rig.server("a")
    rig.start()
    ssh, console, _, ssh_folder, folder, notices = judged(
        rig,
        lambda f: host_block(
            rig, "a", f, "StrictHostKeyChecking accept-new", f"UserKnownHostsFile {f}/sub/kh"
        ),
        {},
    )
    agree(ssh, console)
    assert "Failed to add the host" in ssh.words
    assert not (ssh_folder / "sub").exists() and not (folder / "sub").exists()
    assert len(notices) == 1 and "could not add it" in notices[0]


@pytest.mark.parametrize("mode", ["accept-new", "no"])
def test_a_changed_key_is_refused_in_every_mode(rig: Rig, mode: str) -> None:
    """ssh refuses a changed key with accept-new; with `no` it connects with warnings, and
    there the console deliberately does not (see gpuconsole.hosts.ssh)."""
    rig.server("a")
    rig.start()
    other = keygen(rig.root / "other")
    stale = public_line(other)
    ssh, _, state, *_ = judged(
        rig,
        lambda f: host_block(
            rig, "a", f, f"StrictHostKeyChecking {mode}", f"UserKnownHostsFile {f}/kh"
        ),
        {"kh": f"{rig.name('a')} {stale}\n"},
    )
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in ssh.words
    assert ssh.connected is (mode == "no")
    assert state is HostState.HOST_KEY_MISMATCH


# --- logins as ssh makes them ------------------------------------------------------------------


def test_match_host_and_include_decide_port_and_user(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    port = rig.servers["a"].port

    def config(f: Path) -> str:
        (f / "extra.conf").write_text(f"Match host 127.0.0.1\n  Port {port}\n  User {USER}\n")
        # Match host tests the HostName set before it, so the Include comes after the Host
        return (
            "Host gpu\n  HostName 127.0.0.1\n"
            f"  IdentityFile {rig.key}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
            f"  UserKnownHostsFile {f}/kh\n"
            "Host *\n"
            f"Include {f}/extra.conf\n"
        )

    ssh, console, *_ = judged(rig, config, {"kh": f"{rig.name('a')} {rig.public('a')}\n"})
    agree(ssh, console)
    assert console.connected


def test_a_two_hop_proxy_jump(rig: Rig) -> None:
    for name in ("hop1", "hop2", "target"):
        rig.server(name)
    rig.start()

    def config(f: Path) -> str:
        return (
            host_block(rig, "hop1", f, f"UserKnownHostsFile {f}/kh", name="hop1")
            + host_block(rig, "hop2", f, f"UserKnownHostsFile {f}/kh", name="hop2")
            + host_block(rig, "target", f, f"UserKnownHostsFile {f}/kh", "ProxyJump hop1,hop2")
        )

    lines = "".join(f"{rig.name(n)} {rig.public(n)}\n" for n in ("hop1", "hop2", "target"))
    ssh, console, *_ = judged(rig, config, {"kh": lines})
    agree(ssh, console)
    assert console.connected
    # and a hop whose key is unknown stops both, named as a jump host by the console
    ssh, console, state, *_ = judged(
        rig, config, {"kh": lines.replace(f"{rig.name('hop2')} ", "[nowhere]:1 ")}
    )
    agree(ssh, console)
    assert state is HostState.HOST_KEY_UNKNOWN
    assert "jump host hop2" in console.words


def test_a_user_certificate_logs_in(rig: Rig) -> None:
    user_ca = make_ca(rig.root / "user-ca", "user-ca")
    server = rig.server("a", authorize=False)
    server.configure(f"TrustedUserCAKeys {user_ca}.pub")
    rig.start()
    (rig.root / "certified").mkdir()
    key = keygen(rig.root / "certified" / "id_ed25519")
    subprocess.run(
        [SSH_KEYGEN, "-q", "-s", str(user_ca), "-I", "user", "-n", USER, f"{key}.pub"], check=True
    )
    certificate = Path(f"{key}-cert.pub")
    moved = certificate.rename(rig.root / "certified" / "user.cert")

    def config(f: Path) -> str:
        return (
            f"Host gpu\n  HostName 127.0.0.1\n  Port {server.port}\n  User {USER}\n"
            f"  IdentityFile {key}\n  CertificateFile {moved}\n  IdentitiesOnly yes\n"
            f"  IdentityAgent none\n  UserKnownHostsFile {f}/kh\n"
        )

    files = {"kh": f"{rig.name('a')} {rig.public('a')}\n"}
    ssh, console, *_ = judged(rig, config, files)
    agree(ssh, console)
    assert console.connected
    # without the certificate the key alone is refused by both
    ssh, console, state, *_ = judged(
        rig, lambda f: config(f).replace(f"  CertificateFile {moved}\n", ""), files
    )
    agree(ssh, console)
    assert state is HostState.AUTH_FAILED


def test_the_agent_named_by_identity_agent_logs_in(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    socket_path = rig.root / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(socket_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if socket_path.exists():
                break
            asyncio.run(asyncio.sleep(0.05))
        env = {**os.environ, "SSH_AUTH_SOCK": str(socket_path)}
        subprocess.run(["ssh-add", "-q", str(rig.key)], env=env, check=True, capture_output=True)

        def config(f: Path) -> str:
            return (
                f"Host gpu\n  HostName 127.0.0.1\n  Port {rig.servers['a'].port}\n"
                f"  User {USER}\n  IdentityFile {f}/missing\n"
                f"  IdentityAgent {socket_path}\n  UserKnownHostsFile {f}/kh\n"
            )

        files = {"kh": f"{rig.name('a')} {rig.public('a')}\n"}
        ssh, console, *_ = judged(rig, config, files)
        agree(ssh, console)
        assert console.connected
        # IdentitiesOnly: the agent's key is not offered, as no identity file names it
        ssh, console, state, *_ = judged(rig, lambda f: config(f) + "  IdentitiesOnly yes\n", files)
        agree(ssh, console)
        assert state is HostState.AUTH_FAILED
    finally:
        agent.kill()
        agent.wait()


def test_a_keyword_the_console_does_not_act_on_is_refused_by_name(rig: Rig) -> None:
    rig.server("a")
    rig.start()
    config = rig.file(
        "console/config",
        host_block(rig, "a", rig.root, "CheckHostIP yes", f"UserKnownHostsFile {rig.root}/kh"),
    )
    answer, state, _ = console_answer(config, "gpu")
    assert not answer.connected and state is HostState.REFUSED
    assert "CheckHostIP" in answer.words and "\n" not in answer.words
    assert f"{config} line 8" in answer.words


def test_a_config_ssh_refuses_is_refused_with_ssh_words(rig: Rig) -> None:
    config = rig.file("console/config", "Host gpu\n  Bogus yes\n")
    answer, state, _ = console_answer(config, "gpu")
    assert state is HostState.REFUSED
    assert f"{config}: line 2: Bad configuration option: bogus" in answer.words


def test_a_key_known_under_the_bare_address_counts_for_another_port(rig: Rig) -> None:
    """ssh looks again under `127.0.0.1` when no line names `[127.0.0.1]:PORT`."""
    rig.server("a")
    rig.start()
    ssh, console, *_ = judged(
        rig,
        lambda f: host_block(rig, "a", f, f"UserKnownHostsFile {f}/kh"),
        {"kh": f"127.0.0.1 {rig.public('a')}\n"},
    )
    agree(ssh, console)
    assert console.connected


def test_a_known_key_of_another_type_makes_the_host_changed_not_new(rig: Rig) -> None:
    """Known as ECDSA, it shows ED25519: ssh says the identification changed, even with
    accept-new; so does the console, and adds nothing."""
    rig.server("a")
    rig.start()
    ecdsa = asyncssh.generate_private_key("ecdsa-sha2-nistp256").export_public_key().decode()
    known = f"{rig.name('a')} {' '.join(ecdsa.split()[:2])}\n"
    ssh, console, state, _, folder, notices = judged(
        rig,
        lambda f: host_block(
            rig, "a", f, "StrictHostKeyChecking accept-new", f"UserKnownHostsFile {f}/kh"
        ),
        {"kh": known},
    )
    agree(ssh, console)
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in ssh.words
    assert state is HostState.HOST_KEY_MISMATCH
    assert (folder / "kh").read_text() == known and not notices
