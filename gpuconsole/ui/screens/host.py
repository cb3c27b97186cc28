"""The host screen: every GPU of one host, its trends, its processes and its findings."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.widgets import DataTable

from gpuconsole.actions.processes import ProcessSignals, describe, signal_process
from gpuconsole.core.model import (
    GpuProcess,
    GpuState,
    HostSnapshot,
    HostState,
    MigInstance,
    ProcessLoad,
    Severity,
)
from gpuconsole.fleet.host_order import SORT_KEYS, fleet_order
from gpuconsole.fleet.host_state import DRAIN, state_word
from gpuconsole.rules.summary import short_model
from gpuconsole.ui.messages import (
    ShowBenchmark,
    ShowGpu,
    ShowMemoryTrials,
    ShowRepair,
    ShowService,
    ShowVerify,
    WriteBundle,
)
from gpuconsole.ui.screens.base import ConsoleScreen, Copyable, Freshness, gpu_copyables
from gpuconsole.ui.screens.confirm import ConfirmScreen
from gpuconsole.ui.screens.fleet import FleetScreen
from gpuconsole.ui.widgets import cells
from gpuconsole.ui.widgets.fitted_lines import FittedLines
from gpuconsole.ui.widgets.keyed_table import Cells, ColumnSpec, KeyedTable, fit_columns, sorted_by
from gpuconsole.ui.widgets.problem_line import WRAP_INDENT, problem_line
from gpuconsole.ui.widgets.steady import Steady
from gpuconsole.ui.widgets.trend import sparkline
from gpuconsole.ui.widgets.trend_line import TrendLine

if TYPE_CHECKING:
    from gpuconsole.actions.service import Change

WIDE_FROM = 112
"""From this width the GPU list draws bars and full figures; below it, percentages."""
_THROTTLE_FULL = 17
"""Cells for two reasons in full ("hw-therm,sw-therm"): a throttle cell this wide lists them all."""
_GPU_WIDE = (
    ColumnSpec("gpu", "GPU", 3),
    ColumnSpec("util", "Util", 13),
    ColumnSpec("memory", "Memory", 18),
    ColumnSpec("temp", "Temp", 5),
    ColumnSpec("power", "Power", 9),
    ColumnSpec("sm", "SM MHz", 6),
    ColumnSpec("mem_clock", "Mem MHz", 7),
    ColumnSpec("pstate", "P", 3),
    ColumnSpec("throttle", "Throttle", 16, grow=1, most=30),
    ColumnSpec("ecc", "ECC u/c", 7),
    ColumnSpec("pcie", "PCIe", 9),
)
# The narrow GPU list's columns by priority: utilization, memory, temperature and power stay;
# the clock, the P-state, the ECC counters and the link go in that order where the width is short.
_GPU_NARROW = (
    ColumnSpec("gpu", "GPU", 3),
    ColumnSpec("util", "Util", 4),
    ColumnSpec("memory", "Mem", 4),
    ColumnSpec("temp", "Temp", 5),
    ColumnSpec("power", "Pwr", 4),
    ColumnSpec("sm", "SM", 4, drop=4),
    ColumnSpec("pstate", "P", 3, drop=3),
    ColumnSpec("throttle", "Throttle", 10, grow=1, most=_THROTTLE_FULL),
    ColumnSpec("ecc", "ECC u/c", 7, drop=2),
    ColumnSpec("pcie", "PCIe", 5, drop=1),
)
# The process list's columns by priority: the narrow form keeps who owns a process and how hard it
# drives its GPU, and gives the command what is left; the wide one adds the memory controller's
# share, the age, and the video engines' where a process on the host uses them. Of what the fixed
# columns leave, the owner takes 2 cells in 5 (up to 28), the command the rest.
_PROCESS_HEAD = (
    ColumnSpec("gpu", "GPU", 3),
    ColumnSpec("pid", "PID", 7),
    ColumnSpec("user", "User", 9),
    ColumnSpec("sm", "SM%", 4),
)
_PROCESS_WIDE = (ColumnSpec("membw", "MemBW", 5),)
_PROCESS_VIDEO = (ColumnSpec("enc", "Enc%", 4), ColumnSpec("dec", "Dec%", 4))
_PROCESS_MEMORY = ColumnSpec("memory", "Memory", 7)
_PROCESS_AGE = ColumnSpec("age", "Age", 6)
_PROCESS_TAIL = (
    ColumnSpec("owner", "Owner", 14, grow=2, most=28),
    ColumnSpec("command", "Command", 10, grow=3),
)


@functools.lru_cache(maxsize=32)  # asked every tick, the same for a width
def gpu_columns(width: int) -> tuple[ColumnSpec, ...]:
    """The GPU list's columns on a screen ``width`` cells wide."""
    return fit_columns(_GPU_WIDE if width >= WIDE_FROM else _GPU_NARROW, width)


def _most_first(value: float | None) -> float:
    return float("inf") if value is None else -value


PROCESS_ORDERS = ("gpu", "memory", "sm", "age", "pid")
"""The process list's orders (`o` cycles them): by GPU (the biggest first on each), by GPU
memory, by SM share, the longest running first, by PID."""
_PROCESS_SORT: dict[str, Callable[[GpuProcess], tuple[float, ...]]] = {
    "gpu": lambda p: (p.gpu, _most_first(p.used_memory_mib), p.pid),
    "memory": lambda p: (_most_first(p.used_memory_mib), p.gpu, p.pid),
    "sm": lambda p: (_most_first(p.load.sm_pct if p.load else None), p.gpu, p.pid),
    "age": lambda p: (float("inf") if p.started is None else p.started, p.gpu, p.pid),
    "pid": lambda p: (p.pid, p.gpu),
}
"""Each order's key; a process without the figure comes last, ties go by GPU, then PID."""


@functools.lru_cache(maxsize=32)  # asked every tick, the same for a width
def process_columns(
    width: int, video: bool, order: str = PROCESS_ORDERS[0]
) -> tuple[ColumnSpec, ...]:
    """The process list's columns on a screen ``width`` cells wide; ``video``: some process on
    the host uses the encoder or decoder; ``order``: the column the rows are sorted by, whose
    header carries the arrow."""
    fixed = [*_PROCESS_HEAD]
    if width >= WIDE_FROM:
        fixed += [*_PROCESS_WIDE, *(_PROCESS_VIDEO if video else ()), _PROCESS_MEMORY, _PROCESS_AGE]
    else:
        fixed.append(_PROCESS_MEMORY)
    arrow = "▲" if order in ("gpu", "pid") else "▼"  # up: the smallest first
    marked = [sorted_by(spec, arrow) if spec.key == order else spec for spec in fixed]
    return fit_columns((*marked, *_PROCESS_TAIL), width)


_TREND_LABEL_WIDTH = 18  # "GPU 7 power " before the line, " 700W" after it
# (field, label, unit, low, high): fixed scales, so a shape means the same on every GPU; power
# is scaled to the GPU's own limit.
_TRENDS = (
    ("utilization_pct", "util", "%", 0.0, 100.0),
    ("temperature_c", "temp", "°C", 20.0, 100.0),
    ("power_w", "power", "W", 0.0, None),
)


def _process_key(process: GpuProcess) -> str:
    return f"{process.gpu}/{process.pid}"


def _uses_video(snapshot: HostSnapshot | None) -> bool:
    """Whether some process on the host uses the GPU's encoder or decoder now."""
    loads = (p.load for p in snapshot.processes) if snapshot is not None else ()
    return any(load is not None and (load.encoder_pct or load.decoder_pct) for load in loads)


class HostScreen(ConsoleScreen):
    """One host; the cursor's GPU drives the trend lines."""

    HELP_TITLE = "Host"
    HELP_ORDER = 20

    CSS = """
    HostScreen #host-info {
        /* a host that cannot be read says why here in full: the reason holds the command to run */
        height: auto;
        max-height: 8;
        padding: 0 1;
    }
    HostScreen #gpus {
        max-height: 12;
    }
    HostScreen #trends {
        height: 1;
        padding: 0 1;
    }
    HostScreen .trend {
        width: 1fr;
        height: 1;
    }
    HostScreen #host-lists {
        height: 1fr;
    }
    HostScreen #processes {
        overflow-x: hidden;
        height: 1fr;
        min-height: 3;
        border-top: solid $panel;
    }
    HostScreen #findings-panel {
        /* as tall as its findings need, within a share of the screen (`_findings_rows`) */
        height: 2;
        border-top: solid $panel;
    }
    HostScreen #findings {
        height: 1fr;
        padding: 0 1;
        text-wrap: nowrap;
    }
    """
    FOCUS_KEYS = {
        "gpus": ("host.gpu",),
        "processes": ("host.terminate", "host.kill", "copy", "host.process-order"),
    }
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="host.back"),
        Binding("t", "topology", "Topology", id="host.topology"),
        Binding(
            "v",
            "verify",
            "Verify",
            id="host.verify",
            tooltip="check the host's driver, CUDA, frameworks, PCIe, disks (runs commands there)",
        ),
        Binding(
            "b",
            "benchmark",
            "Benchmark",
            id="host.benchmark",
            tooltip="run the tuned resnet50 benchmark here (asks first) and compare it",
        ),
        Binding(
            "m",
            "memory",
            "Memory fixes",
            id="host.memory",
            tooltip="try each memory fix on bert here (asks first) and recommend the cheapest",
        ),
        Binding(
            "H",
            "history",
            "History",
            id="host.history",
            tooltip="this host's earlier benchmark runs and its peers', regressions flagged",
        ),
        Binding(
            "R",
            "repair",
            "Repair driver",
            id="host.repair",
            tooltip="diagnose a broken NVIDIA driver; each fix is shown and asked for first",
        ),
        Binding(
            "B",
            "bundle",
            "Bundle",
            id="host.bundle",
            tooltip="write an incident bundle for a ticket: readings, findings, nvidia-smi -q, "
            "kernel log, verification, actions",
        ),
        Binding(
            "D",
            "service('drain')",
            "Drain",
            id="host.drain",
            tooltip="take the host's node out of its scheduler (Slurm drain, kubectl cordon): "
            "asks why, shows the command, asks first",
        ),
        Binding(
            "U",
            "service('resume')",
            "Resume",
            id="host.resume",
            show=False,
            tooltip="bring the host's node back into its scheduler (Slurm resume, kubectl "
            "uncordon); shows the command, asks first",
        ),
        Binding(
            "enter",
            "open_gpu",
            "Open GPU",
            id="host.gpu",
            show=False,
            tooltip="the GPU under the cursor: who it is, its counters, its processes, its "
            "readings as plots",
        ),
        Binding("left_square_bracket", "other_host(-1)", "Prev host", id="host.prev"),
        Binding("right_square_bracket", "other_host(1)", "Next host", id="host.next"),
        Binding(
            "k",
            "signal_process('SIGTERM')",
            "Terminate",
            id="host.terminate",
            tooltip="send TERM to the process under the cursor (asks first)",
        ),
        Binding(
            "K",
            "signal_process('SIGKILL')",
            "Kill",
            id="host.kill",
            show=False,
            tooltip="send KILL to the process under the cursor (asks first)",
        ),
        Binding(
            "o",
            "order_processes",
            "Order",
            id="host.process-order",
            show=False,
            tooltip="sort the process list by GPU, GPU memory, SM share, age or PID; the sorted "
            "column's header has the arrow",
        ),
        Binding(
            "tab",
            "app.focus_next",
            "GPUs/processes",
            id="host.focus",
            show=False,
            tooltip="move between the GPU list and the process list",
        ),
    ]

    def __init__(self, host: str, gpu: int | None = None) -> None:
        """``gpu``: the GPU the cursor starts on; None: the worst one (`_worst_gpu`)."""
        super().__init__()
        self.host = host
        self._initial_gpu = gpu
        self._wide: bool | None = None
        self.process_order = PROCESS_ORDERS[0]

    def where(self) -> str:
        return f"host {self.host}"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Steady(id="host-info")
        yield KeyedTable(id="gpus")
        with Horizontal(id="trends"):
            for _, label, _, _, _ in _TRENDS:
                yield TrendLine(id=f"trend-{label}", classes="trend")
        with Vertical(id="host-lists"):  # the rows the two lists share
            yield KeyedTable(id="processes")
            with Vertical(id="findings-panel"):  # its border is not repainted with the findings
                yield FittedLines(indent=WRAP_INDENT, id="findings")
        yield self.key_bar()

    def on_mount(self) -> None:
        super().on_mount()
        self.call_after_refresh(self._show_findings)  # once the lists have their heights
        gpu = self._initial_gpu if self._initial_gpu is not None else self._worst_gpu()
        if gpu is not None:
            gpus = self.query_one("#gpus", KeyedTable)
            if str(gpu) in {key for key, _ in self._gpu_rows()}:
                gpus.move_cursor(row=gpus.get_row_index(str(gpu)), animate=False)
        self.query_one("#gpus", KeyedTable).focus()

    def _worst_gpu(self) -> int | None:
        """The GPU of the host's worst problem of warning or worse (the newest of equals), where
        the cursor starts: the on-call opens a host to see what is wrong with it."""
        return next(
            (
                p.gpu
                for p in self.problems
                if p.host == self.host and p.gpu is not None and p.severity > Severity.INFO
            ),
            None,
        )

    def on_resize(self, _event: Resize) -> None:
        self.refresh_view(None)
        self.call_after_refresh(self._show_findings)  # once the lists have their new heights

    @property
    def selected_gpu(self) -> int | None:
        """The GPU under the cursor (a MIG instance's row counts as its GPU)."""
        key = self.query_one("#gpus", KeyedTable).cursor_key
        return int(key.partition("/")[0]) if key is not None else None

    def reading(self) -> Freshness:
        """The host's newest reading; stale unless the host is live."""
        snapshot = self.store.latest(self.host)
        live = self.store.status(self.host).state is HostState.LIVE
        return Freshness(None if snapshot is None else snapshot.time, not live)

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        if changed is not None and self.host not in changed:
            return
        width = self.size.width or 80
        gpus = self.query_one("#gpus", KeyedTable)
        gpus.set_columns(gpu_columns(width))
        self._wide = width >= WIDE_FROM
        snapshot = self.store.latest(self.host)
        self.query_one("#host-info", Steady).show(self._info(snapshot))
        gpus.sync(self._gpu_rows())
        processes = self.query_one("#processes", KeyedTable)
        columns = process_columns(self.size.width or 80, _uses_video(snapshot), self.process_order)
        processes.set_columns(columns)
        processes.sync(self._process_rows(snapshot, columns))
        self._show_trends()
        self._show_findings()

    def _info(self, snapshot: HostSnapshot | None) -> Text:
        status = self.store.status(self.host)
        word = state_word(status.state, snapshot)
        style = f"bold {self.palette['severity-warning']}" if word == DRAIN else ""
        line = Text.assemble((self.host, "bold"), "  ", (word, style))
        if status.reason:
            line.append(f" ({status.reason})", style=self.palette["severity-warning"])
        if snapshot is None:
            return line
        models = {short_model(g.name) for g in snapshot.gpus if g.name}
        line.append(f"  ·  {len(snapshot.gpus)}× {', '.join(sorted(models)) or 'N/A'}")
        line.append(f"  ·  driver {snapshot.driver_version or 'N/A'}")
        line.append(f"  ·  CUDA {snapshot.cuda_version or 'N/A'}")
        node = snapshot.node
        if node is not None and node.out_of_service:  # in service is the usual: not worth a line
            warning = f"bold {self.palette['severity-warning']}"
            line.append(f"\n{node.scheduler} node {node.name} {node.described}", style=warning)
        return line

    def _gpu_rows(self) -> list[tuple[str, Cells]]:
        snapshot = self.store.latest(self.host)
        if snapshot is None:
            return []
        rows = []
        for gpu in snapshot.gpus:
            rows.append((str(gpu.index), self._gpu_cells(gpu)))
            rows.extend(
                (f"{gpu.index}/mig{mig.gpu_instance_id}", self._mig_cells(mig))
                for mig in gpu.mig_instances
            )
        return rows

    def _mig_cells(self, mig: MigInstance) -> Cells:
        """A MIG instance: its profile and memory. NVML gives no utilization per instance, so
        utilization reads N/A rather than a 0 that would look idle."""
        columns = self.query_one("#gpus", KeyedTable).columns_shown
        if self._wide:
            memory = cells.memory_bar(
                mig.memory_used_mib, mig.memory_total_mib, self.palette, width=7
            )
        else:
            memory = cells.memory_percent(mig.memory_used_mib, mig.memory_total_mib, self.palette)
        shown = {
            "gpu": Text(f"└{mig.gpu_instance_id}", style="dim"),
            "util": cells.na(),
            "memory": memory,
            "throttle": Text(f"MIG {mig.profile or '?'}", style="dim"),
        }
        return tuple(shown.get(spec.key, Text("")) for spec in columns)

    def _gpu_cells(self, gpu: GpuState) -> Cells:
        """The GPU's cells for the columns shown: bars and full figures in the wide form,
        percentages in the narrow one."""
        palette = self.palette
        columns = self.query_one("#gpus", KeyedTable).columns_shown
        index = Text(str(gpu.index), style="bold")
        if gpu.lost:
            lost = Text("LOST", style=f"bold {palette['severity-critical']}")
            return tuple({"gpu": index, "util": lost}.get(c.key, Text("")) for c in columns)
        ecc = gpu.ecc
        wide = self._wide
        width = {spec.key: spec.width for spec in columns}
        shown = {
            "gpu": index,
            "util": cells.utilization_bar(gpu.utilization_pct, palette, width=7)
            if wide
            else cells.percent(gpu.utilization_pct, palette),
            "memory": cells.memory_bar(gpu.memory_used_mib, gpu.memory_total_mib, palette, width=7)
            if wide
            else cells.memory_percent(gpu.memory_used_mib, gpu.memory_total_mib, palette),
            "temp": cells.temperature(gpu.temperature_c, palette, gpu.slowdown_temperature_c),
            "power": cells.power(gpu.power_w, gpu.power_limit_w)
            if wide
            else cells.power_percent(gpu.power_w, gpu.power_limit_w),
            "sm": cells.number(gpu.sm_clock_mhz),
            "mem_clock": cells.number(gpu.memory_clock_mhz),
            "pstate": cells.text(gpu.pstate),
            "throttle": cells.throttle(gpu.throttle_reasons, palette, width=width.get("throttle")),
            "ecc": cells.ecc(
                ecc.volatile_uncorrected if ecc else None,
                ecc.volatile_corrected if ecc else None,
                palette,
            ),
            "pcie": cells.pcie(gpu.pcie, palette, compact=not wide),
        }
        return tuple(shown[spec.key] for spec in columns)

    def _process_rows(
        self, snapshot: HostSnapshot | None, columns: tuple[ColumnSpec, ...]
    ) -> list[tuple[str, Cells]]:
        if snapshot is None:
            return []
        ordered = sorted(snapshot.processes, key=_PROCESS_SORT[self.process_order])
        return [(_process_key(p), self._process_cells(p, snapshot.time, columns)) for p in ordered]

    def _process_cells(self, p: GpuProcess, now: float, columns: tuple[ColumnSpec, ...]) -> Cells:
        load = p.load or ProcessLoad()
        width = {spec.key: spec.width for spec in columns}
        memory = (
            cells.na() if p.used_memory_mib is None else Text(f"{cells.gib(p.used_memory_mib)} GiB")
        )
        shown = {
            "gpu": Text(str(p.gpu)),
            "pid": Text(str(p.pid)),
            "user": cells.text(p.user, width["user"]),
            "sm": cells.percent(load.sm_pct, self.palette),
            "membw": cells.share(load.memory_pct),
            "enc": cells.share(load.encoder_pct),
            "dec": cells.share(load.decoder_pct),
            "memory": memory,
            "age": cells.age(None if p.started is None else now - p.started),
            "owner": cells.text(p.owner, width["owner"]),
            "command": cells.text(p.command, width["command"]),
        }
        return tuple(shown[spec.key] for spec in columns)

    def _show_trends(self) -> None:
        gpu = self.selected_gpu
        snapshot = self.store.latest(self.host)
        state = snapshot.gpu(gpu) if snapshot is not None and gpu is not None else None
        for field, label, unit, low, high in _TRENDS:
            widget = self.query_one(f"#trend-{label}", TrendLine)
            width = max(8, (widget.size.width or 38) - _TREND_LABEL_WIDTH)
            values = self.store.series(self.host, gpu, field, width) if gpu is not None else []
            top = high if high is not None else (state.power_limit_w if state else None)
            if not values or top is None:
                widget.show([(f"GPU {gpu if gpu is not None else '-'} {label}: N/A", "dim")])
                continue
            now = values[-1]
            widget.show(
                [
                    (f"GPU {gpu} {label} ", "dim"),
                    (sparkline(values, low, top, width), self._trend_style(label, now, state)),
                    (f" {now:.0f}{unit}", ""),
                ]
            )

    def _trend_style(self, label: str, now: float, state: GpuState | None) -> str:
        if label == "util":
            return self.palette.utilization(now)
        if label == "temp":
            return self.palette.temperature(now, state.slowdown_temperature_c if state else None)
        return self.palette["util-mid"]

    def _show_findings(self) -> None:
        """The host's problems as the triage view tells them, each wrapped onto the rows it
        needs; the panel is as tall as they need where they and every process fit, else a share
        of the rows (`_findings_rows`), and where they do not fit, the last row says how many
        more there are."""
        problems = [p for p in self.problems if p.host == self.host]
        widget = self.query_one("#findings", FittedLines)
        if problems:
            lines = [problem_line(problem, self.palette) for problem in problems]
        else:
            lines = [Text("No findings: every rule passes on this host.", style="dim")]
        width = widget.content_size.width or (self.size.width or 80) - 2
        needed = widget.rows_needed(lines, width)
        self.query_one("#findings-panel").styles.height = self._findings_rows(needed) + 1
        widget.show_lines(lines, ": T lists every problem with what to do")

    def _findings_rows(self, needed: int) -> int:
        """The findings' rows: all they need where they and every process fit in the rows the
        two lists share; else at most half of those rows, and at least two."""
        processes = self.query_one("#processes", KeyedTable)
        shared = self.query_one("#host-lists").size.height
        if not shared:  # before the first layout: the rows an 8-GPU host leaves
            shared = max(6, (self.size.height or 24) - 14)
        wanted = max(needed, 1)
        if wanted + 1 + processes.row_count + 2 <= shared:  # + borders and the header
            return wanted
        return min(wanted, max(2, shared // 2 - 1))

    @on(DataTable.RowHighlighted, "#gpus")
    def _gpu_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._show_trends()

    @on(DataTable.RowSelected, "#gpus")
    def _gpu_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_gpu()

    def action_order_processes(self) -> None:
        index = PROCESS_ORDERS.index(self.process_order)
        self.process_order = PROCESS_ORDERS[(index + 1) % len(PROCESS_ORDERS)]
        self.refresh_view(None)

    def action_open_gpu(self) -> None:
        gpu = self.selected_gpu
        if gpu is not None:
            self.post_message(ShowGpu(self.host, gpu))

    def action_topology(self) -> None:
        from gpuconsole.ui.screens.topology import TopologyScreen

        self.app.push_screen(TopologyScreen(self.host))

    def _selected_process(self) -> GpuProcess | None:
        table = self.query_one("#processes", KeyedTable)
        snapshot = self.store.latest(self.host)
        if not table.has_focus or table.cursor_key is None or snapshot is None:
            return None
        return next((p for p in snapshot.processes if _process_key(p) == table.cursor_key), None)

    def action_signal_process(self, signal_name: str) -> None:
        """Confirm, then TERM (k) or KILL (K) the process under the process list's cursor."""
        process = self._selected_process()
        if process is None:
            self.notify("select a process first: Tab to the process list", severity="warning")
            return
        signals = self.console.signals
        if signals is None or not signals.can_signal(self.host):
            self.notify(
                f"{self.host}: its processes cannot be signalled from here; nothing sent",
                severity="warning",
            )
            return
        sig = signal.Signals[signal_name]

        def answered(yes: bool | None) -> None:
            if yes:
                self._send_signal(signals, process, sig)

        question = f"Send {sig.name} to this process on {self.host}?"
        self.app.push_screen(ConfirmScreen(question, describe(process)), answered)

    @work(thread=True, exit_on_error=False, group="signal", description="signal a process")
    def _send_signal(
        self, signals: ProcessSignals, process: GpuProcess, sig: signal.Signals
    ) -> None:
        """Off the UI thread: a remote host's agent may take seconds to answer."""
        result = signal_process(signals, self.host, process, sig)
        self.app.call_from_thread(
            self.notify, result.message, severity="information" if result.sent else "error"
        )

    def action_verify(self) -> None:
        self.post_message(ShowVerify([self.host]))

    def action_benchmark(self) -> None:
        self.post_message(ShowBenchmark(self.host))

    def action_memory(self) -> None:
        self.post_message(ShowMemoryTrials(self.host))

    def action_history(self) -> None:
        from gpuconsole.ui.screens.history import HistoryScreen

        self.app.push_screen(HistoryScreen(self.host))

    def action_repair(self) -> None:
        self.post_message(ShowRepair(self.host))

    def action_bundle(self) -> None:
        self.post_message(WriteBundle(self.host))

    def action_service(self, change: Change) -> None:
        self.post_message(ShowService(self.host, change))

    def action_other_host(self, step: int) -> None:
        """The host before or after this one in the fleet's list as the fleet shows it (its
        order, its filter; the whole fleet where the filter leaves this host out)."""
        fleet = next((s for s in self.app.screen_stack if isinstance(s, FleetScreen)), None)
        hosts = fleet.ordered_hosts() if fleet is not None else []
        if self.host not in hosts:
            hosts = fleet_order(
                self.store,
                fleet.sort_key if fleet else SORT_KEYS[0],
                reverse=fleet.sort_reverse if fleet else False,
            )
        target = hosts[(hosts.index(self.host) + step) % len(hosts)]
        self.app.switch_screen(HostScreen(target))

    def copyables(self) -> list[Copyable]:
        """In the process list: the process's PID, command, user and owner; in the GPU list:
        the GPU's UUID and PCI bus id; then the host's name."""
        snapshot = self.store.latest(self.host)
        found: list[Copyable] = []
        process = self._selected_process()
        if process is not None:
            found += _process_copyables(process)
        elif snapshot is not None and self.selected_gpu is not None:
            gpu = snapshot.gpu(self.selected_gpu)
            found += [] if gpu is None else gpu_copyables(self.host, gpu)
        return [*found, Copyable("host name", self.host)]


def _process_copyables(process: GpuProcess) -> list[Copyable]:
    """A process's PID first (for kill, py-spy, nvidia-smi), then what else names it."""
    found = [Copyable("PID", str(process.pid))]
    if process.command:
        found.append(Copyable("command", process.command))
    if process.user:
        found.append(Copyable("user", process.user))
    if process.owner_described:
        found.append(Copyable("owner", process.owner_described))
    return found
