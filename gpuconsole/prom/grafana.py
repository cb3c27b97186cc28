"""``gpuconsole grafana export``: a Grafana dashboard over dcgm-exporter's and the console's
metrics, with the guide's thresholds (§4.2) drawn on its panels.

The dashboard asks for its Prometheus data source when imported (a ``datasource`` variable) and
filters by host with a ``host`` variable. Panels read dcgm-exporter's metrics under the names of
one generation of dcgm-exporter, or of both joined by ``or`` (`gpuconsole.telemetry.dcgm.Dialect`),
so they work on any fleet running it; a panel over a field dcgm-exporter does not collect by
default says so in its description. The findings, host-state and alert panels need the console's
exporter and the exported rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuconsole.telemetry import dcgm

UID = "gpuconsole-fleet"
_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True, slots=True)
class Panel:
    """One panel: its title, what it shows, and its queries (legend per query)."""

    title: str
    description: str
    targets: tuple[tuple[str, str], ...]
    unit: str = "short"
    thresholds: tuple[tuple[float, str], ...] = ()
    kind: str = "timeseries"


def panels(dialect: dcgm.Dialect = dcgm.CLASSIC_DIALECT) -> tuple[Panel, ...]:
    """The dashboard's panels; ``$host`` is the dashboard's host variable."""
    sel = dialect.host_matchers("$host")
    legend = "".join(f"{{{{{label}}}}}" for label in dialect.host_labels) + " GPU {{gpu}}"

    def reading(field: str) -> str:
        return dcgm.BY_FIELD[field].selector(dialect.generations, sel)

    used, free = reading("memory_used_mib"), reading("memory_free_mib")
    limit = dcgm.BY_FIELD["power_limit_w"]
    return (
        Panel(
            "GPU utilization",
            "The guide's ideal is 90 % or more; the utilization rule alerts on a host "
            "averaging over 95 % for 5 minutes.",
            ((reading("utilization_pct"), legend),),
            unit="percent",
            thresholds=((90.0, "green"), (95.0, "orange")),
        ),
        Panel(
            "GPU memory used",
            "Keep 20 % in reserve (the guide): the memory rule alerts above 80 %.",
            ((f"{used} / ({used} + {free}) * 100", legend),),
            unit="percent",
            thresholds=((80.0, "orange"), (95.0, "red")),
        ),
        Panel(
            "GPU temperature",
            "The guide's alert threshold is 85 °C.",
            ((reading("temperature_c"), legend),),
            unit="celsius",
            thresholds=((85.0, "red"),),
        ),
        Panel(
            "Power draw against the limit",
            "Each GPU's draw as a share of its enforced power limit (A100 SXM: 400 W). Needs "
            f"{' or '.join(limit.names[:2])}, which dcgm-exporter does not collect by default.",
            ((f"{reading('power_w')} / {reading('power_limit_w')} * 100", legend),),
            unit="percent",
            thresholds=((98.0, "orange"),),
        ),
        Panel(
            "Power draw",
            "Watts per GPU.",
            ((reading("power_w"), legend),),
            unit="watt",
        ),
        Panel(
            "SM clock",
            "A clock well below the maximum under load means throttling.",
            ((reading("sm_clock_mhz"), legend),),
            unit="MHz",
        ),
        Panel(
            "Last XID error",
            "GPUs whose driver reported an XID (the value is the last XID).",
            ((f"{reading('xid')} > 0", legend),),
            kind="table",
        ),
        Panel(
            "Findings by severity",
            "The console's health findings (gpuconsole exporter).",
            ((f"sum by (severity) ({dcgm.FINDINGS_METRIC}{sel})", "{{severity}}"),),
        ),
        Panel(
            "Hosts not live",
            "Hosts whose readings stopped, by state (gpuconsole exporter).",
            (
                (
                    f'sum by (state) ({dcgm.HOST_STATE_METRIC}{{state!="live"}})',
                    "{{state}}",
                ),
            ),
        ),
        Panel(
            "Firing alerts",
            "Alerts of the exported gpuconsole rules, by rule and severity.",
            (
                (
                    'count by (alertname, severity) (ALERTS{alertstate="firing", rule!=""})',
                    "{{alertname}} {{severity}}",
                ),
            ),
        ),
    )


def host_variable(dialect: dcgm.Dialect = dcgm.CLASSIC_DIALECT) -> dict[str, object]:
    """The ``host`` variable: the values of the host label on the utilization metric; with two
    host labels, each sample's value of whichever it carries (``query_result`` and a regex, as
    Grafana's ``label_values`` takes one label)."""
    utilization = dcgm.BY_FIELD["utilization_pct"]
    names = [name for name, _ in utilization.spelled(dialect.generations)]
    metric = names[0] if len(names) == 1 else f'{{__name__=~"{"|".join(names)}"}}'
    if len(dialect.host_labels) == 1:
        query, regex = f"label_values({metric}, {dialect.host_labels[0]})", ""
    else:
        query = f"query_result(count by ({dialect.host_by}) ({metric}))"
        regex = "/(?:" + "|".join(dialect.host_labels) + ')="([^"]+)"/'
    return {
        "name": "host",
        "label": "Host",
        "type": "query",
        "datasource": _DATASOURCE,
        "query": query,
        "regex": regex,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
    }


def dashboard(dialect: dcgm.Dialect = dcgm.CLASSIC_DIALECT) -> dict[str, object]:
    """The dashboard as Grafana's JSON model."""
    return {
        "uid": UID,
        "title": "GPU fleet (gpuconsole)",
        "description": "dcgm-exporter metrics with the thresholds of the GPU server guide §4.2",
        "tags": ["gpu", "dcgm", "gpuconsole"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                },
                host_variable(dialect),
            ]
        },
        "panels": [_panel(number, panel) for number, panel in enumerate(panels(dialect))],
    }


def dashboard_json(dialect: dcgm.Dialect = dcgm.CLASSIC_DIALECT) -> str:
    return json.dumps(dashboard(dialect), indent=2, ensure_ascii=False) + "\n"


def _panel(number: int, panel: Panel) -> dict[str, object]:
    steps: list[dict[str, object]] = [{"color": "text", "value": None}]
    steps += [{"color": colour, "value": value} for value, colour in panel.thresholds]
    return {
        "id": number + 1,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": _DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (number % 2), "y": 8 * (number // 2)},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "thresholds": {"mode": "absolute", "steps": steps},
                "custom": {"thresholdsStyle": {"mode": "line"}} if panel.thresholds else {},
            },
            "overrides": [],
        },
        "targets": [
            {
                "refId": chr(ord("A") + index),
                "datasource": _DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
                **({"instant": True, "format": "table"} if panel.kind == "table" else {}),
            }
            for index, (expr, legend) in enumerate(panel.targets)
        ],
    }
