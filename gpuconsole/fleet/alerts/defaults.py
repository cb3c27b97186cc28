"""The built-in rules: the health findings worth a page, on by default, and the guide's capacity
thresholds (§4.2), which an alerts file may turn on (``enable``).

A page is for what needs a person now: a GPU lost or raising XIDs, ECC and row-remap faults, a
GPU slowing down, a link trained down, a GPU hotter than the alert temperature. A GPU busy,
using its memory or drawing its power limit is what a training job does: the health rules say
so as findings (``mem-pressure``, ``power-cap``), advice the triage view and the host screen
show, and the capacity rules below stay off unless the alerts file enables them.

The guide's own example rule takes ``rate()`` of a utilization gauge, which measures how fast
utilization changes, not how high it is; these compare the readings themselves.
"""

from __future__ import annotations

from gpuconsole.fleet.alerts.rules import AlertRule, rule_from_dict
from gpuconsole.rules.limits import MEMORY_RESERVE_FRACTION, TEMP_HIGH_C

_PAGING: tuple[dict[str, object], ...] = (
    {
        "name": "gpu-temperature-high",
        "expr": f"temperature_c >= {TEMP_HIGH_C:g}",
        "for": "1m",
        "severity": "warning",
        "message": f"{{host}} GPU {{gpu}} at {{value:.0f}} °C (alert at {TEMP_HIGH_C:g} °C)",
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
_CAPACITY: tuple[dict[str, object], ...] = (
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
        "name": "gpu-power-at-limit",
        "expr": "power_w >= power_limit_w * 0.98",
        "for": "5m",
        "severity": "info",
        "message": "{host} GPU {gpu} drawing {value:.0f} W, at its power limit",
    },
)

DEFAULT_RULES: tuple[AlertRule, ...] = tuple(
    rule_from_dict(table, "built-in rules") for table in _PAGING
)
"""The rules on unless an alerts file disables them: each pages for what needs a person."""
CAPACITY_RULES: tuple[AlertRule, ...] = tuple(
    rule_from_dict(table, "built-in rules") for table in _CAPACITY
)
"""Built-in rules an alerts file may turn on (``enable``): capacity, not faults."""
BUILT_IN_RULES: tuple[AlertRule, ...] = DEFAULT_RULES + CAPACITY_RULES
