"""A host's effective OpenSSH client settings, as `ssh -G HOST` reports them.

The console connects with asyncssh but decides as OpenSSH's `ssh` does, so it asks `ssh` itself:
`ssh -G` applies `Host` and `Match` blocks, `Include`, `~/.ssh/config` and the system-wide
config, the defaults of the installed OpenSSH version, and the `%` tokens of most keywords,
without connecting. ssh expands `IdentityFile` and `CertificateFile` only when it connects
(after `-G` has printed them), so they are expanded here by asking ssh once more, with the value
as a `ControlPath` (which `-G` prints expanded with the very same tokens and `${VAR}`s); `~` is
taken first, from the password database as ssh takes it (not `$HOME`).

Every keyword printed is held to the allow list of `gpuconsole.hosts.ssh_keywords`: a keyword the
console does not act on is refused in one line naming it and the file and line that set it
(`gpuconsole.hosts.ssh_origin`), never silently ignored.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuconsole.hosts.ssh_keywords import Refusal, refusals
from gpuconsole.hosts.ssh_origin import where_set

SSH = "ssh"
"""The OpenSSH client the console asks (found on PATH)."""
SSH_G_TIMEOUT_S = 10.0
"""`ssh -G` reads files only, but a `Match exec` line runs a command: it gets this long."""
MAX_SSH_G_BYTES = 1024 * 1024
BATCH_METHODS = ("gssapi-keyex", "gssapi-with-mic", "hostbased", "publickey")
"""ssh's authentication methods, in its default order, that need no prompt: with BatchMode
(`sshconnect2.c`'s table) password and keyboard-interactive are never tried."""
_METHOD_SWITCH = {
    "gssapi-keyex": "gssapikeyexchange",
    "gssapi-with-mic": "gssapiauthentication",
    "hostbased": "hostbasedauthentication",
    "publickey": "pubkeyauthentication",
}
_OFF = ("no", "false")
_DEFAULTS_HOST = "gpuconsole-defaults.invalid"
_NEEDS_A_COMMAND = "without a command"
"""ssh's words ("Cannot fork into background without a command to execute.") where a setting
(ForkAfterAuthentication) makes `ssh -G` without a command fail: the console always has one."""


class SshConfigError(ValueError):
    """`ssh -G` refused the settings (its own words), or they ask for what is not supported."""


class SshConfigRefused(SshConfigError):
    """A keyword the console does not act on is set for the host (`ssh_keywords`)."""


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
    no_host_authentication_for_localhost: bool = False
    required_rsa_size: int = 1024
    methods: tuple[str, ...] = ("publickey",)
    """The authentication methods ssh would try with BatchMode, in its order."""
    pubkey_authentication: bool = True
    preferred: tuple[str, ...] = ()
    """PreferredAuthentications as set; empty: ssh's own order."""
    pubkey_algorithms: tuple[str, ...] = ()
    """PubkeyAcceptedAlgorithms; empty: asyncssh's own."""
    ciphers: tuple[str, ...] = ()
    macs: tuple[str, ...] = ()
    kex_algorithms: tuple[str, ...] = ()
    compression: bool = False
    address_family: str = "any"
    bind_address: str | None = None
    tcp_keepalive: bool = True
    rekey_limit: tuple[int, int] = (0, 0)
    """Bytes and seconds before new keys; 0: asyncssh's default, as ssh's 0 is its own."""
    ssh_g: tuple[str, ...] = ()
    """The `ssh -G` command these came from, to ask where a keyword was set."""

    @property
    def known_hosts_files(self) -> tuple[Path, ...]:
        """Every file ssh reads host keys from, user files first."""
        return self.user_known_hosts + self.global_known_hosts

    def where(self, keyword: str) -> str:
        """ ", set at FILE line N" for a reason, or "" where no line sets it."""
        place = where_set(keyword, self.ssh_g) if self.ssh_g else None
        return f", set at {place}" if place else ""


def read_ssh_config(
    name: str,
    *,
    user: str | None = None,
    port: int | None = None,
    config_file: Path | None = None,
    options: Sequence[str] = (),
) -> SshConfig:
    """The settings `ssh [-F config_file] [-o OPTION]... [-l user] [-p port] NAME` would use.

    `SshConfigError` with ssh's own line (file and line number) for a config it refuses;
    `SshConfigRefused` naming the keyword, its value and where it was set for a keyword the
    console does not act on."""
    command = _command(name, user=user, port=port, config_file=config_file, options=options)
    try:
        words = _ssh_g(command, name)
    except SshConfigError as error:
        if _NEEDS_A_COMMAND not in str(error):
            raise
        # ForkAfterAuthentication: ssh -G wants the command the console would run
        command = [*command, "true"]
        words = _ssh_g(command, name)
    refused = refusals(words, _defaults(command[0]))
    if refused:
        raise SshConfigRefused(_refusal_text(refused[0], command, name))
    hostname = _one(words, "hostname", name)
    login = _one(words, "user", _local_user())
    expand = functools.partial(_expand_file, command=command, name=name)
    return SshConfig(
        host=name,
        hostname=hostname,
        port=int(_one(words, "port", "22")),
        user=login,
        identity_files=tuple(
            expand(v) for v in words.get("identityfile", ()) if v.lower() != "none"
        ),
        certificate_files=tuple(expand(v) for v in words.get("certificatefile", ())),
        identities_only=_yes(words, "identitiesonly"),
        identity_agent=_agent(words),
        proxy_jump=_optional(words, "proxyjump"),
        user_known_hosts=_known_hosts_files(words, "userknownhostsfile", expanded=True),
        global_known_hosts=_known_hosts_files(words, "globalknownhostsfile", expanded=False),
        strict_host_key_checking=_STRICT.get(_one(words, "stricthostkeychecking", "ask"), "ask"),
        host_key_alias=_optional(words, "hostkeyalias"),
        hash_known_hosts=_yes(words, "hashknownhosts"),
        host_key_algorithms=_list(words, "hostkeyalgorithms"),
        no_host_authentication_for_localhost=_yes(words, "nohostauthenticationforlocalhost"),
        required_rsa_size=int(_one(words, "requiredrsasize", "1024")),
        methods=_methods(words),
        pubkey_authentication=_one(words, "pubkeyauthentication", "yes").lower() not in _OFF,
        preferred=_list(words, "preferredauthentications"),
        pubkey_algorithms=_list(words, "pubkeyacceptedalgorithms"),
        ciphers=_list(words, "ciphers"),
        macs=_list(words, "macs"),
        kex_algorithms=_list(words, "kexalgorithms"),
        compression=_yes(words, "compression"),
        address_family=_one(words, "addressfamily", "any"),
        bind_address=_optional(words, "bindaddress"),
        tcp_keepalive=_one(words, "tcpkeepalive", "yes").lower() not in _OFF,
        rekey_limit=_rekey_limit(words),
        ssh_g=tuple(command),
    )


_STRICT = {"true": "yes", "false": "no", "ask": "ask", "accept-new": "accept-new"}


def _command(
    name: str,
    *,
    user: str | None,
    port: int | None,
    config_file: Path | None,
    options: Sequence[str],
) -> list[str]:
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
    return [*command, "--", name]


def _ssh_g(command: Sequence[str], name: str) -> dict[str, tuple[str, ...]]:
    """`ssh -G`'s answer, keyword (lowercase) -> its values (a keyword may repeat)."""
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
        raise SshConfigError(f"cannot run {command[0]}: {error.strerror or error}") from None
    if done.returncode != 0:
        raise SshConfigError(f"ssh config: {_ssh_complaint(done.stderr)}")
    words: dict[str, tuple[str, ...]] = {}
    for line in done.stdout[:MAX_SSH_G_BYTES].decode("utf-8", "replace").splitlines():
        keyword, _, value = line.partition(" ")
        if keyword:
            words[keyword.lower()] = (*words.get(keyword.lower(), ()), value.strip())
    return words


@functools.cache
def _defaults(ssh: str) -> Mapping[str, tuple[str, ...]]:
    """The installed OpenSSH's own settings, read with no config file at all."""
    try:
        return _ssh_g([ssh, "-G", "-F", os.devnull, "--", _DEFAULTS_HOST], _DEFAULTS_HOST)
    except SshConfigError:
        return {}


def _refusal_text(refusal: Refusal, command: Sequence[str], name: str) -> str:
    place = where_set(refusal.keyword, command)
    where = f" at {place}" if place else ""
    return (
        f"ssh config sets {refusal.keyword} {refusal.value}{where}: the console does not "
        f"connect with it ({refusal.why}); unset it for this host (ssh -G {name} shows it)"
    )


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


def _yes(words: Mapping[str, tuple[str, ...]], keyword: str) -> bool:
    return _one(words, keyword, "no").lower() in ("yes", "true")


def _optional(words: Mapping[str, tuple[str, ...]], keyword: str) -> str | None:
    value = _one(words, keyword, "none")
    return None if value.lower() == "none" else value


def _list(words: Mapping[str, tuple[str, ...]], keyword: str) -> tuple[str, ...]:
    return tuple(alg for alg in _one(words, keyword, "").split(",") if alg)


def _methods(words: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The methods ssh would try with BatchMode: PreferredAuthentications' order (else ssh's
    own), those switched off, and those that need a prompt, left out."""
    preferred = _list(words, "preferredauthentications") or BATCH_METHODS
    return tuple(
        method
        for method in preferred
        if method in _METHOD_SWITCH
        and _one(words, _METHOD_SWITCH[method], "no").lower() not in _OFF
    )


def _rekey_limit(words: Mapping[str, tuple[str, ...]]) -> tuple[int, int]:
    parts = _one(words, "rekeylimit", "0 0").split()
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return 0, 0


def _known_hosts_files(
    words: Mapping[str, tuple[str, ...]], keyword: str, *, expanded: bool
) -> tuple[Path, ...]:
    """A known-hosts keyword's files (`none` for none), each value holding several. ssh -G
    prints UserKnownHostsFile already expanded; GlobalKnownHostsFile ssh only tilde-expands."""
    names = [name for value in words.get(keyword, ()) for name in value.split()]
    if [name.lower() for name in names] == ["none"]:
        return ()
    return tuple(Path(name if expanded else _tilde(name)) for name in names)


def _agent(words: Mapping[str, tuple[str, ...]]) -> str | None:
    """The agent socket: IdentityAgent's (`none`, `SSH_AUTH_SOCK`, `$VAR`, a path ssh -G has
    expanded), else `$SSH_AUTH_SOCK`."""
    value = _one(words, "identityagent", "SSH_AUTH_SOCK")
    if value.lower() == "none":
        return None
    if value == "SSH_AUTH_SOCK":
        return os.environ.get("SSH_AUTH_SOCK") or None
    if value.startswith("$"):
        return os.environ.get(value[1:]) or None
    return value


def _expand_file(value: str, *, command: Sequence[str], name: str) -> Path:
    """An IdentityFile or CertificateFile as ssh opens it: `~` first, then ssh's own expansion
    of tokens and `${VAR}` (asked of `ssh -G` through ControlPath, which it expands alike)."""
    value = _tilde(value)
    if "%" not in value and "${" not in value:
        return Path(value)
    quoted = value.replace("\\", "\\\\").replace('"', '\\"')
    probe = [command[0], "-o", f'ControlPath="{quoted}"', *command[1:]]
    try:
        words = _ssh_g(probe, name)
    except SshConfigError as error:
        raise SshConfigError(f"{error} (expanding {value})") from None
    return Path(_one(words, "controlpath", value))


def _tilde(value: str) -> str:
    """ssh's `tilde_expand_filename`: `~/` is the user's home from the password database (not
    `$HOME`), `~name/` that user's."""
    if not value.startswith("~"):
        return value
    head, slash, rest = value[1:].partition("/")
    if head:
        try:
            home = pwd.getpwnam(head).pw_dir
        except KeyError:
            raise SshConfigError(f"ssh config: {value}: no such user {head!r}") from None
    else:
        home = user_home()
    return home.rstrip("/") + "/" + rest if slash else home


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
