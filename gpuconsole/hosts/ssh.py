"""Opening an SSH connection to one host of the inventory, with OpenSSH's decisions.

asyncssh verifies the server's key against known_hosts, but it has no `StrictHostKeyChecking`:
what an unknown or a changed key means is decided here. A changed key is refused loudly and
never retried by itself (it may be an attack, or a reinstalled host: a person must decide); an
unknown one is refused with the command that would add it. Keys come from the SSH agent, the
default key files and `~/.ssh/config`, which asyncssh reads, so `Host` aliases work by name.

The files are untrusted input, and a bad one is a reason, never a traceback or a host left
"connecting": an ssh config that is not text or includes itself, a known_hosts line that cannot
be read, a port out of range are each named (file, and line where known). Where OpenSSH decides,
the console decides the same:

- a private key file that its owner lets group or others read is ignored, as `sshkey_perm_ok`
  does ("UNPROTECTED PRIVATE KEY FILE"), and said in the reason when the login then fails;
- Includes nest at most 16 deep (OpenSSH's READCONF_MAX_DEPTH);
- the agent is never forwarded, whatever `ForwardAgent` says: a watched node's users are not
  trusted, and the console stays connected for days. Jump hosts (the inventory's `jump`, or
  `ProxyJump` from ssh config) are connected here too, hop by hop, so that the same holds for
  them, and their keys are checked against the same known_hosts.
"""

from __future__ import annotations

import asyncio
import functools
import locale
import os
import shlex
import socket
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from gpuconsole.hosts.inventory import PORTS, HostEntry, InventoryError, jump_hosts
from gpuconsole.model import HostState
from gpuconsole.untrusted import visible

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
DEFAULT_SSH_CONFIG = Path("~/.ssh/config")
MAX_INCLUDE_DEPTH = 16
"""OpenSSH's READCONF_MAX_DEPTH: deeper Includes are a loop, or as good as one."""
MAX_JUMPS = 8
"""Hops in a ProxyJump chain, counting the jump hosts' own ProxyJump: more is a loop."""
MAX_REASON_CHARS = 500
# The identity files OpenSSH tries when none is configured (and asyncssh's id_ed448).
_DEFAULT_KEY_FILES = (
    "id_rsa",
    "id_ecdsa",
    "id_ecdsa_sk",
    "id_ed25519",
    "id_ed25519_sk",
    "id_xmss",
    "id_dsa",
    "id_ed448",
)


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
        # Reasons quote files and servers: made one printable line here, once for every caller.
        reason = visible(reason, MAX_REASON_CHARS)
        super().__init__(reason)
        self.state = state
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Plan:
    """One connection as asyncssh will make it, decided before any packet is sent."""

    options: dict[str, object]
    """asyncssh.connect's keyword arguments."""
    host: str  # where it connects: the address after ssh config's HostName
    port: int
    jump: str | None  # ProxyJump hops: the inventory's, else ssh config's
    ignored_keys: tuple[str, ...]  # why each key file was not offered, in OpenSSH's words
    known_hosts: Path


async def connect(
    entry: HostEntry,
    settings: SshSettings,
    *,
    via: asyncssh.SSHClientConnection | None = None,
    hops: int = 0,
) -> asyncssh.SSHClientConnection:
    """Connect and authenticate, or raise `ConnectFailure` saying why, naming the host.

    ``via``: the jump host connection to tunnel through (the hop before, in a ProxyJump chain);
    ``hops``: how many jump hosts lead here, to stop a chain that loops.
    """
    plan = await asyncio.to_thread(_plan, entry, settings)
    tunnel = via
    if via is None and plan.jump is not None:
        tunnel = await _jump_through(entry, plan.jump, settings, hops)
    try:
        connection = await _open(entry, plan, tunnel)
    except BaseException:
        if tunnel is not None and tunnel is not via:  # a caller's `via` is the caller's
            tunnel.close()
        raise
    if tunnel is not None:
        connection.set_tunnel(tunnel)  # closed with this connection, as asyncssh does its own
    return connection


async def _jump_through(
    entry: HostEntry, jump: str, settings: SshSettings, hops: int
) -> asyncssh.SSHClientConnection:
    """The connection to the last hop of ``jump``, each hop reached through the one before."""
    try:
        chain = jump_hosts(jump, entry.connect_timeout)
    except InventoryError as error:
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: {error}") from None
    hops += len(chain)
    if hops > MAX_JUMPS:
        raise ConnectFailure(
            HostState.DOWN,
            f"{entry.name}: more than {MAX_JUMPS} jump hosts on the way (does a ProxyJump "
            "lead back to a host before it?)",
        )
    tunnel: asyncssh.SSHClientConnection | None = None
    try:
        for hop in chain:
            tunnel = await connect(hop, settings, via=tunnel, hops=hops)
    except BaseException as error:
        if tunnel is not None:
            tunnel.close()  # and the hops before it, through set_tunnel
        if isinstance(error, ConnectFailure):
            raise ConnectFailure(error.state, f"{entry.name}: jump host {error.reason}") from None
        raise
    assert tunnel is not None  # a ProxyJump has at least one hop
    return tunnel


async def _open(
    entry: HostEntry, plan: _Plan, tunnel: asyncssh.SSHClientConnection | None
) -> asyncssh.SSHClientConnection:
    try:
        return await asyncssh.connect(entry.address, tunnel=tunnel, **plan.options)  # type: ignore[arg-type]
    except asyncssh.HostKeyNotVerifiable:
        raise _host_key_failure(entry, plan) from None
    except asyncssh.PermissionDenied as error:
        ignored = "".join(f"; {why}" for why in plan.ignored_keys)
        raise ConnectFailure(
            HostState.AUTH_FAILED,
            f"{entry.name}: authentication refused for user {entry.user or 'from ssh config'} "
            f"({error.reason or 'no key was accepted'}){ignored}; not retried until the console "
            "restarts",
        ) from None
    except (asyncio.TimeoutError, TimeoutError):
        raise ConnectFailure(
            HostState.DOWN,
            f"{entry.name}: no SSH answer within {entry.connect_timeout:g} s",
        ) from None
    except asyncssh.Error as error:
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: SSH: {error.reason}") from None
    except OSError as error:
        raise ConnectFailure(
            HostState.DOWN, f"{entry.name}: {_os_reason(error)} ({plan.host}:{plan.port})"
        ) from None
    except ValueError as error:  # what asyncssh reads only now: a key file it cannot import...
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: SSH: {error}") from None


# --- the plan: every file read and every setting checked before connecting --------------------


def _plan(entry: HostEntry, settings: SshSettings) -> _Plan:
    """What `connect` passes to asyncssh; `ConnectFailure` for a file or setting it must not get.

    asyncssh's own option parser reads the ssh config here, so what is checked is what it will
    do; it reads the files again when connecting (they are small)."""
    config_files = _config_files(settings)
    problem = _config_problem(config_files)
    if problem is not None:
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: ssh config {problem}")
    known_hosts = settings.known_hosts.expanduser()
    options: dict[str, object] = {
        "known_hosts": _read_known_hosts(entry, known_hosts),
        "config": [str(path) for path in config_files],
        "connect_timeout": entry.connect_timeout,
        "login_timeout": entry.connect_timeout,
        "keepalive_interval": settings.keepalive_interval,
        "keepalive_count_max": settings.keepalive_count_max,
        "agent_forwarding": False,
    }
    if entry.user is not None:
        options["username"] = entry.user
    if entry.port is not None:
        options["port"] = entry.port
    if settings.client_keys is not None:
        options["client_keys"] = [str(path.expanduser()) for path in settings.client_keys]
        options["agent_path"] = None
    # resolved without loading keys: which key files to load is decided from what it says
    resolved = _resolved(entry, {**options, "client_keys": None}, config_files)
    if not PORTS[0] <= resolved.port <= PORTS[1]:
        raise ConnectFailure(
            HostState.DOWN,
            f"{entry.name}: ssh config {_named(config_files)}: Bad port '{resolved.port}' "
            f"(a port is {PORTS[0]}..{PORTS[1]})",
        )
    ignored = _choose_keys(options, _key_files(settings, resolved))
    jump = entry.jump if entry.jump is not None else resolved.tunnel
    return _Plan(
        options=options,
        host=resolved.host,
        port=resolved.port,
        jump=jump if isinstance(jump, str) else None,
        ignored_keys=ignored,
        known_hosts=known_hosts,
    )


def _resolved(
    entry: HostEntry, options: dict[str, object], config_files: Sequence[Path]
) -> asyncssh.SSHClientConnectionOptions:
    """The options as asyncssh resolves them with the ssh config for this host."""
    try:
        return asyncssh.SSHClientConnectionOptions(host=entry.address, **options)  # type: ignore[arg-type]
    except asyncssh.ConfigParseError as error:  # "FILE line N: what"
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: ssh config {error}") from None
    except (ValueError, OSError) as error:  # a key file it cannot import, an unreadable one...
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: SSH settings: {error}") from None
    except Exception as error:
        # asyncssh's parser meets the untrusted files first; what it fails on that the check
        # before did not foresee is still a reason, not a traceback
        raise ConnectFailure(
            HostState.DOWN,
            f"{entry.name}: ssh config {_named(config_files)} cannot be read "
            f"({type(error).__name__}: {error})",
        ) from None


def _named(paths: Sequence[Path]) -> str:
    return ", ".join(str(path) for path in paths) or "(none)"


# --- ssh config files -------------------------------------------------------------------------


def _config_files(settings: SshSettings) -> tuple[Path, ...]:
    """The files asyncssh reads: the settings' list, else ~/.ssh/config where it is readable."""
    if settings.config_files is not None:
        return tuple(path.expanduser() for path in settings.config_files)
    default = DEFAULT_SSH_CONFIG.expanduser()
    return (default,) if os.access(default, os.R_OK) else ()


def _config_problem(paths: Sequence[Path]) -> str | None:
    """What keeps asyncssh from reading these files and their Includes, as `FILE line N: why`.

    asyncssh reads them as text in the locale's encoding (it raises on other bytes, where
    OpenSSH takes bytes as they are) and follows an Include loop until Python's recursion
    limit (holding a file open per level): both are found here first."""
    for path in paths:
        problem = _file_problem(path, 0)
        if problem is not None:
            return problem
    return None


def _file_problem(path: Path, depth: int) -> str | None:
    try:
        data = path.read_bytes()
    except OSError as error:
        return f"{path}: cannot read: {error.strerror or error}"
    encoding = locale.getpreferredencoding(False)
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            words = _words(raw.decode(encoding))
        except UnicodeDecodeError:
            return f"{path} line {number}: not {encoding} text"
        if words[:1] == ["="]:  # asyncssh fails on it with an IndexError (ssh skips it)
            return f"{path} line {number}: '=' with no keyword before it"
        patterns = _include_patterns(words)
        if patterns and depth == MAX_INCLUDE_DEPTH:
            return (
                f"{path} line {number}: too many recursive Includes (more than "
                f"{MAX_INCLUDE_DEPTH}; does a file include itself?)"
            )
        for included in _included(patterns):
            problem = _file_problem(included, depth + 1)
            if problem is not None:
                return problem
    return None


def _words(line: str) -> list[str]:
    """A config line's shell words, as asyncssh splits it; none for a comment, or a line it
    refuses itself (with its place)."""
    line = line.strip()
    if not line or line.startswith("#"):
        return []
    try:
        return shlex.split(line)
    except ValueError:
        return []


def _include_patterns(words: list[str]) -> list[str]:
    """The patterns of an `Include` line (`Include a`, `Include=a`, `Include = a`, as asyncssh
    reads them); none for any other line."""
    keyword, _, rest = words[0].partition("=") if words else ("", "", "")
    if keyword.lower() != "include":
        return []
    patterns, tail = [rest] if rest else [], words[1:]
    while tail and tail[0].startswith("="):
        patterns += [tail[0][1:]] if len(tail[0]) > 1 else []
        tail = tail[1:]
    return patterns + tail


def _included(patterns: list[str]) -> list[Path]:
    """The files Include patterns name, found as asyncssh finds them: globs, relative to
    ~/.ssh unless absolute."""
    found: list[Path] = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if path.anchor:
            base, pattern = Path(path.anchor), str(Path(*path.parts[1:]))
        else:
            base = DEFAULT_SSH_CONFIG.expanduser().parent
        try:
            found.extend(match for match in sorted(base.glob(pattern)) if match.is_file())
        except (OSError, ValueError):  # an unreadable directory; a pattern glob refuses
            continue
    return found


# --- known_hosts -------------------------------------------------------------------------------


def _read_known_hosts(entry: HostEntry, path: Path) -> asyncssh.SSHKnownHosts | bytes:
    """The known_hosts file, read once here (asyncssh would raise from inside the handshake);
    no file is no trusted keys."""
    if not path.is_file():
        return b""
    try:
        return asyncssh.read_known_hosts(str(path))
    except OSError as error:
        raise ConnectFailure(
            HostState.DOWN, f"{entry.name}: {path}: cannot read: {error.strerror or error}"
        ) from None
    except ValueError:  # UnicodeDecodeError too
        raise ConnectFailure(
            HostState.DOWN, f"{entry.name}: {_known_hosts_problem(path)}"
        ) from None


def _known_hosts_problem(path: Path) -> str:
    """Which line of a known_hosts file asyncssh refuses, and why. OpenSSH skips such a line;
    asyncssh refuses the whole file, so no host's key can be checked until it is fixed."""
    encoding = locale.getpreferredencoding(False)
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            asyncssh.import_known_hosts(raw.decode(encoding))
        except UnicodeDecodeError:
            return f"{path} line {number}: not {encoding} text; fix or delete the line"
        except ValueError as error:
            return f"{path} line {number}: {error}; fix or delete the line"
    return f"{path}: cannot be read as known_hosts"


def _host_key_failure(entry: HostEntry, plan: _Plan) -> ConnectFailure:
    """A changed key (known_hosts lists other keys for the host) or an unknown host."""
    port = None if plan.port == 22 else plan.port
    target = plan.host if port is None else f"[{plan.host}]:{port}"
    known_hosts = plan.options["known_hosts"]
    trusted = asyncssh.match_known_hosts(known_hosts, plan.host, "", port)  # type: ignore[arg-type]
    if trusted[0] or trusted[1]:
        return ConnectFailure(
            HostState.HOST_KEY_MISMATCH,
            f"{entry.name}: REFUSED: the host key differs from the one in {plan.known_hosts} for "
            f"{target}; it may have been reinstalled, or someone is in the middle. Confirm it, "
            f"then `ssh-keygen -R '{target}'`",
        )
    return ConnectFailure(
        HostState.DOWN,
        f"{entry.name}: host key unknown: {target} is not in {plan.known_hosts}; check its "
        f"fingerprint and add it (ssh {entry.address} once, or ssh-keyscan)",
    )


# --- private keys ------------------------------------------------------------------------------


def _key_files(
    settings: SshSettings, resolved: asyncssh.SSHClientConnectionOptions
) -> tuple[Path, ...]:
    """The private key files asyncssh would offer: the settings', else ssh config's
    IdentityFile, else the default ones."""
    if settings.client_keys is not None:
        return tuple(path.expanduser() for path in settings.client_keys)
    configured = resolved.config.get("IdentityFile")
    if isinstance(configured, list) and configured:
        return tuple(Path(str(path)).expanduser() for path in configured)
    return tuple(Path("~/.ssh", name).expanduser() for name in _DEFAULT_KEY_FILES)


def _choose_keys(options: dict[str, object], files: Sequence[Path]) -> tuple[str, ...]:
    """Leave out the key files OpenSSH would ignore, and anything that is not a file (asyncssh
    would read /dev/zero for ever); OpenSSH's words for each key file left out.

    What is left is listed for asyncssh explicitly; asyncssh reads an empty list as "the
    default files", so a key no server knows stands in for none, which keeps the agent asked."""
    ignored = tuple(why for why in map(_unprotected, files) if why is not None)
    if not ignored and all(path.is_file() or not path.exists() for path in files):
        return ()
    kept = [
        str(path)
        for path in files
        if path.is_file() and _unprotected(path) is None and _loadable(path)
    ]
    options["client_keys"] = kept or [_no_key()]
    options["ignore_encrypted"] = True  # as ssh in batch mode: a key it cannot open is skipped
    return ignored


def _unprotected(path: Path) -> str | None:
    """OpenSSH's `sshkey_perm_ok`: a key file the user owns that group or others may use."""
    try:
        info = path.stat()
    except (OSError, ValueError):  # ValueError: a NUL in the name ssh config gave
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or not info.st_mode & 0o077:
        return None
    return (
        f"UNPROTECTED PRIVATE KEY FILE ignored: permissions {info.st_mode & 0o777:04o} for "
        f"'{path}' are too open (chmod 600 it)"
    )


def _loadable(path: Path) -> bool:
    """Whether asyncssh can load a key file without a passphrase (ssh skips the others)."""
    try:
        asyncssh.load_keypairs(str(path), ignore_encrypted=True)
    except (OSError, ValueError):
        return False
    return True


@functools.cache
def _no_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519", comment="gpuconsole: no key")


def _os_reason(error: OSError) -> str:
    """'connection refused', 'no route to host': the errno's words rather than asyncio's."""
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the name ({error.strerror or error})"
    text = os.strerror(error.errno) if error.errno else str(error)
    return text[0].lower() + text[1:] if text else type(error).__name__
