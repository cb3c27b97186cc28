"""``gpuconsole rules export``: the console's alert rules as a Prometheus rules file.

Condition rules become PromQL over dcgm-exporter's metrics (so they work on any fleet running
it), written for the names of one generation of dcgm-exporter, or of both joined by ``or``
(`gpuconsole.telemetry.dcgm.Dialect`); a rule that reads a field dcgm-exporter does not collect by
default says so in a comment above it. Finding rules select the console exporter's
``gpuconsole_findings``. Thresholds are compared on the gauges themselves: the guide's example
took ``rate()`` of the utilization gauge, which is near 0 for a GPU pinned at 100 % and so never
fires when it should.

Prometheus expands every label value and annotation of an alerting rule as a Go template
(``text/template``, with ``query`` among its functions: a template can run PromQL). The console's
labels and the literal text of its messages are data, so each ``{`` of them is written as the
template ``{{ "{" }}``: Prometheus's alert then carries exactly the text the console's does, and
no text from an alerts file can be a template that promtool refuses ("unclosed action") or one
that runs.

The file is YAML; every string is written JSON-quoted, which YAML reads as the same string, with
each character that is not printable escaped (YAML refuses raw C1 controls and DEL: promtool
says "control characters are not allowed").
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence

from gpuconsole.fleet.alerts.rules import AlertRule, value_format
from gpuconsole.telemetry import dcgm

GROUP = "gpuconsole"


def rule_expr(rule: AlertRule, dialect: dcgm.Dialect = dcgm.CLASSIC_DIALECT) -> str:
    """The PromQL that holds exactly where the console's rule holds."""
    classic = _classic_expr(rule, dialect)
    if classic is not None:
        return dcgm.in_generations(classic, dialect.generations)
    codes = "|".join(rule.findings)
    return f'{dcgm.FINDINGS_METRIC}{{code=~"{codes}"}} > 0'


def _classic_expr(rule: AlertRule, dialect: dcgm.Dialect) -> str | None:
    """A condition rule's PromQL over classic names, as the rule language renders it (None for a
    finding rule)."""
    if rule.condition is None:
        return None
    return rule.condition.promql(dialect.host_by, host_scope=rule.scope == "host")


def requirement(rule: AlertRule, dialect: dcgm.Dialect = dcgm.CLASSIC_DIALECT) -> str | None:
    """What a rule needs beyond dcgm-exporter's default collector file, None when nothing."""
    classic = _classic_expr(rule, dialect)
    needed = [] if classic is None else dcgm.outside_defaults(classic)
    if not needed:
        return None
    names = "; ".join(
        " or ".join(name for name, _ in m.spelled(dialect.generations)) for m in needed
    )
    return (
        f"needs {names}, which dcgm-exporter does not collect by default: "
        "add it to its collector file (--collectors, default-counters.csv)"
    )


def go_template(message: str, dialect: dcgm.Dialect = dcgm.CLASSIC_DIALECT) -> str:
    """A rule message with Prometheus's template syntax in place of the console's fields."""
    labels = [f"$labels.{label}" for label in dialect.host_labels]
    host = labels[0] if len(labels) == 1 else f"or {' '.join(labels)}"
    fields = {
        "host": f"{{{{ {host} }}}}",
        "gpu": "{{ $labels.gpu }}",
        "detail": "{{ $labels.code }}{{ if $labels.gpu }} on GPU {{ $labels.gpu }}{{ end }}",
    }
    parts = []
    for literal, field, spec, _ in string.Formatter().parse(message):
        parts.append(_literal_template(literal))
        if field is None:
            continue
        if field == "value":
            printf = value_format(spec or "")
            parts.append(f'{{{{ printf "{printf}" $value }}}}' if printf else "{{ $value }}")
        else:
            parts.append(fields[field])
    return "".join(parts)


def _literal_template(text: str) -> str:
    """A Go template that expands to ``text`` itself."""
    return text.replace("{", '{{ "{" }}')


def rules_yaml(rules: Sequence[AlertRule], dialect: dcgm.Dialect = dcgm.CLASSIC_DIALECT) -> str:
    """A Prometheus rules file with one alerting rule per console rule."""
    names = " or ".join(
        "the classic names" if g == dcgm.CLASSIC else f"dcgm-exporter {g}'s names"
        for g in dialect.generations
    )
    lines = [
        "# Alert rules of gpuconsole (`gpuconsole rules export`), for Prometheus's rule_files.",
        f"# Condition rules read dcgm-exporter's metrics under {names}, the host from "
        f"{' or '.join(dialect.host_labels)};",
        "# finding rules need `gpuconsole exporter`.",
        "groups:",
        f"  - name: {_q(GROUP)}",
        "    rules:",
    ]
    for rule in rules:
        labels = dict(rule.labels)
        labels["rule"] = rule.name
        if rule.severity is not None:
            labels["severity"] = rule.severity.label
        needs = requirement(rule, dialect)
        if needs is not None:
            lines.append(f"      # {_q(rule.name)} {needs}")
        lines += [
            f"      - alert: {_q(rule.alert_name)}",
            f"        expr: {_q(rule_expr(rule, dialect))}",
            f"        for: {_q(rule.for_text)}",
            "        labels:",
            *(
                f"          {key}: {_q(_literal_template(value))}"
                for key, value in sorted(labels.items())
            ),
            "        annotations:",
            f"          summary: {_q(go_template(rule.message, dialect))}",
        ]
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    """``text`` as a YAML double-quoted string: JSON's quoting (which escapes C0, quotes and
    backslashes) and a YAML escape for each other character that is not printable."""
    return "".join(
        char if char.isprintable() else _yaml_escape(char)
        for char in json.dumps(text, ensure_ascii=False)
    )


def _yaml_escape(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
