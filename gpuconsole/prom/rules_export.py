"""``gpuconsole rules export``: the console's alert rules as a Prometheus rules file.

Condition rules become PromQL over dcgm-exporter's metrics (so they work on any fleet running
it); finding rules select the console exporter's ``gpuconsole_findings``. Thresholds are
compared on the gauges themselves: the guide's example took ``rate()`` of the utilization gauge,
which is near 0 for a GPU pinned at 100 % and so never fires when it should.

The file is YAML; every string is written JSON-quoted, which YAML reads as the same string.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence

from gpuconsole.alerts.rules import AlertRule, value_format
from gpuconsole.prom import dcgm

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
        parts.append(literal.replace("{{", '{{ "{{" }}'))
        if field is None:
            continue
        if field == "value":
            printf = value_format(spec or "")
            parts.append(f'{{{{ printf "{printf}" $value }}}}' if printf else "{{ $value }}")
        else:
            parts.append(fields[field])
    return "".join(parts)


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
            *(f"          {key}: {_q(value)}" for key, value in sorted(labels.items())),
            "        annotations:",
            f"          summary: {_q(go_template(rule.message, host_label))}",
        ]
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
