"""The fleet screen: one row per host, worst first, each expandable to its GPUs."""

from __future__ import annotations

import functools
from dataclasses import replace

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.widgets import DataTable, Input

from gpuconsole.core.model import (
    GpuProcess,
    GpuState,
    HostSnapshot,
    HostState,
    Severity,
)
from gpuconsole.fleet.host_order import SORT_KEYS, fleet_order, owners
from gpuconsole.fleet.host_state import DRAIN, state_word
from gpuconsole.fleet.triage_list import TriageItem
from gpuconsole.rules.summary import short_model, summarize
from gpuconsole.ui.messages import ShowVerify
from gpuconsole.ui.screens.base import ConsoleScreen, Copyable, gpu_copyables
from gpuconsole.ui.widgets import cells
from gpuconsole.ui.widgets.filter_box import FilterBox
from gpuconsole.ui.widgets.fitted_lines import FittedLines
from gpuconsole.ui.widgets.keyed_table import (
    Cells,
    ColumnSpec,
    KeyedTable,
    fit_columns,
    sorted_by,
)
from gpuconsole.ui.widgets.problem_line import WRAP_INDENT, problem_line
from gpuconsole.ui.widgets.title_bar import Part, part

# Wide layout from this many columns on; below it the narrow one keeps the problem readable.
WIDE_FROM = 116
_FIXED_WIDE = (
    ColumnSpec("host", "Host", 12),
    ColumnSpec("state", "State", 5),
    ColumnSpec("gpus", "GPUs", 18),
    ColumnSpec("util", "Util avg/max", 12),
    ColumnSpec("memory", "Memory GiB", 10),
    ColumnSpec("temp", "Hottest", 8),
    ColumnSpec("power", "Power", 10),
)
_FIXED_NARROW = (
    ColumnSpec("host", "Host", 11),
    ColumnSpec("state", "State", 5),
    ColumnSpec("util", "Util", 4),
    ColumnSpec("memory", "Mem", 4),
    ColumnSpec("temp", "Temp", 5),
    ColumnSpec("power", "Pwr", 4),
)
_MIN_PROBLEM_WIDTH = 20
_MESSAGE_FROM = 40  # below this width the problem column names the finding's code
_JOBS = ColumnSpec("jobs", "Jobs", 24, drop=1)
"""Whose work runs on the host: shown only where the problem keeps its message beside it."""


_BARS = 2
"""The title line and the key bar."""


@functools.lru_cache(maxsize=64)  # asked every tick, the same for a width and an order
def fleet_columns(
    width: int, sort_key: str = SORT_KEYS[0], reverse: bool = False
) -> tuple[ColumnSpec, ...]:
    """The fleet's columns ``width`` cells wide: the jobs where the problem keeps its message
    beside them (`_MESSAGE_FROM`), the problem taking the rest; the column the hosts are sorted
    by says so with an arrow (`sort_mark`)."""
    fixed = _FIXED_WIDE if width >= WIDE_FROM else _FIXED_NARROW
    fixed = tuple(_marked(spec, sort_key, reverse) for spec in fixed)
    problem = _marked(
        ColumnSpec("problem", "Worst problem", _MESSAGE_FROM, grow=1), sort_key, reverse
    )
    columns = fit_columns((*fixed, _JOBS, problem), width)
    if any(spec.key == "jobs" for spec in columns):
        return columns
    return fit_columns((*fixed, replace(problem, width=_MIN_PROBLEM_WIDTH)), width)


_SORTED_COLUMN = {
    "worst": "problem",
    "name": "host",
    "utilization": "util",
    "temperature": "temp",
    "power": "power",
    "memory": "memory",
}
"""The column each order sorts by."""


def _slowdown_of(snapshot: HostSnapshot, gpu: int | None) -> float | None:
    """The slowdown temperature of a host's GPU (its hottest), for the band of its colour."""
    state = snapshot.gpu(gpu) if gpu is not None else None
    return state.slowdown_temperature_c if state is not None else None


def sort_mark(sort_key: str, reverse: bool) -> str:
    """▼ where the order runs from the most (the worst, the highest) down, ▲ where it runs up
    (names A to Z, or an order reversed)."""
    descending = sort_key != "name"
    return "▼" if descending != reverse else "▲"


def _marked(spec: ColumnSpec, sort_key: str, reverse: bool) -> ColumnSpec:
    if _SORTED_COLUMN[sort_key] != spec.key:
        return spec
    return sorted_by(spec, sort_mark(sort_key, reverse))


def back_to_fleet(app: App[object]) -> FleetScreen | None:
    """Pop the screens above the fleet's (the palette's screens and `:` go from there, so that
    Esc leads back to it); the fleet screen, where it is the one shown then."""
    while len(app.screen_stack) > 2 and not isinstance(app.screen, FleetScreen):
        app.pop_screen()
    return app.screen if isinstance(app.screen, FleetScreen) else None


_STATE_STYLE = {
    HostState.LIVE: "severity-info",
    HostState.CONNECTING: "util-low",
    HostState.STALE: "severity-warning",
    HostState.DOWN: "severity-critical",
    HostState.AUTH_FAILED: "severity-critical",
    HostState.HOST_KEY_MISMATCH: "severity-critical",
    HostState.HOST_KEY_UNKNOWN: "severity-critical",
    HostState.HOST_KEY_REVOKED: "severity-critical",
    HostState.REFUSED: "severity-critical",
    HostState.NO_DRIVER: "severity-critical",
    HostState.AGENT_ERROR: "severity-critical",
}


def gpu_row_key(host: str, gpu: int) -> str:
    return f"{host}/{gpu}"


class FleetScreen(ConsoleScreen):
    """Every host at a glance; Enter opens a host, Space shows its GPUs."""

    HELP_TITLE = "Fleet"
    HELP_ORDER = 10

    WHERE = "fleet"
    CSS = """
    FleetScreen #fleet {
        /* the rows its hosts need, set with the detail's (`_show_detail`) */
        height: 1fr;
        max-height: 100%;
    }
    FleetScreen #fleet-detail {
        /* as tall as the cursor host's problems need (`_detail_rows`), right under the hosts */
        height: 3;
        border-top: solid $panel;
        padding: 0 1;
    }
    """
    PINNED_KEYS = frozenset({"fleet.open", "alerts", "triage", "quit"})
    FOCUS_KEYS = {"fleet": ("fleet.open",)}
    BINDINGS = [
        Binding("enter", "open_host", "Open host", id="fleet.open", tooltip="open the host or GPU"),
        Binding(
            "space", "toggle_expand", "GPUs", id="fleet.expand", tooltip="show or hide its GPUs"
        ),
        Binding(
            "e", "expand_all", "Expand all", id="fleet.expand-all", tooltip="every host's GPUs"
        ),
        Binding(
            "s",
            "cycle_sort",
            "Sort",
            id="fleet.sort",
            tooltip="worst first, name, utilization, temperature, power, memory; the sorted "
            "column's header has the arrow",
        ),
        Binding(
            "S",
            "reverse_sort",
            "Reverse",
            id="fleet.reverse",
            show=False,
            tooltip="the same order the other way round (the best first, the lowest first)",
        ),
        Binding(
            "slash",
            "filter",
            "Filter",
            id="fleet.filter",
            tooltip="by host, state, GPU model, problem, job, pod or user",
        ),
        Binding("t", "topology", "Topology", id="fleet.topology", tooltip="how its GPUs connect"),
        Binding(
            "v",
            "verify",
            "Verify",
            id="fleet.verify",
            tooltip="check the host's driver, CUDA, frameworks, PCIe, disks (runs commands there)",
        ),
        Binding(
            "V",
            "verify_all",
            "Verify all",
            id="fleet.verify-all",
            show=False,
            tooltip="verify every host at once: a check × host matrix",
        ),
        Binding("escape", "clear_filter", "Clear filter", id="fleet.clear-filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.sort_key = SORT_KEYS[0]
        self.sort_reverse = False
        self.filter_text = ""
        self.expanded: set[str] = set()
        self._wide: bool | None = None
        self._jobs_shown = False
        self._problem_width = _MIN_PROBLEM_WIDTH
        self._problems: dict[tuple[str, int | None], list[TriageItem]] = {}
        """The problems of each host (GPU None) and GPU, worst first: this refresh's."""

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield KeyedTable(id="fleet")
        yield FittedLines(indent=WRAP_INDENT, id="fleet-detail")
        yield FilterBox(
            placeholder="filter (whole words): host, state, crit/warn, model, code, job, user",
            id="filter",
        )
        yield self.key_bar()

    def where(self) -> str:
        return "fleet"

    def title_notes(self) -> list[Part]:
        reversed_ = ", reversed" if self.sort_reverse else ""
        notes = [part(f"sorted by {self.sort_key}{reversed_}", rank=5, right=True)]
        if self.filter_text:
            notes.append(part(f"filter {self.filter_text!r}", rank=1, right=True))
        return notes

    def ordered_hosts(self) -> list[str]:
        """The hosts as the fleet lists them now: its filter, in its order."""
        return fleet_order(self.store, self.sort_key, self.filter_text, self.sort_reverse)

    @property
    def table(self) -> KeyedTable:
        return self.query_one("#fleet", KeyedTable)

    def on_resize(self, _event: Resize) -> None:
        self.refresh_view(None)

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        self._set_columns()
        self.table.sync(self._rows())
        self._show_detail()

    def _show_detail(self) -> None:
        """Under the hosts, the problems of the host (or GPU) under the cursor, each with its
        remedy in full, wrapped: what the cut "Worst problem" cell leads to, in the rows a
        short fleet leaves empty."""
        target = self._cursor_host()
        detail = self.query_one("#fleet-detail", FittedLines)
        if target is None:
            detail.display = False
            return
        host, gpu = target
        problems = self._problems.get((host, gpu), [])
        status = self.store.status(host)
        word = state_word(status.state, self.store.latest(host))
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}" if problems else ""
        head = Text.assemble(
            (host if gpu is None else f"{host} GPU {gpu}", "bold"),
            f" · {word}",
            (
                f" · {count} (T lists them all)" if count else " · no problem: every rule passes",
                "dim",
            ),
        )
        lines = [head, *(problem_line(problem, self.palette) for problem in problems)]
        width = detail.content_size.width or (self.size.width or 80) - 2
        rows = self._detail_rows(detail.rows_needed(lines, width))
        detail.styles.height = rows + 1
        # the hosts take the rows they need and the detail sits under them; where they need
        # more than is left, they scroll in what the detail leaves
        room = (self.size.height or 24) - _BARS - (rows + 1)
        self.table.styles.height = max(3, min(self.table.row_count + 1, room))
        detail.display = True
        detail.show_lines(lines, ": T lists every problem with what to do")

    def _detail_rows(self, needed: int) -> int:
        """All the rows the detail needs where the hosts leave them; else a quarter of the
        screen (at least two)."""
        height = self.size.height or 24
        free = height - _BARS - (self.table.row_count + 1) - 1  # the hosts, the detail's border
        return max(1, min(needed, max(free, 2, height // 4)))

    def _set_columns(self) -> None:
        width = self.size.width or 80
        columns = fleet_columns(width, self.sort_key, self.sort_reverse)
        widths = {spec.key: spec.width or 0 for spec in columns}
        self._jobs_shown = "jobs" in widths
        self._problem_width = widths["problem"]
        self.table.set_columns(columns)
        self._wide = width >= WIDE_FROM

    def _rows(self) -> list[tuple[str, Cells]]:
        self._problems = {}
        for problem in self.problems:  # worst first: each list's first is its worst
            self._problems.setdefault((problem.host, None), []).append(problem)
            if problem.gpu is not None:
                self._problems.setdefault((problem.host, problem.gpu), []).append(problem)
        rows = []
        for host in self.ordered_hosts():
            rows.append((host, self._host_cells(host)))
            snapshot = self.store.latest(host)
            if host in self.expanded and snapshot is not None:
                last = len(snapshot.gpus) - 1
                for position, gpu in enumerate(snapshot.gpus):
                    rows.append(
                        (gpu_row_key(host, gpu.index), self._gpu_cells(host, gpu, position == last))
                    )
        return rows

    def _host_cells(self, host: str) -> Cells:
        palette = self.palette
        status = self.store.status(host)
        snapshot = self.store.latest(host)
        glyph = "▾ " if host in self.expanded else "▸ "
        name = Text.assemble(glyph, (host, "bold"))
        state = self._state(status.state, snapshot)
        problem = self._problem(self._problems.get((host, None), []))
        if snapshot is None:
            blank = cells.na()
            middle = (blank,) * ((5 if self._wide else 4) + (1 if self._jobs_shown else 0))
            return (name, state, *middle, problem)
        jobs = self._jobs(snapshot.processes)
        s = summarize(snapshot)
        if self._wide:
            lost = f" ({s.lost_gpus} lost)" if s.lost_gpus else ""
            gpus = Text(f"{s.gpu_count}× {s.model or '?'}{lost}")
            if s.utilization_mean is None or s.utilization_max is None:
                util = cells.na()
            else:
                util = Text(
                    f"{s.utilization_mean:3.0f}%/{s.utilization_max:3.0f}%",
                    style=palette.utilization(s.utilization_mean),
                )
            temp = cells.temperature(s.hottest_c, palette, _slowdown_of(snapshot, s.hottest_gpu))
            if s.hottest_gpu is not None:
                temp.append(f" g{s.hottest_gpu}", style="dim")
            return (
                name,
                state,
                gpus,
                util,
                cells.memory(s.memory_used_mib, s.memory_total_mib, palette, unit=False),
                temp,
                cells.kilowatts(s.power_w, s.power_limit_w),
                *jobs,
                problem,
            )
        return (
            name,
            state,
            cells.percent(s.utilization_mean, palette),
            cells.memory_percent(s.memory_used_mib, s.memory_total_mib, palette),
            cells.temperature(s.hottest_c, palette, _slowdown_of(snapshot, s.hottest_gpu)),
            cells.power_percent(s.power_w, s.power_limit_w),
            *jobs,
            problem,
        )

    def _state(self, state: HostState, snapshot: HostSnapshot | None) -> Text:
        """The host's state word (`gpuconsole.fleet.host_state`), short; a drained host's
        reason is on its host screen."""
        word = state_word(state, snapshot, short=True)
        if word == DRAIN:
            return Text(word, style=f"bold {self.palette['severity-warning']}")
        return Text(word, style=self.palette[_STATE_STYLE[state]])

    def _jobs(self, processes: tuple[GpuProcess, ...]) -> tuple[Text, ...]:
        """The jobs column's cell, when it is shown: the owner on the most GPUs and how many
        others there are; "—" where nothing runs, N/A where no process has a known owner."""
        if not self._jobs_shown:
            return ()
        if not processes:
            return (Text("—", style="dim"),)
        found = owners(processes)
        if not found:
            return (cells.na(),)
        more = f" +{len(found) - 1}" if len(found) > 1 else ""
        first = cells.fit(found[0], (_JOBS.width or 0) - len(more))
        return (Text.assemble(first, (more, "dim")),)

    def _gpu_cells(self, host: str, gpu: GpuState, last: bool) -> Cells:
        palette = self.palette
        name = Text(f"  {'└' if last else '├'} GPU {gpu.index}", style="dim")
        state = Text("lost", style=palette["severity-critical"]) if gpu.lost else Text("")
        problem = self._problem(self._problems.get((host, gpu.index), []))
        snapshot = self.store.latest(host)
        jobs = self._jobs(snapshot.processes_on(gpu.index) if snapshot is not None else ())
        if self._wide:
            return (
                name,
                state,
                cells.text(short_model(gpu.name)),
                cells.utilization_bar(gpu.utilization_pct, palette, width=6),
                cells.memory(gpu.memory_used_mib, gpu.memory_total_mib, palette, unit=False),
                cells.temperature(gpu.temperature_c, palette, gpu.slowdown_temperature_c),
                cells.power(gpu.power_w, gpu.power_limit_w),
                *jobs,
                problem,
            )
        return (
            name,
            state,
            cells.percent(gpu.utilization_pct, palette),
            cells.memory_percent(gpu.memory_used_mib, gpu.memory_total_mib, palette),
            cells.temperature(gpu.temperature_c, palette, gpu.slowdown_temperature_c),
            cells.power_percent(gpu.power_w, gpu.power_limit_w),
            *jobs,
            problem,
        )

    def _problem(self, problems: list[TriageItem]) -> Text:
        """The worst problem, as the triage view tells it: its code where space is short, its
        message where there is room.

        Info problems (a GPU at its power cap under full load) are advice, no problem: the host
        reads "ok" with a count of them.
        """
        top = problems[0] if problems else None
        if top is None or top.severity is Severity.INFO:
            badge = cells.severity_badge(None, self.palette)
            return Text.assemble(badge, (f" {len(problems)} info" if problems else "", "dim"))
        badge = cells.severity_badge(top.severity, self.palette)
        count = f" +{len(problems) - 1}" if len(problems) > 1 else ""
        if self._problem_width >= _MESSAGE_FROM:
            line = Text.assemble(badge, (count, "dim"), " ", top.what)
            return cells.fit_text(line, self._problem_width)
        where = "" if top.gpu is None else f" GPU {top.gpu}"
        return Text.assemble(badge, f" {top.code}{where}", (count, "dim"))

    def _cursor_host(self) -> tuple[str, int | None] | None:
        key = self.table.cursor_key
        if key is None:
            return None
        host, _, gpu = key.partition("/")
        return host, int(gpu) if gpu else None

    @on(DataTable.RowHighlighted, "#fleet")
    def _row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    @on(DataTable.RowSelected, "#fleet")
    def _row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_host()

    def action_open_host(self) -> None:
        from gpuconsole.ui.screens.host import HostScreen

        target = self._cursor_host()
        if target is not None:
            self.app.push_screen(HostScreen(*target))

    def action_topology(self) -> None:
        from gpuconsole.ui.screens.topology import TopologyScreen

        target = self._cursor_host()
        if target is not None:
            self.app.push_screen(TopologyScreen(target[0]))

    def action_verify(self) -> None:
        target = self._cursor_host()
        if target is not None:
            self.post_message(ShowVerify([target[0]]))

    def action_verify_all(self) -> None:
        self.post_message(ShowVerify(self.store.hosts))

    def action_toggle_expand(self) -> None:
        target = self._cursor_host()
        if target is None:
            return
        host = target[0]
        self.expanded.symmetric_difference_update({host})
        self.refresh_view(None)
        self.table.move_cursor(row=self.table.get_row_index(host), animate=False)

    def action_expand_all(self) -> None:
        hosts = set(self.store.hosts)
        self.expanded = set() if self.expanded >= hosts else hosts
        self.refresh_view(None)

    def action_cycle_sort(self) -> None:
        """The next order; its column's header carries the arrow, so no notice covers a row."""
        index = SORT_KEYS.index(self.sort_key)
        self.sort_key = SORT_KEYS[(index + 1) % len(SORT_KEYS)]
        self.sort_reverse = False
        self.refresh_view(None)

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self.refresh_view(None)

    def copyables(self) -> list[Copyable]:
        """A host row: its name; a GPU row: the GPU's UUID and PCI bus id, then the host."""
        target = self._cursor_host()
        if target is None:
            return []
        host, index = target
        snapshot = self.store.latest(host)
        gpu = snapshot.gpu(index) if snapshot is not None and index is not None else None
        found = [] if gpu is None else gpu_copyables(host, gpu)
        return [*found, Copyable("host name", host)]

    def action_filter(self) -> None:
        self.query_one("#filter", FilterBox).open()

    def filter_by(self, text: str) -> None:
        """Show only the hosts ``text`` matches (`:job ID` lists the hosts a job runs on)."""
        box = self.query_one("#filter", FilterBox)
        box.value = text
        box.add_class("shown")
        self.filter_text = text
        self.refresh_view(None)
        self.table.focus()

    def action_clear_filter(self) -> None:
        self.query_one("#filter", FilterBox).close()
        self.table.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.refresh_view(None)

    @on(Input.Submitted, "#filter")
    def _filter_done(self, _event: Input.Submitted) -> None:
        if not self.filter_text:
            self.query_one("#filter", FilterBox).remove_class("shown")
        self.table.focus()
