"""ssh_config(5) keywords one by one, judged by OpenSSH: where `ssh -o BatchMode=yes` connects,
the console connects; where ssh refuses, the console refuses, and says why.

Each case starts one private sshd (tests/sshd.py), sets one keyword (and its neighbours: the
same keyword set so that ssh connects), asks the real ssh first and the console's `connect`
second on separate copies of the files (`ssh_judge.judged`), checks that ssh answered as the
case says it does (ssh is the judge: if it does not, the case is wrong, not the console), and
then that the console agrees. A keyword the console does not act on is refused by name, with
the file and line that set it; keywords that change nothing about a login connect as ssh does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from ssh_judge import (
    USER,
    Answer,
    Rig,
    agree,
    console_answer,
    host_block,
    host_certificate,
    judged,
    make_ca,
    needs_openssh,
    no_agent_fixture,  # noqa: F401 - the fixture `no_agent`, found by pytest here
    public_line,
    rig_fixture,  # noqa: F401 - the fixture `rig`
    ssh_g,
)
from sshd import SSH_KEYGEN, keygen

from gpuconsole.core.model import HostState

pytestmark = [needs_openssh, pytest.mark.usefixtures("no_agent")]


def ruling(ssh: Answer, console: Answer, connects: bool) -> None:
    """ssh answered as the case says (else the case is wrong); the console agrees with it."""
    assert ssh.connected is connects, f"ssh itself {'refused' if connects else 'connected'}: {ssh}"
    agree(ssh, console)


def serve(rig: Rig, *sshd_config: str) -> None:
    """Start the case's one server, "a", with these sshd_config lines."""
    server = rig.server("a")
    for line in sshd_config:
        server.configure(line)
    rig.start()


def ask(
    rig: Rig,
    *extra: str,
    known_hosts: str = "{f}/kh",
    files: dict[str, str] | None = None,
    copies: dict[str, Path] | None = None,
    prepare: Callable[[Path], None] | None = None,
    **block: object,
) -> tuple[Answer, Answer, HostState | None, Path, Path, list[str]]:
    """`judged` on server "a": its `host_block` (``block``: host_block's options), then
    UserKnownHostsFile ``known_hosts`` (default: {f}/kh, listing the server's key unless
    ``files`` gives it), then ``extra`` lines; "{f}" in any of them is the folder."""

    def config(folder: Path) -> str:
        if prepare is not None:
            prepare(folder)
        lines = [
            line.replace("{f}", str(folder))
            for line in (f"UserKnownHostsFile {known_hosts}", *extra)
        ]
        options = {
            name: value.replace("{f}", str(folder)) if isinstance(value, str) else value
            for name, value in block.items()
        }
        return host_block(rig, "a", folder, *lines, **options)  # type: ignore[arg-type]

    return judged(rig, config, {"kh": rig.known("a"), **(files or {})}, copies=copies)


def other_key(rig: Rig) -> str:
    """A known_hosts "TYPE BASE64" of a key no server has."""
    return public_line(keygen(rig.root / "other-host-key", "other"))


# --- it logs in where ssh refuses ----------------------------------------------------------------


@pytest.mark.parametrize(("value", "connects"), [("no", False), ("yes", True)])
def test_pubkey_authentication(rig: Rig, value: str, connects: bool) -> None:
    """ssh with PubkeyAuthentication no has no method BatchMode lets it use: it refuses."""
    serve(rig)
    ssh, console, state, *_ = ask(rig, f"PubkeyAuthentication {value}")
    ruling(ssh, console, connects)
    if not connects:
        assert state is HostState.AUTH_FAILED and "PubkeyAuthentication no" in console.words


@pytest.mark.parametrize(
    ("value", "connects"),
    [("password", False), ("publickey", True), ("password,publickey", True)],
)
def test_preferred_authentications(rig: Rig, value: str, connects: bool) -> None:
    """ssh tries only the methods PreferredAuthentications lists; password alone is refused."""
    serve(rig)
    ssh, console, state, *_ = ask(rig, f"PreferredAuthentications {value}")
    ruling(ssh, console, connects)
    if not connects:
        assert (
            state is HostState.AUTH_FAILED and f"PreferredAuthentications {value}" in console.words
        )


@pytest.mark.parametrize(
    ("value", "connects"),
    [
        ("rsa-sha2-512", False),
        ("-ssh-ed25519", False),
        ("ssh-ed25519", True),
        ("-rsa-sha2-512", True),
    ],
)
def test_pubkey_accepted_algorithms(rig: Rig, value: str, connects: bool) -> None:
    """ssh does not offer a key whose type PubkeyAcceptedAlgorithms leaves out (it is ed25519)."""
    serve(rig)
    ssh, console, *_ = ask(rig, f"PubkeyAcceptedAlgorithms {value}")
    ruling(ssh, console, connects)


@pytest.mark.parametrize(
    ("sshd_config", "client", "connects"),
    [
        pytest.param(("Ciphers aes256-ctr",), "Ciphers aes128-ctr", False, id="ciphers-apart"),
        pytest.param(("Ciphers aes256-ctr",), "Ciphers -aes256-ctr", False, id="ciphers-minus"),
        pytest.param(("Ciphers aes256-ctr",), "Ciphers aes256-ctr", True, id="ciphers-shared"),
        pytest.param(
            ("Ciphers aes128-ctr", "MACs hmac-sha2-256"),
            "MACs hmac-sha2-512",
            False,
            id="macs-apart",
        ),
        pytest.param(
            ("Ciphers aes128-ctr", "MACs hmac-sha2-256"),
            "MACs hmac-sha2-256",
            True,
            id="macs-shared",
        ),
        # chacha20-poly1305 carries its own MAC: ssh negotiates none, so none need be shared
        pytest.param(("MACs hmac-sha2-256",), "MACs hmac-sha2-512", True, id="macs-aead-cipher"),
        pytest.param(
            ("KexAlgorithms curve25519-sha256",),
            "KexAlgorithms diffie-hellman-group14-sha256",
            False,
            id="kex-apart",
        ),
        pytest.param(
            ("KexAlgorithms curve25519-sha256",),
            "KexAlgorithms curve25519-sha256",
            True,
            id="kex-shared",
        ),
        pytest.param((), "HostKeyAlgorithms rsa-sha2-512", False, id="hostkey-apart"),
        pytest.param((), "HostKeyAlgorithms -ssh-ed25519", False, id="hostkey-minus"),
        pytest.param((), "HostKeyAlgorithms ssh-ed25519", True, id="hostkey-shared"),
    ],
)
def test_algorithms_in_common(
    rig: Rig, sshd_config: tuple[str, ...], client: str, connects: bool
) -> None:
    """ssh refuses ("Unable to negotiate") where its list and the server's share nothing."""
    serve(rig, *sshd_config)
    ssh, console, *_ = ask(rig, client)
    ruling(ssh, console, connects)
    if not connects:
        assert "no matching" in ssh.words
        # the keyword whose list shares nothing, unless the server hung up before its offer
        # reached the console (OpenSSH's sshd drops a client it shares no host key type with:
        # a reset, or under load a plain close, which asyncssh calls "Connection lost")
        hung_up = "reset by peer" in console.words or "Connection lost" in console.words
        assert client.split()[0] in console.words or hung_up


@pytest.mark.parametrize(("family", "connects"), [("inet6", False), ("inet", True), ("any", True)])
def test_address_family(rig: Rig, family: str, connects: bool) -> None:
    """ssh with AddressFamily inet6 cannot reach HostName 127.0.0.1, an IPv4 address."""
    serve(rig)
    ssh, console, *_ = ask(rig, f"AddressFamily {family}")
    ruling(ssh, console, connects)


@pytest.mark.parametrize(("user_file", "connects"), [("none", False), ("{f}/kh", True)])
def test_accept_new_takes_a_key_only_where_it_can_record_it(
    rig: Rig, user_file: str, connects: bool
) -> None:
    """ssh with accept-new and UserKnownHostsFile none cannot record a new key: it refuses it."""
    serve(rig)
    ssh, console, state, *_ = ask(
        rig,
        "StrictHostKeyChecking accept-new",
        "GlobalKnownHostsFile {f}/global",
        known_hosts=user_file,
        files={"kh": "", "global": ""},
    )
    ruling(ssh, console, connects)
    if not connects:
        assert state is HostState.HOST_KEY_UNKNOWN


# --- it refuses where ssh connects ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "key_at", "connects"),
    [(None, "gpu", True), ("other", "other", True), ("other", "gpu", False)],
)
def test_identity_file_with_the_alias_token(
    rig: Rig, alias: str | None, key_at: str, connects: bool
) -> None:
    """ssh expands %k in IdentityFile to the HostKeyAlias, else the name on the command line."""
    serve(rig)
    ssh, console, *_ = ask(
        rig,
        *([f"HostKeyAlias {alias}"] if alias else []),
        key="{f}/keys/%k",
        files={"kh": f"{alias} {rig.public('a')}\n" if alias else rig.known("a")},
        copies={f"keys/{key_at}": rig.key},
    )
    ruling(ssh, console, connects)


def test_identity_file_with_the_connection_hash_token(rig: Rig) -> None:
    """ssh expands %C in IdentityFile to the hash of %l%h%p%r, as `ssh -G` shows for ControlPath."""
    serve(rig)
    probe = rig.file("probe/config", host_block(rig, "a", rig.root / "probe"))
    digest = ssh_g(probe, "gpu", "ControlPath=%C")["controlpath"]
    assert re.fullmatch(r"[0-9a-f]{40}", digest), digest
    ssh, console, *_ = ask(rig, key="{f}/keys/%C", copies={f"keys/{digest}": rig.key})
    ruling(ssh, console, True)


@pytest.mark.parametrize(("variable", "connects"), [("GPU_KEYS", True), ("NOPE", False)])
def test_an_environment_variable_in_identity_file(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, variable: str, connects: bool
) -> None:
    """ssh expands ${VAR} in IdentityFile from its environment; an unset one stops it."""
    keys = rig.root / "env-keys"
    keys.mkdir()
    shutil.copy2(rig.key, keys / "id")
    monkeypatch.setenv("GPU_KEYS", str(keys))
    monkeypatch.delenv("NOPE", raising=False)
    serve(rig)
    ssh, console, *_ = ask(rig, key=f"${{{variable}}}/id")
    ruling(ssh, console, connects)
    if not connects:
        assert "${NOPE}" in ssh.words


@pytest.mark.parametrize(("variable", "connects"), [("GPU_CERTS", True), ("NOPE", False)])
def test_an_environment_variable_in_certificate_file(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, variable: str, connects: bool
) -> None:
    """ssh expands ${VAR} in CertificateFile; the server accepts only the certificate."""
    user_ca = make_ca(rig.root / "user-ca", "user-ca")
    rig.server("a", authorize=False).configure(f"TrustedUserCAKeys {user_ca}.pub")
    rig.start()
    certs = rig.root / "certs"
    certs.mkdir()
    shutil.copy2(f"{rig.key}.pub", certs / "user.pub")  # not beside the key: ssh would find it
    sign = [SSH_KEYGEN, "-q", "-s", str(user_ca), "-I", "user", "-n", USER]
    subprocess.run([*sign, str(certs / "user.pub")], check=True, capture_output=True)
    (certs / "user-cert.pub").rename(certs / "user.cert")
    monkeypatch.setenv("GPU_CERTS", str(certs))
    monkeypatch.delenv("NOPE", raising=False)
    ssh, console, *_ = ask(rig, f"CertificateFile ${{{variable}}}/user.cert")
    ruling(ssh, console, connects)


@pytest.mark.parametrize("identities_only", ["yes", "no"])
@pytest.mark.parametrize(
    ("identity", "public"),
    [("{f}/keys/only.pub", "keys/only.pub"), ("{f}/keys/only", "keys/only.pub")],
    ids=["names-the-pub", "pub-beside-no-key"],
)
def test_a_public_identity_file_selects_the_agents_key(
    rig: Rig, identity: str, public: str, identities_only: str
) -> None:
    """ssh reads the public half an IdentityFile gives and signs with the agent's matching key."""
    serve(rig)
    agent = rig.agent(rig.key)
    ssh, console, *_ = ask(
        rig,
        f"IdentityFile {identity}",
        f"IdentitiesOnly {identities_only}",
        key=None,
        agent=str(agent),
        files={public: Path(f"{rig.key}.pub").read_text()},
    )
    ruling(ssh, console, True)


def test_a_public_identity_file_of_another_key_with_identities_only_is_refused(rig: Rig) -> None:
    """ssh with IdentitiesOnly offers the agent's keys that an IdentityFile names, no other."""
    serve(rig)
    agent = rig.agent(rig.key)
    other = keygen(rig.root / "other-client-key")
    ssh, console, *_ = ask(
        rig,
        "IdentityFile {f}/keys/only.pub",
        "IdentitiesOnly yes",
        key=None,
        agent=str(agent),
        files={"keys/only.pub": Path(f"{other}.pub").read_text()},
    )
    ruling(ssh, console, False)


@pytest.mark.parametrize(
    ("setting", "alias", "known", "connects"),
    [
        ("yes", None, "unknown", True),
        ("yes", None, "changed", True),
        ("yes", "x", "unknown", False),
        ("yes", "x", "changed", False),
        ("no", None, "unknown", False),
        ("no", None, "changed", False),
    ],
)
def test_no_host_authentication_for_localhost(
    rig: Rig, setting: str, alias: str | None, known: str, connects: bool
) -> None:
    """ssh takes any host key from a loopback address with this set, unless a HostKeyAlias is."""
    serve(rig)
    name = alias or rig.name("a")
    ssh, console, *_ = ask(
        rig,
        "StrictHostKeyChecking yes",
        f"NoHostAuthenticationForLocalhost {setting}",
        *([f"HostKeyAlias {alias}"] if alias else []),
        files={"kh": "" if known == "unknown" else f"{name} {other_key(rig)}\n"},
    )
    ruling(ssh, console, connects)


@pytest.mark.parametrize(
    ("principals", "validity"),
    [("other", None), ("127.0.0.1", "20200101:20200102")],
    ids=["wrong-principal", "expired"],
)
@pytest.mark.parametrize(
    ("plain", "mode", "connects"),
    [("known", "yes", True), ("unknown", "accept-new", True), ("unknown", "yes", False)],
)
def test_an_invalid_host_certificate_falls_back_to_the_plain_key(
    rig: Rig,
    principals: str,
    validity: str | None,
    plain: str,
    mode: str,
    connects: bool,
) -> None:
    """ssh judges the plain key of a host certificate that its trusted CA signed but that is not
    valid for the host: known, it connects; new, as StrictHostKeyChecking says."""
    ca = make_ca(rig.root / "ca")
    host_certificate(rig.server("a"), ca, principals, validity)
    rig.start()
    kh = f"@cert-authority * {public_line(ca)}\n" + (rig.known("a") if plain == "known" else "")
    ssh, console, state, ssh_folder, folder, _ = ask(
        rig, f"StrictHostKeyChecking {mode}", files={"kh": kh}
    )
    ruling(ssh, console, connects)
    if mode == "accept-new":  # the plain key is added, as a plain line
        for added in (ssh_folder / "kh", folder / "kh"):
            assert f"{rig.name('a')} {rig.public('a')}" in added.read_text(), added
    if not connects:
        assert state is HostState.HOST_KEY_UNKNOWN


@pytest.mark.parametrize(("mode", "connects"), [("accept-new", True), ("yes", False)])
def test_another_key_under_the_bare_address_leaves_the_host_new(
    rig: Rig, mode: str, connects: bool
) -> None:
    """ssh looks under the bare `127.0.0.1` only for the key shown: another key there does not
    make `[127.0.0.1]:PORT` changed, it stays new."""
    serve(rig)
    ssh, console, state, ssh_folder, folder, _ = ask(
        rig, f"StrictHostKeyChecking {mode}", files={"kh": f"127.0.0.1 {other_key(rig)}\n"}
    )
    assert "IDENTIFICATION HAS CHANGED" not in ssh.words
    ruling(ssh, console, connects)
    if connects:
        for added in (ssh_folder / "kh", folder / "kh"):
            assert f"{rig.name('a')} {rig.public('a')}" in added.read_text(), added
    else:
        assert state is HostState.HOST_KEY_UNKNOWN


# --- failures name their cause -------------------------------------------------------------------


def _a_directory(folder: Path) -> None:
    (folder / "keys" / "id").mkdir(parents=True, exist_ok=True, mode=0o700)


def _mode_000(folder: Path) -> None:
    (folder / "keys" / "id").chmod(0)


@pytest.mark.parametrize("how", ["directory", "mode-000"])
def test_an_unreadable_identity_file_is_named(rig: Rig, how: str) -> None:
    """ssh cannot load the only key and the server refuses it: the console names the file."""
    if how == "mode-000" and os.geteuid() == 0:
        pytest.skip("root reads a file whatever its mode; the directory case runs instead")
    serve(rig)
    ssh, console, state, _, folder, _ = ask(
        rig,
        key="{f}/keys/id",
        copies={} if how == "directory" else {"keys/id": rig.key},
        prepare=_a_directory if how == "directory" else _mode_000,
    )
    ruling(ssh, console, False)
    assert state is HostState.AUTH_FAILED
    assert str(folder / "keys" / "id") in console.words


# --- keywords the console does not act on, refused by name -------------------------------------

NOT_ACTED_ON = [
    # keyword, value, the spellings of the value the reason may quote (the file's, ssh -G's)
    ("ProxyCommand", "nc %h %p", ("nc %h %p",)),
    ("KnownHostsCommand", "/bin/echo %H", ("/bin/echo %H",)),
    ("RemoteCommand", "echo hi", ("echo hi",)),
    ("PKCS11Provider", "/nonexistent.so", ("/nonexistent.so",)),
    ("CanonicalizeHostname", "yes", ("yes", "true")),
    ("BindInterface", "lo", ("lo",)),
    ("CheckHostIP", "yes", ("yes", "true")),
]


@pytest.mark.parametrize("where", ["host-block", "included"])
@pytest.mark.parametrize(("keyword", "value", "spellings"), NOT_ACTED_ON)
def test_a_keyword_the_console_does_not_act_on_is_refused_by_name(
    rig: Rig, keyword: str, value: str, spellings: tuple[str, ...], where: str
) -> None:
    """ssh acts on it (another way in, another check); the console refuses, naming its line."""
    serve(rig)
    folder = rig.root / "console"
    folder.mkdir()
    setting = f"{keyword} {value}"
    block = host_block(rig, "a", folder, f"UserKnownHostsFile {folder}/kh")
    if where == "included":
        source = rig.file("console/extra.conf", f"# for every host\n\n{setting}\n")
        config = rig.file("console/config", f"Include {source}\n" + block)
    else:
        config = source = rig.file("console/config", block + f"  {setting}\n")
    number = [line.strip() for line in source.read_text().splitlines()].index(setting) + 1
    rig.file("console/kh", rig.known("a"))
    answer, state, _ = console_answer(config, "gpu")
    assert not answer.connected
    assert state is HostState.REFUSED, (state, answer.words)
    assert keyword in answer.words, answer.words
    assert any(spelling in answer.words for spelling in spellings), answer.words
    assert re.search(rf"{re.escape(str(source))}:? line {number}\b", answer.words), answer.words
    assert "\n" not in answer.words


def test_remote_command_stops_ssh_given_a_command_too(rig: Rig) -> None:
    """ssh refuses `ssh HOST true` when RemoteCommand is set: "Cannot execute command-line and
    remote command"."""
    serve(rig)
    ssh, console, *_ = ask(rig, "RemoteCommand echo hi")
    assert "Cannot execute command-line and remote command" in ssh.words
    ruling(ssh, console, False)


@pytest.mark.parametrize(
    "setting",
    [
        "ProxyCommand none",
        "KnownHostsCommand none",
        "RemoteCommand none",
        "PKCS11Provider none",
        "CanonicalizeHostname no",
        "CheckHostIP no",
    ],
)
def test_a_keyword_at_its_default_connects(rig: Rig, setting: str) -> None:
    """ssh with the keyword set to its default connects as without it."""
    serve(rig)
    ssh, console, *_ = ask(rig, setting)
    ruling(ssh, console, True)


# --- keywords that change nothing about a login ------------------------------------------------


@pytest.mark.parametrize(
    "setting",
    [
        "ForwardX11 yes",
        "ForwardAgent yes",
        "LogLevel DEBUG3",
        "ServerAliveInterval 7",
        "SendEnv FOO",
        "ControlMaster auto",
        "RequestTTY no",
        "Compression yes",
        "TCPKeepAlive no",
        "GSSAPIAuthentication yes",
        "ConnectionAttempts 2",
    ],
)
def test_a_keyword_that_changes_nothing_about_the_login_connects(rig: Rig, setting: str) -> None:
    """ssh connects with it as without it."""
    serve(rig)
    if not setting.startswith("ControlMaster"):
        ssh, console, *_ = ask(rig, setting)
        ruling(ssh, console, True)
        return
    # a socket's path has at most 107 bytes: the test's own folder is too deep for one
    sockets = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))
    try:
        ssh, console, *_ = ask(rig, setting, f"ControlPath {sockets}/%C")
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    ruling(ssh, console, True)


def test_a_known_hosts_file_that_cannot_be_read_is_named(rig: Rig) -> None:
    """ssh reads a known_hosts file it cannot open as empty (the key is then unknown); the
    console refuses as ssh does and says the file could not be read."""
    serve(rig)
    ssh, console, state, *_ = ask(rig, known_hosts="{f}/folder", prepare=_a_folder)
    ruling(ssh, console, False)
    assert state is HostState.HOST_KEY_UNKNOWN
    assert "folder: cannot be read: not a regular file (a folder)" in console.words


def _a_folder(folder: Path) -> None:
    (folder / "folder").mkdir(exist_ok=True)


def test_the_command_that_adds_a_key_quotes_the_file(rig: Rig) -> None:
    """A known_hosts path with shell characters is quoted in the command the reason suggests."""
    serve(rig)
    ssh, console, state, _, folder, _ = ask(
        rig, "StrictHostKeyChecking yes", known_hosts="{f}/k;h", files={"k;h": ""}
    )
    ruling(ssh, console, False)
    assert state is HostState.HOST_KEY_UNKNOWN
    assert f">> '{folder}/k;h'`" in console.words
