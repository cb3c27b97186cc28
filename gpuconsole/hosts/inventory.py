"""The host inventory: which hosts the console watches over SSH, from a TOML file or `--hosts`.

The file is `$GPUCONSOLE_INVENTORY` if set, else `<XDG config dir>/gpuconsole/hosts.toml`:

```toml
[defaults]                 # optional: applies to every host
user = "ops"
port = 22                  # 1..65535
jump = "bastion.example"   # optional ProxyJump: [user@]host[:port], hops joined by ","; "none"
                           # turns a default one off
connect_timeout = 10       # seconds, 0.1..3600
gpus = 8                   # expected GPU count of each host, 1..1024
python = "python3"         # the interpreter recipes run with (a venv's or conda's, say)

[groups.rack-a]            # a group (rack): its own defaults and its hosts
user = "root"
hosts = ["gpu-a01", "gpu-a02"]

[groups.rack-b]            # hosts may also join a group with `group = "rack-b"`
gpus = 4

[hosts.gpu-a02]            # settings of one host of a group
port = 2200

[hosts.gpu-b01]            # one host with its own settings
address = "10.0.0.21"      # defaults to the name (which may be a Host alias of ~/.ssh/config)
user = "admin"
port = 2222
group = "rack-b"

[hosts.dgx-01]             # a host in no group
jump = "none"
```

Rules:
- A setting comes from the host's table, else its group's table, else `[defaults]`, else the
  built-in: user None (ssh config decides), port None (ssh config, else 22), no jump host,
  no expected GPU count, connect_timeout 10 s.
- A host joins a group by being listed in the group's `hosts` or by its own `group` key. The
  group must be declared as `[groups.NAME]` (it may list no hosts): a typo in `group` is an
  error rather than a new rack of one. A host belongs to one group at most.
- Hosts keep file order: each group in order (its listed hosts, then those that joined with
  `group`), then the hosts in no group.
- Host names, addresses, users and jump hosts are non-empty, contain no whitespace or control
  characters and do not start with `-`, so none of them can be read by ssh as an option.
- Numbers are range-checked (the ranges above): the file is untrusted input, and a timeout of
  1e308 s or a port of 10**400 is a mistake to name, not a value to pass on.
"""

from __future__ import annotations

import json
import math
import re
import sys
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuconsole.core.untrusted import MAX_GPUS

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_PYTHON = "python3"
HOSTS_OPTION = "--hosts"
PORTS = (1, 65535)
CONNECT_TIMEOUTS_S = (0.1, 3600.0)
EXPECTED_GPUS = (1, MAX_GPUS)


class InventoryError(ValueError):
    """A bad inventory, as one line: `FILE:LINE: what is wrong` (or `FILE: ...` with no line)."""


@dataclass(frozen=True, slots=True)
class HostEntry:
    """One host the console watches, with every setting resolved."""

    name: str
    address: str  # what ssh connects to; a name or a Host alias of ~/.ssh/config
    user: str | None  # None: ~/.ssh/config (or the local user) decides
    port: int | None  # None: ~/.ssh/config, else 22
    jump: str | None  # ProxyJump host, None for none from the inventory
    group: str | None
    expected_gpus: int | None  # None: not known, nothing to compare against
    connect_timeout: float
    python: str = DEFAULT_PYTHON  # the interpreter that has torch, for training recipes


@dataclass(frozen=True, slots=True)
class HostDefaults:
    """The settings a host takes where it sets none of its own."""

    user: str | None = None
    port: int | None = None
    jump: str | None = None
    expected_gpus: int | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    python: str = DEFAULT_PYTHON

    def entry(self, name: str, address: str, group: str | None = None) -> HostEntry:
        return HostEntry(
            name=name,
            address=address,
            user=self.user,
            port=self.port,
            jump=self.jump,
            group=group,
            expected_gpus=self.expected_gpus,
            connect_timeout=self.connect_timeout,
            python=self.python,
        )


@dataclass(frozen=True, slots=True)
class Inventory:
    """The hosts to watch, in order, and where they were read from (a file path or `--hosts`)."""

    hosts: tuple[HostEntry, ...]
    source: str
    _by_name: dict[str, HostEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {host.name: host for host in self.hosts}
        if len(by_name) != len(self.hosts):
            raise ValueError(f"{self.source}: host names must be unique")
        object.__setattr__(self, "_by_name", by_name)

    def groups(self) -> dict[str, tuple[str, ...]]:
        """Each group that has hosts, in order, with its host names in order."""
        groups: dict[str, list[str]] = {}
        for host in self.hosts:
            if host.group is not None:
                groups.setdefault(host.group, []).append(host.name)
        return {name: tuple(members) for name, members in groups.items()}

    def get(self, name: str) -> HostEntry:
        """The host called `name`; KeyError if there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in {self.source}") from None


def load_inventory(path: Path) -> Inventory:
    """Read and check the inventory file at `path`; InventoryError on anything wrong."""
    source = str(path)
    text = _read(path)
    return _Builder(source, text).build(_parse(source, text))


def hosts_from_option(text: str, defaults: HostDefaults | None = None) -> Inventory:
    """Hosts from `--hosts a,ops@b,c:2222,[fe80::1]:22`, each taking `defaults` where it is silent.

    An entry's name is the entry without its `user@`, so `c:2222` and `c:2223` stay apart.
    """
    base = defaults or HostDefaults()
    if not text.strip():
        raise InventoryError(f"{HOSTS_OPTION}: no hosts")
    hosts: dict[str, HostEntry] = {}
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            raise InventoryError(f"{HOSTS_OPTION}: empty entry in {_show(text)}")
        try:
            host = _option_entry(entry, base)
        except _Invalid as bad:
            raise InventoryError(f"{HOSTS_OPTION}: {_show(entry)}: {bad}") from None
        if host.name in hosts:
            raise InventoryError(f"{HOSTS_OPTION}: {_show(entry)}: listed twice")
        hosts[host.name] = host
    return Inventory(tuple(hosts.values()), HOSTS_OPTION)


# --- values ------------------------------------------------------------------------------------


class _Invalid(Exception):
    """A value is wrong; whoever knows where it came from turns this into an InventoryError."""


_SHOWN_CHARS = 60


def _show(value: object) -> str:
    """A value as the TOML file (or command line) spells it, near enough, and short: control
    characters escaped, a long value cut, a huge integer described rather than written out."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return f"an integer of {_digits(abs(value))} digits"
    try:
        text = json.dumps(value, default=str)
    except (ValueError, RecursionError):  # a huge integer, or nesting deeper than json goes
        text = f"a {type(value).__name__}"
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def _digits(number: int) -> int:
    """How many decimal digits `number` (> 0) has, without str(), which refuses over 4300."""
    digits = math.floor(math.log10(number)) + 1  # log10 of a float: may be one off either way
    if 10 ** (digits - 1) > number:
        return digits - 1
    return digits + 1 if 10**digits <= number else digits


def _word(value: object) -> str:
    """A string ssh can take as one argument and never as an option."""
    if not isinstance(value, str):
        raise _Invalid(f"must be a string, got {_show(value)}")
    if not value:
        raise _Invalid("must not be empty")
    if any(char.isspace() for char in value):
        raise _Invalid(f"must not contain whitespace, got {_show(value)}")
    if any(unicodedata.category(char) in ("Cc", "Cf") for char in value):
        raise _Invalid(f"must not contain control characters, got {_show(value)}")
    if value.startswith("-"):
        raise _Invalid(f"must not start with '-' (ssh would take it for an option): {_show(value)}")
    return value


def _user(value: object) -> str:
    user = _word(value)
    if "@" in user:
        raise _Invalid(f"must not contain '@', got {_show(user)}")
    return user


_PROGRAM = re.compile(r"[A-Za-z0-9_./+~-]+")


def _python(value: object) -> str:
    """A program name or path, run by a remote shell: nothing a shell would read as syntax."""
    program = _word(value)
    if not _PROGRAM.fullmatch(program):
        raise _Invalid(f"must be a program name or path, got {_show(program)}")
    return program


def _jump(value: object) -> str | None:
    jump = _word(value)
    if jump == "none":
        return None
    _hops(jump)
    return jump


def jump_hosts(
    jump: str, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
) -> tuple[HostEntry, ...]:
    """The hops of a ProxyJump value (the inventory's `jump`, or ssh config's), first hop first;
    InventoryError naming the hop if one is not `[user@]host[:port]`."""
    try:
        return _hops(jump, HostDefaults(connect_timeout=connect_timeout))
    except _Invalid as bad:
        raise InventoryError(f"ProxyJump {_show(jump)}: {bad}") from None


def _hops(jump: str, defaults: HostDefaults | None = None) -> tuple[HostEntry, ...]:
    hops = []
    for hop in jump.split(","):
        try:
            hops.append(_option_entry(hop, defaults or HostDefaults()))
        except _Invalid as bad:
            raise _Invalid(f"hop {_show(hop)}: {bad}") from None
    return tuple(hops)


# TOML's true/false arrive as bool, which Python counts as an int: each number check refuses it.


def _integer(value: object, bounds: tuple[int, int]) -> int:
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _Invalid(f"must be an integer in {low}..{high}, got {_show(value)}")
    return value


def _port(value: object) -> int:
    return _integer(value, PORTS)


def _gpus(value: object) -> int:
    return _integer(value, EXPECTED_GPUS)


def _timeout(value: object) -> float:
    low, high = CONNECT_TIMEOUTS_S
    # NaN compares false with everything, so the range check refuses it too
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _Invalid(f"must be a number of seconds in {low:g}..{high:g}, got {_show(value)}")
    return float(value)


# Settings that [defaults], [groups.X] and [hosts.X] share: TOML key -> (HostDefaults field, check).
_SETTINGS: dict[str, tuple[str, Callable[[object], Any]]] = {
    "user": ("user", _user),
    "port": ("port", _port),
    "jump": ("jump", _jump),
    "connect_timeout": ("connect_timeout", _timeout),
    "gpus": ("expected_gpus", _gpus),
    "python": ("python", _python),
}
_TOP_KEYS = ("defaults", "groups", "hosts")
_DEFAULTS_KEYS = tuple(_SETTINGS)
_GROUP_KEYS = ("hosts", *_SETTINGS)
_HOST_KEYS = ("address", "group", *_SETTINGS)


# --- the file ----------------------------------------------------------------------------------

_Where = tuple[str, ...]  # a key's path in the document, e.g. ("hosts", "gpu-b01", "port")
_LONG_NUMBER = re.compile(r"[0-9][0-9_]{4300,}")  # past Python's default int_max_str_digits
_TOML_LOCATION = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")


def _read(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InventoryError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InventoryError(f"{path}: not UTF-8 text (byte {error.start})") from None


def _parse(source: str, text: str) -> dict[str, Any]:
    # Here, not at the top: the console starts without reading TOML where there is no inventory.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise InventoryError(f"{source}: invalid TOML: arrays or tables nested too deep") from None
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        found = _TOML_LOCATION.search(message)
        if found is None:
            raise InventoryError(f"{source}: invalid TOML: {message}") from None
        reason = message[: found.start()]
        if found[1] is None:  # at end of document: the last line with anything on it
            line, reason = text.rstrip().count("\n") + 1, f"{reason} (at end of file)"
        else:
            line, reason = int(found[1]), f"{reason} (column {found[2]})"
        raise InventoryError(f"{source}:{line}: invalid TOML: {reason}") from None
    except ValueError:  # tomllib lets int() refuse an integer of more digits than Python reads
        long = _LONG_NUMBER.search(text)
        place = source if long is None else f"{source}:{text.count(chr(10), 0, long.start()) + 1}"
        raise InventoryError(f"{place}: invalid TOML: a number with too many digits") from None


@dataclass(frozen=True, slots=True)
class _Group:
    """A checked `[groups.NAME]`: the settings it gives its hosts and the hosts it lists."""

    settings: dict[str, Any]
    listed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Host:
    """A checked `[hosts.NAME]`: its own settings, and `address` and `group` where it sets them."""

    settings: dict[str, Any]
    address: str | None
    group: str | None


class _Builder:
    """Checks a parsed document and builds the Inventory; errors point into the text."""

    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.text = text

    def build(self, document: dict[str, Any]) -> Inventory:
        self._known_keys(document, (), _TOP_KEYS, "unknown top-level table or key")
        defaults = self._settings(self._table(document, ("defaults",)), ("defaults",))
        groups = {
            name: self._group(table, ("groups", name))
            for name, table in self._tables(document, "groups").items()
        }
        hosts = {
            name: self._host(table, ("hosts", name), groups)
            for name, table in self._tables(document, "hosts").items()
        }
        members = self._membership(groups, hosts)
        if not members:
            raise self.error((), "no hosts: list some in a [groups.NAME] or add [hosts.NAME]")
        entries = tuple(
            _entry(name, group, defaults, groups, hosts) for name, group in members.items()
        )
        return Inventory(entries, self.source)

    def error(self, where: _Where, message: str) -> InventoryError:
        line = _find_line(self.text, where)
        place = self.source if line is None else f"{self.source}:{line}"
        key = f"{_dotted(where)}: " if where else ""
        return InventoryError(f"{place}: {key}{message}")

    def _known_keys(
        self, table: Mapping[str, Any], where: _Where, allowed: tuple[str, ...], what: str
    ) -> None:
        for key in table:
            if key not in allowed:
                raise self.error((*where, key), f"{what} (allowed: {', '.join(allowed)})")

    def _table(self, parent: Mapping[str, Any], where: _Where) -> dict[str, Any]:
        table = parent.get(where[-1], {})
        if not isinstance(table, dict):
            raise self.error(where, f"must be a table, got {_show(table)}")
        return table

    def _tables(self, document: Mapping[str, Any], kind: str) -> dict[str, dict[str, Any]]:
        """`[groups.*]` or `[hosts.*]`: a table of tables, one per name."""
        tables = self._table(document, (kind,))
        for name in tables:
            self._table(tables, (kind, name))
        return tables

    def _value(
        self, table: Mapping[str, Any], where: _Where, check: Callable[[object], Any]
    ) -> Any:
        try:
            return check(table[where[-1]])
        except _Invalid as bad:
            raise self.error(where, str(bad)) from None

    def _settings(
        self, table: Mapping[str, Any], where: _Where, allowed: tuple[str, ...] = _DEFAULTS_KEYS
    ) -> dict[str, Any]:
        """The shared settings a table sets, checked, keyed by HostDefaults field."""
        self._known_keys(table, where, allowed, "unknown key")
        return {
            name: self._value(table, (*where, key), check)
            for key, (name, check) in _SETTINGS.items()
            if key in table
        }

    def _group(self, table: Mapping[str, Any], where: _Where) -> _Group:
        settings = self._settings(table, where, _GROUP_KEYS)
        listed = self._value(table, (*where, "hosts"), _names) if "hosts" in table else ()
        return _Group(settings, listed)

    def _host(self, table: Mapping[str, Any], where: _Where, groups: Mapping[str, _Group]) -> _Host:
        try:
            _word(where[-1])
        except _Invalid as bad:
            raise self.error(where, f"host name {bad}") from None
        settings = self._settings(table, where, _HOST_KEYS)
        address = self._value(table, (*where, "address"), _word) if "address" in table else None
        group = self._value(table, (*where, "group"), _string) if "group" in table else None
        if group is not None and group not in groups:
            raise self.error(
                (*where, "group"),
                f"unknown group {_show(group)} (declared: {', '.join(groups) or 'none'});"
                f" declare it as [groups.{_dotted((group,))}]",
            )
        return _Host(settings, address, group)

    def _membership(
        self, groups: Mapping[str, _Group], hosts: Mapping[str, _Host]
    ) -> dict[str, str | None]:
        """Every host name, in inventory order, with the group it belongs to."""
        grouped: dict[str, str] = {}
        for name, group in groups.items():
            for host in group.listed:
                self._join(grouped, host, name, hosts.get(host))
            for host, table in hosts.items():
                if table.group == name:
                    grouped.setdefault(host, name)
        return {**grouped, **{host: None for host in hosts if host not in grouped}}

    def _join(self, grouped: dict[str, str], host: str, group: str, table: _Host | None) -> None:
        """Put a host that `[groups.GROUP]` lists into that group, if it is in no other."""
        if table is not None and table.group not in (None, group):
            raise self.error(
                ("hosts", host, "group"),
                f"is {_show(table.group)}, but {_dotted(('groups', group))} lists {host}",
            )
        if host in grouped:
            other = grouped[host]
            again = "twice" if other == group else f"in {_dotted(('groups', other))} too"
            raise self.error(
                ("groups", group, "hosts"),
                f"{host} is listed {again} (a host is in one group at most)",
            )
        grouped[host] = group


def _entry(
    name: str,
    group: str | None,
    defaults: Mapping[str, Any],
    groups: Mapping[str, _Group],
    hosts: Mapping[str, _Host],
) -> HostEntry:
    """One host's entry: its own settings over its group's over `[defaults]` over built-ins."""
    own = hosts.get(name)
    inherited = groups[group].settings if group is not None else {}
    settings = {**defaults, **inherited, **(own.settings if own else {})}
    address = own.address if own and own.address else name
    return replace(HostDefaults(), **settings).entry(name, address, group)


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"must be a string, got {_show(value)}")
    return value


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _Invalid(f"must be a list of host names, got {_show(value)}")
    names = []
    for number, item in enumerate(value, start=1):
        try:
            names.append(_word(item))
        except _Invalid as bad:
            raise _Invalid(f"item {number} {bad}") from None
    return tuple(names)


# --- where in the text -------------------------------------------------------------------------

_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_DOTTED_KEY = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_HEADER = re.compile(rf"\s*\[\[?\s*({_DOTTED_KEY})\s*\]")
_ASSIGNMENT = re.compile(rf"\s*({_DOTTED_KEY})\s*=")
_PART = re.compile(_KEY_PART)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key_parts(dotted: str) -> _Where:
    return tuple(part[1:-1] if part[0] in "\"'" else part for part in _PART.findall(dotted))


def _dotted(where: _Where) -> str:
    return ".".join(part if _BARE_KEY.fullmatch(part) else json.dumps(part) for part in where)


def _find_line(text: str, where: _Where) -> int | None:
    """The line where `where` (or, failing that, the nearest table holding it) is first written.

    A light scan of table headers and `key =` lines, not a TOML parser: a multi-line string that
    looks like TOML can fool it, which costs a wrong or missing line number, never a wrong verdict.
    """
    for depth in range(len(where), 0, -1):
        line = _first_line_under(text, where[:depth])
        if line is not None:
            return line
    return None


def _first_line_under(text: str, where: _Where) -> int | None:
    table: _Where = ()
    for number, line in enumerate(text.split("\n"), start=1):
        header = _HEADER.match(line)
        assignment = None if header else _ASSIGNMENT.match(line)
        if header:
            table = key = _key_parts(header[1])
        elif assignment:
            key = table + _key_parts(assignment[1])
        else:
            continue
        if key[: len(where)] == where:
            return number
    return None


# --- --hosts -----------------------------------------------------------------------------------

_DIGITS = re.compile(r"[0-9]+")


def _option_entry(entry: str, defaults: HostDefaults) -> HostEntry:
    """One `[user@]host[:port]` entry; an IPv6 address takes a port only inside `[...]`."""
    user, at, target = entry.rpartition("@")
    host, port = _split_port(target)
    settings: dict[str, Any] = {}
    if at:
        settings["user"] = _labelled("user", _user, user)
    if port is not None:
        # a port has at most 5 digits past leading zeros; int() of a longer one is never needed
        # (and Python refuses one of over 4300 digits)
        if not _DIGITS.fullmatch(port) or len(port.lstrip("0")) > len(str(PORTS[1])):
            raise _Invalid(f"port must be an integer in {PORTS[0]}..{PORTS[1]}, got {_show(port)}")
        settings["port"] = _labelled("port", _port, int(port))
    address = _labelled("host", _word, host)
    return replace(defaults, **settings).entry(target, address)


def _split_port(target: str) -> tuple[str, str | None]:
    if target.startswith("["):
        host, bracket, rest = target[1:].partition("]")
        if not bracket:
            raise _Invalid("'[' without ']'")
        if rest and not rest.startswith(":"):
            raise _Invalid(f"expected ':PORT' after ']', got {_show(rest)}")
        return host, rest[1:] if rest else None
    if target.count(":") == 1:
        host, _, port = target.partition(":")
        return host, port
    return target, None


def _labelled(label: str, check: Callable[[object], Any], value: object) -> Any:
    try:
        return check(value)
    except _Invalid as bad:
        raise _Invalid(f"{label} {bad}") from None
