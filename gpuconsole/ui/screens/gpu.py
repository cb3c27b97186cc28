"""The GPU screen (Enter on a GPU): one GPU's whole story. Who it is, its limits, its error
counters and XIDs, its PCIe link, its processes and their owners, and its readings over the last
5, 15 or 60 minutes as plots on a time axis, with the moments its findings began and ended
marked on them.

Live, the plots show what the store holds (`FleetStore.history_length` readings, two minutes at
the default refresh) and, where the console records, the span's older readings and ended
episodes from its own recording, read on a worker when the screen opens and when the span
changes (`earlier`); the line above the plots says where they come from, and how much they
cover when that is less than the span. The episodes are the held
readings run through an `OnsetTracker`, as a primed session runs its past, and an episode still
open begins where the session's onsets say (the time triage shows). In replay the readings and
the episodes come from the recording, up to the cursor, read on a worker by the callable the
replay app gives (`PastReader`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.events import Resize
from textual.worker import Worker, WorkerState

from gpuconsole.core.model import GpuProcess, GpuState, HostSnapshot, HostState, Severity
from gpuconsole.core.xid import describe
from gpuconsole.fleet.alerts.engine import findings_from
from gpuconsole.fleet.host_state import state_word
from gpuconsole.fleet.record.episodes import FINDING, Episode, OnsetTracker
from gpuconsole.fleet.record.when import clock
from gpuconsole.fleet.store import FleetStore
from gpuconsole.fleet.triage_list import TriageItem
from gpuconsole.ui.screens.base import ConsoleScreen, Copyable, Freshness, gpu_copyables
from gpuconsole.ui.widgets import cells
from gpuconsole.ui.widgets.cells import Palette
from gpuconsole.ui.widgets.problem_line import WRAP_INDENT, problem_line
from gpuconsole.ui.widgets.steady import Steady
from gpuconsole.ui.widgets.time_plot import Level, Mark, TimePlot, TimeSeries

if TYPE_CHECKING:
    from gpuconsole.fleet.record.reader import Recording

RANGES_S = (300, 900, 3600)
"""The spans `r` steps through: the last 5, 15 and 60 minutes."""
WIDE_FROM = (140, 40)
"""From this many columns and rows the details sit left of the plots, which stack in one
column; below, the plots come first, two abreast, and the details under them."""
PLOTS_SHARE = 58
"""The plots' share of a wide screen's width, in percent."""
PLOT_ROWS = 9
"""A plot's height on a narrow screen: its title, its frame, five rows of readings (twenty dots
high) and its clock times; two rows of plots fill an 80×24 screen below the head."""
_LABEL = 15
"""The details' label column."""
_HEAD_FINDINGS = 3
"""The most findings the head lists; the rest are counted."""
_HEAD_ROWS_TALL = 3
"""The rows a problem of the head wraps onto on a tall screen (one on a short one: the plots
need the rows)."""
_TALL_FROM = 40
_SCROLLBAR = 2


class RecordedPast(NamedTuple):
    """A GPU's host as a recording holds it: its readings and its episodes up to ``at``."""

    at: float
    readings: Sequence[HostSnapshot]
    episodes: Sequence[Episode]

    @classmethod
    def read(cls, recording: Recording, host: str, at: float, seconds: float) -> RecordedPast:
        """``host``'s readings and episodes in the ``seconds`` up to ``at`` (it reads a file:
        call it on a worker)."""
        start = at - seconds
        return cls(at, recording.snapshots(host, start, at), recording.episodes(start, at, host))


_REPLAYED = "gpu-past"
"""The worker group reading replay's past."""
_EARLIER = "gpu-earlier"
"""The worker group reading, live, the console's recording."""

PastReader = Callable[[str, float], RecordedPast]
"""(host, seconds) → the host's last ``seconds`` up to the replay's cursor (live: up to now); it
reads a file, so the screen calls it on a worker."""


class _Past(NamedTuple):
    """What the plots show: readings and episodes up to ``end``."""

    end: float
    readings: Iterable[HostSnapshot]
    episodes: Sequence[Episode]


class HeldEpisodes:
    """One GPU's episodes over the readings a store holds, found as a primed session finds
    them: each reading, oldest first, through an `OnsetTracker` (with the store's findings for
    the newest, the health rules' for the others). Ended episodes are kept for the longest
    range; a new store (the console's start, replay's jumps) starts over."""

    def __init__(self, host: str, gpu: int) -> None:
        self.host = host
        self.gpu = gpu
        self._start(None)

    def _start(self, store: FleetStore | None) -> None:
        self._store = store
        self._tracker = OnsetTracker()
        self._open: dict[str, Episode] = {}
        self._ended: list[Episode] = []
        self._last = float("-inf")

    def update(self, store: FleetStore) -> list[Episode]:
        """Take the readings the store took since the last update; the episodes now."""
        if store is not self._store:
            self._start(store)
        findings_of = findings_from(store)
        for snapshot in [s for s in store.history(self.host) if s.time > self._last]:
            mine = [f for f in findings_of(snapshot) if f.gpu == self.gpu]
            changes = self._tracker.update_host(self.host, snapshot.time, mine, snapshot.xid_events)
            self._open.update((e.ident, e) for e in (*changes.opened, *changes.worsened))
            for ident, went in changes.closed:
                began = self._open.pop(ident, None)
                if began is not None:
                    self._ended.append(replace(began, until=went))
            self._last = snapshot.time
        self._ended = [e for e in self._ended if (e.until or 0) >= self._last - RANGES_S[-1]]
        return [*self._ended, *self._tracker.episodes_now()]


@dataclass(frozen=True, slots=True)
class _Plot:
    """One plot: which reading, in which unit, on which scale."""

    key: str
    title: str
    read: Callable[[GpuState], float | None]


def _gib(mib: float | None) -> float | None:
    return None if mib is None else mib / 1024


_PLOTS = (
    _Plot("util", "Util %", lambda g: g.utilization_pct),
    _Plot("memory", "Memory GiB", lambda g: _gib(g.memory_used_mib)),
    _Plot("temp", "Temp °C", lambda g: g.temperature_c),
    _Plot("power", "Power W", lambda g: g.power_w),
    _Plot("clock", "SM clock MHz", lambda g: g.sm_clock_mhz),
)


def _now(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.0f}"


def _top(limit: float | None, points: Sequence[tuple[float, float]], floor: float) -> float:
    """The scale's top: above the limit and every reading, never below ``floor``."""
    highest = max((v for _, v in points), default=floor)
    return max(floor, highest, limit or 0.0) * 1.08


def _series(
    plot: _Plot,
    state: GpuState | None,
    points: tuple[tuple[float, float], ...],
    window: tuple[float, float],
    marks: tuple[Mark, ...],
    palette: Palette,
) -> TimeSeries:
    """The plot's series, scale, limit line and title (with the reading now and its limit)."""
    now = plot.read(state) if state is not None else None
    title, low, high, levels = f"{plot.title}  now {_now(now)}", 0.0, 100.0, ()
    if plot.key == "memory":
        total = _gib(state.memory_total_mib) if state else None
        title += f" of {_now(total)}"
        high = _top(total, points, 1.0)
    elif plot.key == "temp":
        slowdown = state.slowdown_temperature_c if state else None
        title += f"  slowdown {_now(slowdown)}"
        low, high = 20.0, _top(slowdown, points, 90.0)
        if slowdown is not None:
            levels = (Level(slowdown, palette["severity-warning"]),)
    elif plot.key in ("power", "clock"):
        limit = state and (state.power_limit_w if plot.key == "power" else state.sm_clock_max_mhz)
        title += f"  {'limit' if plot.key == 'power' else 'max'} {_now(limit)}"
        high = _top(limit, points, 1.0)
        if limit:
            levels = (Level(limit, palette["util-low"]),)
    colour = palette["temp-warm"] if plot.key == "temp" else palette["util-mid"]
    return TimeSeries(title, *window, points, colour, low, high, levels, marks)


def _marks(episodes: Iterable[Episode], palette: Palette) -> tuple[Mark, ...]:
    """A line where each episode began (its severity's colour) and ended (grey)."""
    marks = []
    for episode in episodes:
        marks.append(Mark(episode.since, palette.severity(episode.severity)))
        if episode.until is not None:
            marks.append(Mark(episode.until, palette["util-low"]))
    return tuple(marks)


def _in_window(episodes: Iterable[Episode], gpu: int, window: tuple[float, float]) -> list[Episode]:
    """The GPU's findings of warning and worse open at some time of ``window``, oldest first
    (info ones, a GPU at its power cap, would mark every job)."""
    start, end = window
    chosen = (
        e
        for e in episodes
        if e.kind == FINDING
        and e.gpu == gpu
        and e.severity >= Severity.WARNING
        and e.since <= end
        and (e.until is None or e.until >= start)
    )
    return sorted(chosen, key=lambda e: e.since)


def _marked(episodes: Sequence[Episode]) -> list[Episode]:
    """The episodes the plots mark: those of the worst severity among ``episodes``. A GPU
    that throttles on heat crosses the temperature warning on its way up each time, and a
    line at each crossing would bury the throttling's own beginnings and ends."""
    worst = max((e.severity for e in episodes), default=None)
    return [e for e in episodes if e.severity == worst]


def _began_ended(episode: Episode) -> str:
    return f"{clock(episode.since)}–{'now' if episode.until is None else clock(episode.until)}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min" + (f" {secs:02d} s" if secs and minutes < 10 else "")


class GpuScreen(ConsoleScreen):
    """One GPU of one host; ``recorded`` (replay) reads its past from the recording."""

    HELP_TITLE = "GPU"
    HELP_ORDER = 25

    CSS = (
        """
        GpuScreen #gpu-head { height: auto; padding: 0 1; }
        GpuScreen #gpu-body { height: 1fr; }
        GpuScreen #gpu-plots { height: auto; }
        GpuScreen #gpu-span, GpuScreen #gpu-marks { height: auto; padding: 0 1; }
        GpuScreen #gpu-grid { grid-size: 2; grid-gutter: 0 1; padding: 0 1; }
        GpuScreen #plot-clock { column-span: 2; }
        GpuScreen #gpu-details, GpuScreen #gpu-processes { height: auto; padding: 0 1; }
        GpuScreen #gpu-details, GpuScreen #gpu-processes { margin-top: 1; }
        GpuScreen.-wide #gpu-details { margin-top: 0; }
        GpuScreen.-wide #gpu-grid { grid-size: 1; grid-rows: 1fr; height: 1fr; }
        GpuScreen.-wide #plot-clock { column-span: 1; }
        """
        f"GpuScreen.-wide #gpu-plots {{ dock: right; width: {PLOTS_SHARE}%; height: 100%; }}"
        # Three rows of plots, of a fixed height: a grid sized by its content grows past them.
        f"GpuScreen #gpu-grid {{ grid-rows: {PLOT_ROWS}; height: {PLOT_ROWS * 3}; }}"
    )
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="gpu.back"),
        Binding(
            "r",
            "next_range",
            "Range",
            id="gpu.range",
            tooltip="plot the last 5, 15 or 60 minutes",
        ),
        Binding("left_square_bracket", "other_gpu(-1)", "Prev GPU", id="gpu.prev"),
        Binding("right_square_bracket", "other_gpu(1)", "Next GPU", id="gpu.next"),
    ]

    def __init__(
        self,
        host: str,
        gpu: int,
        recorded: PastReader | None = None,
        earlier: PastReader | None = None,
    ) -> None:
        """``recorded``: replay's reader of the recording; ``earlier``: live, the console's own
        recording, for what the store no longer holds."""
        super().__init__()
        self.host = host
        self.gpu = gpu
        self.span = float(RANGES_S[0])
        self._recorded = recorded
        self._past: RecordedPast | None = None
        self._earlier_reader = earlier
        self._earlier: RecordedPast | None = None
        self._held = HeldEpisodes(host, gpu)

    def where(self) -> str:
        return f"{self.host} GPU {self.gpu}"

    def reading(self) -> Freshness:
        """The host's newest reading; stale unless the host is live."""
        snapshot = self.store.latest(self.host) if self.host in self.store.hosts else None
        live = snapshot is not None and self.store.status(self.host).state is HostState.LIVE
        return Freshness(None if snapshot is None else snapshot.time, not live)

    def copyables(self) -> list[Copyable]:
        """The GPU's UUID and PCI bus id, then the host's name."""
        snapshot = self.store.latest(self.host) if self.host in self.store.hosts else None
        gpu = snapshot.gpu(self.gpu) if snapshot is not None else None
        return [
            *([] if gpu is None else gpu_copyables(self.host, gpu)),
            Copyable("host name", self.host),
        ]

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Steady(id="gpu-head")
        with VerticalScroll(id="gpu-body"):
            with Vertical(id="gpu-plots"):
                yield Steady(id="gpu-span")
                with Grid(id="gpu-grid"):
                    for plot in _PLOTS:
                        yield TimePlot(id=f"plot-{plot.key}")
                yield Steady(id="gpu-marks")
            yield Steady(id="gpu-details")
            yield Steady(id="gpu-processes")
        yield self.key_bar()

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#gpu-body", VerticalScroll).focus()
        self._read_earlier()

    def on_resize(self, event: Resize) -> None:
        wide = event.size.width >= WIDE_FROM[0] and event.size.height >= WIDE_FROM[1]
        self.set_class(wide, "-wide")
        self.refresh_view(None)

    @property
    def head_room(self) -> int:
        """The head's room: the screen less the padding."""
        return (self.size.width or 80) - 2

    @property
    def width(self) -> int:
        """The details' room: their column less the padding and the scroll bar."""
        column = self.head_room + 2
        if self.has_class("-wide"):
            column -= column * PLOTS_SHARE // 100
        return column - 2 - _SCROLLBAR

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        if changed is not None and self.host not in changed:
            return
        if self._recorded is not None:
            self._read_recorded()
        self._show()

    def _show(self) -> None:
        """The store's latest reading of the GPU; the plots once their past is known."""
        snapshot = self.store.latest(self.host) if self.host in self.store.hosts else None
        state = snapshot.gpu(self.gpu) if snapshot is not None else None
        self.query_one("#gpu-head", Steady).show(self._head(snapshot, state))
        self.query_one("#gpu-details", Steady).show(self._details(snapshot, state))
        self.query_one("#gpu-processes", Steady).show(self._processes(snapshot))
        if self._recorded is None or self._past is not None:
            self._show_plots(state)

    # --- the head: who, and what is wrong ------------------------------------------------------

    def _head(self, snapshot: HostSnapshot | None, state: GpuState | None) -> Text:
        """Which GPU, its state (LOST, else its host's, and why when it is not live), and its
        problems."""
        status = self.store.status(self.host) if self.host in self.store.hosts else None
        line = Text(self.where(), style="bold")
        if state is not None:
            line.append(f" · {state.name or 'N/A'} · {state.pci_bus_id or 'bus id N/A'}")
        if state is not None and state.lost:
            line.append(" · ").append("LOST", style=f"bold {self.palette['severity-critical']}")
        elif status is not None:
            line.append(f" · {state_word(status.state, snapshot)}")
        lines = [line]
        if status is not None and status.reason:
            lines.append(Text(status.reason, style=self.palette["severity-warning"]))
        if snapshot is None:
            lines.append(Text(f"no reading of {self.host} yet", style="dim"))
        elif state is None:
            lines.append(Text(f"GPU {self.gpu} is not in {self.host}'s reading", style="dim"))
        rows = [cells.fit_text(line, self.head_room) for line in lines]
        problems = self._problems() if snapshot else []
        for problem in problems[:_HEAD_FINDINGS]:
            rows += self._wrapped(problem_line(problem, self.palette))
        if len(problems) > _HEAD_FINDINGS:
            more = len(problems) - _HEAD_FINDINGS
            rows.append(Text(f"+{more} more: triage (T) lists them all", style="dim"))
        if snapshot is not None and state is not None and not problems:
            rows.append(Text("No findings: every rule passes on this GPU.", style="dim"))
        return Text("\n").join(rows)

    def _wrapped(self, line: Text) -> list[Text]:
        """A problem's rows: its remedy whole where the screen is tall enough to give it
        `_HEAD_ROWS_TALL` rows; the last one cut where a word ends."""
        most = _HEAD_ROWS_TALL if (self.size.height or 24) >= _TALL_FROM else 1
        rows = cells.wrap_text(line, self.head_room, WRAP_INDENT)
        if len(rows) <= most:
            return rows
        return [*rows[: most - 1], cells.fit_text(rows[most - 1] + cells.ELLIPSIS, self.head_room)]

    def _problems(self) -> list[TriageItem]:
        """This GPU's problems, as the triage view tells them."""
        return [p for p in self.problems if (p.host, p.gpu) == (self.host, self.gpu)]

    # --- the plots -----------------------------------------------------------------------------

    def _show_plots(self, state: GpuState | None) -> None:
        past = self._live_past() if self._recorded is None else self._recorded_past()
        if past is None:
            return
        window = (past.end - self.span, past.end)
        columns: dict[str, list[tuple[float, float]]] = {p.key: [] for p in _PLOTS}
        for snapshot in past.readings:
            gpu = snapshot.gpu(self.gpu) if snapshot.time >= window[0] else None
            if gpu is None or gpu.lost:
                continue
            for plot in _PLOTS:
                value = plot.read(gpu)
                if value is not None:
                    columns[plot.key].append((snapshot.time, value))
        episodes = _in_window(past.episodes, self.gpu, window)
        marks = _marks(_marked(episodes), self.palette)
        for plot in _PLOTS:
            points = tuple(columns[plot.key])
            series = _series(plot, state, points, window, marks, self.palette)
            self.query_one(f"#plot-{plot.key}", TimePlot).show(series)
        self.query_one("#gpu-span", Steady).show(self._span_line(past))
        self.query_one("#gpu-marks", Steady).show(self._marks_text(episodes))

    def _live_past(self) -> _Past | None:
        """The store's readings of the host, its newest round's time, and the GPU's episodes
        (an open one since when the session's onsets say)."""
        store = self.store
        if self.host not in store.hosts:
            return None
        latest = store.latest(self.host)
        end = self.console.last_round or (latest.time if latest else None)
        if end is None:
            return None
        began = self.console.began
        episodes = [
            e if e.until is not None else replace(e, since=began(e.ident) or e.since)
            for e in self._held.update(store)
        ]
        history = store.history(self.host)
        earlier = self._earlier
        if earlier is None:
            return _Past(end, history, episodes)
        oldest = history[0].time if history else end
        readings = [s for s in earlier.readings if s.time < oldest]
        ended = [e for e in earlier.episodes if e.until is not None and e.until < oldest]
        return _Past(end, [*readings, *history], [*ended, *episodes])

    def _recorded_past(self) -> _Past | None:
        """The recording's past as the cursor's moment saw it: an episode that ended after
        the cursor is still open there."""
        past = self._past
        if past is None:
            return None
        episodes = [
            replace(e, until=None) if e.until is not None and e.until > past.at else e
            for e in past.episodes
        ]
        return _Past(past.at, past.readings, episodes)

    def _span_line(self, past: _Past) -> Text:
        """The span and where its readings come from; live, how much of it they cover when
        that is less: the store keeps `FleetStore.history_length` readings, and the
        recording, where older ones come from it, only what it has."""
        line = Text.assemble(
            (f"Last {self.span // 60:.0f} min", "bold"), f" to {clock(past.end)} UTC"
        )
        if self._recorded is not None:
            line.append(" · from the recording", style="dim")
            return line
        held = past.end - past.readings[0].time if past.readings else 0.0
        short = held < self.span - 1
        history = self.store.history(self.host)
        if past.readings and (not history or past.readings[0].time < history[0].time):
            line.append(" · older readings from the recording", style="dim")
            if short:
                line.append(f" · recorded: {_duration(held)}", style="dim")
        elif short:
            kept = self.store.history_length
            line.append(f" · held: {_duration(held)}, the last {kept} readings", style="dim")
        return line

    def _marks_text(self, episodes: Sequence[Episode]) -> Text:
        """Each finding of the span, worst first: when the marked ones began and ended, how
        often the others came and when they last did."""
        if not episodes:
            return Text("No finding of this GPU was open in this span.", style="dim")
        shown = set(_marked(episodes))
        codes = dict.fromkeys(e.code for e in sorted(episodes, key=lambda e: -e.severity))
        lines = []
        for code in codes:
            mine = [e for e in episodes if e.code == code]
            line = Text.assemble(
                cells.severity_badge(max(e.severity for e in mine), self.palette),
                (f" {code}", "bold"),
                f" ×{len(mine)}" if len(mine) > 1 else "",
            )
            if mine[0] in shown:
                line.append(f" (marked): {', '.join(map(_began_ended, mine))}")
            else:
                line.append(f", the last {_began_ended(mine[-1])}")
            lines.append(line)
        return Text("\n").join(lines)

    # --- replay: the past from the recording, on a worker --------------------------------------

    def _read_recorded(self) -> None:
        assert self._recorded is not None
        self._read_past(self._recorded, _REPLAYED)

    def _read_earlier(self) -> None:
        """Live: the span from the console's own recording, for what the store no longer
        holds (nothing to read when the store holds the whole span)."""
        history = self.store.history(self.host) if self.host in self.store.hosts else []
        covered = bool(history) and history[-1].time - history[0].time >= self.span - 1
        if self._earlier_reader is not None and not covered:
            self._read_past(self._earlier_reader, _EARLIER)

    def _read_past(self, reader: PastReader, group: str) -> None:
        """The span's past read by ``reader`` on a worker of ``group``; a newer read replaces
        one still running."""
        host, span = self.host, self.span
        self.run_worker(
            lambda: reader(host, span),
            thread=True,
            exclusive=True,
            group=group,
            exit_on_error=False,
            description=f"read {host}'s last {int(span // 60)} min from the recording",
        )

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        group = event.worker.group
        if group not in (_REPLAYED, _EARLIER):
            return
        if event.state is WorkerState.SUCCESS and isinstance(event.worker.result, RecordedPast):
            if group == _REPLAYED:
                self._past = event.worker.result
            else:
                self._earlier = event.worker.result
            self._show()
        elif event.state is WorkerState.ERROR:
            self.notify(f"reading the recording failed: {event.worker.error}", severity="error")

    # --- the details ---------------------------------------------------------------------------

    def _details(self, snapshot: HostSnapshot | None, state: GpuState | None) -> Text:
        if snapshot is None or state is None:
            return Text("")
        sections = (
            ("Identity", self._identity(snapshot, state)),
            ("Limits", self._limits(state)),
            ("Now", self._readings(state)),
            ("Errors", self._errors(snapshot, state)),
        )
        blocks = [
            Text.assemble((title, "bold underline"), "\n", Text("\n").join(rows))
            for title, rows in sections
        ]
        return Text("\n").join(blocks)

    def _field(self, label: str, value: Text | str) -> Text:
        shown = value if isinstance(value, Text) else Text(value)
        return Text.assemble((f"{label:<{_LABEL}}", "dim"), shown)

    def _fitted(self, value: str | None) -> Text:
        """Host text in the room beside the labels, cut where a word ends."""
        return cells.text(value, self.width - _LABEL)

    def _fit(self, value: Text) -> Text:
        """A row's value in the room beside the labels, cut where a word ends."""
        return cells.fit_text(value, self.width - _LABEL)

    def _identity(self, snapshot: HostSnapshot, state: GpuState) -> list[Text]:
        mig = "N/A" if state.mig_mode is None else "on" if state.mig_mode else "off"
        rows = [
            self._field("Name", self._fitted(state.name)),
            self._field("UUID", self._fitted(state.uuid)),
            self._field("Bus id", self._fitted(state.pci_bus_id)),
            self._field("Serial", self._fitted(state.serial)),
            self._field("VBIOS", self._fitted(state.vbios_version)),
            self._field("Driver", self._fitted(snapshot.driver_version)),
            self._field("CUDA", self._fitted(snapshot.cuda_version)),
            self._field("Persistence", _on_off(state.persistence_mode)),
            self._field("Compute mode", self._fitted(state.compute_mode)),
            self._field("MIG", mig),
        ]
        rows += [
            self._field(
                f"  instance {m.gpu_instance_id}",
                self._fitted(f"{m.profile or '?'} · {cells.gib(m.memory_total_mib or 0)} GiB"),
            )
            for m in state.mig_instances
        ]
        return rows

    def _limits(self, state: GpuState) -> list[Text]:
        power_range = Text.assemble(
            cells.number(state.power_limit_min_w), "–", cells.number(state.power_limit_max_w), " W"
        )
        rows = (
            (
                "Power limit",
                _pair(
                    "enforced", state.power_limit_w, "default", state.power_limit_default_w, " W"
                ),
            ),
            ("Power range", power_range),
            (
                "SM clock",
                _pair(
                    "max",
                    state.sm_clock_max_mhz,
                    "application",
                    state.sm_clock_application_mhz,
                    " MHz",
                ),
            ),
            (
                "Mem clock",
                _pair(
                    "max",
                    state.memory_clock_max_mhz,
                    "application",
                    state.memory_clock_application_mhz,
                    " MHz",
                ),
            ),
            (
                "Temp limits",
                _pair(
                    "slowdown",
                    state.slowdown_temperature_c,
                    "shutdown",
                    state.shutdown_temperature_c,
                    " °C",
                ),
            ),
        )
        return [self._field(label, self._fit(value)) for label, value in rows]

    def _readings(self, state: GpuState) -> list[Text]:
        if state.lost:
            critical = f"bold {self.palette['severity-critical']}"
            return [self._field("State", Text("LOST: fallen off the bus", style=critical))]
        palette = self.palette
        power = cells.power(state.power_w, state.power_limit_w)
        clocks = Text.assemble(
            cells.number(state.sm_clock_mhz, " MHz"),
            " SM · ",
            cells.number(state.memory_clock_mhz, " MHz"),
            " memory",
        )
        return [
            self._field("Utilization", cells.percent(state.utilization_pct, palette)),
            self._field(
                "Memory", cells.memory(state.memory_used_mib, state.memory_total_mib, palette)
            ),
            self._field(
                "Temperature",
                cells.temperature(state.temperature_c, palette, state.slowdown_temperature_c),
            ),
            self._field("Power", power),
            self._field("Clocks", clocks),
            self._field("P-state", cells.text(state.pstate)),
            self._field("Throttle", cells.throttle(state.throttle_reasons, palette)),
            self._field("PCIe link", cells.pcie(state.pcie, palette)),
            self._field("PCIe traffic", self._fit(_traffic(state))),
        ]

    def _errors(self, snapshot: HostSnapshot, state: GpuState) -> list[Text]:
        ecc, remap = state.ecc, state.remap
        rows = [
            self._field(
                "ECC volatile",
                _counts(ecc and (ecc.volatile_corrected, ecc.volatile_uncorrected)),
            ),
            self._field(
                "ECC aggregate",
                _counts(ecc and (ecc.aggregate_corrected, ecc.aggregate_uncorrected)),
            ),
            self._field(
                "Row remaps",
                "N/A"
                if remap is None
                else f"{_count(remap.correctable)} correctable · "
                f"{_count(remap.uncorrectable)} uncorrectable",
            ),
            self._field(
                "Remap state",
                "N/A"
                if remap is None
                else f"pending {_yes_no(remap.pending)} · failure {_yes_no(remap.failure)}",
            ),
            self._field("Retired pages", f"pending {_yes_no(state.retired_pages_pending)}"),
            self._field("Recovery", self._fitted(state.recovery_action)),
        ]
        events = [e for e in snapshot.xid_events if e.gpu == self.gpu]
        if not events:
            rows.append(self._field("XIDs", Text("none reported", style="dim")))
        for event in events:
            info = describe(event.xid)
            text = f"{info.meaning} at {clock(event.time)} → {info.action}"
            rows.append(self._field(f"XID {event.xid}", text))
        return rows

    # --- processes -----------------------------------------------------------------------------

    def _processes(self, snapshot: HostSnapshot | None) -> Text:
        mine = snapshot.processes_on(self.gpu) if snapshot is not None else ()
        if not mine:
            return Text("No processes on this GPU.", style="dim")
        fixed = (("PID", 8), ("User", 10), ("SM%", 5), ("Memory", 8))
        left = max(20, self.width - sum(w for _, w in fixed))
        owner = max(12, left * 2 // 5)
        heads = [*fixed, ("Owner", owner), ("Command", left - owner)]
        lines = [Text("".join(f"{h:<{w}}" for h, w in heads), style="bold")]
        for process in sorted(mine, key=lambda p: -(p.used_memory_mib or 0)):
            lines.append(self._process_line(process, owner, left - owner))
        return Text("\n").join(lines)

    def _process_line(self, p: GpuProcess, owner: int, command: int) -> Text:
        load = p.load.sm_pct if p.load is not None else None
        memory = "N/A" if p.used_memory_mib is None else f"{cells.gib(p.used_memory_mib)} GiB"
        return Text.assemble(
            f"{p.pid:<8}",
            _padded(cells.text(p.user, 9), 10),
            _padded(cells.percent(load, self.palette), 5),
            f"{memory:<8}",
            _padded(cells.text(p.owner, owner - 1), owner),
            cells.text(p.command, command),
        )

    # --- keys ----------------------------------------------------------------------------------

    def action_next_range(self) -> None:
        """The next span; in replay, the recording's past is read again for it, and what was
        read shows meanwhile."""
        self.span = float(RANGES_S[(RANGES_S.index(int(self.span)) + 1) % len(RANGES_S)])
        self._read_earlier()
        self.refresh_view(None)

    def action_other_gpu(self, step: int) -> None:
        snapshot = self.store.latest(self.host)
        indices = [g.index for g in snapshot.gpus] if snapshot is not None else []
        if not indices:
            return
        here = indices.index(self.gpu) if self.gpu in indices else 0
        self.gpu = indices[(here + step) % len(indices)]
        self._held = HeldEpisodes(self.host, self.gpu)
        self.refresh_view(None)


def _pair(first: str, a: float | None, second: str, b: float | None, unit: str) -> Text:
    """Two readings of one unit: 'max 1980 · application 1755 MHz'; N/A for one not known."""
    return Text.assemble(f"{first} ", cells.number(a), f" · {second} ", cells.number(b), unit)


def _traffic(state: GpuState) -> Text:
    """'TX 1.2 GiB/s · RX 740 KiB/s': what the GPU sends and receives over PCIe."""
    return Text.assemble("TX ", _rate(state.pcie_tx_kib_s), " · RX ", _rate(state.pcie_rx_kib_s))


def _rate(kib_s: float | None) -> Text:
    """KiB/s in the largest binary unit below it: '740 KiB/s', '15.6 MiB/s', '1.2 GiB/s'."""
    if kib_s is None:
        return cells.na()
    value, unit = kib_s, "KiB/s"
    for larger in ("MiB/s", "GiB/s"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return Text(f"{value:.0f} {unit}" if value >= 100 or unit == "KiB/s" else f"{value:.1f} {unit}")


def _padded(text: Text, width: int) -> Text:
    padded = text.copy()
    padded.pad_right(max(0, width - padded.cell_len))
    return padded


def _count(value: int | None) -> str:
    return "N/A" if value is None else str(value)


def _counts(pair: tuple[int | None, int | None] | None) -> str:
    if pair is None:
        return "N/A"
    return f"{_count(pair[0])} corrected · {_count(pair[1])} uncorrected"


def _yes_no(flag: bool | None) -> str:
    return "N/A" if flag is None else "yes" if flag else "no"


def _on_off(flag: bool | None) -> str:
    return "N/A" if flag is None else "on" if flag else "off"
