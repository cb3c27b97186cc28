"""Opening an SSH connection to one host of the inventory, deciding as OpenSSH's `ssh` does.

An admin's `ssh -o BatchMode=yes gpu07` is the judge: where it connects, the console connects;
where it refuses a key, the console refuses it the same way. So every setting is `ssh -G`'s
(`gpuconsole.hosts.ssh_config`), and asyncssh is given them explicitly and reads no config
itself. Host keys are decided here from exactly the files ssh reads for the host
(`UserKnownHostsFile`, `GlobalKnownHostsFile`), looked up under the name ssh looks up
(`HostKeyAlias`, else `[HostName]:Port`, and then the bare `HostName` where no line names the
port), with `@cert-authority` and `@revoked` lines (`gpuconsole.hosts.known_hosts`):

- a revoked key, or a host certificate signed by a revoked CA, is refused in every mode, loudly,
  and not retried; so is a key that differs from the known ones (of any type: OpenSSH 9
  calls a host whose known key is ECDSA and which shows ED25519 "changed" too; ssh with
  `StrictHostKeyChecking no` would connect with warnings; the console never does: it may be an
  attack, and a person must decide);
- an unknown key is refused with the command that adds it, unless `StrictHostKeyChecking` is
  `accept-new` (or `no`): then it is added to the first `UserKnownHostsFile`, hashed when
  `HashKnownHosts` says so, the caller is told and the audit log says so;
- a private key file that its owner lets group or others read is ignored, as `sshkey_perm_ok`
  does ("UNPROTECTED PRIVATE KEY FILE"), and said in the reason when the login then fails;
- the agent is never forwarded, whatever `ForwardAgent` says: a watched node's users are not
  trusted, and the console stays connected for days. Jump hosts (the inventory's `jump`, or
  `ProxyJump` from ssh config) are connected here too, hop by hop, each with its own settings
  and host keys.

Each refusal is a `ConnectFailure`: the host's state and one line naming the file and line that
decided.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import socket
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from gpuconsole import audit, paths
from gpuconsole.hosts.inventory import HostEntry, InventoryError, jump_hosts
from gpuconsole.hosts.known_hosts import (
    HostKeys,
    append_known_host,
    host_keys,
    known_hosts_line,
    lookup_name,
)
from gpuconsole.hosts.ssh_config import SshConfig, SshConfigError, read_ssh_config, user_home
from gpuconsole.model import HostState
from gpuconsole.untrusted import visible

MAX_JUMPS = 8
"""Hops in a ProxyJump chain, counting the jump hosts' own ProxyJump: more is a loop."""
MAX_REASON_CHARS = 500
HOST_KEY_ADDED = "host-key-added"
"""The audit log's word for a key `accept-new` added to known_hosts."""


@dataclass(frozen=True, slots=True)
class SshSettings:
    """What every connection of the console shares (the inventory holds what is per host)."""

    config_file: Path | None = field(default_factory=paths.ssh_config_file)
    """The file given to `ssh -F`; None: ssh's own (`~/.ssh/config`, `/etc/ssh/ssh_config`)."""
    options: tuple[str, ...] = ()
    """`KEYWORD=VALUE` options, as `ssh -o` takes them: they win over the config files."""
    keepalive_interval: float = 5.0
    """A dropped link can leave a read waiting forever; keepalives find it within
    ``keepalive_interval × keepalive_count_max`` seconds."""
    keepalive_count_max: int = 3

    def ssh_command(self, name: str) -> str:
        """How to run the `ssh` that sees these settings, for a reason to quote."""
        words = ["ssh"]
        if self.config_file is not None:
            words += ["-F", str(self.config_file)]
        for option in self.options:
            words += ["-o", option]
        return " ".join([*words, name])


class ConnectFailure(Exception):
    """A host could not be connected to: the state it is in now and a one-line reason."""

    def __init__(self, state: HostState, reason: str) -> None:
        # Reasons quote files and servers: made one printable line here, once for every caller.
        reason = visible(reason, MAX_REASON_CHARS)
        super().__init__(reason)
        self.state = state
        self.reason = reason


async def connect(
    entry: HostEntry,
    settings: SshSettings,
    *,
    via: asyncssh.SSHClientConnection | None = None,
    hops: int = 0,
    notices: list[str] | None = None,
) -> asyncssh.SSHClientConnection:
    """Connect and authenticate, or raise `ConnectFailure` saying why, naming the host.

    ``via``: the jump host connection to tunnel through (the hop before, in a ProxyJump chain);
    ``hops``: how many jump hosts lead here, to stop a chain that loops; ``notices``: where to
    say what the connection changed (a host key `accept-new` added), one line each.
    """
    plan = await asyncio.to_thread(_plan, entry, settings)
    tunnel = via
    if via is None and plan.jump is not None:
        tunnel = await _jump_through(entry, plan.jump, settings, hops, notices)
    try:
        connection = await _open(entry, plan, tunnel)
    except BaseException:
        if tunnel is not None and tunnel is not via:  # a caller's `via` is the caller's
            tunnel.close()
        raise
    if tunnel is not None:
        connection.set_tunnel(tunnel)  # closed with this connection, as asyncssh does its own
    if plan.judge.added is not None and notices is not None:
        notices.append(plan.judge.added)
    return connection


async def _jump_through(
    entry: HostEntry,
    jump: str,
    settings: SshSettings,
    hops: int,
    notices: list[str] | None,
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
            tunnel = await connect(hop, settings, via=tunnel, hops=hops, notices=notices)
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
    config = plan.config
    try:
        return await asyncssh.connect(  # type: ignore[arg-type]
            config.hostname,
            tunnel=tunnel,
            client_factory=functools.partial(_Client, plan.judge),
            **plan.options,
        )
    except asyncssh.HostKeyNotVerifiable as error:
        raise _host_key_failure(entry, plan, error.reason) from None
    except asyncssh.PermissionDenied as error:
        ignored = "".join(f"; {why}" for why in plan.ignored_keys)
        raise ConnectFailure(
            HostState.AUTH_FAILED,
            f"{entry.name}: authentication refused for user {config.user} "
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
            HostState.DOWN,
            f"{entry.name}: {_os_reason(error)} ({config.hostname}:{config.port})",
        ) from None
    except ValueError as error:  # what asyncssh reads only now: a key file it cannot import...
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: SSH: {error}") from None


# --- the plan: every file read and every setting decided before connecting --------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """One connection as asyncssh will make it, decided before any packet is sent."""

    config: SshConfig
    options: dict[str, object]
    """asyncssh.connect's keyword arguments."""
    jump: str | None  # ProxyJump hops: the inventory's, else ssh config's
    ignored_keys: tuple[str, ...]  # why each key file was not offered, in OpenSSH's words
    judge: _HostKeyJudge
    settings: SshSettings


def _plan(entry: HostEntry, settings: SshSettings) -> _Plan:
    """What `connect` passes to asyncssh; `ConnectFailure` for a setting ssh would refuse."""
    try:
        config = read_ssh_config(
            entry.address,
            user=entry.user,
            port=entry.port,
            config_file=settings.config_file,
            options=settings.options,
        )
    except SshConfigError as error:
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: {error}") from None
    keys = _known_keys(config)
    options: dict[str, object] = {
        "port": config.port,
        "username": config.user,
        "config": [],  # every setting is ssh -G's, given here
        "known_hosts": (
            [known.key for known in keys.trusted()],
            [known.key for known in keys.authorities if keys.revoked_entry(known.key) is None],
            [known.key for known in keys.revoked],
        ),
        "host_key_alias": config.host_key_alias,
        "server_host_key_algs": _host_key_algorithms(config, keys),
        "x509_trusted_certs": None,
        "agent_path": config.identity_agent,
        "agent_forwarding": False,
        "connect_timeout": entry.connect_timeout,
        "login_timeout": entry.connect_timeout,
        "keepalive_interval": settings.keepalive_interval,
        "keepalive_count_max": settings.keepalive_count_max,
    }
    certificates = [str(path) for path in config.certificate_files if path.is_file()]
    if certificates:
        options["client_certs"] = certificates
    ignored = _choose_keys(options, config.identity_files)
    if config.identities_only:
        # the agent's keys only where an identity file names them, as ssh's IdentitiesOnly
        options["agent_identities"] = [
            str(path) for path in config.identity_files if _identity_present(path)
        ] or [_no_key()]
    jump = entry.jump if entry.jump is not None else config.proxy_jump
    return _Plan(
        config=config,
        options=options,
        jump=jump,
        ignored_keys=ignored,
        judge=_HostKeyJudge(entry.name, config, keys),
        settings=settings,
    )


def _known_keys(config: SshConfig) -> HostKeys:
    """The lines of ssh's files for this host, under the name ssh looks up; where none names
    `[host]:port` (and no HostKeyAlias is set), ssh looks again under the bare host name."""
    files = config.known_hosts_files
    keys = host_keys(files, lookup_name(config.hostname, config.port, config.host_key_alias))
    if keys.keys or keys.authorities or config.host_key_alias is not None or config.port == 22:
        return keys
    bare = host_keys(files, lookup_name(config.hostname, 22, None))
    if not (bare.keys or bare.authorities):
        return keys
    return dataclasses.replace(bare, revoked=keys.revoked + bare.revoked)


def _host_key_algorithms(config: SshConfig, keys: HostKeys) -> list[str]:
    """ssh's HostKeyAlgorithms in ssh's order of preference for this host: the types of its
    known keys first. Certificate types only where a CA is trusted for the host: ssh meets a
    certificate it cannot check by checking the plain key, which asyncssh cannot, so the
    server is asked for its plain key instead (the decision is the same)."""
    supported = {alg.decode() for alg in asyncssh.public_key.get_public_key_algs()}
    certificate = {alg.decode() for alg in asyncssh.public_key.get_certificate_algs()}
    offered = [alg for alg in config.host_key_algorithms if alg in supported | certificate]
    if not keys.authorities:
        offered = [alg for alg in offered if alg not in certificate]
    known = {alg.decode() for entry in keys.trusted() for alg in entry.key.sig_algorithms}
    first = [alg for alg in offered if alg in certificate or alg in known]
    return first + [alg for alg in offered if alg not in first] or sorted(supported)


class _Client(asyncssh.SSHClient):
    """asyncssh asks this about a host key that no trusted line lists."""

    def __init__(self, judge: _HostKeyJudge) -> None:
        self._judge = judge

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        return self._judge.unknown_key(key)


class _HostKeyJudge:
    """What ssh does with a key no line trusts: refuses it, or (accept-new) adds it."""

    def __init__(self, host: str, config: SshConfig, keys: HostKeys) -> None:
        self.host = host
        self.config = config
        self.keys = keys
        self.presented: asyncssh.SSHKey | None = None
        self.added: str | None = None
        """What was added to known_hosts, one line, once the key was taken."""

    def unknown_key(self, key: asyncssh.SSHKey) -> bool:
        self.presented = key
        if self.keys.revoked_entry(key) is not None or self.keys.trusted():
            return False  # revoked, or changed (another key is known): refused in every mode
        if self.config.strict_host_key_checking not in ("accept-new", "no"):
            return False
        self.added = self._add(key)
        return True

    def _add(self, key: asyncssh.SSHKey) -> str:
        """Add the key to the first UserKnownHostsFile as ssh does; what was done, one line."""
        name, kind = self.keys.name, _key_type(key)
        mode = f"StrictHostKeyChecking {self.config.strict_host_key_checking}"
        files = self.config.user_known_hosts
        if not files:
            return (
                f"{self.host}: accepted the new {kind} key of {name} ({mode}); not kept, as "
                "UserKnownHostsFile is none"
            )
        target = files[0]
        if not target.parent.is_dir() and target.parent != Path(user_home(), ".ssh"):
            # ssh makes ~/.ssh if it is missing, and no other folder
            return (
                f"{self.host}: accepted the new {kind} key of {name} ({mode}) but could not add "
                f"it to {target}: its folder does not exist"
            )
        try:
            append_known_host(
                target, known_hosts_line(name, key, hashed=self.config.hash_known_hosts)
            )
        except (OSError, ValueError) as error:  # ValueError: a name ssh would not record
            return (
                f"{self.host}: accepted the new {kind} key of {name} ({mode}) but could not add "
                f"it to {target}: {getattr(error, 'strerror', None) or error}"
            )
        audit.record(
            HOST_KEY_ADDED,
            host=self.host,
            name=name,
            file=str(target),
            key_type=kind,
            fingerprint=key.get_fingerprint(),
        )
        return (
            f"{self.host}: permanently added the {kind} key of {name} to {target} ({mode}); "
            f"{key.get_fingerprint()}"
        )


def _host_key_failure(entry: HostEntry, plan: _Plan, why: str) -> ConnectFailure:
    """The refusal, with the file and line that decided it: revoked, changed, or unknown."""
    keys, judge, config = plan.judge.keys, plan.judge, plan.config
    name = keys.name
    if "revoked" in why:  # asyncssh's words, "Host key is revoked" / "Host CA key is revoked"
        places = ", ".join(known.place for known in keys.revoked) or "a @revoked line"
        what = "CA that signed the host certificate" if "CA" in why else "host key"
        return ConnectFailure(
            HostState.HOST_KEY_REVOKED,
            f"{entry.name}: REFUSED: the {what} of {name} is revoked ({places}); the host "
            "needs a new key, and a person to check why; not retried",
        )
    presented = judge.presented
    if presented is not None and (changed := keys.same_type(presented) or keys.trusted()):
        places = ", ".join(known.place for known in changed)
        return ConnectFailure(
            HostState.HOST_KEY_MISMATCH,
            f"{entry.name}: REFUSED: the {_key_type(presented)} host key of {name} "
            f"({presented.get_fingerprint()}) differs from the one at {places}; it may have "
            "been reinstalled, or someone is in the middle. Confirm it, then "
            f"`ssh-keygen -R '{name}' -f {changed[0].path}`",
        )
    files = ", ".join(str(path) for path in config.known_hosts_files) or "no file (none set)"
    if presented is None:
        detail = f" ({why})"
    else:
        detail = f": no {_key_type(presented)} key ({presented.get_fingerprint()})"
    add = f"`{plan.settings.ssh_command(config.host)}` asks once"
    if config.host_key_alias is None and config.user_known_hosts:
        port = f"-p {config.port} " if config.port != 22 else ""
        scan = f"`ssh-keyscan {port}{config.hostname} >> {config.user_known_hosts[0]}`"
        add = f"{scan}, or {add}"
    return ConnectFailure(
        HostState.HOST_KEY_UNKNOWN,
        f"{entry.name}: host key unknown{detail} for {name} in {files}; "
        f"StrictHostKeyChecking {config.strict_host_key_checking} refuses it. Check its "
        f"fingerprint, then add it: {add}",
    )


def _key_type(key: asyncssh.SSHKey) -> str:
    """'ED25519', 'ECDSA', 'RSA': the word ssh uses for a key's type."""
    algorithm = key.algorithm.decode()
    for word in ("ed25519", "ed448", "ecdsa", "rsa", "dss"):
        if word in algorithm:
            return "DSA" if word == "dss" else word.upper()
    return algorithm


# --- private keys ------------------------------------------------------------------------------


def _choose_keys(options: dict[str, object], files: Sequence[Path]) -> tuple[str, ...]:
    """Offer the identity files OpenSSH would use, leaving out those it ignores and anything
    that is not a file (asyncssh would read /dev/zero for ever); OpenSSH's words for each key
    file left out.

    asyncssh reads an empty list as "the default files" (found through `$HOME`, which ssh
    ignores), so a key no server knows stands in for none, which keeps the agent asked."""
    ignored = tuple(why for why in map(_unprotected, files) if why is not None)
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


def _identity_present(path: Path) -> bool:
    """Whether an identity file, or its `.pub`, is there for IdentitiesOnly to match the
    agent's keys against."""
    return path.is_file() or Path(f"{path}.pub").is_file()


@functools.cache
def _no_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519", comment="gpuconsole: no key")


def _os_reason(error: OSError) -> str:
    """'connection refused', 'no route to host': the errno's words rather than asyncio's."""
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the name ({error.strerror or error})"
    text = os.strerror(error.errno) if error.errno else str(error)
    return text[0].lower() + text[1:] if text else type(error).__name__
