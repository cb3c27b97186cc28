"""The topology screen: the GPU × GPU matrix as `nvidia-smi topo -m` prints it, and advice."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import groupby

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from gpuconsole.core.model import (
    LINK_LEGEND,
    Finding,
    HostSnapshot,
    Severity,
    TooManySets,
    Topology,
    nvlink_count,
)
from gpuconsole.core.xid import FALLEN_OFF_THE_BUS
from gpuconsole.ui.screens.base import ConsoleScreen
from gpuconsole.ui.widgets.cells import Palette


def link_style(link: str, palette: Palette) -> str:
    if link == "X":
        return "dim"
    if nvlink_count(link):
        return f"bold {palette['link-nvlink']}"
    return palette["link-sys"] if link in ("SYS", "NODE") else palette["link-pcie"]


def matrix_table(topology: Topology, palette: Palette) -> Table:
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    table.add_column("")
    for index in range(topology.gpu_count):
        table.add_column(f"GPU{index}", justify="center")
    table.add_column("CPU Affinity")
    table.add_column("NUMA")
    for a, row in enumerate(topology.matrix):
        cpu = topology.cpu_affinity[a] if a < len(topology.cpu_affinity) else None
        numa = topology.numa_affinity[a] if a < len(topology.numa_affinity) else None
        table.add_row(
            Text(f"GPU{a}", style="bold"),
            *(Text(link, style=link_style(link, palette)) for link in row),
            Text(cpu) if cpu else Text("N/A", style="dim"),
            Text("N/A", style="dim") if numa is None else str(numa),
        )
    return table


def legend(topology: Topology, palette: Palette) -> Text:
    present = {cell for row in topology.matrix for cell in row}
    present = {"NV#" if nvlink_count(c) else c for c in present}
    text = Text("Legend\n", style="bold")
    for code, meaning in LINK_LEGEND.items():
        if code in present or code == "X":
            sample = "NV18" if code == "NV#" else code
            text.append(f"  {code:<5}", style=link_style(sample, palette))
            text.append(f"{meaning}\n")
    return text


SETS_SHOWN = 4
"""How many sets of each size the advice lists, best first."""
_SPANS_MARK = "*"
"""After a set that spans NUMA nodes, explained once below the sets."""


def left_out(
    snapshot: HostSnapshot, topology: Topology, findings: Iterable[Finding] = ()
) -> dict[int, str]:
    """The GPUs of ``topology`` no set may hold, each with why: lost (fallen off the bus, as the
    GPU's state or an XID 79 says; the health rules' ``gpu-lost``), absent from the reading, or
    with a critical finding among ``findings`` (the worst one named): a job should not land there.
    """
    fallen = {event.gpu for event in snapshot.xid_events if event.xid == FALLEN_OFF_THE_BUS}
    reasons: dict[int, str] = {}
    for index in range(topology.gpu_count):
        gpu = snapshot.gpu(index)
        if gpu is None:
            reasons[index] = "not in the reading"
        elif gpu.lost or index in fallen:
            reasons[index] = "fallen off the bus"
    for finding in findings:
        gpu_index = -1 if finding.gpu is None else finding.gpu
        if finding.severity is Severity.CRITICAL and 0 <= gpu_index < topology.gpu_count:
            reasons.setdefault(gpu_index, f"critical finding {finding.code}")
    return dict(sorted(reasons.items()))


def offered_sizes(available: int) -> list[int]:
    """The set sizes the advice ranks: 2, 4, 8... up to ``available``, and ``available`` itself
    (every GPU that answers) when it is not a power of two."""
    sizes = [1 << power for power in range(1, available.bit_length())]
    return sizes if available < 2 or available in sizes else [*sizes, available]


def _gpu_set(gpus: tuple[int, ...]) -> str:
    return "{" + ",".join(map(str, gpus)) + "}"


def advice(topology: Topology, palette: Palette, skipped: Mapping[int, str]) -> Text:
    """Which GPU sets are best connected: where to put jobs that talk a lot between GPUs.

    One line per set size; on it the sets best first, each run of sets followed by the weakest
    link they share (`Topology.best_sets`). GPUs in ``skipped`` are in no set."""
    text = Text("Best-connected GPU sets (put communication-heavy jobs here)\n", style="bold")
    for index, why in skipped.items():
        text.append(f"  GPU {index} left out: {why}\n", style=palette["severity-warning"])
    sizes = offered_sizes(topology.gpu_count - len(skipped))
    spanning = False
    if not sizes:
        text.append("  Fewer than 2 GPUs answer: no sets to rank.\n", style="dim")
    for k in sizes:
        text.append(f"  best {k} GPUs: ", style="bold")
        try:
            sets = topology.best_sets(k, SETS_SHOWN, leave_out=skipped.keys())
        except TooManySets as error:
            text.append(f"{error}\n", style="dim")
            continue
        for i, (weakest, run) in enumerate(groupby(sets, key=lambda s: s.weakest)):
            text.append(" · " if i else "")
            for gpu_set in run:
                spans = topology.spans_numa(gpu_set.gpus)
                spanning = spanning or spans
                text.append(_gpu_set(gpu_set.gpus))
                text.append(_SPANS_MARK if spans else "", style="bold")
                text.append(" ")
            text.append(weakest, style=link_style(weakest, palette))
        text.append("\n")
    if spanning:
        text.append(f"  {_SPANS_MARK} spans NUMA nodes: host-side traffic crosses sockets\n", "dim")
    if not any(nvlink_count(c) for row in topology.matrix for c in row):
        text.append(
            "  No NVLink on this host: GPU-to-GPU traffic crosses PCIe; prefer GPUs under one "
            "switch (PIX) or one NUMA node.\n",
            style=palette["severity-warning"],
        )
    return text


class TopologyScreen(ConsoleScreen):
    """How one host's GPUs are connected."""

    HELP_TITLE = "Topology"
    HELP_ORDER = 30

    CSS = """
    TopologyScreen #topology-body {
        padding: 0 1;
    }
    """
    BINDINGS = [Binding("escape", "app.pop_screen", "Back", id="topology.back")]

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host
        self._shown: tuple[Topology, Palette, dict[int, str]] | None = None

    def where(self) -> str:
        return f"topology of {self.host}"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        with VerticalScroll(id="topology-body"):
            yield Static(id="topology", markup=False)
        yield self.key_bar()

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        if changed is not None and self.host not in changed:
            return
        snapshot = self.store.latest(self.host)
        body = self.query_one("#topology", Static)
        if snapshot is None or snapshot.topology is None:
            body.update(Text(f"{self.host}: no topology reading yet", style="dim"))
            return
        topology = snapshot.topology
        palette = self.palette
        skipped = left_out(snapshot, topology, self.store.findings(self.host))
        if self._shown == (topology, palette, skipped):
            return
        self._shown = (topology, palette, skipped)
        body.update(
            Group(
                Text(f"{self.host}: {topology.gpu_count} GPUs", style="bold"),
                matrix_table(topology, palette),
                Text(""),
                legend(topology, palette),
                advice(topology, palette, skipped),
            )
        )
