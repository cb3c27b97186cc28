"""The built-in rules: the guide's thresholds (§4.2) and the health findings worth a page.

The guide's own example rule takes ``rate()`` of a utilization gauge, which measures how fast
utilization changes, not how high it is; these compare the readings themselves.
"""

from __future__ import annotations

from gpuconsole.fleet.alerts.rules import AlertRule, rule_from_dict
from gpuconsole.rules.limits import MEMORY_RESERVE_FRACTION, TEMP_HIGH_C

_TABLES: tuple[dict[str, object], ...] = (
    {
        "name": "gpu-utilization-high",
        "expr": "utilization_pct > 95",
        "scope": "host",
        "for": "5m",
        "severity": "warning",
        "message": "{host}: its GPUs average {value:.0f} % busy, no headroom left",
    },
    {
        "name": "gpu-memory-high",
        "expr": f"memory_used_pct > {MEMORY_RESERVE_FRACTION * 100:g}",
        "for": "5m",
        "severity": "warning",
        "message": "{host} GPU {gpu}: {value:.0f} % of memory used, past the "
        f"{(1 - MEMORY_RESERVE_FRACTION) * 100:g} % reserve",
    },
    {
        "name": "gpu-temperature-high",
        "expr": f"temperature_c >= {TEMP_HIGH_C:g}",
        "for": "1m",
        "severity": "warning",
        "message": f"{{host}} GPU {{gpu}} at {{value:.0f}} °C (alert at {TEMP_HIGH_C:g} °C)",
    },
    {
        "name": "gpu-power-at-limit",
        "expr": "power_w >= power_limit_w * 0.98",
        "for": "5m",
        "severity": "info",
        "message": "{host} GPU {gpu} drawing {value:.0f} W, at its power limit",
    },
    {"name": "gpu-xid", "findings": ["xid", "gpu-lost"]},
    {
        "name": "gpu-ecc",
        "findings": ["ecc-uncorrectable", "row-remap-pending", "row-remap-failure"],
    },
    {
        "name": "gpu-throttling",
        "findings": ["thermal-throttle", "hw-slowdown", "power-brake"],
        "for": "1m",
    },
    {"name": "gpu-link-degraded", "findings": ["pcie-degraded"], "for": "1m"},
)

DEFAULT_RULES: tuple[AlertRule, ...] = tuple(
    rule_from_dict(table, "built-in rules") for table in _TABLES
)
