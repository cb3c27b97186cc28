"""Replay (`gpuconsole replay FILE`): the console's own screens on a recording, at a time cursor.

Keys (everywhere): `,` `.` step a second, `<` `>` a minute, `n` `N` jump to the next or
previous finding, `g` go to a time, `P` play or pause, `F` play faster. A bar under each screen
shows the cursor on the recording's timeline. Playing moves the cursor as fast as the speed says
by the clock, however long each step takes to show.

Moving the cursor a little forward (a step, playing) reads the new moment into the store, as a
live console takes a new reading. Any other move rebuilds the store at the cursor on a worker:
first the readings at the cursor alone (shown at once), then with the history before it (trends,
duration rules, alerts' `for`), which replaces it when ready.

A damaged recording replays what can be read. The damage is said on the screen: the title says the
recording is damaged, a line above the cursor bar names the first damaged stretch (whose, when,
what is wrong) and how many more, and each newly found stretch is a notice. The recording is
checked for damage on a worker at the start; a reading's row is decoded in full only when the
cursor reaches it, so what that finds is told then. A host whose reading at the cursor is damaged
shows as stale, with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from textual.binding import Binding
from textual.events import Mount
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from gpuconsole.actions.bundle.contents import BundleInputs
from gpuconsole.actions.bundle.inputs import recorded_inputs
from gpuconsole.core.model import Severity
from gpuconsole.fleet.alerts.rules import AlertRule
from gpuconsole.fleet.poller import HostReading, collect
from gpuconsole.fleet.record.episodes import Episode
from gpuconsole.fleet.record.reader import Recording
from gpuconsole.fleet.record.replay import EpisodesAt, ReplaySource
from gpuconsole.fleet.record.retention import parse_duration
from gpuconsole.fleet.record.when import clock, resolve_moment
from gpuconsole.fleet.session import FleetSession
from gpuconsole.fleet.store import HISTORY_READINGS
from gpuconsole.fleet.triage_list import Since
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.base import ConsoleScreen
from gpuconsole.ui.screens.fleet import FleetScreen
from gpuconsole.ui.screens.goto import GoToScreen
from gpuconsole.ui.themes import DEFAULT_THEME
from gpuconsole.ui.widgets.cursor_bar import CursorBar, CursorState
from gpuconsole.ui.widgets.damage_bar import DamageBar

if TYPE_CHECKING:
    from gpuconsole.fleet.alerts.engine import Alert
    from gpuconsole.ui.screens.gpu import RecordedPast

STEP_FORWARD_MAX_S = 60.0
"""Forward moves up to this long read the new moment into the store; longer ones rebuild it."""
JUMP_HISTORY_S = 61
"""History read after a jump: the 60 s the duration rules need (idle memory), and as much of
the trend lines as a wide host screen shows."""
SPEEDS = (1, 10, 60)
CHECK_AROUND_S = 600.0
"""At the start, the readings this long either side of the cursor are checked in full."""
DAMAGE_NOTICES = 3
"""Newly found damaged stretches told as a notice each, at a time; the rest in one more."""


class ReplayApp(GpuConsoleApp):
    """The console on a recording; see the module's docstring."""

    HELP_TITLE = "Replay (gpuconsole replay FILE)"
    HELP_ORDER = 1000
    _SECOND = Binding.Group("−/+1s")
    _MINUTE = Binding.Group("−/+1min")
    _FINDING = Binding.Group("finding")
    BINDINGS = [
        Binding("comma", "step(-1)", "−1s", id="replay.back", group=_SECOND),
        Binding("full_stop", "step(1)", "+1s", id="replay.forward", group=_SECOND),
        Binding("less_than_sign", "step(-60)", "−1min", id="replay.back-minute", group=_MINUTE),
        Binding(
            "greater_than_sign", "step(60)", "+1min", id="replay.forward-minute", group=_MINUTE
        ),
        Binding("n", "finding(1)", "Next finding", id="replay.next-finding", group=_FINDING),
        Binding("N", "finding(-1)", "Prev finding", id="replay.prev-finding", group=_FINDING),
        Binding("g", "go_to", "Go to", id="replay.go-to", tooltip="a time: 03:12, +5m, -90s"),
        Binding("P", "play", "Play/pause", id="replay.play"),
        Binding("F", "faster", "Faster", id="replay.faster", tooltip="1×, 10×, 60×"),
    ]
    LEADING_KEYS: ClassVar[frozenset[str]] = frozenset(b.id for b in BINDINGS if b.id is not None)

    def __init__(
        self,
        recording: Recording,
        *,
        at: float | None = None,
        host: str | None = None,
        theme: str = DEFAULT_THEME,
        history_seconds: int = HISTORY_READINGS,
        alert_rules: Sequence[AlertRule] | None = None,
    ) -> None:
        self.recording = recording
        self.replay = ReplaySource(recording, at)
        super().__init__(
            self.replay,
            label=f"replay of {recording.path.name}",
            refresh=1.0,
            theme=theme,
            auto_poll=False,
            history_seconds=history_seconds,
            alert_rules=alert_rules,
        )
        self.recorded = EpisodesAt()
        """The findings and alerts open at the cursor, as recorded."""
        self._label = self.label
        self._damage_told: set[tuple[str, str, str | None]] = set()
        """The damaged stretches told in a notice, each once however it grows."""
        self._open_host = host
        self.onsets: list[tuple[float, Severity]] = []
        self.playing = False
        self.speed = SPEEDS[0]
        self._played_from: tuple[float, float] = (0.0, 0.0)
        """Where playing (re)started: the monotonic clock's time and the cursor's."""
        self._monotonic: Callable[[], float] = time.monotonic
        self._generation = 0

    # --- start ---------------------------------------------------------------------------------

    def on_mount(self, event: Mount) -> None:
        event.prevent_default()  # the live console's on_mount reads its source on this thread
        self.screen_change_signal.subscribe(self, self._attach_bar)
        self.push_screen(FleetScreen())
        if self._open_host is not None:
            from gpuconsole.ui.screens.host import HostScreen

            self.push_screen(HostScreen(self._open_host))
        self._rebuild(self.replay.cursor, first=True)
        self.run_worker(
            self._check,
            thread=True,
            group="check",
            exit_on_error=False,
            description="look for damage in the recording",
        )

    def _check(self) -> None:
        """The whole recording's rows as SQL sees them, and the readings around the opening
        cursor inflated too (elsewhere, a damaged reading is found when the cursor gets there)."""
        at = self.replay.cursor
        self.recording.check(contents=False)
        self.recording.check(at - CHECK_AROUND_S, at + CHECK_AROUND_S)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A read at the cursor is taken in; a worker that read the recording may have found
        damage; one that failed says why."""
        if event.worker.group not in ("check", "replay", "poll"):
            return
        if event.worker.group == "poll":
            if event.state is WorkerState.SUCCESS:
                self.apply_readings(event.worker.result or [])
            elif event.state is WorkerState.ERROR:
                self.reading_failed(event.worker.error)
        elif event.state is WorkerState.ERROR:
            self.notify(f"reading the recording failed: {event.worker.error}", severity="error")
        if event.state in (WorkerState.SUCCESS, WorkerState.ERROR):
            self._show_damage()

    def _show_damage(self) -> None:
        """The title and every damage line; a notice for each stretch not told before."""
        found = self.recording.damage.stretches()
        if not found:
            return
        count = f" ({len(found)} parts, `replay --list` names them)" if len(found) > 1 else ""
        self.label = f"{self._label} · DAMAGED ({len(found)})"
        for screen in self.screen_stack:
            for bar in screen.query(DamageBar):
                bar.show(f"recording damaged{count}: {found[0].line()}")
        new = [d for d in found if (d.what, d.table, d.host) not in self._damage_told]
        if not new:
            return
        self._damage_told |= {(d.what, d.table, d.host) for d in new}
        for damage in new[:DAMAGE_NOTICES]:
            self.notify(damage.line(), title="recording damaged", severity="error", timeout=15)
        if len(new) > DAMAGE_NOTICES:
            self.notify(
                f"and {len(new) - DAMAGE_NOTICES} more damaged stretches",
                title="recording damaged",
                severity="error",
                timeout=15,
            )
        self._fleet_updated(None)

    def _attach_bar(self, screen: Screen[object]) -> None:
        """Every console screen gets a cursor bar (above its footer) once it is composed."""
        if isinstance(screen, ConsoleScreen):
            screen.call_after_refresh(self._ensure_bar, screen)

    def _ensure_bar(self, screen: ConsoleScreen) -> None:
        if not screen.query(CursorBar):
            screen.mount(CursorBar())
            screen.mount(DamageBar())
            screen.call_after_refresh(self._show_cursor)
            screen.call_after_refresh(self._show_damage)
        else:
            self._show_cursor()

    # --- moving the cursor ---------------------------------------------------------------------

    def now(self) -> float:
        """The cursor: a reading is stale when it is older than the moment replayed."""
        return self.replay.cursor

    def move_to(self, t: float, *, reading_on: bool = False) -> None:
        """Put the cursor at ``t``: a short step forward (any step forward ``reading_on``, as
        playing) reads on, anything else rebuilds."""
        old = self.replay.cursor
        new = self.replay.clamp(t)
        if new == old:
            self._show_cursor()
            return
        if 0 < new - old <= (self.replay.end - old if reading_on else STEP_FORWARD_MAX_S):
            self.replay.move_to(new)
            self._show_cursor()
            self.poll_now()
        else:
            self._rebuild(new)

    def poll_now(self) -> Worker[list[HostReading]]:
        """Read every host at the cursor, and the episodes open there (a worker thread)."""
        return self.run_worker(
            self._read_at_cursor,
            thread=True,
            exclusive=True,
            group="poll",
            exit_on_error=False,
            description="read the recording at the cursor",
        )

    def _read_at_cursor(self) -> list[HostReading]:
        readings = collect(self.replay)
        episodes = self.replay.episodes_at()
        self.call_from_thread(self.recorded.load, episodes)
        return readings

    def apply_readings(self, readings: list[HostReading]) -> None:
        """Readings of a read that the cursor has since moved back from are dropped."""
        cursor = self.replay.cursor
        if any(r.snapshot is not None and r.snapshot.time > cursor for r in readings):
            return
        super().apply_readings(readings)
        self._show_cursor()

    def _rebuild(self, t: float, *, first: bool = False, jumped: bool = False) -> None:
        """A fresh store at ``t`` on a worker: the cursor's readings first, then the history."""
        self._generation += 1
        generation = self._generation
        self.workers.cancel_group(self, "poll")
        self.replay.move_to(t)
        at = self.replay.cursor
        self._show_cursor()

        def work() -> None:
            quick = self._new_session()
            quick.take(collect(self.replay))
            episodes = self.replay.episodes_at()
            self.call_from_thread(self._swap, generation, quick, episodes)
            if jumped:
                self.call_from_thread(self._tell_onset, at, episodes)
            if first:
                self.call_from_thread(self._set_onsets, self.recording.onsets())
            if generation != self._generation:
                return
            full = self._new_session()
            full.prime(self.replay, JUMP_HISTORY_S)
            full.take(collect(self.replay))
            self.call_from_thread(self._swap, generation, full, episodes)

        self.run_worker(
            work,
            thread=True,
            exclusive=True,
            group="replay",
            exit_on_error=False,
            description=f"read the recording at {clock(at)} UTC",
        )

    def _swap(self, generation: int, fleet: FleetSession, episodes: list[Episode]) -> None:
        if generation != self._generation:
            return  # the cursor moved on meanwhile
        self.fleet = fleet
        self.starting = False
        self.recorded.load(episodes)
        self._fleet_updated(None)
        self._show_cursor()

    def _set_onsets(self, onsets: list[tuple[float, Severity]]) -> None:
        self.onsets = onsets
        self._show_cursor()

    def _tell_onset(self, at: float, episodes: list[Episode]) -> None:
        began = [e for e in episodes if e.since == at and e.severity >= Severity.WARNING]
        if began:
            names = ", ".join(
                f"{e.host}{'' if e.gpu is None else f' GPU {e.gpu}'} {e.code}" for e in began[:3]
            )
            more = f" and {len(began) - 3} more" if len(began) > 3 else ""
            self.notify(f"{clock(at)} UTC: {names}{more} began", timeout=6)

    # --- the cursor bar and title ----------------------------------------------------------------

    @property
    def cursor_state(self) -> CursorState:
        return CursorState(
            self.replay.start,
            self.replay.end,
            self.replay.cursor,
            self.playing,
            self.speed,
            self.onsets,
            self.recording.covers(self.replay.cursor),
        )

    def _show_cursor(self) -> None:
        """Every bar, also those on screens under the top one (they show it when resumed)."""
        state = self.cursor_state
        for screen in self.screen_stack:
            for bar in screen.query(CursorBar):
                bar.show(state, self.palette)

    # --- actions -------------------------------------------------------------------------------

    def action_step(self, seconds: float) -> None:
        self.playing = False
        self.move_to(self.replay.cursor + seconds)

    def action_finding(self, direction: int) -> None:
        """Jump to the next (1) or previous (-1) moment a warning or critical finding began."""
        self.playing = False
        now = self.replay.cursor
        if direction > 0:
            later = [t for t, _ in self.onsets if t > now + 0.5]
            target = later[0] if later else None
        else:
            earlier = [t for t, _ in self.onsets if t < now - 0.5]
            target = earlier[-1] if earlier else None
        if target is None:
            word = "after" if direction > 0 else "before"
            self.notify(f"no finding begins {word} {clock(now)} UTC", timeout=3)
            return
        self._rebuild(self.replay.clamp(target), jumped=True)

    def action_go_to(self) -> None:
        def answered(text: str | None) -> None:
            if not text:
                return
            try:
                t = self._moment(text)
            except ValueError as error:
                self.notify(str(error), severity="error")
                return
            self.playing = False
            self.move_to(t)

        self.push_screen(GoToScreen(), answered)

    def _moment(self, text: str) -> float:
        """Where `g` goes: a move (``+5m``, ``-90s``) from the cursor, which `move_to` keeps in
        the recording; a time, the one `resolve_moment` finds in the recording (or a ValueError
        that names the recording's span, which the notice shows)."""
        if text[:1] in "+-":
            seconds = parse_duration(text[1:])
            return self.replay.cursor + (seconds if text[0] == "+" else -seconds)
        return resolve_moment(text, self.replay.start, self.replay.end, self.recording.path.name)

    def action_play(self) -> None:
        self.playing = not self.playing
        self._show_cursor()
        if self.playing:
            self._played_from = (self._monotonic(), self.replay.cursor)
            self._play_tick_later()

    def action_faster(self) -> None:
        self.speed = SPEEDS[(SPEEDS.index(self.speed) + 1) % len(SPEEDS)]
        self._played_from = (self._monotonic(), self.replay.cursor)
        self._show_cursor()

    def _play_tick_later(self) -> None:
        self.set_timer(self.refresh_seconds, self._play_tick, name="play")

    def _play_tick(self) -> None:
        if not self.playing:
            return
        if self.replay.cursor >= self.replay.end:
            self.playing = False
            self.notify("end of the recording", timeout=3)
            self._show_cursor()
            return
        started, origin = self._played_from
        self.move_to(origin + self.speed * (self._monotonic() - started), reading_on=True)
        self._play_tick_later()

    def _problem_evidence(self) -> tuple[list[Alert], Since]:
        """The alerts and episodes open at the cursor, as recorded."""
        return self.recorded.alerts(), self.recorded.since

    def show_gpu(self, host: str, gpu: int) -> None:
        """The GPU screen with its plots and episodes from the recording, up to the cursor."""
        from gpuconsole.ui.screens.gpu import GpuScreen

        self.push_screen(GpuScreen(host, gpu, recorded=self._recorded_past))

    def _recorded_past(self, host: str, seconds: float) -> RecordedPast:
        """``host``'s readings and episodes in the ``seconds`` up to the cursor (a worker)."""
        from gpuconsole.ui.screens.gpu import RecordedPast

        return RecordedPast.read(self.recording, host, self.replay.cursor, seconds)

    def write_bundle(self, host: str) -> None:
        """A bundle of the recording around the cursor (the host itself is not contacted)."""
        at = self.replay.cursor
        note = (
            "nvidia-smi -q, kernel log, verification: made from a recording; the host as it is "
            "now would not describe it as it was then"
        )
        self._bundle_in_background(host, lambda: self._bundle_inputs(host, at, note), None)

    def _bundle_inputs(self, host: str, at: float, note: str) -> BundleInputs:
        """The bundle's inputs; each damaged stretch of the host (or of the recording's tables)
        that reading them met is a note: what the bundle lacks, and why."""
        inputs = recorded_inputs(self.recording, host, at, (note,))
        damaged = tuple(
            f"damaged recording: {d.line()}"
            for d in self.recording.damage.stretches()
            if d.host in (host, None)
        )
        return replace(inputs, notes=inputs.notes + damaged) if damaged else inputs
