"""``gpuconsole rules export``: the console's alert rules as a Prometheus rules file.

Condition rules become PromQL over dcgm-exporter's metrics (so they work on any fleet running
it); finding rules select the console exporter's ``gpuconsole_findings``. Thresholds are
compared on the gauges themselves: the guide's example took ``rate()`` of the utilization gauge,
which is near 0 for a GPU pinned at 100 % and so never fires when it should.

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

from gpuconsole.alerts.rules import AlertRule, value_format
from gpuconsole.telemetry import dcgm

GROUP = "gpuconsole"


def rule_expr(rule: AlertRule, host_label: str = dcgm.HOST_LABEL) -> str:
    """The PromQL that holds exactly where the console's rule holds."""
    if rule.condition is not None:
        return rule.condition.promql(host_label, host_scope=rule.scope == "host")
    codes = "|".join(rule.findings)
    return f'{dcgm.FINDINGS_METRIC}{{code=~"{codes}"}} > 0'


def go_template(message: str, host_label: str = dcgm.HOST_LABEL) -> str:
    """A rule message with Prometheus's template syntax in place of the console's fields."""
    fields = {
        "host": f"{{{{ $labels.{host_label} }}}}",
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


def rules_yaml(rules: Sequence[AlertRule], host_label: str = dcgm.HOST_LABEL) -> str:
    """A Prometheus rules file with one alerting rule per console rule."""
    lines = [
        "# Alert rules of gpuconsole (`gpuconsole rules export`), for Prometheus's rule_files.",
        "# Condition rules read dcgm-exporter's metrics; finding rules need `gpuconsole exporter`.",
        "groups:",
        f"  - name: {_q(GROUP)}",
        "    rules:",
    ]
    for rule in rules:
        labels = dict(rule.labels)
        labels["rule"] = rule.name
        if rule.severity is not None:
            labels["severity"] = rule.severity.label
        lines += [
            f"      - alert: {_q(rule.alert_name)}",
            f"        expr: {_q(rule_expr(rule, host_label))}",
            f"        for: {_q(rule.for_text)}",
            "        labels:",
            *(
                f"          {key}: {_q(_literal_template(value))}"
                for key, value in sorted(labels.items())
            ),
            "        annotations:",
            f"          summary: {_q(go_template(rule.message, host_label))}",
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
