"""A case per keyword of the allow list (`gpuconsole.hosts.ssh_keywords.KEYWORDS`), judged by ssh.

Each case sets one keyword away from its default, as the first line of the `Host gpu` block (ssh
takes the first value it obtains, so it comes before the lines that reach the server), checks
that `ssh -G` accepts the line and that it changes what `ssh -G` prints, then:

- for a keyword the console does not act on (`Rule.OFF_ONLY`, `Rule.DEFAULT_ONLY`), asks the
  console only: it refuses the host by name, with the keyword, its value and "FILE line N";
- for every other keyword, asks the real `ssh -o BatchMode=yes gpu true` first and the console's
  `connect` second, each on its own copy of the files (`ssh_judge.judged`): ssh connects (else
  the case's value is wrong, not the console), and the console agrees.

Keywords whose case needs a whole setup of its own (another server, an agent, a certificate, a
key that is not known) are covered by the test `COVERED_ELSEWHERE` names. One sshd serves the
whole module; each case has its own folder.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from ssh_judge import (
    SSH,
    USER,
    Rig,
    agree,
    console_answer,
    judged,
    needs_openssh,
    no_agent_fixture,  # noqa: F401 - the fixture `no_agent`, found by pytest here
)
from sshd import free_port

from gpuconsole.core.model import HostState
from gpuconsole.hosts.ssh_keywords import KEYWORDS, Rule

pytestmark = [needs_openssh, pytest.mark.usefixtures("no_agent")]

TESTS = Path(__file__).parent

# "{f}": the case's folder (ssh's copy or the console's); "{sockets}": a short folder under /tmp
# (a socket's path has at most 107 bytes); "{port}": a free local port.
CASES: dict[str, str] = {
    # who and where
    "AddressFamily": "AddressFamily inet",
    "BindAddress": "BindAddress 127.0.0.1",
    "BindInterface": "BindInterface lo",
    "ProxyCommand": "ProxyCommand nc %h %p",
    "ProxyUseFdpass": "ProxyUseFdpass yes",
    "CanonicalizeHostname": "CanonicalizeHostname yes",
    "CanonicalDomains": "CanonicalDomains example.com",
    "CanonicalizeFallbackLocal": "CanonicalizeFallbackLocal no",
    "CanonicalizeMaxDots": "CanonicalizeMaxDots 0",
    "CanonicalizePermittedCNAMEs": "CanonicalizePermittedCNAMEs *.example.com:*.example.net",
    # ssh_answer's own `-o ConnectTimeout=10` wins for ssh; the console reads this line
    "ConnectTimeout": "ConnectTimeout 7",
    "ConnectionAttempts": "ConnectionAttempts 2",
    "Tag": "Tag gpu-nodes",
    # the host's key
    "GlobalKnownHostsFile": "GlobalKnownHostsFile {f}/global",
    "HostKeyAlgorithms": "HostKeyAlgorithms ssh-ed25519",
    "HashKnownHosts": "HashKnownHosts yes",
    "NoHostAuthenticationForLocalhost": "NoHostAuthenticationForLocalhost yes",
    "CASignatureAlgorithms": "CASignatureAlgorithms ssh-ed25519",
    "RequiredRSASize": "RequiredRSASize 2048",  # the keys are ed25519
    "CheckHostIP": "CheckHostIP yes",
    "VerifyHostKeyDNS": "VerifyHostKeyDNS yes",
    "KnownHostsCommand": "KnownHostsCommand /bin/true",
    "RevokedHostKeys": "RevokedHostKeys {f}/revoked",
    "UpdateHostKeys": "UpdateHostKeys yes",
    "FingerprintHash": "FingerprintHash md5",
    "VisualHostKey": "VisualHostKey yes",
    # logging in
    "PreferredAuthentications": "PreferredAuthentications publickey",
    "PubkeyAcceptedAlgorithms": "PubkeyAcceptedAlgorithms ssh-ed25519",
    "AddKeysToAgent": "AddKeysToAgent yes",  # no agent: ssh adds nothing
    "PKCS11Provider": "PKCS11Provider /nonexistent/pkcs11.so",
    "SecurityKeyProvider": "SecurityKeyProvider /nonexistent/sk.so",
    "BatchMode": "BatchMode yes",
    "PasswordAuthentication": "PasswordAuthentication no",
    "KbdInteractiveAuthentication": "KbdInteractiveAuthentication no",
    "KbdInteractiveDevices": "KbdInteractiveDevices pam",
    "NumberOfPasswordPrompts": "NumberOfPasswordPrompts 1",
    "GSSAPIAuthentication": "GSSAPIAuthentication yes",
    "GSSAPIKeyExchange": "GSSAPIKeyExchange yes",
    "GSSAPIDelegateCredentials": "GSSAPIDelegateCredentials yes",
    "GSSAPITrustDns": "GSSAPITrustDns yes",
    "GSSAPIRenewalForcesRekey": "GSSAPIRenewalForcesRekey yes",
    "GSSAPIKexAlgorithms": "GSSAPIKexAlgorithms gss-curve25519-sha256-",
    "GSSAPIClientIdentity": "GSSAPIClientIdentity gpu@EXAMPLE.COM",
    "GSSAPIServerIdentity": "GSSAPIServerIdentity gpu.example.com",
    "HostbasedAuthentication": "HostbasedAuthentication yes",
    "HostbasedAcceptedAlgorithms": "HostbasedAcceptedAlgorithms ssh-ed25519",
    "EnableSSHKeysign": "EnableSSHKeysign yes",
    # the transport
    "Ciphers": "Ciphers aes256-gcm@openssh.com",
    # with the default chacha20-poly1305 (an AEAD cipher) no MAC is negotiated: the list is
    # only offered (test_ssh_keywords_openssh.py::test_algorithms_in_common uses one)
    "MACs": "MACs hmac-sha2-512",
    "KexAlgorithms": "KexAlgorithms curve25519-sha256",
    "Compression": "Compression yes",
    "RekeyLimit": "RekeyLimit 1M 60",
    "TCPKeepAlive": "TCPKeepAlive no",
    "ServerAliveInterval": "ServerAliveInterval 7",
    "ServerAliveCountMax": "ServerAliveCountMax 1",
    "IPQoS": "IPQoS throughput",
    "ChannelTimeout": "ChannelTimeout session=5m",
    "ObscureKeystrokeTiming": "ObscureKeystrokeTiming no",
    "WarnWeakCrypto": "WarnWeakCrypto no",
    "VersionAddendum": "VersionAddendum gpu",
    # what runs once logged in
    "RemoteCommand": "RemoteCommand echo hi",
    "SessionType": "SessionType none",
    "RequestTTY": "RequestTTY no",
    "StdinNull": "StdinNull yes",
    # ssh forks after logging in and the child runs `true`: the case waits for it, and kills
    # it if it has not ended (the `leftovers` fixture)
    "ForkAfterAuthentication": "ForkAfterAuthentication yes",
    "SendEnv": "SendEnv GPU_CASE",
    "SetEnv": "SetEnv GPU_CASE=1",
    "EscapeChar": "EscapeChar none",
    "EnableEscapeCommandline": "EnableEscapeCommandline yes",
    "PermitLocalCommand": "PermitLocalCommand yes",
    "LocalCommand": "LocalCommand /bin/true",  # not run: PermitLocalCommand is no
    # ssh makes a master at {sockets} (NEIGHBOURS) and, with ControlPersist, leaves it running
    # for a second: the `leftovers` fixture kills any master still there
    "ControlMaster": "ControlMaster auto",
    "ControlPath": "ControlPath {sockets}/%C",
    "ControlPersist": "ControlPersist 1",
    # forwarding
    "ForwardAgent": "ForwardAgent yes",
    "ForwardX11": "ForwardX11 yes",
    "ForwardX11Trusted": "ForwardX11Trusted no",
    "ForwardX11Timeout": "ForwardX11Timeout 5m",
    "XAuthLocation": "XAuthLocation /nonexistent/xauth",
    "LocalForward": "LocalForward {port} 127.0.0.1:1",
    "RemoteForward": "RemoteForward {port} 127.0.0.1:1",
    "DynamicForward": "DynamicForward {port}",
    "GatewayPorts": "GatewayPorts yes",
    "ClearAllForwardings": "ClearAllForwardings yes",
    "ExitOnForwardFailure": "ExitOnForwardFailure yes",
    "PermitRemoteOpen": "PermitRemoteOpen 127.0.0.1:1",
    "StreamLocalBindMask": "StreamLocalBindMask 0077",
    "StreamLocalBindUnlink": "StreamLocalBindUnlink yes",
    "Tunnel": "Tunnel yes",
    "TunnelDevice": "TunnelDevice 1:1",
    # ssh's own messages
    "LogLevel": "LogLevel ERROR",
    "LogVerbose": "LogVerbose kex.c:*",
    "SyslogFacility": "SyslogFacility LOCAL0",
    "IgnoreUnknown": "IgnoreUnknown GpuConsoleNoSuchKeyword",
}

NEIGHBOURS: dict[str, tuple[str, ...]] = {
    # lines a case needs after its own for the keyword to do anything
    "ControlMaster": ("ControlPath {sockets}/%C",),
    "ControlPersist": ("ControlMaster auto", "ControlPath {sockets}/%C"),
}

FILES: dict[str, dict[str, str]] = {
    # files a case needs besides known_hosts ("{known}": the server's known_hosts line)
    "GlobalKnownHostsFile": {"global": "{known}"},
    "RevokedHostKeys": {"revoked": ""},
}

_OPENSSH = "tests/test_ssh_openssh.py"
_KEYWORDS = "tests/test_ssh_keywords_openssh.py"
COVERED_ELSEWHERE: dict[str, str] = {
    # every case's block sets these to reach the server: a setting of its own needs a setup
    "Host": f"{_OPENSSH}::test_match_host_and_include_decide_port_and_user",
    "HostName": f"{_OPENSSH}::test_match_host_and_include_decide_port_and_user",
    "Port": f"{_OPENSSH}::test_match_host_and_include_decide_port_and_user",
    "User": f"{_OPENSSH}::test_match_host_and_include_decide_port_and_user",
    "IdentityFile": f"{_KEYWORDS}::test_identity_file_with_the_alias_token",
    "IdentitiesOnly": f"{_KEYWORDS}::test_a_public_identity_file_selects_the_agents_key",
    "IdentityAgent": f"{_OPENSSH}::test_the_agent_named_by_identity_agent_logs_in",
    "UserKnownHostsFile": f"{_OPENSSH}::test_a_key_in_the_second_user_file_connects",
    # another server, a certificate, an unknown key
    "ProxyJump": f"{_OPENSSH}::test_a_two_hop_proxy_jump",
    "CertificateFile": f"{_OPENSSH}::test_a_user_certificate_logs_in",
    "HostKeyAlias": f"{_OPENSSH}::test_host_key_alias_is_the_name_looked_up",
    "StrictHostKeyChecking": f"{_OPENSSH}::test_strict_checking_refuses_an_unknown_key",
    # away from its default (no) ssh refuses: both refuse, which is that test's case
    "PubkeyAuthentication": f"{_KEYWORDS}::test_pubkey_authentication",
}

REFUSED_RULES = (Rule.OFF_ONLY, Rule.DEFAULT_ONLY)
BY_NAME = {keyword.name: keyword for keyword in KEYWORDS}


def _openssh_version() -> str:
    done = subprocess.run([SSH, "-V"], capture_output=True, text=True, check=False)
    found = re.search(r"OpenSSH_(\S+?),? ", done.stderr + done.stdout)
    return found.group(1) if found else "(unknown version)"


# --- the table is whole ------------------------------------------------------------------------


def test_every_keyword_has_one_case_or_a_test_elsewhere() -> None:
    names = [keyword.name for keyword in KEYWORDS]
    assert not set(CASES) & set(COVERED_ELSEWHERE), set(CASES) & set(COVERED_ELSEWHERE)
    assert sorted(CASES.keys() | COVERED_ELSEWHERE.keys()) == sorted(names)
    assert set(NEIGHBOURS) <= set(CASES) and set(FILES) <= set(CASES)
    for name, line in CASES.items():
        assert line.split()[0] == name, (name, line)


def test_each_test_named_elsewhere_exists() -> None:
    for keyword, where in COVERED_ELSEWHERE.items():
        path, _, test = where.partition("::")
        source = (TESTS.parent / path).read_text()
        assert re.search(rf"^def {re.escape(test)}\(", source, re.MULTILINE), (keyword, where)


# --- the cases ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", name="server")
def server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One sshd, "a", for every case of the module."""
    made = Rig(tmp_path_factory.mktemp("keyword-table"))
    made.server("a")
    made.start()
    yield made
    made.stop()


@pytest.fixture(name="sockets")
def sockets_fixture() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gpk", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(name="leftovers")
def leftovers_fixture(tmp_path: Path, sockets: Path) -> Iterator[None]:
    """After the case, no process of its own is left: ssh's forked child (ForkAfterAuthentication)
    and a ControlPersist master name the case's config or its sockets folder on their command
    line; each still running after 5 s is killed, by its id."""
    yield
    markers = (str(tmp_path), str(sockets))

    def theirs() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            line = " ".join(process.info["cmdline"] or [])
            if any(marker in line for marker in markers):
                found.append(process)
        return found

    deadline = time.monotonic() + 5
    while theirs() and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in theirs():
        try:
            process.kill()
            process.wait(5)
        except psutil.NoSuchProcess:
            pass


def _config(rig: Rig, lines: list[str], folder: Path, sockets: Path, port: int) -> str:
    """A `Host gpu` block with ``lines`` first, then what reaches the module's server with the
    rig's key only, no agent, and the server's key known in FOLDER/kh."""

    def fill(line: str) -> str:
        return (
            line.replace("{f}", str(folder))
            .replace("{sockets}", str(sockets))
            .replace("{port}", str(port))
        )

    block = [
        "Host gpu",
        *(f"  {fill(line)}" for line in lines),
        "  HostName 127.0.0.1",
        f"  Port {rig.servers['a'].port}",
        f"  User {USER}",
        f"  IdentityFile {rig.key}",
        "  IdentitiesOnly yes",
        "  IdentityAgent none",
        f"  UserKnownHostsFile {folder}/kh",
    ]
    return "\n".join(block) + "\n"


def _ssh_g(config: Path, keyword: str) -> tuple[str, ...]:
    """The values `ssh -G -F CONFIG gpu` prints for ``keyword``; skips the case where the
    installed OpenSSH does not know the keyword. Where ssh -G stops for want of a command
    (ForkAfterAuthentication yes: "Cannot fork into background without a command to execute"),
    it is asked again with the judge's command, `true`."""

    def ask(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SSH, "-G", "-F", str(config), "gpu", *command],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    done = ask()
    if done.returncode != 0 and "Bad configuration option" in done.stderr:
        pytest.skip(f"OpenSSH {_openssh_version()} does not know {keyword}")
    if done.returncode != 0 and "without a command" in done.stderr:
        done = ask("true")
    assert done.returncode == 0, f"ssh -G refuses the case: {done.stderr.strip()}"
    printed = keyword.lower()
    return tuple(
        value
        for word, _, value in (line.partition(" ") for line in done.stdout.splitlines())
        if word.lower() == printed
    )


@pytest.mark.usefixtures("leftovers")
@pytest.mark.parametrize(("keyword", "line"), list(CASES.items()), ids=list(CASES))
def test_a_keyword_away_from_its_default(
    server: Rig, tmp_path: Path, sockets: Path, keyword: str, line: str
) -> None:
    rule = BY_NAME[keyword].rule
    rig = copy.copy(server)  # the module's server and key; this case's own folder
    rig.root = tmp_path / "case"
    port = free_port()
    lines = [line, *NEIGHBOURS.get(keyword, ())]
    known = server.known("a")
    files = {
        "kh": known,
        **{name: text.replace("{known}", known) for name, text in FILES.get(keyword, {}).items()},
    }

    def write(folder: Path, *, with_case: bool = True) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for relative, text in files.items():
            (folder / relative).write_text(text)
        config = folder / "config"
        config.write_text(_config(rig, lines if with_case else lines[1:], folder, sockets, port))
        return config

    # ssh takes the line, and it changes what ssh -G prints
    values = _ssh_g(write(rig.root / "probe"), keyword)
    without = _ssh_g(write(rig.root / "probe-without", with_case=False), keyword)
    assert values, f"ssh -G does not print {keyword} for {line!r}"
    assert values != without, f"{line!r} leaves ssh -G at {without}: use another value"

    if rule in REFUSED_RULES:
        config = write(rig.root / "console")
        number = next(
            n
            for n, text in enumerate(config.read_text().splitlines(), 1)
            if text.split()[:1] == [keyword]
        )
        answer, state, _ = console_answer(config, "gpu")
        assert not answer.connected
        assert state is HostState.REFUSED, (state, answer.words)
        assert keyword in answer.words, answer.words
        value = line.split(None, 1)[1].replace("{f}", str(config.parent))
        spellings = {value, *_ssh_g(config, keyword)}
        assert any(spelling in answer.words for spelling in spellings), (spellings, answer.words)
        assert re.search(rf"{re.escape(str(config))}:? line {number}\b", answer.words), (
            number,
            answer.words,
        )
        assert "\n" not in answer.words
        return

    ssh, console, state, *_ = judged(
        rig, lambda folder: _config(rig, lines, folder, sockets, port), files
    )
    assert ssh.connected, f"ssh itself refused {line!r}: {ssh.words}"
    agree(ssh, console)
    assert state is None
