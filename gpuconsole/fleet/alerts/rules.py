"""Alert rules: what to watch, for how long, how bad it is, and what to say.

A rule is either a condition over readings (``expr``, see `gpuconsole.fleet.alerts.expr`) or a
set of health-finding codes (``findings``). It fires once the condition has held for ``for`` (a
Prometheus duration such as ``5m`` or ``1h30m``; ``0s`` fires at once), as in Prometheus.

Rules come from dictionaries (the defaults, and the tables of the user's alerts file, which a
ticket may have brought: hostile) and are checked as they are built: a bad rule is a `RuleError`,
one line naming the rule, the value and what is wrong. What is accepted is what promtool accepts
for the exported rule, and an alert's texts hold no control character for a terminal to obey.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuconsole.core.model import Severity
from gpuconsole.core.untrusted import UNSAFE
from gpuconsole.fleet.alerts.expr import Condition, ExprError, parse, shown
from gpuconsole.rules.health import RULES as FINDING_CODES

SCOPES = ("gpu", "host")
PLACEHOLDERS = {
    "host": "the host's name",
    "gpu": "the GPU's index (empty for a host-wide alert)",
    "value": "the value compared (a format like {value:.0f} is allowed)",
    "detail": "the finding's own message (finding rules)",
}
_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED_LABELS = frozenset({"alertname", "severity", "rule", "host", "gpu", "Hostname", "UUID"})
"""Labels the console sets on every alert it exports or sends
(`gpuconsole.fleet.alerts.alertmanager`): a rule's own label of one of these names would make
one alert of every host's or GPU's."""
_DURATION = re.compile(
    r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?"
    r"(?:([0-9]+)ms)?"
)
"""Prometheus's duration syntax (prometheus/common ``model.ParseDuration``), "0" aside."""
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
MAX_DURATION_MS = (2**63 - 1) // 1_000_000
"""The longest ``for``: Prometheus parses a duration into Go's ``time.Duration``, int64
nanoseconds, and refuses more with "duration out of range" (``model.ParseDuration``). promtool
2.42 passes ``9223372036854ms`` and ``292y``, refuses ``9223372036855ms`` and ``293y``."""
_FIXED_FORMAT = re.compile(r"\.([0-9])f")
_KEYS = frozenset({"name", "expr", "findings", "for", "severity", "scope", "message", "labels"})


class RuleError(ValueError):
    """A rule that cannot be used: one line naming where it came from, the rule, and why."""


@dataclass(frozen=True, slots=True)
class AlertRule:
    """One checked rule."""

    name: str
    for_text: str
    for_seconds: float
    severity: Severity | None
    """None: a finding rule takes the severity of the worst finding it matched."""
    message: str
    labels: tuple[tuple[str, str], ...] = ()
    condition: Condition | None = None
    findings: tuple[str, ...] = ()
    scope: str = "gpu"

    @property
    def alert_name(self) -> str:
        """As a Prometheus alert name: ``gpu-temperature-high`` → ``GpuTemperatureHigh``."""
        return alert_name(self.name)

    def render(self, host: str, gpu: int | None, value: float | None, detail: str = "") -> str:
        """The alert's message for one host or GPU."""
        return self.message.format(
            host=host,
            gpu="" if gpu is None else gpu,
            value=_Value(value),
            detail=detail,
        )


def alert_name(rule: str) -> str:
    """A rule's name as Prometheus's alert (``alertname``) names it: ``gpu-temperature-high`` →
    ``GpuTemperatureHigh``, in the exported rules and in what the console sends Alertmanager."""
    return "".join(part.capitalize() for part in rule.split("-"))


class _Value:
    """A value in a message template: "N/A" when missing, so a template never fails on None."""

    __slots__ = ("value",)

    def __init__(self, value: float | None) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        if self.value is None:
            return "N/A"
        if not math.isfinite(self.value):
            return _GO_SPELLING[str(self.value)]
        return format(self.value, spec) if spec else _plain(self.value)


_GO_SPELLING = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}
"""How Prometheus's templates write a non-finite ``$value`` (Go's fmt, ``%v`` and ``%.Nf``)."""


def _plain(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:.2f}"


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration (``90s``, ``5m``, ``1h30m``, ``2d``, ``1w``, ``500ms``);
    ValueError for what Prometheus would refuse, saying why in its words."""
    text = text.strip()
    if text == "0":  # the one duration without a unit
        return 0.0
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        raise ValueError(f"{shown(text)} is not a duration like 30s, 5m, 1h30m or 0s")
    # Leading zeros are allowed ("01m"); the digits' length is checked before int() sees them.
    parts = [(part or "0").lstrip("0") or "0" for part in match.groups()]
    if any(len(part) > len(str(MAX_DURATION_MS)) for part in parts):
        raise _out_of_range(text)
    milliseconds = sum(int(part) * unit for part, unit in zip(parts, _UNIT_MS, strict=True))
    if milliseconds > MAX_DURATION_MS:
        raise _out_of_range(text)
    return milliseconds / 1000


def _out_of_range(text: str) -> ValueError:
    return ValueError(
        f"{shown(text)}: duration out of range (Prometheus's longest is {MAX_DURATION_MS}ms, "
        "about 292 years)"
    )


def rule_from_dict(table: Mapping[str, Any], where: str) -> AlertRule:
    """Build and check one rule; ``where`` names its origin for error messages."""
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        what = "a missing name" if name is None else f"name {shown(name)}"
        raise RuleError(f"{where}: {what}: rule names are kebab-case, like 'gpu-temperature-high'")
    return _Builder(table, f"{where}: rule {shown(name)}").build(name)


class _Builder:
    def __init__(self, table: Mapping[str, Any], where: str) -> None:
        self.table = table
        self.where = where

    def fail(self, what: str) -> RuleError:
        return RuleError(f"{self.where}: {what}")

    def build(self, name: str) -> AlertRule:
        unknown = sorted(set(self.table) - _KEYS)
        if unknown:
            raise self.fail(f"unknown key {shown(unknown[0])} (keys: {', '.join(sorted(_KEYS))})")
        condition, findings = self._what()
        scope = self._text("scope", "gpu")
        if scope not in SCOPES:
            raise self.fail(f"scope {shown(scope)} is neither 'gpu' nor 'host'")
        if findings and scope != "gpu":
            raise self.fail("a findings rule is per GPU (or host-wide finding); drop scope")
        for_text = self._text("for", "0s")
        try:
            for_seconds = parse_duration(for_text)
        except ValueError as error:
            raise self.fail(f"for: {error}") from None
        message = self._text("message", "{host}: {detail}" if findings else "")
        if not message:
            raise self.fail("a rule needs a message, e.g. 'GPU {gpu} at {value} °C'")
        self._check_message(message, bool(findings))
        return AlertRule(
            name=name,
            for_text=for_text.strip(),
            for_seconds=for_seconds,
            severity=self._severity(required=not findings),
            message=message,
            labels=self._labels(),
            condition=condition,
            findings=findings,
            scope=scope,
        )

    def _text(self, key: str, default: str) -> str:
        value = self.table.get(key, default)
        if not isinstance(value, str):
            raise self.fail(f"{key} must be a string, not {shown(value)}")
        return value

    def _what(self) -> tuple[Condition | None, tuple[str, ...]]:
        expr, findings = self.table.get("expr"), self.table.get("findings")
        if (expr is None) == (findings is None):
            raise self.fail("give either expr (a condition over readings) or findings (codes)")
        if expr is not None:
            if not isinstance(expr, str):
                raise self.fail(f"expr must be a string, not {shown(expr)}")
            try:
                return parse(expr), ()
            except ExprError as error:
                raise self.fail(f"expr: {error}") from None
        if isinstance(findings, str):
            findings = [findings]
        if not isinstance(findings, list) or not findings:
            raise self.fail("findings must be a list of finding codes, like ['xid']")
        for code in findings:
            if not isinstance(code, str) or code not in FINDING_CODES:
                raise self.fail(
                    f"unknown finding code {shown(code)} (codes: {', '.join(FINDING_CODES)})"
                )
        return None, tuple(findings)

    def _severity(self, required: bool) -> Severity | None:
        text = self.table.get("severity")
        if text is None:
            if required:
                raise self.fail("severity is missing (info, warning or critical)")
            return None
        # ASCII only: str.upper() makes "ınfo" (a dotless ı) "INFO".
        if isinstance(text, str) and text.isascii() and text.upper() in Severity.__members__:
            return Severity[text.upper()]
        raise self.fail(f"severity {shown(text)} is not info, warning or critical")

    def _labels(self) -> tuple[tuple[str, str], ...]:
        labels = self.table.get("labels", {})
        if not isinstance(labels, Mapping):
            raise self.fail("labels must be a table of names to strings")
        for key, value in labels.items():
            if not _LABEL.fullmatch(key) or key.startswith("__") or key in _RESERVED_LABELS:
                raise self.fail(f"label {shown(key)} is not a usable label name")
            if not isinstance(value, str):
                raise self.fail(f"label {shown(key)} must be a string, not {shown(value)}")
            self._check_text(f"label {shown(key)}", value)
        return tuple(sorted(labels.items()))

    def _check_text(self, what: str, text: str) -> None:
        control = UNSAFE.search(text)
        if control:
            raise self.fail(
                f"{what}: {shown(text)} holds the control character {shown(control.group())}"
            )

    def _check_message(self, message: str, finding_rule: bool) -> None:
        self._check_text("message", message)
        try:
            fields = list(string.Formatter().parse(message))
        except ValueError as error:
            raise self.fail(f"message: {error}") from None
        for _, field, spec, conversion in fields:
            if field is None:
                continue
            if field not in PLACEHOLDERS:
                known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                raise self.fail(
                    f"message: unknown placeholder {shown('{' + field + '}')} (known: {known})"
                )
            if field == "detail" and not finding_rule:
                raise self.fail("message: {detail} is the finding's message: findings rules only")
            if conversion or (spec and not (field == "value" and _FIXED_FORMAT.fullmatch(spec))):
                raise self.fail(
                    f"message: {shown(f'{{{field}:{spec}}}')}: only {{value:.Nf}} formats are "
                    "supported"
                )


def value_format(spec: str) -> str | None:
    """The printf format of a ``{value:.Nf}`` spec, for Prometheus templates."""
    match = _FIXED_FORMAT.fullmatch(spec)
    return f"%.{match.group(1)}f" if match else None
