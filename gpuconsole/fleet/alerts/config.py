"""The user's alert rules: the built-in ones, changed by an alerts file.

The file is ``--alerts FILE``, else ``$GPUCONSOLE_ALERTS``, else
``<XDG config dir>/gpuconsole/alerts.toml`` where it exists:

```toml
disable = ["gpu-temperature-high"]   # built-in rules to switch off
enable = ["gpu-memory-high"]         # capacity rules to switch on (off by default)

[[rule]]                             # a new rule; one named like a built-in one replaces it
name = "gpu-hot"
expr = "temperature_c >= 80"         # or: findings = ["xid"]
for = "2m"
severity = "warning"                 # info, warning or critical
scope = "gpu"                        # or "host": compare the means over the host's GPUs
message = "{host} GPU {gpu} at {value:.0f} °C"
labels = { team = "ml-infra" }

# where firing alerts go (see `gpuconsole.fleet.alerts.alertmanager`)
[alertmanager]
urls = ["http://alertmanager:9093"]  # several: one cluster's members (--alertmanager replaces)
resend = "1m"                        # a firing alert is sent again this often
timeout = "10s"                      # the longest a request may take
```
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpuconsole.core import paths
from gpuconsole.fleet.alerts.alertmanager import (
    MAX_URLS,
    RESEND_RANGE,
    RESEND_SECONDS,
    TIMEOUT_RANGE,
    TIMEOUT_SECONDS,
    AlertmanagerSettings,
    alertmanager_url,
)
from gpuconsole.fleet.alerts.defaults import CAPACITY_RULES, DEFAULT_RULES
from gpuconsole.fleet.alerts.expr import shown
from gpuconsole.fleet.alerts.rules import AlertRule, RuleError, parse_duration, rule_from_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

MAX_FILE_BYTES = 1 << 20
"""The largest alerts file read (a real one is a few kilobytes): more is refused unread."""
_KEYS = frozenset({"disable", "enable", "rule", "alertmanager"})
_ALERTMANAGER_KEYS = frozenset({"urls", "resend", "timeout"})


@dataclass(frozen=True, slots=True)
class AlertsConfig:
    """What the alerts file says: the rules, and where their alerts go."""

    rules: tuple[AlertRule, ...] = DEFAULT_RULES
    alertmanager: AlertmanagerSettings = field(default_factory=AlertmanagerSettings)


def load_config(path: Path | None = None) -> AlertsConfig:
    """The alerts file (``path``, else the default one if any): the built-in rules as it changes
    them, and its ``[alertmanager]``.

    RuleError, as one line naming the file and the rule or key, on anything wrong.
    """
    explicit = path is not None or paths.ALERTS.explicit
    path = path or paths.ALERTS.path()
    if not explicit and not path.exists():
        return AlertsConfig()
    source = _file_name(path)
    data = _read_toml(path, source)
    return AlertsConfig(merge_rules(data, source), alertmanager_settings(data, source))


def load_rules(path: Path | None = None) -> tuple[AlertRule, ...]:
    """The built-in rules changed by the alerts file (see `load_config`)."""
    return load_config(path).rules


def _file_name(path: Path) -> str:
    """The path as messages name it: as it is, or quoted whole where it holds what a terminal
    would obey or cannot print (a newline, an escape, a byte of a name that is not UTF-8)."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def _read_toml(path: Path, source: str) -> dict[str, object]:
    """The file's TOML; for anything else, a RuleError of one line naming ``source``."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise RuleError(f"{source}: {error.strerror or error}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise RuleError(f"{source}: larger than {MAX_FILE_BYTES} bytes, too big for alert rules")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RuleError(
            f"{source}: not UTF-8 text, as TOML must be (byte {raw[error.start]:#04x} at offset "
            f"{error.start})"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise RuleError(f"{source}: {error}") from None
    except ValueError as error:  # int() past sys.get_int_max_str_digits(): a 5000-digit number
        raise RuleError(f"{source}: not valid TOML: {error}") from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise RuleError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None


def merge_rules(data: dict[str, object], source: str) -> tuple[AlertRule, ...]:
    """The built-in rules, less those disabled, with the capacity rules enabled, and the file's
    rules replacing or added."""
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise RuleError(
            f"{source}: unknown key {shown(unknown[0])} "
            "(keys: disable, enable, [[rule]], [alertmanager])"
        )
    rules = {rule.name: rule for rule in DEFAULT_RULES}
    capacity = {rule.name: rule for rule in CAPACITY_RULES}
    for name in _names(data, "disable", source):
        if rules.pop(name, None) is None:
            off = " (it is off unless enabled)" if name in capacity else ""
            raise RuleError(f"{source}: disable: no built-in rule {shown(name)} is on{off}")
    for name in _names(data, "enable", source):
        if name not in capacity:
            names = ", ".join(capacity)
            raise RuleError(f"{source}: enable: {shown(name)} is not a capacity rule ({names})")
        rules[name] = capacity[name]
    tables = data.get("rule", [])
    if not isinstance(tables, list):
        raise RuleError(f"{source}: write rules as [[rule]] tables")
    seen: set[str] = set()
    for number, table in enumerate(tables, start=1):
        if not isinstance(table, dict):
            raise RuleError(f"{source}: rule #{number} is not a table")
        rule = rule_from_dict(table, source if "name" in table else f"{source}: rule #{number}")
        if rule.name in seen:
            raise RuleError(f"{source}: rule {shown(rule.name)} is defined twice")
        seen.add(rule.name)
        rules[rule.name] = rule
    return tuple(rules.values())


def _names(data: dict[str, object], key: str, source: str) -> list[str]:
    names = data.get(key, [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise RuleError(f"{source}: {key} must be a list of rule names")
    return names


def alertmanager_settings(data: dict[str, object], source: str) -> AlertmanagerSettings:
    """The file's ``[alertmanager]`` table, checked; the defaults (no URL) without one."""
    table = data.get("alertmanager", {})
    where = f"{source}: [alertmanager]"
    if not isinstance(table, dict):
        raise RuleError(f'{where} must be a table, like: [alertmanager] urls = ["http://am:9093"]')
    unknown = sorted(set(table) - _ALERTMANAGER_KEYS)
    if unknown:
        keys = ", ".join(sorted(_ALERTMANAGER_KEYS))
        raise RuleError(f"{where}: unknown key {shown(unknown[0])} (keys: {keys})")
    return AlertmanagerSettings(
        urls=_urls(table.get("urls", []), f"{where} urls"),
        resend=_seconds(table, "resend", RESEND_SECONDS, RESEND_RANGE, where),
        timeout=_seconds(table, "timeout", TIMEOUT_SECONDS, TIMEOUT_RANGE, where),
    )


def _urls(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(url, str) for url in value):
        raise RuleError(f'{where} must be a list of URLs, like ["http://am:9093"]')
    if len(value) > MAX_URLS:
        raise RuleError(f"{where}: {len(value)} URLs, more than the {MAX_URLS} allowed")
    urls: list[str] = []
    for text in value:
        try:
            url = alertmanager_url(text)
        except ValueError as error:
            raise RuleError(f"{where}: {error}") from None
        if url in urls:
            raise RuleError(f"{where}: {shown(url)} is given twice")
        urls.append(url)
    return tuple(urls)


def _seconds(
    table: dict[str, object], key: str, default: float, bounds: tuple[float, float], where: str
) -> float:
    """A duration of the table (Prometheus's syntax, as ``for``) within ``bounds``."""
    text = table.get(key)
    if text is None:
        return default
    if not isinstance(text, str):
        raise RuleError(f'{where} {key} must be a duration like "1m", not {shown(text)}')
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise RuleError(f"{where} {key}: {error}") from None
    least, most = bounds
    if not least <= seconds <= most:
        raise RuleError(f"{where} {key}: {shown(text)} is not between {least:g}s and {most:g}s")
    return seconds
