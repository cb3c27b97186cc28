"""The user's alert rules: the built-in ones, changed by an alerts file.

The file is ``--alerts FILE``, else ``$GPUCONSOLE_ALERTS``, else
``<XDG config dir>/gpuconsole/alerts.toml`` where it exists:

```toml
disable = ["gpu-power-at-limit"]     # built-in rules to switch off

[[rule]]                             # a new rule; one named like a built-in one replaces it
name = "gpu-hot"
expr = "temperature_c >= 80"         # or: findings = ["xid"]
for = "2m"
severity = "warning"                 # info, warning or critical
scope = "gpu"                        # or "host": compare the means over the host's GPUs
message = "{host} GPU {gpu} at {value:.0f} °C"
labels = { team = "ml-infra" }
```
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import platformdirs

from gpuconsole.alerts.defaults import DEFAULT_RULES
from gpuconsole.alerts.rules import AlertRule, RuleError, rule_from_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ALERTS_ENV = "GPUCONSOLE_ALERTS"
_KEYS = frozenset({"disable", "rule"})


def default_alerts_path() -> Path:
    """``$GPUCONSOLE_ALERTS``, else ``<XDG config dir>/gpuconsole/alerts.toml``."""
    override = os.environ.get(ALERTS_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_config_dir("gpuconsole")) / "alerts.toml"


def load_rules(path: Path | None = None) -> tuple[AlertRule, ...]:
    """The built-in rules changed by the alerts file (``path``, else the default one if any).

    RuleError, as one line naming the file and the rule, on anything wrong.
    """
    explicit = path is not None or bool(os.environ.get(ALERTS_ENV))
    path = path or default_alerts_path()
    if not explicit and not path.exists():
        return DEFAULT_RULES
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise RuleError(f"{path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise RuleError(f"{path}: {error}") from None
    return merge_rules(data, str(path))


def merge_rules(data: dict[str, object], source: str) -> tuple[AlertRule, ...]:
    """The built-in rules, less those disabled, with the file's rules replacing or added."""
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise RuleError(f"{source}: unknown key {unknown[0]!r} (keys: disable, [[rule]])")
    rules = {rule.name: rule for rule in DEFAULT_RULES}
    disable = data.get("disable", [])
    if not isinstance(disable, list) or not all(isinstance(n, str) for n in disable):
        raise RuleError(f"{source}: disable must be a list of rule names")
    for name in disable:
        if rules.pop(name, None) is None:
            raise RuleError(f"{source}: disable: no built-in rule {name!r}")
    tables = data.get("rule", [])
    if not isinstance(tables, list):
        raise RuleError(f"{source}: write rules as [[rule]] tables")
    seen: set[str] = set()
    for number, table in enumerate(tables, start=1):
        if not isinstance(table, dict):
            raise RuleError(f"{source}: rule #{number} is not a table")
        rule = rule_from_dict(table, source if "name" in table else f"{source}: rule #{number}")
        if rule.name in seen:
            raise RuleError(f"{source}: rule {rule.name!r} is defined twice")
        seen.add(rule.name)
        rules[rule.name] = rule
    return tuple(rules.values())
