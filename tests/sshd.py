"""A private OpenSSH sshd on 127.0.0.1 for tests and benchmarks: real keys, real protocol.

Each instance has its own host key, listens on a free loopback port and accepts one generated
client key. `home` is a directory laid out as a user's home (`.ssh/id_ed25519`, `known_hosts`,
`config`). ssh takes `~` from the password database, not from HOME, so the console is pointed
at `home/.ssh/config` with `GPUCONSOLE_SSH_CONFIG` (as `ssh -F`), and that config names the
key and the known_hosts file; `settings()` gives the same without a config file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil
from cli_runner import gpuconsole
from leftovers import end

from gpuconsole.hosts.ssh import SshSettings

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SESSION_MARK = "GPUCONSOLE_TEST_SSHD"
"""Set in every session of an `Sshd` to its directory."""
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def sshd_available() -> bool:
    return Path(SSHD).exists() and Path(SSH_KEYGEN).exists()


def keygen(path: Path, comment: str = "gpuconsole-test") -> Path:
    """A new ed25519 key pair at ``path`` (and ``path``.pub), without a passphrase."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Sshd:
    """One sshd; `start`, `kill` (the listener and every session) and `start` again."""

    def __init__(
        self,
        directory: Path,
        *,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        client_key: Path | None = None,
    ) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.host_key = keygen(directory / "host_ed25519", "host")
        self.home = directory / "home"
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True)
        self.client_key = client_key or keygen(ssh_dir / "id_ed25519")
        authorized = directory / "authorized_keys"
        authorized.write_text(Path(f"{self.client_key}.pub").read_text())
        self.known_hosts = ssh_dir / "known_hosts"
        self.trust(self.host_key)
        self.config = directory / "sshd_config"
        settings = {
            "Port": str(self.port),
            "ListenAddress": "127.0.0.1",
            "HostKey": str(self.host_key),
            "AuthorizedKeysFile": str(authorized),
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "UsePAM": "no",
            "StrictModes": "no",
            "PermitRootLogin": "prohibit-password",
            "PidFile": "none",
            "LogLevel": "ERROR",
            "MaxStartups": "200",
            "MaxSessions": "20",
        }
        lines = [f"{key} {value}" for key, value in settings.items()]
        # every session carries the server's mark: `kill` finds what a session left running
        env = {**(env or {}), SESSION_MARK: str(directory)}
        lines.append("SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()))
        self.config.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen[bytes] | None = None

    def configure(self, line: str) -> None:
        """Add an sshd_config line (before `start`)."""
        with self.config.open("a") as config:
            config.write(line + "\n")

    def certify(self, ca: Path, principals: str) -> Path:
        """Have the server present a host certificate for its key, signed by ``ca`` for
        ``principals`` (comma-separated), as `ssh-keygen -h` makes it (before `start`)."""
        subprocess.run(
            [
                SSH_KEYGEN,
                "-q",
                "-s",
                str(ca),
                "-I",
                "host",
                "-h",
                "-n",
                principals,
                f"{self.host_key}.pub",
            ],
            check=True,
        )
        certificate = Path(f"{self.host_key}-cert.pub")
        self.configure(f"HostCertificate {certificate}")
        return certificate

    def trust(self, host_key: Path) -> None:
        """Make known_hosts list ``host_key`` (and only it) for this server."""
        public = Path(f"{host_key}.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {public[0]} {public[1]}\n")

    def start(self) -> Sshd:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.directory / "sshd.log", "ab"),  # noqa: SIM115 - the child keeps it
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.directory / "sshd.log").read_text(errors="replace")
                raise RuntimeError(f"sshd exited at start: {log.strip()[-400:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on port {self.port} within 10 s")

    def kill(self) -> None:
        """Kill the listener and every session it forked: every connection drops at once. Then
        end what the sessions started (TERM first: a shell's exit traps, such as the release of
        pyenv's rehash lock, still run), so that nothing runs on: a hung command, or one that
        left its session."""
        if self.process is None:
            return
        try:
            family = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        self.process.kill()
        self.process.wait()
        for child in family:
            with contextlib.suppress(psutil.Error):
                if child.name().startswith("sshd"):
                    child.kill()
        end({p.pid: p for p in [*family, *self._sessions_left()]}.values(), timeout=3)
        self.process = None

    def _sessions_left(self) -> list[psutil.Process]:
        """Processes started in this server's sessions, wherever they are now."""
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get(SESSION_MARK) == str(self.directory):
                    found.append(process)
            except psutil.Error:
                continue
        return found

    def ssh_config(self, names: list[str] | None = None) -> Path:
        """Write ``home/.ssh/config`` with a Host alias per name, all pointing at this server,
        its known_hosts being ``home/.ssh/known_hosts`` (for every other host too)."""
        config = self.home / ".ssh" / "config"
        blocks = [
            f"Host {name}\n  HostName 127.0.0.1\n  Port {self.port}\n  User {_user()}\n"
            f"  IdentityFile {self.client_key}\n  UserKnownHostsFile {self.known_hosts}\n"
            for name in names or ["gpu-test"]
        ]
        # any other host (an address the inventory names, a jump host) uses the same files
        blocks.append(
            f"Host *\n  IdentityFile {self.client_key}\n  UserKnownHostsFile {self.known_hosts}\n"
        )
        config.write_text("".join(blocks))
        return config

    def settings(self, **changes: object) -> SshSettings:
        """Settings that reach this server with no config file: its key only, no agent, its
        known_hosts only (`ssh -F /dev/null -o ...`)."""
        return SshSettings(
            **{"config_file": Path(os.devnull), "options": self.options(), **changes}
        )  # type: ignore[arg-type]

    def options(self) -> tuple[str, ...]:
        return (
            f"UserKnownHostsFile={self.known_hosts}",
            f"IdentityFile={self.client_key}",
            "IdentitiesOnly=yes",
            "IdentityAgent=none",
        )


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def run_gpuconsole(home: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``gpuconsole ARGS`` as a user runs it: a subprocess whose HOME is ``home`` (its
    ``~/.ssh`` names the test servers), with no SSH agent."""
    return gpuconsole(*args, env=user_env(home), timeout=timeout)


def user_env(home: Path) -> dict[str, str]:
    """The environment of a user whose home is ``home``: its ``~/.ssh/config`` (handed to the
    console as `ssh -F` would be, since ssh takes `~` from the password database), no agent."""
    config = home / ".ssh" / "config"
    env = {
        **os.environ,
        "HOME": str(home),
        "GPUCONSOLE_SSH_CONFIG": str(config) if config.exists() else os.devnull,
    }
    env.pop("SSH_AUTH_SOCK", None)
    return env


def wait_for(condition: Callable[[], object], timeout: float = 15.0, what: str = "") -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")


def running(marker: str) -> list[psutil.Process]:
    """Processes whose command line holds ``marker``: the shell running it (`sh -c '...'`), and
    the command itself (which the shell may have become by exec: `sleep` `308`)."""
    return [
        process
        for process in psutil.process_iter(["cmdline"])
        if marker in " ".join(process.info["cmdline"] or [])
    ]


async def gone(marker: str, within: float = 10.0) -> bool:
    """Whether every process ``running(marker)`` finds has ended within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not running(marker):
            return True
        await asyncio.sleep(0.1)
    return False
