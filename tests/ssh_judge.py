"""The judge: OpenSSH's `ssh -o BatchMode=yes` and the console's `connect`, asked the same thing.

A `Rig` runs private OpenSSH sshd servers on 127.0.0.1 (tests/sshd.py) that accept one client
key, and holds whatever else a case needs (an ssh-agent, a CA, host certificates). `judged`
writes one ssh config and its files twice, asks the real
`ssh -F CONFIG -o BatchMode=yes HOST true` first and the console's `connect` second, each on its
own copy, and `agree` compares the two answers: both connect, or both refuse.

The fixtures `rig` and `no_agent` are defined here as `rig_fixture` and `no_agent_fixture`: a test
module imports those names (pytest finds fixtures in a test module's namespace) and its tests
take `rig` and `no_agent`.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sshd import SSH_KEYGEN, Sshd, keygen, sshd_available

from gpuconsole.core.model import HostState
from gpuconsole.hosts.inventory import HostDefaults
from gpuconsole.hosts.ssh import ConnectFailure, SshSettings, connect

SSH = shutil.which("ssh") or "/usr/bin/ssh"
SSH_AGENT = shutil.which("ssh-agent") or "/usr/bin/ssh-agent"
SSH_ADD = shutil.which("ssh-add") or "/usr/bin/ssh-add"
USER = pwd.getpwuid(os.getuid()).pw_name

needs_openssh = pytest.mark.skipif(
    not sshd_available() or shutil.which("ssh") is None, reason="OpenSSH is not installed"
)


@pytest.fixture(name="no_agent")
def no_agent_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither ssh nor the console finds the agent of whoever runs the tests."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@dataclass
class Rig:
    """Servers, a client key, agents and the files one case writes, in a folder of its own."""

    root: Path
    servers: dict[str, Sshd] = field(default_factory=dict)
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = self.root / "client"
        self.client.mkdir(parents=True, exist_ok=True)
        self.key = keygen(self.client / "id_ed25519")

    def server(
        self, name: str, *, authorize: bool = True, ca: Path | None = None, **kw: str
    ) -> Sshd:
        server = Sshd(self.root / name, client_key=self.key)
        if not authorize:
            (server.directory / "authorized_keys").write_text("")
        if ca is not None:
            server.certify(ca, kw.get("principals", "127.0.0.1"))
        self.servers[name] = server
        return server

    def start(self) -> None:
        for server in self.servers.values():
            server.start()

    def stop(self) -> None:
        for server in self.servers.values():
            server.kill()
        for agent in self.agents:
            agent.kill()
            agent.wait()

    def agent(self, *keys: Path) -> Path:
        """A new ssh-agent (`ssh-agent -D -a SOCKET`) holding ``keys``: its socket."""
        socket_path = self.root / f"agent{len(self.agents)}.sock"
        self.agents.append(
            subprocess.Popen(
                [SSH_AGENT, "-D", "-a", str(socket_path)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 10
        while not socket_path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"ssh-agent made no socket at {socket_path} within 10 s")
            time.sleep(0.02)
        env = {**os.environ, "SSH_AUTH_SOCK": str(socket_path)}
        for key in keys:
            subprocess.run([SSH_ADD, "-q", str(key)], env=env, check=True, capture_output=True)
        return socket_path

    def public(self, server: str) -> str:
        """The server's host key as a known_hosts line's "TYPE BASE64"."""
        return public_line(self.servers[server].host_key)

    def name(self, server: str) -> str:
        return f"[127.0.0.1]:{self.servers[server].port}"

    def known(self, server: str) -> str:
        """A known_hosts line listing the server's key under `[127.0.0.1]:PORT`."""
        return f"{self.name(server)} {self.public(server)}\n"

    def file(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path


def public_line(key: Path) -> str:
    """The public half of the key pair at ``key`` as a known_hosts line's "TYPE BASE64"."""
    words = Path(f"{key}.pub").read_text().split()
    return f"{words[0]} {words[1]}"


def make_ca(folder: Path, name: str = "ca") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return keygen(folder / name, name)


def host_certificate(server: Sshd, ca: Path, principals: str, validity: str | None = None) -> Path:
    """Have ``server`` present a host certificate for its key signed by ``ca``
    (`ssh-keygen -s CA -h -n PRINCIPALS [-V VALIDITY]`; before `start`)."""
    command = [SSH_KEYGEN, "-q", "-s", str(ca), "-I", "host", "-h", "-n", principals]
    if validity is not None:
        command += ["-V", validity]
    subprocess.run([*command, f"{server.host_key}.pub"], check=True, capture_output=True)
    certificate = Path(f"{server.host_key}-cert.pub")
    server.configure(f"HostCertificate {certificate}")
    return certificate


def ssh_g(config: Path, host: str, *options: str) -> dict[str, str]:
    """`ssh -G -F CONFIG [-o OPTION]... HOST`: each keyword's (first) value."""
    command = [SSH, "-G", "-F", str(config)]
    for option in options:
        command += ["-o", option]
    done = subprocess.run(
        [*command, host], capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL
    )
    words: dict[str, str] = {}
    for line in done.stdout.splitlines():
        keyword, _, value = line.partition(" ")
        words.setdefault(keyword, value)
    return words


@pytest.fixture(name="rig")
def rig_fixture(tmp_path: Path, no_agent: None) -> Iterator[Rig]:
    made = Rig(tmp_path / "rig")
    yield made
    made.stop()


@dataclass(frozen=True)
class Answer:
    connected: bool
    words: str  # ssh's stderr, or the console's reason


def ssh_answer(config: Path, host: str) -> Answer:
    done = subprocess.run(
        [SSH, "-F", str(config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, "true"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=60,
        check=False,
    )
    return Answer(done.returncode == 0, done.stderr)


def console_answer(config: Path, host: str) -> tuple[Answer, HostState | None, list[str]]:
    entry = HostDefaults(connect_timeout=10.0).entry(host, host)
    notices: list[str] = []

    async def attempt() -> None:
        connection = await connect(entry, SshSettings(config_file=config), notices=notices)
        async with connection:
            result = await connection.run("true", check=False)
            assert result.exit_status == 0

    try:
        asyncio.run(attempt())
    except ConnectFailure as failure:
        return Answer(False, failure.reason), failure.state, notices
    return Answer(True, ""), None, notices


def judged(
    rig: Rig,
    config_text: Callable[[Path], str],
    files: Mapping[str, str],
    host: str = "gpu",
    *,
    copies: Mapping[str, Path] | None = None,
) -> tuple[Answer, Answer, HostState | None, Path, Path, list[str]]:
    """ssh's answer and the console's, each given a fresh copy of ``files`` (relative path ->
    text) and of ``copies`` (relative path -> a file copied with its mode: a private key) under
    its own folder, with ``config_text(folder)`` as the ssh config."""
    answers = []
    for who in ("ssh", "console"):
        folder = rig.root / who
        folder.mkdir(parents=True, exist_ok=True)
        for relative, text in files.items():
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        for relative, source in (copies or {}).items():
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        config = folder / "config"
        config.write_text(config_text(folder))
        if who == "ssh":
            answers.append((ssh_answer(config, host), None, folder, []))
        else:
            answers.append((*console_answer(config, host), folder))
    (ssh, _, ssh_folder, _), (console, state, notices, console_folder) = answers
    return ssh, console, state, ssh_folder, console_folder, notices


_RIG_KEY = object()


def host_block(
    rig: Rig,
    server: str,
    folder: Path,
    *extra: str,
    name: str = "gpu",
    key: Path | str | object | None = _RIG_KEY,
    agent: str = "none",
) -> str:
    """A `Host` block reaching ``server`` with the rig's key only (``key``: another
    IdentityFile; None: no IdentityFile line and no IdentitiesOnly) and no agent (``agent``:
    the IdentityAgent), then the ``extra`` lines."""
    identity = rig.key if key is _RIG_KEY else key
    lines = [
        f"Host {name}",
        "  HostName 127.0.0.1",
        f"  Port {rig.servers[server].port}",
        f"  User {USER}",
        *([f"  IdentityFile {identity}", "  IdentitiesOnly yes"] if identity is not None else []),
        f"  IdentityAgent {agent}",
        *[f"  {line}" for line in extra],
    ]
    return "\n".join(lines) + "\n"


def agree(ssh: Answer, console: Answer) -> None:
    assert ssh.connected == console.connected, f"ssh: {ssh}\nconsole: {console}"
