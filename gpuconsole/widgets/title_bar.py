"""The one-line fleet summary at the top of every screen."""

from __future__ import annotations

from collections import Counter

from rich.text import Text

from gpuconsole.model import HostState, Severity
from gpuconsole.store import FleetStore
from gpuconsole.widgets.cells import Palette


def fleet_line(store: FleetStore, label: str, palette: Palette, where: str = "") -> Text:
    """'gpuconsole · demo rack · 6 hosts: 5 live, 1 down · 40 GPUs · 2 critical, 1 warning'."""
    states = Counter(store.status(host).state for host in store.hosts)
    severities = Counter(store.severity(host) for host in store.hosts)
    gpus = sum(len(s.gpus) for host in store.hosts if (s := store.latest(host)) is not None)
    line = Text.assemble(("gpuconsole", "bold"), f" · {label} · {len(store.hosts)} hosts: ")
    line.append(", ".join(f"{n} {state.value}" for state, n in _ordered(states)))
    line.append(f" · {gpus} GPUs")
    for severity in (Severity.CRITICAL, Severity.WARNING):
        if severities[severity]:
            word = "critical" if severity is Severity.CRITICAL else "warning"
            line.append(" · ")
            line.append(
                f"{severities[severity]} {word}", style=f"bold {palette.severity(severity)}"
            )
    if where:
        line.append(f" · {where}", style="dim")
    return line


def _ordered(states: Counter[HostState]) -> list[tuple[HostState, int]]:
    return [(state, states[state]) for state in HostState if states[state]]
