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
from asyncssh.encryption import get_encryption_algs
from asyncssh.kex import get_kex_algs
from asyncssh.mac import get_mac_algs

from gpuconsole.core import paths
from gpuconsole.core.model import HostState
from gpuconsole.core.untrusted import visible
from gpuconsole.hosts.host_key_judge import HostKeyJudge, failure, rsa_bits
from gpuconsole.hosts.inventory import HostEntry, InventoryError, jump_hosts
from gpuconsole.hosts.known_hosts import HostKeys, host_keys, lookup_name, read_regular
from gpuconsole.hosts.ssh_config import SshConfig, SshConfigError, read_ssh_config

MAX_JUMPS = 8
"""Hops in a ProxyJump chain, counting the jump hosts' own ProxyJump: more is a loop."""
MAX_REASON_CHARS = 500


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
    plan = await asyncio.to_thread(_plan, entry, settings, tunnelled=via is not None)
    tunnel = via
    if via is None and plan.jump is not None:
        tunnel = await _jump_through(entry, plan.jump, settings, hops, notices)
    try:
        connection, judge = await _open(entry, plan, tunnel)
    except BaseException:
        if tunnel is not None and tunnel is not via:  # a caller's `via` is the caller's
            tunnel.close()
        raise
    if tunnel is not None:
        connection.set_tunnel(tunnel)  # closed with this connection, as asyncssh does its own
    if judge.added is not None and notices is not None:
        notices.append(judge.added)
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
) -> tuple[asyncssh.SSHClientConnection, HostKeyJudge]:
    """Connect as the plan says, and the judge that took the host's key; where the host's
    certificate fails, connect again asking for its plain key, as ssh drops the certificate
    and judges the key underneath."""
    try:
        return await _attempt(entry, plan, tunnel), plan.judge
    except _CertificateFailed:
        algorithms = plan.options["server_host_key_algs"]
        assert isinstance(algorithms, list)
        plain = plain_algorithms(algorithms)
        retry = dataclasses.replace(
            plan, options={**plan.options, "server_host_key_algs": plain}, judge=plan.new_judge()
        )
        return await _attempt(entry, retry, tunnel, retry=True), retry.judge


class _CertificateFailed(Exception):
    """The host showed a certificate that ssh would drop for its plain key."""


async def _attempt(
    entry: HostEntry,
    plan: _Plan,
    tunnel: asyncssh.SSHClientConnection | None,
    *,
    retry: bool = False,
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
        if plan.judge.certificate_seen and "revoked" not in error.reason and not retry:
            raise _CertificateFailed from None
        add = plan.settings.ssh_command(config.host)
        why = await asyncio.to_thread(failure, plan.judge, error.reason, add)
        raise ConnectFailure(*why) from None
    except asyncssh.PermissionDenied as error:
        raise ConnectFailure(
            HostState.AUTH_FAILED,
            f"{entry.name}: authentication refused for user {config.user} "
            f"({error.reason or 'no key was accepted'}){_auth_notes(plan)}; not retried until "
            "the console restarts",
        ) from None
    except asyncssh.KeyExchangeFailed as error:
        note = await asyncio.to_thread(_negotiation_note, error, config)
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: SSH: {error.reason}{note}") from None
    except (asyncio.TimeoutError, TimeoutError):
        raise ConnectFailure(
            HostState.DOWN,
            f"{entry.name}: no SSH answer within {entry.connect_timeout:g} s",
        ) from None
    except asyncssh.Error as error:
        raise ConnectFailure(HostState.DOWN, f"{entry.name}: SSH: {error.reason}") from None
    except OSError as error:
        note = await asyncio.to_thread(_family_note, config)
        raise ConnectFailure(
            HostState.DOWN,
            f"{entry.name}: {_os_reason(error)} ({config.hostname}:{config.port}{note})",
        ) from None
    except ValueError as error:  # asyncssh refusing an option it was given
        raise ConnectFailure(HostState.REFUSED, f"{entry.name}: SSH: {error}") from None


def _auth_notes(plan: _Plan) -> str:
    """Why no key worked, in OpenSSH's words, and the methods ssh would try that the console
    does not."""
    notes = [*plan.ignored_keys]
    untried = [method for method in plan.config.methods if method != "publickey"]
    if untried:
        notes.append(f"ssh would also try {', '.join(untried)}, which the console does not")
    return "".join(f"; {note}" for note in notes)


_NEGOTIATED = {
    "encryption": "Ciphers",
    "mac": "MACs",
    "key exchange": "KexAlgorithms",
    "host key": "HostKeyAlgorithms",
    "compression": "Compression",
}


def _negotiation_note(error: asyncssh.KeyExchangeFailed, config: SshConfig) -> str:
    """The keyword whose algorithms the server shares none of, and where it was set."""
    text = error.reason.lower()
    for word, keyword in _NEGOTIATED.items():
        if f"no matching {word}" in text:
            return f" (the host shares none of {keyword}{config.where(keyword)})"
    return ""


def _family_note(config: SshConfig) -> str:
    if config.address_family == "any":
        return ""
    return f", AddressFamily {config.address_family}{config.where('AddressFamily')}"


# --- the plan: every file read and every setting decided before connecting --------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """One connection as asyncssh will make it, decided before any packet is sent."""

    entry: HostEntry
    config: SshConfig
    options: dict[str, object]
    """asyncssh.connect's keyword arguments."""
    jump: str | None  # ProxyJump hops: the inventory's, else ssh config's
    ignored_keys: tuple[str, ...]  # why each key file was not offered, in OpenSSH's words
    keys: HostKeys
    bare: HostKeys | None
    judge: HostKeyJudge
    settings: SshSettings

    def new_judge(self) -> HostKeyJudge:
        return HostKeyJudge(
            self.entry.name, self.config, self.keys, self.bare, direct=self.judge.direct
        )


_CERT_ALGS = frozenset(alg.decode() for alg in asyncssh.public_key.get_certificate_algs())
_HOST_KEY_ALGS = [
    *asyncssh.public_key.get_public_key_algs(),
    *asyncssh.public_key.get_certificate_algs(),
]
_FAMILIES = {"inet": socket.AF_INET, "inet6": socket.AF_INET6}


def _plan(entry: HostEntry, settings: SshSettings, *, tunnelled: bool) -> _Plan:
    """What `connect` passes to asyncssh; `ConnectFailure` for a setting ssh would refuse, or
    that the console does not act on."""
    try:
        config = read_ssh_config(
            entry.address,
            user=entry.user,
            port=entry.port,
            config_file=settings.config_file,
            options=settings.options,
        )
    except SshConfigError as error:
        raise ConnectFailure(HostState.REFUSED, f"{entry.name}: {error}") from None
    if "publickey" not in config.methods:
        raise ConnectFailure(HostState.AUTH_FAILED, f"{entry.name}: {_no_method(config)}")
    keys, bare = _known_keys(config)
    revoked = [*keys.revoked, *(bare.revoked if bare else ())]
    options: dict[str, object] = {
        "port": config.port,
        "username": config.user,
        "config": [],  # every setting is ssh -G's, given here
        # no key or CA trusted up front: the judge decides each, as ssh's check_host_key
        "known_hosts": ([], [], [known.key for known in revoked]),
        "host_key_alias": config.host_key_alias,
        "server_host_key_algs": _host_key_algorithms(entry, config, keys, bare),
        "x509_trusted_certs": None,
        "agent_path": config.identity_agent,
        "agent_forwarding": False,
        "connect_timeout": entry.connect_timeout,
        "login_timeout": entry.connect_timeout,
        "keepalive_interval": settings.keepalive_interval,
        "keepalive_count_max": settings.keepalive_count_max,
        "tcp_keepalive": config.tcp_keepalive,
        "compression_algs": ["zlib@openssh.com", "zlib", "none"]
        if config.compression
        else ["none"],
        "preferred_auth": ["publickey"],
        "password_auth": False,
        "kbdint_auth": False,
        "gss_auth": False,
        "gss_kex": False,
        "host_based_auth": False,
    }
    for keyword, option, wanted, known in (
        ("Ciphers", "encryption_algs", config.ciphers, get_encryption_algs()),
        ("MACs", "mac_algs", config.macs, get_mac_algs()),
        ("KexAlgorithms", "kex_algs", config.kex_algorithms, get_kex_algs()),
        (
            "PubkeyAcceptedAlgorithms",
            "signature_algs",
            _signature_algorithms(config.pubkey_algorithms),
            asyncssh.public_key.get_public_key_algs(),
        ),
    ):
        if wanted:
            options[option] = _usable(entry, config, keyword, wanted, known)
    if config.address_family in _FAMILIES and not tunnelled:
        options["family"] = _FAMILIES[config.address_family]
    if config.bind_address is not None and not tunnelled:
        options["local_addr"] = (config.bind_address, 0)
    rekey_bytes, rekey_seconds = config.rekey_limit
    if rekey_bytes > 0:
        options["rekey_bytes"] = rekey_bytes
    if rekey_seconds > 0:
        options["rekey_seconds"] = rekey_seconds
    ignored = _choose_keys(options, config)
    jump = entry.jump if entry.jump is not None else config.proxy_jump
    direct = not tunnelled and jump is None
    return _Plan(
        entry=entry,
        config=config,
        options=options,
        jump=jump,
        ignored_keys=ignored,
        keys=keys,
        bare=bare,
        judge=HostKeyJudge(entry.name, config, keys, bare, direct=direct),
        settings=settings,
    )


def _no_method(config: SshConfig) -> str:
    """Why ssh, in batch mode, would offer this host no key."""
    if config.pubkey_authentication:
        keyword, value = "PreferredAuthentications", ",".join(config.preferred)
    else:
        keyword, value = "PubkeyAuthentication", "no"
    if config.methods:
        left = f"ssh would try only {', '.join(config.methods)}, which the console does not"
    else:
        left = "nothing is left to try"
    return (
        f"ssh would offer no key: {keyword} {value}{config.where(keyword)}, and without a "
        f"prompt (BatchMode) {left}; not retried until the console restarts"
    )


def _usable(
    entry: HostEntry,
    config: SshConfig,
    keyword: str,
    wanted: Sequence[str],
    known: Sequence[bytes],
) -> list[str]:
    """ssh's list for ``keyword``, in its order, less what asyncssh cannot do; none left is a
    refusal naming the keyword."""
    names = {alg.decode() for alg in known}
    usable = [alg for alg in wanted if alg in names]
    if not usable:
        raise ConnectFailure(
            HostState.REFUSED,
            f"{entry.name}: {keyword} {','.join(wanted)}{config.where(keyword)} names nothing "
            "the console can use",
        )
    return usable


def _known_keys(config: SshConfig) -> tuple[HostKeys, HostKeys | None]:
    """The lines of ssh's files under the name ssh looks up, and under the bare host name
    where ssh looks there too (a port other than 22, and no HostKeyAlias)."""
    files = config.known_hosts_files
    keys = host_keys(files, lookup_name(config.hostname, config.port, config.host_key_alias))
    if config.host_key_alias is not None or config.port in (0, 22):
        return keys, None
    return keys, host_keys(files, lookup_name(config.hostname, 22, None))


def _host_key_algorithms(
    entry: HostEntry, config: SshConfig, keys: HostKeys, bare: HostKeys | None
) -> list[str]:
    """ssh's HostKeyAlgorithms in ssh's order of preference for this host: the types of its
    known keys first. Where no CA is listed for the host, a certificate type is left out when
    its plain type is offered too: ssh judges an unvouched certificate as the plain key it
    holds, so that key is asked for at once."""
    lines = [keys, *([bare] if bare else [])]
    offered = list(config.host_key_algorithms)
    if not any(found.authorities for found in lines):
        offered = [
            alg
            for alg in offered
            if plain_algorithms([alg])[0] not in offered or alg not in _CERT_ALGS
        ]
    known = {
        alg.decode()
        for found in lines
        for entry in found.trusted()
        for alg in entry.key.sig_algorithms
    }
    first = [alg for alg in offered if alg in _CERT_ALGS or alg in known]
    ordered = first + [alg for alg in offered if alg not in first]
    return _usable(entry, config, "HostKeyAlgorithms", ordered, _HOST_KEY_ALGS)


def _signature_algorithms(accepted: Sequence[str]) -> list[str]:
    """PubkeyAcceptedAlgorithms as asyncssh takes it: the plain types (asyncssh signs for a
    certificate with its key's type); for a list of certificate types only, theirs."""
    plain = [alg for alg in accepted if alg not in _CERT_ALGS]
    return plain or plain_algorithms(accepted)


def plain_algorithms(algorithms: Sequence[str]) -> list[str]:
    """Each certificate algorithm replaced by the plain key algorithm it certifies, in order,
    once each ("ssh-ed25519-cert-v01@openssh.com" -> "ssh-ed25519")."""
    plain: list[str] = []
    for alg in algorithms:
        if alg in _CERT_ALGS:
            alg = alg.replace("-cert-v01@openssh.com", "")
            alg = f"{alg}@openssh.com" if alg.startswith("sk-") else alg
        if alg not in plain:
            plain.append(alg)
    return plain


class _Client(asyncssh.SSHClient):
    """asyncssh asks this about every host key and CA: the judge answers."""

    def __init__(self, judge: HostKeyJudge) -> None:
        self._judge = judge

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        return self._judge.plain_key(key, addr)

    def validate_host_ca_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        return self._judge.ca_key(key, addr)


# --- private keys ------------------------------------------------------------------------------

MAX_KEY_FILE_BYTES = 1024 * 1024
"""A key or certificate file is read up to this size (an RSA 16384-bit key is under 13 KB)."""


@dataclass(frozen=True, slots=True)
class _Identity:
    """One IdentityFile as ssh's `load_public_identity_files` and `load_identity_file` see it."""

    path: Path
    public: asyncssh.SSHKey | None
    """The file itself read as a public key, else its `.pub`, else the private key's own."""
    private: asyncssh.SSHKey | None
    """Usable without a prompt, protected, and long enough; else None (`note` says why)."""
    note: str | None


def _choose_keys(options: dict[str, object], config: SshConfig) -> tuple[str, ...]:
    """Offer the identities OpenSSH would, paired with their certificates; OpenSSH's words for
    each key file left out.

    Every file is read here, bounded, so asyncssh reads none (it would read /dev/zero for
    ever). An identity whose private half is missing, unprotected or encrypted still selects
    the agent's copy of its public half, as with ssh. asyncssh reads an empty key list as "the
    default files" (found through `$HOME`, which ssh ignores), so a key no server knows stands
    in for none, which keeps the agent asked."""
    identities = [_identity(path, config.required_rsa_size) for path in config.identity_files]
    private = [identity.private for identity in identities if identity.private is not None]
    certificates, notes = _certificates(config, identities)
    keypairs = asyncssh.load_keypairs(private, certlist=certificates) if private else []
    options["client_keys"] = keypairs or [_no_key()]
    if config.identities_only:
        # the agent's keys only where an identity file names them, as ssh's IdentitiesOnly
        options["agent_identities"] = [
            identity.public for identity in identities if identity.public is not None
        ] or [_no_key()]
    notes += [identity.note for identity in identities if identity.note is not None]
    return tuple(notes)


def _identity(path: Path, required_rsa_size: int) -> _Identity:
    data, why = _read_key_file(path)
    pub = _public_of(Path(f"{path}.pub"))
    if data is None:
        return _Identity(path, pub, None, why)
    try:
        key = asyncssh.import_private_key(data)
    except asyncssh.KeyEncryptionError:
        return _Identity(path, pub, None, None)  # ssh in batch mode skips it silently
    except (asyncssh.KeyImportError, ValueError):
        public = _import_public(data)  # a public key: the agent signs for it, or nothing
        note = None if public is not None else f'Load key "{path}": invalid format'
        return _Identity(path, public or pub, None, note)
    public = pub or key.convert_to_public()
    if (why := _unprotected(path)) is not None:
        return _Identity(path, public, None, why)
    bits = rsa_bits(key)
    if bits is not None and bits < required_rsa_size:
        why = (
            f'Load key "{path}": RSA key of {bits} bits, under RequiredRSASize {required_rsa_size}'
        )
        return _Identity(path, public, None, why)
    return _Identity(path, public, key, None)


def _certificates(
    config: SshConfig, identities: Sequence[_Identity]
) -> tuple[list[asyncssh.SSHCertificate], list[str]]:
    """The user certificates ssh would offer: CertificateFile's, else each identity's
    `-cert.pub`; those PubkeyAcceptedAlgorithms leaves out are not offered."""
    paths = list(config.certificate_files)
    if not paths:
        paths = [Path(f"{identity.path}-cert.pub") for identity in identities]
    found: list[asyncssh.SSHCertificate] = []
    notes: list[str] = []
    for path in paths:
        data, why = _read_key_file(path)
        if data is None:
            if why is not None and config.certificate_files:
                notes.append(why.replace("Load key", "Load certificate"))
            continue
        try:
            certificate = asyncssh.import_certificate(data)
        except (asyncssh.KeyImportError, ValueError):
            continue
        algorithm = certificate.algorithm.decode()
        if not config.pubkey_algorithms or algorithm in config.pubkey_algorithms:
            found.append(certificate)
    return found, notes


def _read_key_file(path: Path) -> tuple[bytes | None, str | None]:
    """A key file's bytes, or None and (where ssh would say so) why: a missing file is silent,
    as with ssh; one that cannot be read is named, in ssh's words."""
    try:
        data = read_regular(path, MAX_KEY_FILE_BYTES)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as error:  # ValueError: a NUL in the name ssh config gave
        return None, f'Load key "{path}": {getattr(error, "strerror", None) or error}'
    if len(data) > MAX_KEY_FILE_BYTES:
        return None, f'Load key "{path}": larger than {MAX_KEY_FILE_BYTES} bytes'
    return data, None


def _public_of(path: Path) -> asyncssh.SSHKey | None:
    data, _ = _read_key_file(path)
    return _import_public(data) if data is not None else None


def _import_public(data: bytes) -> asyncssh.SSHKey | None:
    try:
        return asyncssh.import_public_key(data)
    except (asyncssh.KeyImportError, ValueError):
        return None


def _unprotected(path: Path) -> str | None:
    """OpenSSH's `sshkey_perm_ok`: a key file the user owns that group or others may use."""
    try:
        info = path.stat()
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or not info.st_mode & 0o077:
        return None
    return (
        f"UNPROTECTED PRIVATE KEY FILE ignored: permissions {info.st_mode & 0o777:04o} for "
        f"'{path}' are too open (chmod 600 it)"
    )


@functools.cache
def _no_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519", comment="gpuconsole: no key")


def _os_reason(error: OSError) -> str:
    """'connection refused', 'no route to host': the errno's words rather than asyncio's."""
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the name ({error.strerror or error})"
    text = os.strerror(error.errno) if error.errno else str(error)
    return text[0].lower() + text[1:] if text else type(error).__name__
