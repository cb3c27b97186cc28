"""Every keyword `ssh -G` prints, and what the console does with it: the allow list.

The console connects where `ssh -o BatchMode=yes HOST` would and refuses where it would
refuse. Each keyword of the client's effective settings therefore has one rule here:

- `Rule.HONOURED`: acted on as OpenSSH does (`gpuconsole.hosts.ssh` shows how);
- `Rule.NOT_TRIED`: an authentication method (GSSAPI, host-based) that ssh would try and the
  console cannot; it tries the rest, and an authentication failure names this keyword;
- `Rule.NO_EFFECT`: cannot change whether or how the console logs in, nor what its commands
  see: the console runs commands without a terminal, never prompts (as BatchMode), forwards
  nothing and keeps its own connection;
- `Rule.OFF_ONLY`: not acted on, so a host whose value is not one of `Keyword.off` is refused,
  naming the keyword (a keyword `ssh -G` leaves out is off);
- `Rule.DEFAULT_ONLY`: not acted on, so a host is refused where the value differs from the
  installed OpenSSH's own default.

A keyword `ssh -G` prints that is not in the table (a later OpenSSH's) refuses the host by name:
it is never ignored. The names and the versions that print them come from `dump_client_config`
in OpenSSH's readconf.c, 8.9 to 10.5, and Debian's GSSAPI patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class Rule(str, Enum):
    HONOURED = "honoured"
    NOT_TRIED = "not tried"
    NO_EFFECT = "no effect"
    OFF_ONLY = "refused unless off"
    DEFAULT_ONLY = "refused unless default"


@dataclass(frozen=True, slots=True)
class Keyword:
    name: str
    """As ssh_config(5) spells it."""
    rule: Rule
    how: str
    """What the console does with it, one line for the README's table."""
    off: tuple[str, ...] = ()
    """For `Rule.OFF_ONLY`: the values, as `ssh -G` prints them, that mean off."""


_H, _T, _N, _O, _D = Rule.HONOURED, Rule.NOT_TRIED, Rule.NO_EFFECT, Rule.OFF_ONLY, Rule.DEFAULT_ONLY
_NO = ("no", "false")
_NONE = ("none",)
_FORWARDS = "the console opens no forwarding"
_TERMINAL = "the console's commands run without a terminal"
_PRINTS = "changes only what ssh prints"

KEYWORDS: tuple[Keyword, ...] = (
    # who and where
    Keyword("Host", _H, "the name given to ssh"),
    Keyword("HostName", _H, "the address connected to"),
    Keyword("Port", _H, "the port connected to"),
    Keyword("User", _H, "the login name"),
    Keyword("AddressFamily", _H, "inet or inet6 limits the addresses tried"),
    Keyword("BindAddress", _H, "the local address connected from"),
    Keyword("BindInterface", _O, "not supported", _NONE),
    Keyword("ProxyJump", _H, "each hop connected in turn, with its own settings and host keys"),
    Keyword("ProxyCommand", _O, "not supported: the console cannot run a proxy", _NONE),
    Keyword("ProxyUseFdpass", _N, "matters only with ProxyCommand"),
    Keyword("CanonicalizeHostname", _O, "not supported: it changes the name looked up", _NO),
    Keyword("CanonicalDomains", _N, "matters only with CanonicalizeHostname"),
    Keyword("CanonicalizeFallbackLocal", _N, "matters only with CanonicalizeHostname"),
    Keyword("CanonicalizeMaxDots", _N, "matters only with CanonicalizeHostname"),
    Keyword(
        "CanonicalizePermittedCNAMEs",
        _O,
        "not supported: ssh follows CNAMEs with it, changing the name looked up",
        _NONE,
    ),
    Keyword("ConnectTimeout", _N, "the console waits the inventory's connect_timeout"),
    Keyword("ConnectionAttempts", _N, "the console retries a host with its own backoff"),
    Keyword("Tag", _N, "only selects Match blocks, which ssh -G has applied"),
    # the host's key
    Keyword("StrictHostKeyChecking", _H, "unknown keys refused, or added with accept-new"),
    Keyword("UserKnownHostsFile", _H, "read, and the first written by accept-new; none: none"),
    Keyword("GlobalKnownHostsFile", _H, "read"),
    Keyword("HostKeyAlias", _H, "the name looked up in known_hosts and in certificates"),
    Keyword("HostKeyAlgorithms", _H, "the host key types offered, known types first"),
    Keyword("HashKnownHosts", _H, "keys added by accept-new are hashed"),
    Keyword("NoHostAuthenticationForLocalhost", _H, "any key accepted from a loopback address"),
    Keyword("CASignatureAlgorithms", _D, "not supported away from OpenSSH's default"),
    Keyword("RequiredRSASize", _H, "smaller RSA host and user keys refused"),
    Keyword("CheckHostIP", _O, "not supported: the address's own known_hosts lines", _NO),
    Keyword("VerifyHostKeyDNS", _O, "not supported: SSHFP records", _NO),
    Keyword("KnownHostsCommand", _O, "not supported: the console cannot run it", _NONE),
    Keyword("RevokedHostKeys", _O, "not supported: revocation files", _NONE),
    Keyword("UpdateHostKeys", _N, "the console records no extra keys a host announces"),
    Keyword("FingerprintHash", _N, _PRINTS),
    Keyword("VisualHostKey", _N, _PRINTS),
    # logging in
    Keyword("PreferredAuthentications", _H, "publickey must be among them"),
    Keyword("PubkeyAuthentication", _H, "no: nothing to try, refused before connecting"),
    Keyword("PubkeyAcceptedAlgorithms", _H, "the signature algorithms user keys may use"),
    Keyword("IdentityFile", _H, "offered in order, tokens and ${VAR} expanded; .pub via agent"),
    Keyword("CertificateFile", _H, "user certificates offered with their keys"),
    Keyword("IdentitiesOnly", _H, "the agent's keys only where an identity file names them"),
    Keyword("IdentityAgent", _H, "the agent asked for keys; none: no agent"),
    Keyword("AddKeysToAgent", _N, "the console adds no key to the agent"),
    Keyword("PKCS11Provider", _O, "not supported: keys on a token", _NONE),
    Keyword("SecurityKeyProvider", _O, "not supported away from the built-in", ("internal",)),
    Keyword("BatchMode", _N, "the console never prompts, as with BatchMode yes"),
    Keyword("PasswordAuthentication", _N, "never tried: it needs a prompt (BatchMode)"),
    Keyword("KbdInteractiveAuthentication", _N, "never tried: it needs a prompt (BatchMode)"),
    Keyword("KbdInteractiveDevices", _N, "matters only with keyboard-interactive"),
    Keyword("NumberOfPasswordPrompts", _N, "the console never prompts"),
    Keyword("GSSAPIAuthentication", _T, "Kerberos logins are not tried"),
    Keyword("GSSAPIKeyExchange", _T, "Kerberos key exchange is not tried"),
    Keyword("GSSAPIDelegateCredentials", _N, "matters only with GSSAPI"),
    Keyword("GSSAPITrustDns", _N, "matters only with GSSAPI"),
    Keyword("GSSAPIRenewalForcesRekey", _N, "matters only with GSSAPI"),
    Keyword("GSSAPIKexAlgorithms", _N, "matters only with GSSAPI"),
    Keyword("GSSAPIClientIdentity", _N, "matters only with GSSAPI"),
    Keyword("GSSAPIServerIdentity", _N, "matters only with GSSAPI"),
    Keyword("HostbasedAuthentication", _T, "host-based logins are not tried"),
    Keyword("HostbasedAcceptedAlgorithms", _N, "matters only with host-based logins"),
    Keyword("EnableSSHKeysign", _N, "matters only with host-based logins"),
    # the transport
    Keyword("Ciphers", _H, "offered in ssh's order"),
    Keyword("MACs", _H, "offered in ssh's order"),
    Keyword("KexAlgorithms", _H, "offered in ssh's order"),
    Keyword("Compression", _H, "zlib asked for, or not"),
    Keyword("RekeyLimit", _H, "keys renewed after that much data or time"),
    Keyword("TCPKeepAlive", _H, "TCP keepalives on or off"),
    Keyword("ServerAliveInterval", _N, "the console's own keepalive finds a dead link"),
    Keyword("ServerAliveCountMax", _N, "the console's own keepalive finds a dead link"),
    Keyword("IPQoS", _N, "the console sets no TOS bits"),
    Keyword("ChannelTimeout", _N, "the console closes its own idle channels"),
    Keyword("ObscureKeystrokeTiming", _N, _TERMINAL),
    Keyword("WarnWeakCrypto", _N, _PRINTS),
    Keyword("VersionAddendum", _N, "the console sends its own version string"),
    # what runs once logged in
    Keyword("RemoteCommand", _O, "not supported: ssh would run it, not the console's", _NONE),
    Keyword("SessionType", _O, "not supported: the console runs commands", ("default",)),
    Keyword("RequestTTY", _N, _TERMINAL),
    Keyword("StdinNull", _N, "the console gives its commands their input"),
    Keyword("ForkAfterAuthentication", _N, "the console keeps its own connection"),
    Keyword("SendEnv", _N, "the console's commands set their own environment"),
    Keyword("SetEnv", _N, "the console's commands set their own environment"),
    Keyword("EscapeChar", _N, _TERMINAL),
    Keyword("EnableEscapeCommandline", _N, _TERMINAL),
    Keyword("PermitLocalCommand", _N, "the console runs no local command"),
    Keyword("LocalCommand", _N, "the console runs no local command"),
    Keyword("ControlMaster", _N, "the console keeps its own connection, shared with none"),
    Keyword("ControlPath", _N, "the console keeps its own connection, shared with none"),
    Keyword("ControlPersist", _N, "the console keeps its own connection, shared with none"),
    # forwarding
    Keyword("ForwardAgent", _N, "never forwarded: a watched node's users are not trusted"),
    Keyword("ForwardX11", _N, _FORWARDS),
    Keyword("ForwardX11Trusted", _N, _FORWARDS),
    Keyword("ForwardX11Timeout", _N, _FORWARDS),
    Keyword("XAuthLocation", _N, _FORWARDS),
    Keyword("LocalForward", _N, _FORWARDS),
    Keyword("RemoteForward", _N, _FORWARDS),
    Keyword("DynamicForward", _N, _FORWARDS),
    Keyword("GatewayPorts", _N, _FORWARDS),
    Keyword("ClearAllForwardings", _N, _FORWARDS),
    Keyword("ExitOnForwardFailure", _N, _FORWARDS),
    Keyword("PermitRemoteOpen", _N, _FORWARDS),
    Keyword("StreamLocalBindMask", _N, _FORWARDS),
    Keyword("StreamLocalBindUnlink", _N, _FORWARDS),
    Keyword("Tunnel", _N, _FORWARDS),
    Keyword("TunnelDevice", _N, _FORWARDS),
    # ssh's own messages
    Keyword("LogLevel", _N, _PRINTS),
    Keyword("LogVerbose", _N, _PRINTS),
    Keyword("SyslogFacility", _N, _PRINTS),
    Keyword("IgnoreUnknown", _N, "ssh -G has already applied it"),
)

BY_PRINTED: Mapping[str, Keyword] = {keyword.name.lower(): keyword for keyword in KEYWORDS}
"""Keyed by the name as `ssh -G` prints it (lowercase)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A keyword whose value the console will not connect with."""

    keyword: str
    """As ssh_config(5) spells it, or as ssh printed it when the table does not know it."""
    value: str
    why: str


def refusals(
    words: Mapping[str, tuple[str, ...]], defaults: Mapping[str, tuple[str, ...]]
) -> list[Refusal]:
    """The keywords of `ssh -G`'s answer (``words``, lowercase keyword -> values) the console
    will not connect with; ``defaults`` is the installed OpenSSH's own answer with no config
    (for `Rule.DEFAULT_ONLY`)."""
    found: list[Refusal] = []
    for printed, values in words.items():
        value = " ".join(values)
        keyword = BY_PRINTED.get(printed)
        if keyword is None:
            found.append(Refusal(printed, value, "a keyword the console does not know"))
        elif _refused(keyword, values, defaults.get(printed, values)):
            found.append(Refusal(keyword.name, value, keyword.how))
    return found


def _refused(keyword: Keyword, values: tuple[str, ...], default: tuple[str, ...]) -> bool:
    if keyword.rule is Rule.OFF_ONLY:
        return values[0].lower() not in keyword.off
    return keyword.rule is Rule.DEFAULT_ONLY and values != default


def readme_table() -> str:
    """The keyword table as the README shows it (a test holds the README to it)."""
    rows = ["| Keyword | The console |", "| --- | --- |"]
    for keyword in sorted(KEYWORDS, key=lambda k: k.name.lower()):
        how = keyword.how
        if keyword.rule is Rule.OFF_ONLY:
            how = f"{how}; refused unless {' / '.join(keyword.off)}"
        elif keyword.rule is Rule.DEFAULT_ONLY:
            how = f"{how}; refused when set"
        elif keyword.rule is Rule.NOT_TRIED:
            how = f"{how}; named when a login fails"
        rows.append(f"| `{keyword.name}` | {how} |")
    return "\n".join(rows)
