"""Human-readable output of the subcommands (the `--json` forms live in `jsonout`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from gpuconsole.core.fields import gib
from gpuconsole.core.model import Finding, HostSnapshot
from gpuconsole.core.untrusted import visible
from gpuconsole.rules.summary import short_model

_BADGES = {0: "info", 1: "WARN", 2: "CRIT"}


def _value(value: float | None, fmt: str, unit: str = "") -> str:
    return "N/A" if value is None else f"{value:{fmt}}{unit}"


def shown_path(path: Path | str) -> str:
    """A file's name as one line to print: whoever named the file (a dump a ticket brought)
    chose it, so line breaks and control characters are made visible (`visible`), and bytes
    that are not UTF-8 show as ``\\xNN`` (printed raw, a byte such as 0x9b is an escape
    sequence to a terminal that takes 8-bit controls)."""
    return visible(os.fsencode(path).decode("utf-8", "backslashreplace"))


def snapshot_text(snapshot: HostSnapshot) -> str:
    """One line per GPU and per process, the way an admin pastes it into a ticket."""
    lines = [
        f"{snapshot.host}: {len(snapshot.gpus)} GPUs, driver {snapshot.driver_version or 'N/A'}, "
        f"CUDA {snapshot.cuda_version or 'N/A'} (from {snapshot.source})"
    ]
    for g in snapshot.gpus:
        if g.lost:
            lines.append(f"  GPU {g.index} {g.pci_bus_id or ''} LOST: not answering")
            continue
        memory = (
            "N/A"
            if g.memory_used_mib is None or g.memory_total_mib is None
            else f"{gib(g.memory_used_mib)}/{gib(g.memory_total_mib)} GiB"
        )
        lines.append(
            f"  GPU {g.index} {short_model(g.name) or 'N/A'} {g.pci_bus_id or ''}  "
            f"util {_value(g.utilization_pct, '.0f', '%')}  mem {memory}  "
            f"{_value(g.temperature_c, '.0f', '°C')}  "
            f"{_value(g.power_w, '.0f')}/{_value(g.power_limit_w, '.0f', ' W')}  "
            f"SM {_value(g.sm_clock_mhz, '.0f', ' MHz')}  {g.pstate or 'N/A'}"
        )
    for p in snapshot.processes:
        memory = "N/A" if p.used_memory_mib is None else f"{gib(p.used_memory_mib)} GiB"
        facts = [f"{memory} {p.user or 'N/A'}"]
        if p.load is not None:
            facts.append(f"SM {_value(p.load.sm_pct, '.0f', '%')}")
        if p.owner_described:
            facts.append(p.owner_described)
        command = f": {p.command}" if p.command else ""
        lines.append(f"  pid {p.pid} on GPU {p.gpu}: {', '.join(facts)}{command}")
    if snapshot.node is not None:
        node = snapshot.node
        lines.append(f"  {node.scheduler} node {node.name}: {node.described}")
    return "\n".join(lines)


def findings_text(findings: Iterable[Finding]) -> str:
    lines = []
    for f in findings:
        where = "host " if f.gpu is None else f"GPU {f.gpu}"
        lines.append(f"{_BADGES[int(f.severity)]}  {where:<6} {f.code}: {f.message}")
        lines.append(f"      → {f.remediation}")
    return "\n".join(lines) if lines else "no findings: every rule passes"
