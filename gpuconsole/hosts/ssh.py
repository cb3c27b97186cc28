"""Opening an SSH connection to one host of the inventory, with OpenSSH's host-key policy.

asyncssh verifies the server's key against known_hosts, but it has no `StrictHostKeyChecking`:
what an unknown or a changed key means is decided here. A changed key is refused loudly and
never retried by itself (it may be an attack, or a reinstalled host: a person must decide); an
unknown one is refused with the command that would add it. Keys come from the SSH agent, the
default key files and `~/.ssh/config`, which asyncssh reads, so `Host` aliases work by name.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from gpuconsole.hosts.inventory import HostEntry
from gpuconsole.model import HostState

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


@dataclass(frozen=True, slots=True)
class SshSettings:
    """What every connection of the console shares (the inventory holds what is per host)."""

    known_hosts: Path = DEFAULT_KNOWN_HOSTS
    client_keys: tuple[Path, ...] | None = None
    """Private keys to offer; None: the SSH agent and the default key files, as ssh does."""
    config_files: tuple[Path, ...] | None = None
    """OpenSSH client config files; None: ~/.ssh/config."""
    keepalive_interval: float = 5.0
    """A dropped link can leave a read waiting forever; keepalives find it within
    ``keepalive_interval × keepalive_count_max`` seconds."""
    keepalive_count_max: int = 3


class ConnectFailure(Exception):
    """A host could not be connected to: the state it is in now and a one-line reason."""

    def __init__(self, state: HostState, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


async def connect(entry: HostEntry, settings: SshSettings) -> asyncssh.SSHClientConnection:
    """Connect and authenticate, or raise `ConnectFailure` saying why, naming the host."""
    known_hosts = settings.known_hosts.expanduser()
    options: dict[str, object] = {
        "known_hosts": str(known_hosts) if known_hosts.is_file() else b"",
        "connect_timeout": entry.connect_timeout,
        "login_timeout": entry.connect_timeout,
        "keepalive_interval": settings.keepalive_interval,
        "keepalive_count_max": settings.keepalive_count_max,
    }
    if entry.user is not None:
        options["username"] = entry.user
    if entry.port is not None:
        options["port"] = entry.port
    if entry.jump is not None:
        options["tunnel"] = entry.jump
    if settings.client_keys is not None:
        options["client_keys"] = [str(path.expanduser()) for path in settings.client_keys]
        options["agent_path"] = None
    if settings.config_files is not None:
        options["config"] = [str(path.expanduser()) for path in settings.config_files]
    try:
        return await asyncssh.connect(entry.address, **options)  # type: ignore[arg-type]
    except asyncssh.HostKeyNotVerifiable:
        raise _host_key_failure(entry, known_hosts) from None
    except asyncssh.PermissionDenied as error:
        raise ConnectFailure(
            HostState.AUTH_FAILED,
            f"{entry.name}: authentication refused for user {entry.user or 'from ssh config'} "
            f"({error.reason or 'no key was accepted'}); not retried until the console restarts",
        ) from None
    except (asyncio.TimeoutError, TimeoutError):
        raise ConnectFailure(
            HostState.DOWN,
            f"{entry.name}: no SSH answer within {entry.connect_timeout:g} s",
        ) from None
    except asyncssh.Error as error:
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: SSH: {error.reason}") from None
    except OSError as error:
        where = f"{entry.address}:{entry.port or 22}"
        raise ConnectFailure(
            HostState.DOWN, f"{entry.name}: {_os_reason(error)} ({where})"
        ) from None


def _host_key_failure(entry: HostEntry, known_hosts: Path) -> ConnectFailure:
    """A changed key (known_hosts lists other keys for the host) or an unknown host."""
    target = entry.address if entry.port in (None, 22) else f"[{entry.address}]:{entry.port}"
    listed = False
    if known_hosts.is_file():
        try:
            port = None if entry.port in (None, 22) else entry.port
            trusted = asyncssh.match_known_hosts(str(known_hosts), entry.address, "", port)
            listed = bool(trusted[0] or trusted[1])
        except (OSError, ValueError):
            listed = False
    if listed:
        return ConnectFailure(
            HostState.HOST_KEY_MISMATCH,
            f"{entry.name}: REFUSED: the host key differs from the one in {known_hosts} for "
            f"{target}; it may have been reinstalled, or someone is in the middle. Confirm it, "
            f"then `ssh-keygen -R '{target}'`",
        )
    return ConnectFailure(
        HostState.DOWN,
        f"{entry.name}: host key unknown: {target} is not in {known_hosts}; check its "
        f"fingerprint and add it (ssh {entry.address} once, or ssh-keyscan)",
    )


def _os_reason(error: OSError) -> str:
    """'connection refused', 'no route to host': the errno's words rather than asyncio's."""
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the name ({error.strerror or error})"
    text = os.strerror(error.errno) if error.errno else str(error)
    return text[0].lower() + text[1:] if text else type(error).__name__
