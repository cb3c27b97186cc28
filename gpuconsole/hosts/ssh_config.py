"""A host's effective OpenSSH client settings, as `ssh -G HOST` reports them.

The console connects with asyncssh but decides as OpenSSH's `ssh` does, so it asks `ssh` itself:
`ssh -G` applies `Host` and `Match` blocks, `Include`, `~/.ssh/config` and the system-wide
config, the defaults of the installed OpenSSH version, and the `%` tokens of most keywords,
without connecting. What `ssh -G` leaves unexpanded (`IdentityFile`, `CertificateFile` and
`IdentityAgent` keep `~` and their tokens) is expanded here as ssh expands it when it connects:
`~` is the user's home from the password database (ssh ignores `$HOME`), and the tokens are
those of ssh_config(5) "TOKENS".

A keyword that would make ssh decide differently from what the console can do is refused in one
line naming it (see `UNSUPPORTED`), never silently ignored.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SSH = "ssh"
"""The OpenSSH client the console asks (found on PATH)."""
SSH_G_TIMEOUT_S = 10.0
"""`ssh -G` reads files only, but a `Match exec` line runs a command: it gets this long."""
MAX_SSH_G_BYTES = 1024 * 1024


class SshConfigError(ValueError):
    """`ssh -G` refused the settings (its own words), or they ask for what is not supported."""


@dataclass(frozen=True, slots=True)
class SshConfig:
    """What ssh would use to connect to one host: the keywords the console acts on."""

    host: str
    """The name as given to ssh (a `Host` alias, or the address itself)."""
    hostname: str
    port: int
    user: str
    identity_files: tuple[Path, ...]
    certificate_files: tuple[Path, ...]
    identities_only: bool
    identity_agent: str | None
    """The agent's socket; None for none (`IdentityAgent none`, or no `SSH_AUTH_SOCK`)."""
    proxy_jump: str | None
    user_known_hosts: tuple[Path, ...]
    global_known_hosts: tuple[Path, ...]
    strict_host_key_checking: str
    """"yes", "accept-new", "no" or "ask" (which, in batch mode, refuses as "yes" does)."""
    host_key_alias: str | None
    hash_known_hosts: bool
    host_key_algorithms: tuple[str, ...]

    @property
    def known_hosts_files(self) -> tuple[Path, ...]:
        """Every file ssh reads host keys from, user files first."""
        return self.user_known_hosts + self.global_known_hosts


UNSUPPORTED: Mapping[str, tuple[str, ...]] = {
    # keyword, as ssh_config(5) spells it -> the values ssh -G prints when it is off
    "ProxyCommand": ("none",),
    "KnownHostsCommand": ("none",),
    "RevokedHostKeys": ("none",),
    "VerifyHostKeyDNS": ("false",),
    "CheckHostIP": ("no", "false"),
}
"""Keywords the console does not act on, with their "off" values: each changes what ssh would
accept or how it reaches the host, so a host that sets one is refused rather than connected
differently. A keyword `ssh -G` does not print is off."""

_STRICT = {"true": "yes", "false": "no", "ask": "ask", "accept-new": "accept-new"}


def read_ssh_config(
    name: str,
    *,
    user: str | None = None,
    port: int | None = None,
    config_file: Path | None = None,
    options: Sequence[str] = (),
) -> SshConfig:
    """The settings `ssh [-F config_file] [-o OPTION]... [-l user] [-p port] NAME` would use.

    `SshConfigError` with ssh's own line (file and line number) for a config it refuses, and
    for a keyword of `UNSUPPORTED` that is on."""
    words = _ssh_g(name, user=user, port=port, config_file=config_file, options=options)
    for keyword, off in UNSUPPORTED.items():
        values = words.get(keyword.lower())  # ssh -G prints keywords in lowercase
        if values and values[0].lower() not in off:
            raise SshConfigError(
                f"ssh config sets {keyword} {' '.join(values)}, which the console "
                f"does not support; unset it for this host (ssh -G {name} shows it)"
            )
    hostname = _one(words, "hostname", name)
    login = _one(words, "user", _local_user())
    port_number = int(_one(words, "port", "22"))
    tokens = _Tokens(home=user_home(), user=login, host=hostname, original=name, port=port_number)
    return SshConfig(
        host=name,
        hostname=hostname,
        port=port_number,
        user=login,
        identity_files=tuple(tokens.path(v) for v in words.get("identityfile", ())),
        certificate_files=tuple(tokens.path(v) for v in words.get("certificatefile", ())),
        identities_only=_one(words, "identitiesonly", "no") in ("yes", "true"),
        identity_agent=_agent(words, tokens),
        proxy_jump=_optional(words, "proxyjump"),
        user_known_hosts=_files(words, "userknownhostsfile", tokens),
        global_known_hosts=_files(words, "globalknownhostsfile", tokens),
        strict_host_key_checking=_STRICT.get(_one(words, "stricthostkeychecking", "ask"), "ask"),
        host_key_alias=_optional(words, "hostkeyalias"),
        hash_known_hosts=_one(words, "hashknownhosts", "no") in ("yes", "true"),
        host_key_algorithms=tuple(_one(words, "hostkeyalgorithms", "").split(",")),
    )


def _ssh_g(
    name: str,
    *,
    user: str | None,
    port: int | None,
    config_file: Path | None,
    options: Sequence[str],
) -> dict[str, tuple[str, ...]]:
    """`ssh -G`'s answer, keyword (lowercase) -> its values (a keyword may repeat)."""
    ssh = shutil.which(SSH)
    if ssh is None:
        raise SshConfigError(
            "the OpenSSH client (ssh) is not installed: the console reads ssh config through "
            "`ssh -G`; install openssh-client"
        )
    command = [ssh, "-G"]
    if config_file is not None:
        command += ["-F", str(config_file)]
    for option in options:
        command += ["-o", option]
    if user is not None:
        command += ["-l", user]
    if port is not None:
        command += ["-p", str(port)]
    command += ["--", name]
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=SSH_G_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SshConfigError(
            f"`ssh -G {name}` did not answer within {SSH_G_TIMEOUT_S:g} s (a Match exec "
            "command that hangs?)"
        ) from None
    except OSError as error:
        raise SshConfigError(f"cannot run {ssh}: {error.strerror or error}") from None
    if done.returncode != 0:
        raise SshConfigError(f"ssh config: {_ssh_complaint(done.stderr)}")
    words: dict[str, tuple[str, ...]] = {}
    for line in done.stdout[:MAX_SSH_G_BYTES].decode("utf-8", "replace").splitlines():
        keyword, _, value = line.partition(" ")
        if keyword:
            words[keyword.lower()] = (*words.get(keyword.lower(), ()), value.strip())
    return words


def _ssh_complaint(stderr: bytes) -> str:
    """ssh's first line that names what is wrong (it ends with "terminating, N bad options")."""
    lines = [
        line.strip()
        for line in stderr.decode("utf-8", "replace").splitlines()
        if line.strip() and not line.startswith("Pseudo-terminal")
    ]
    return lines[0] if lines else "ssh -G failed with no message"


def _one(words: Mapping[str, tuple[str, ...]], keyword: str, default: str) -> str:
    values = words.get(keyword)
    return values[0] if values else default


def _optional(words: Mapping[str, tuple[str, ...]], keyword: str) -> str | None:
    value = _one(words, keyword, "none")
    return None if value.lower() == "none" else value


def _files(words: Mapping[str, tuple[str, ...]], keyword: str, tokens: _Tokens) -> tuple[Path, ...]:
    """A known-hosts keyword's files (`none` for none), each value holding several."""
    names = [name for value in words.get(keyword, ()) for name in value.split()]
    if [name.lower() for name in names] == ["none"]:
        return ()
    return tuple(tokens.path(name) for name in names)


def _agent(words: Mapping[str, tuple[str, ...]], tokens: _Tokens) -> str | None:
    """The agent socket: IdentityAgent's (`none`, `SSH_AUTH_SOCK`, `$VAR`, a path), else
    `$SSH_AUTH_SOCK`."""
    value = _one(words, "identityagent", "SSH_AUTH_SOCK")
    if value.lower() == "none":
        return None
    if value == "SSH_AUTH_SOCK":
        return os.environ.get("SSH_AUTH_SOCK") or None
    if value.startswith("$"):
        return os.environ.get(value[1:]) or None
    return str(tokens.path(value))


def user_home() -> str:
    """The home ssh uses for `~` and `%d`: the password database's, not `$HOME`."""
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return os.path.expanduser("~")


def _local_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


@dataclass(frozen=True, slots=True)
class _Tokens:
    """ssh_config(5)'s TOKENS for the file keywords, as ssh expands them when it connects."""

    home: str
    user: str
    host: str
    original: str
    port: int

    def path(self, value: str) -> Path:
        if value.startswith("~/") or value == "~":
            value = self.home + value[1:]
        return Path(self.expand(value))

    def expand(self, value: str) -> str:
        tokens = {
            "%": "%",
            "d": self.home,
            "h": self.host,
            "i": str(os.getuid()),
            "L": socket.gethostname().split(".")[0],
            "l": socket.gethostname(),
            "n": self.original,
            "p": str(self.port),
            "r": self.user,
            "u": _local_user(),
        }
        out: list[str] = []
        index = 0
        while index < len(value):
            char = value[index]
            if char != "%" or index + 1 == len(value):
                out.append(char)
                index += 1
                continue
            token = value[index + 1]
            if token not in tokens:
                raise SshConfigError(f"ssh config: token %{token} in {value!r} is not supported")
            out.append(tokens[token])
            index += 2
        return "".join(out)
