"""``gpuconsole grafana export``: a Grafana dashboard over dcgm-exporter's and the console's
metrics, with the guide's thresholds (§4.2) drawn on its panels.

The dashboard asks for its Prometheus data source when imported (a ``datasource`` variable) and
filters by host with a ``host`` variable. Panels read dcgm-exporter's classic metric names, so
they work on any fleet running it; the findings, host-state and alert panels need the console's
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


def panels(host_label: str = dcgm.HOST_LABEL) -> tuple[Panel, ...]:
    """The dashboard's panels; ``$host`` is the dashboard's host variable."""
    sel = f'{{{host_label}=~"$host"}}'
    gpu_legend = f"{{{{{host_label}}}}} GPU {{{{gpu}}}}"
    used, free = f"DCGM_FI_DEV_FB_USED{sel}", f"DCGM_FI_DEV_FB_FREE{sel}"
    return (
        Panel(
            "GPU utilization",
            "The guide's ideal is 90 % or more; the utilization rule alerts on a host "
            "averaging over 95 % for 5 minutes.",
            ((f"DCGM_FI_DEV_GPU_UTIL{sel}", gpu_legend),),
            unit="percent",
            thresholds=((90.0, "green"), (95.0, "orange")),
        ),
        Panel(
            "GPU memory used",
            "Keep 20 % in reserve (the guide): the memory rule alerts above 80 %.",
            ((f"{used} / ({used} + {free}) * 100", gpu_legend),),
            unit="percent",
            thresholds=((80.0, "orange"), (95.0, "red")),
        ),
        Panel(
            "GPU temperature",
            "The guide's alert threshold is 85 °C.",
            ((f"DCGM_FI_DEV_GPU_TEMP{sel}", gpu_legend),),
            unit="celsius",
            thresholds=((85.0, "red"),),
        ),
        Panel(
            "Power draw against the limit",
            "Each GPU's draw as a share of its enforced power limit (A100 SXM: 400 W).",
            (
                (
                    f"DCGM_FI_DEV_POWER_USAGE{sel} / DCGM_FI_DEV_ENFORCED_POWER_LIMIT{sel} * 100",
                    gpu_legend,
                ),
            ),
            unit="percent",
            thresholds=((98.0, "orange"),),
        ),
        Panel(
            "Power draw",
            "Watts per GPU.",
            ((f"DCGM_FI_DEV_POWER_USAGE{sel}", gpu_legend),),
            unit="watt",
        ),
        Panel(
            "SM clock",
            "A clock well below the maximum under load means throttling.",
            ((f"DCGM_FI_DEV_SM_CLOCK{sel}", gpu_legend),),
            unit="MHz",
        ),
        Panel(
            "Last XID error",
            "GPUs whose driver reported an XID (the value is the last XID).",
            ((f"{dcgm.XID_METRIC}{sel} > 0", gpu_legend),),
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


def dashboard(host_label: str = dcgm.HOST_LABEL) -> dict[str, object]:
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
                {
                    "name": "host",
                    "label": "Host",
                    "type": "query",
                    "datasource": _DATASOURCE,
                    "query": f"label_values(DCGM_FI_DEV_GPU_UTIL, {host_label})",
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "panels": [_panel(number, panel) for number, panel in enumerate(panels(host_label))],
    }


def dashboard_json(host_label: str = dcgm.HOST_LABEL) -> str:
    return json.dumps(dashboard(host_label), indent=2, ensure_ascii=False) + "\n"


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
