"""Deciding a host's key as OpenSSH's `check_host_key` (sshconnect.c) does.

asyncssh is given no trusted key and no trusted CA, so it asks `HostKeyJudge` about every plain
key and every CA a host shows (it refuses revoked ones itself, from the @revoked lines). The
judge answers as ssh would, in ssh's order:

1. `NoHostAuthenticationForLocalhost yes`, no `HostKeyAlias` and a loopback address reached
   directly: any key is accepted (ssh does not look at known_hosts at all);
2. an RSA key shorter than `RequiredRSASize` is refused;
3. a key listed for the name looked up (`[host]:port`, or the alias) is accepted; any other key
   listed for that name, of whatever type, makes the host "changed": refused;
4. on a port other than 22 and without an alias, a key listed under the bare host name is
   accepted ("checking without port identifier"); another key there does not make the host
   changed: it stays new;
5. a new key is refused where ssh could not record it (`UserKnownHostsFile none`, or a host
   name ssh will not write), else added with `StrictHostKeyChecking accept-new` or `no`, else
   refused.

A host certificate is accepted when its CA is listed (@cert-authority) for the name looked up
or, as in 4, the bare name, and the certificate is valid for the name (asyncssh checks the
principal and the dates). When it is not, ssh drops the certificate and judges the plain key
underneath: `certificate_failed` tells the caller to connect again asking for plain keys only.

Where the console parts from ssh, it is stricter: a changed key is refused with
`StrictHostKeyChecking no` too, and a key revoked under the bare name is refused (ssh would take
it as new).
"""

from __future__ import annotations

import ipaddress
import shlex
from pathlib import Path

import asyncssh

from gpuconsole.core import audit
from gpuconsole.core.model import HostState
from gpuconsole.hosts.known_hosts import (
    UNREADABLE,
    HostKeys,
    append_known_host,
    known_hosts_line,
)
from gpuconsole.hosts.ssh_config import SshConfig, user_home

HOST_KEY_ADDED = "host-key-added"
"""The audit log's word for a key `accept-new` added to known_hosts."""
_UNRECORDABLE = set("@?*#[]|'\"\\")
"""Characters that make ssh refuse to write a host name to known_hosts (`check_host_key`)."""


class HostKeyJudge:
    """What ssh does with the keys a host shows, for one connection attempt."""

    def __init__(
        self,
        host: str,
        config: SshConfig,
        keys: HostKeys,
        bare: HostKeys | None,
        *,
        direct: bool,
    ) -> None:
        self.host = host
        self.config = config
        self.keys = keys
        """The lines for the name ssh looks up."""
        self.bare = bare
        """The lines for the bare host name, where ssh looks there too; else None."""
        self.direct = direct
        """Reached over TCP, not through a jump host."""
        self.presented: asyncssh.SSHKey | None = None
        self.certificate_seen = False
        self.added: str | None = None
        """What was added to known_hosts, one line, once the key was taken."""
        self.refusal: tuple[HostState, str, str] | None = None
        """Why a key was refused, where the judge knows better than "unknown": the state, the
        reason with "{where}" for where the keyword that decided was set, and that keyword.
        (Finding the place runs ssh, which asyncssh's callbacks must not wait for.)"""

    def plain_key(self, key: asyncssh.SSHKey, addr: str) -> bool:
        """Whether ssh would accept this plain host key (adding it to known_hosts if so)."""
        self.presented = key
        if self._local(addr):
            return True
        if not self._long_enough(key):
            return False
        if self.keys.trusts(key):
            return True
        if self.keys.trusted():
            return False  # another key is known: changed, refused in every mode
        if self.bare is not None and self.bare.trusts(key):
            return True
        return self._new(key)

    def ca_key(self, ca: asyncssh.SSHKey, addr: str) -> bool:
        """Whether ssh trusts this CA for the host's certificate."""
        self.certificate_seen = True
        if self._local(addr):
            return True
        trusted = [*self.keys.authorities, *(self.bare.authorities if self.bare else ())]
        return any(known.key.public_data == ca.public_data for known in trusted)

    def _local(self, addr: str) -> bool:
        """`NoHostAuthenticationForLocalhost`: ssh's `sockaddr_is_local`, for a connection it
        makes itself (through a jump host the address is not known to be local)."""
        if not (
            self.config.no_host_authentication_for_localhost
            and self.config.host_key_alias is None
            and self.direct
        ):
            return False
        try:
            return ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback
        except ValueError:
            return False

    def _long_enough(self, key: asyncssh.SSHKey) -> bool:
        size = rsa_bits(key)
        if size is None or size >= self.config.required_rsa_size:
            return True
        self.refusal = (
            HostState.REFUSED,
            f"{self.host}: the host's RSA key has {size} bits, fewer than RequiredRSASize "
            f"{self.config.required_rsa_size}{{where}}; ssh refuses it",
            "RequiredRSASize",
        )
        return False

    def _new(self, key: asyncssh.SSHKey) -> bool:
        """A key no line lists: ssh's HOST_NEW. ssh adds it only where it can record it."""
        mode = self.config.strict_host_key_checking
        if mode not in ("accept-new", "no"):
            return False
        if not self.config.user_known_hosts:
            why = "UserKnownHostsFile is none{where}"
        elif _UNRECORDABLE & set(self.config.hostname):
            why = f"ssh will not write the name {self.config.hostname} to known_hosts"
        else:
            self.added = self._add(key)
            return True
        self.refusal = (
            HostState.HOST_KEY_UNKNOWN,
            f"{self.host}: host key unknown: no {key_type(key)} key ({key.get_fingerprint()}) "
            f"for {self.keys.name}; ssh cannot record it ({why}), so even "
            f"StrictHostKeyChecking {mode} refuses it. Add it to a known_hosts file the "
            "host's ssh config names",
            "UserKnownHostsFile",
        )
        return False

    def _add(self, key: asyncssh.SSHKey) -> str:
        """Add the key to the first UserKnownHostsFile as ssh does; what was done, one line."""
        name, kind = self.keys.name, key_type(key)
        mode = f"StrictHostKeyChecking {self.config.strict_host_key_checking}"
        target = self.config.user_known_hosts[0]
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


def failure(judge: HostKeyJudge, why: str, add_command: str) -> tuple[HostState, str]:
    """The refusal, with the file and line that decided it: revoked, changed, or unknown.

    ``why`` is asyncssh's reason; ``add_command`` the ssh command that would ask once. It may
    run ssh (to find where a keyword was set): call it from a thread."""
    if judge.refusal is not None:
        state, text, keyword = judge.refusal
        return state, text.replace("{where}", judge.config.where(keyword))
    keys, config = judge.keys, judge.config
    name = keys.name
    if "revoked" in why:  # asyncssh's words, "Host key is revoked" / "Host CA key is revoked"
        places = ", ".join(known.place for known in keys.revoked) or "a @revoked line"
        what = "CA that signed the host certificate" if "CA" in why else "host key"
        return (
            HostState.HOST_KEY_REVOKED,
            f"{judge.host}: REFUSED: the {what} of {name} is revoked ({places}); the host "
            "needs a new key, and a person to check why; not retried",
        )
    presented = judge.presented
    if presented is not None and (changed := keys.same_type(presented) or keys.trusted()):
        places = ", ".join(known.place for known in changed)
        return (
            HostState.HOST_KEY_MISMATCH,
            f"{judge.host}: REFUSED: the {key_type(presented)} host key of {name} "
            f"({presented.get_fingerprint()}) differs from the one at {places}; it may have "
            "been reinstalled, or someone is in the middle. Confirm it, then "
            f"`ssh-keygen -R '{name}' -f {changed[0].path}`",
        )
    files = ", ".join(str(path) for path in config.known_hosts_files) or "no file (none set)"
    if presented is None:
        detail = f" ({why})"
    else:
        detail = f": no {key_type(presented)} key ({presented.get_fingerprint()})"
    add = f"`{add_command}` asks once"
    if config.host_key_alias is None and config.user_known_hosts:
        port = f"-p {config.port} " if config.port != 22 else ""
        target = shlex.quote(str(config.user_known_hosts[0]))
        scan = f"`ssh-keyscan {port}{shlex.quote(config.hostname)} >> {target}`"
        add = f"{scan}, or {add}"
    unread = "".join(f" ({why})" for why in keys.skipped if UNREADABLE in why)
    return (
        HostState.HOST_KEY_UNKNOWN,
        f"{judge.host}: host key unknown{detail} for {name} in {files}{unread}; "
        f"StrictHostKeyChecking {config.strict_host_key_checking} refuses it. Check its "
        f"fingerprint, then add it: {add}",
    )


def key_type(key: asyncssh.SSHKey) -> str:
    """'ED25519', 'ECDSA', 'RSA': the word ssh uses for a key's type."""
    algorithm = key.algorithm.decode()
    for word in ("ed25519", "ed448", "ecdsa", "rsa", "dss"):
        if word in algorithm:
            return "DSA" if word == "dss" else word.upper()
    return algorithm


def rsa_bits(key: asyncssh.SSHKey) -> int | None:
    """An RSA key's modulus size in bits; None for any other type."""
    if key_type(key) != "RSA":
        return None
    size = getattr(getattr(key, "pyca_key", None), "key_size", None)
    return size if isinstance(size, int) else None
