"""The Textual application: wires a source to the fleet store and the store to the screens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from textual.app import App
from textual.binding import Binding
from textual.notifications import Notification, Notify, SeverityLevel
from textual.worker import Worker, WorkerState

from gpuconsole.actions.processes import ProcessSignals
from gpuconsole.core import paths
from gpuconsole.core.clock import Clock, wall_clock
from gpuconsole.fleet.alerts.defaults import DEFAULT_RULES
from gpuconsole.fleet.alerts.rules import AlertRule
from gpuconsole.fleet.poller import HostReading, collect
from gpuconsole.fleet.session import FleetSession, Round
from gpuconsole.fleet.store import HISTORY_READINGS
from gpuconsole.fleet.triage_list import Since, TriageItem, triage_items
from gpuconsole.hosts.targets import Target, TargetFinder
from gpuconsole.telemetry import Source
from gpuconsole.ui.messages import (
    FleetUpdated,
    ShowBenchmark,
    ShowGpu,
    ShowMemoryTrials,
    ShowRepair,
    ShowService,
    ShowVerify,
    WriteBundle,
)
from gpuconsole.ui.screens.base import ConsoleScreen, Copyable
from gpuconsole.ui.screens.commands import ConsoleCommands
from gpuconsole.ui.screens.copy import CopyScreen
from gpuconsole.ui.screens.fleet import FleetScreen, back_to_fleet
from gpuconsole.ui.screens.help import HelpScreen
from gpuconsole.ui.terminal.colourless import colourless
from gpuconsole.ui.terminal.strips import guard_strips
from gpuconsole.ui.themes import DEFAULT_THEME, THEMES
from gpuconsole.ui.widgets.cells import NO_COLOUR_BANDS, Palette, fit
from gpuconsole.ui.widgets.key_bar import KeyBar
from gpuconsole.ui.widgets.notices import laid_out

if TYPE_CHECKING:
    from textual.driver import Driver
    from textual.screen import Screen

    from gpuconsole.actions.bundle.live import InputsBuilder
    from gpuconsole.actions.service import Change
    from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSender
    from gpuconsole.fleet.alerts.engine import Alert, AlertEngine
    from gpuconsole.fleet.record.recorder import Recorder
    from gpuconsole.fleet.store import FleetStore
    from gpuconsole.ui.screens.command_line import Destination
    from gpuconsole.ui.screens.gpu import RecordedPast


class GpuConsoleApp(App[None]):
    """The console. Readings arrive from a worker thread into the fleet session; screens render
    from its store and are told which hosts changed (`FleetUpdated`).

    The screens see it as a `Console` (`gpuconsole.ui.screens.console`) and ask it to open
    panels or start work with `ConsoleRequest` messages, which its ``on_...`` handlers take."""

    CSS_PATH = "app.tcss"
    TITLE = "gpuconsole"
    HELP_TITLE: ClassVar[str | None] = "Everywhere"
    """The heading of the app's own keys on the help screen (see `ConsoleScreen.HELP_TITLE`)."""
    HELP_ORDER: ClassVar[int] = 0
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    LEADING_KEYS: ClassVar[frozenset[str]] = frozenset()
    """Ids of the app's bindings the key bar puts before the screen's (replay's own keys)."""
    BINDINGS = [
        Binding("question_mark", "help", "Help", id="help"),
        Binding("q", "quit", "Quit", id="quit"),
        Binding(
            "p",
            "toggle_pause",
            "Pause",
            id="pause",
            show=False,
            tooltip="freeze the screen; readings are still taken and kept (p again resumes)",
        ),
        Binding(
            "ctrl+l",
            "redraw",
            "Redraw",
            id="redraw",
            show=False,
            tooltip="paint every cell again (after a stray message)",
        ),
        Binding(
            "a",
            "alerts",
            "Alerts",
            id="alerts",
            show=False,
            tooltip="firing and pending alerts across the fleet",
        ),
        Binding(
            "T",
            "triage",
            "Triage",
            id="triage",
            show=False,
            tooltip="every finding and firing alert, worst first, then newest, with what to do",
        ),
        Binding(
            "colon",
            "command_line",
            "Go to",
            id="command-line",
            show=False,
            tooltip="type where to go: fleet, alerts, triage, host NAME, gpu HOST N, job ID "
            "(Tab completes)",
        ),
        Binding(
            "y",
            "copy",
            "Copy",
            id="copy",
            show=False,
            tooltip="copy the value under the cursor (a host, a GPU's UUID, a PID...) to the "
            "clipboard, through the terminal (OSC 52: works over SSH in most terminals)",
        ),
        Binding(
            "Y",
            "copy_what",
            "Copy…",
            id="copy-what",
            show=False,
            tooltip="choose what of the row under the cursor to copy (a command, a path...)",
        ),
    ]

    def __init__(
        self,
        source: Source,
        *,
        label: str = "demo rack",
        refresh: float = 1.0,
        theme: str = DEFAULT_THEME,
        auto_poll: bool = True,
        background_start: bool = True,
        history_seconds: int = HISTORY_READINGS,
        signals: ProcessSignals | None = None,
        alert_rules: Sequence[AlertRule] | None = None,
        recorder: Recorder | None = None,
        alertmanager: AlertmanagerSender | None = None,
        clock: Clock = wall_clock,
    ) -> None:
        guard_strips()
        super().__init__()
        if self.no_color:
            self._filters = colourless()
        self.source = source
        if signals is None and isinstance(source, ProcessSignals):
            signals = source
        self.signals = signals
        """Who can signal which host's processes; None: no host's (the demo)."""
        self.targets = source if isinstance(source, TargetFinder) else None
        """How to reach hosts to verify them; None: none can be (the demo)."""
        self.label = label
        self.refresh_seconds = refresh
        self._clock = clock
        self.paused_at: float | None = None
        """When the user paused (`now`), or None. Screens are not refreshed while paused;
        readings still go into the store."""
        self.starting = True
        """Until the hosts' recent past and first readings are in (see `background_start`)."""
        self.auto_poll = auto_poll
        self.background_start = background_start
        """Paint the first frame before the hosts' recent past is read (a 64-host demo rack
        takes seconds to simulate); False reads it before the first frame, as tests want."""
        self._alert_rules = DEFAULT_RULES if alert_rules is None else tuple(alert_rules)
        self._notice_until = 0.0
        """When the last notice shown goes (`time.monotonic`)."""
        self._history_seconds = history_seconds
        self._recorder = recorder
        self._alertmanager = alertmanager
        """Where firing alerts go, if anywhere; each session of the app feeds it."""
        self.fleet = self._new_session()
        """The store, the alerts, the onsets and the recording the screens show; replaced by
        one primed with the hosts' recent past once that is read (see `_begin`)."""
        for registered in THEMES.values():
            self.register_theme(registered)
        self.theme = theme

    @property
    def palette(self) -> Palette:
        """The theme's bands; under NO_COLOR, emphasis (bold, reverse) instead of colours."""
        if self.no_color:
            return Palette(NO_COLOUR_BANDS)
        return Palette(self.current_theme.variables)

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def store(self) -> FleetStore:
        """The readings the screens show (`Console.store`)."""
        return self.fleet.store

    @property
    def alerts(self) -> AlertEngine:
        return self.fleet.alerts

    @property
    def alertmanager(self) -> AlertmanagerSender | None:
        return self.fleet.alertmanager

    @property
    def last_round(self) -> float | None:
        """When the newest round's readings were taken: the time the alerts were evaluated at."""
        return self.fleet.alerts.now

    def problems(self) -> list[TriageItem]:
        """The fleet's problems now, one story each (see `Console.problems`)."""
        alerts, since = self._problem_evidence()
        return triage_items(self.fleet.store, alerts, since, self._alert_rules)

    def _problem_evidence(self) -> tuple[list[Alert], Since]:
        """The active alerts, and when each open episode began: the session's."""
        return self.fleet.alerts.active(), self.fleet.onsets.since

    def began(self, ident: str) -> float | None:
        """When the open episode ``ident`` began, as the session's onsets say."""
        return self.fleet.onsets.since(ident)

    def now(self) -> float:
        """The time the readings are compared with: how old the newest one is, when it is stale,
        and since when the screen is paused."""
        return self._clock()

    def get_driver_class(self) -> type[Driver]:
        """On a real terminal, a driver that writes only the cells that changed."""
        from gpuconsole.ui.terminal import console_driver

        return console_driver(super().get_driver_class())

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
        kind: str | None = None,
    ) -> None:
        """Notifications quote host names and hosts' errors: their text is never markup (a
        ``[@click=...]`` in a process name must not become an action). A notice of a ``kind``
        replaces the one of its kind still shown (the sort order, a copy), so that repeating
        a key does not stack notices over the screen. Paths are laid out whole (`laid_out`)."""
        if timeout is None:
            timeout = self.NOTIFICATION_TIMEOUT
        notice = _Notice(laid_out(message), title, severity, timeout, markup=False, kind=kind)
        self.post_message(Notify(notice))

    def _on_notify(self, event: Notify) -> None:
        kind = getattr(event.notification, "kind", None)
        if kind is not None:
            for shown in list(self._notifications):
                if getattr(shown, "kind", None) == kind:
                    self._unnotify(shown, refresh=False)
        super()._on_notify(event)
        timeout = event.notification.timeout
        self._notice_until = max(self._notice_until, time.monotonic() + timeout)
        self.make_room_for_notices()
        self.set_timer(timeout + 0.1, self.make_room_for_notices)

    @property
    def notice_showing(self) -> bool:
        """Whether a notice is on the screen (until the last one's timeout)."""
        return time.monotonic() < self._notice_until

    def make_room_for_notices(self) -> None:
        """The key bar of the screen shown leaves a row for the notices while one shows."""
        for bar in self.screen.query(KeyBar):
            bar.room_for_notice(self.notice_showing)

    def on_mount(self) -> None:
        if not self.background_start:
            self._begin(self._read_start())
            self.push_screen(FleetScreen())
            return
        self.push_screen(FleetScreen())
        self.call_after_refresh(self._start_reading)

    def _start_reading(self) -> None:
        """Read the hosts' recent past and a first round on a thread, once the first frame is
        painted: started sooner, the thread shares the interpreter with that frame."""
        self.run_worker(
            self._read_start,
            thread=True,
            group="start",
            exit_on_error=False,
            description="read the hosts' recent past and a first reading",
        )

    def _new_session(self) -> FleetSession:
        """An empty session with the console's hosts, rules, history length, recorder and
        Alertmanager sender."""
        return FleetSession(
            self.source.hosts,
            self._alert_rules,
            history_seconds=self._history_seconds,
            recorder=self._recorder,
            alertmanager=self._alertmanager,
        )

    def _read_start(self) -> _Start:
        """A session primed with the hosts' recent past, that took a first reading; built apart
        from the app's, so the screens never see it half filled."""
        fleet = self._new_session()
        fleet.prime(self.source, self._history_seconds)
        return _Start(fleet, fleet.take(collect(self.source)))

    def _begin(self, start: _Start) -> None:
        """Show the start's session, then poll."""
        self.fleet = start.fleet
        self.starting = False
        self._tell_problem(start.first.problem)
        self._fleet_updated(start.first.changed)
        if self.auto_poll:
            self._schedule_poll()

    def poll_now(self) -> asyncio.Future[list[HostReading]]:
        """Start one polling round now, on the event loop's threads (the timer chain calls
        this; so can tests).

        A round is a plain future with a callback, not a Textual worker and timer: those cost
        three messages, a timer task and a worker task a round, about 0.45 ms of the 3 ms the
        console's thread spent on a tick of an idle GPU's host screen (2-core build machine)."""
        loop = asyncio.get_running_loop()
        polling = loop.run_in_executor(None, collect, self.source)
        polling.add_done_callback(self._polled)
        return polling

    def _polled(self, polling: asyncio.Future[list[HostReading]]) -> None:
        if polling.cancelled():
            return
        error = polling.exception()
        if error is None:
            self.apply_readings(polling.result())
        else:
            self.reading_failed(error)
        if self.auto_poll:
            self._schedule_poll()

    def reading_failed(self, error: BaseException | None) -> None:
        """Say that a round of readings failed (not a host: `collect` reports those)."""
        self.notify(f"reading failed: {error}", severity="error")

    def _schedule_poll(self) -> None:
        asyncio.get_running_loop().call_later(self.refresh_seconds, self.poll_now)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group == "start":
            self._started(event)

    def _started(self, event: Worker.StateChanged) -> None:
        if event.state is WorkerState.SUCCESS:
            self._begin(event.worker.result)
        elif event.state is WorkerState.ERROR:
            self.starting = False
            self.reading_failed(event.worker.error)
            if self.auto_poll:
                self._schedule_poll()

    def apply_readings(self, readings: list[HostReading]) -> None:
        """One round into the session; the screen on top shows what changed."""
        taken = self.fleet.take(readings)
        self._tell_problem(taken.problem)
        if taken.changed and not self.paused:
            self._fleet_updated(taken.changed)

    def _fleet_updated(self, changed: set[str] | None) -> None:
        """Tell the screen on top that ``changed`` hosts changed (None: anything may have)."""
        if isinstance(self.screen, ConsoleScreen):
            self.screen.post_message(FleetUpdated(changed))

    def _tell_problem(self, problem: str | None) -> None:
        """The recorder's one line, when it has one (why it stopped, that it falls behind)."""
        if problem is not None:
            self.notify(problem, severity="error", timeout=30)

    # --- what the screens ask for (`ConsoleRequest`) --------------------------------------------

    def on_show_gpu(self, request: ShowGpu) -> None:
        self.show_gpu(request.host, request.gpu)

    def on_show_verify(self, request: ShowVerify) -> None:
        self.show_verify(request.hosts)

    def on_show_repair(self, request: ShowRepair) -> None:
        self.show_repair(request.host)

    def on_show_service(self, request: ShowService) -> None:
        self.show_service(request.host, request.change)

    def on_show_memory_trials(self, request: ShowMemoryTrials) -> None:
        self.show_memory_trials(request.host)

    def on_show_benchmark(self, request: ShowBenchmark) -> None:
        self.show_benchmark(request.host)

    def on_write_bundle(self, request: WriteBundle) -> None:
        self.write_bundle(request.host)

    def _target_for(self, host: str) -> Target | None:
        """How to reach ``host`` to act on it; None: it cannot be (a simulated host)."""
        return self.targets.target_for(host) if self.targets else None

    def show_verify(self, hosts: Sequence[str]) -> None:
        """Open the verification screen on those of ``hosts`` that can be reached."""
        from gpuconsole.ui.screens.verify import VerifyScreen

        targets = [t for h in hosts if (t := self._target_for(h)) is not None]
        if not targets:
            self._refuse("nothing to verify: simulated hosts have no shell to run the checks in")
            return
        self.push_screen(VerifyScreen(targets))

    def show_repair(self, host: str) -> None:
        """Open the repair panel on ``host`` if it can be reached."""
        from gpuconsole.ui.screens.repair import RepairScreen

        target = self._target_for(host)
        if target is None:
            self._refuse("nothing to repair: a simulated host has no driver to fix")
            return
        self.push_screen(RepairScreen(target))

    def show_service(self, host: str, change: Change) -> None:
        """Take ``host``'s node out of its scheduler (after asking why) or bring it back, in the
        service panel, if it can be reached."""
        from gpuconsole.actions.service import DRAIN
        from gpuconsole.ui.screens.service import ReasonScreen, ServiceScreen

        target = self._target_for(host)
        if target is None:
            self._refuse(f"nothing to {change}: {host} is simulated, and so is its scheduler node")
            return
        if change != DRAIN:
            self.push_screen(ServiceScreen(target, change))
            return

        def answered(reason: str | None) -> None:
            if reason is not None:
                self.push_screen(ServiceScreen(target, change, reason))

        self.push_screen(ReasonScreen(host), answered)

    def show_memory_trials(self, host: str) -> None:
        """Ask, then try each memory fix of the default job on ``host`` in the memory panel."""
        from gpuconsole.ui.screens.memory import DEFAULT_JOB, MemoryScreen

        job = DEFAULT_JOB
        self._ask_then_open(
            host,
            "a simulated host cannot run the memory trials",
            f"Try each memory fix of {job.recipe} on {host}?",
            f"About 20 short runs of {job.recipe} on GPU {job.gpu} of {host} (a few minutes); "
            "the GPU is busy meanwhile. s stops them.",
            lambda target: MemoryScreen(target, job),
        )

    def show_benchmark(self, host: str) -> None:
        """Ask, then run the default benchmark on ``host`` in the run panel."""
        from gpuconsole.ui.screens.run import DEFAULT_BENCHMARK, RunScreen

        spec = DEFAULT_BENCHMARK
        self._ask_then_open(
            host,
            "a simulated host cannot run a benchmark",
            f"Run the {spec.preset} {spec.recipe} benchmark on {host}?",
            f"{spec.steps} steps on every GPU of {host} (about a minute, compilation included); "
            "the GPUs are busy meanwhile. s stops it.",
            lambda target: RunScreen(target, spec),
        )

    def _ask_then_open(
        self,
        host: str,
        refusal: str,
        question: str,
        detail: str,
        panel: Callable[[Target], Screen[None]],
    ) -> None:
        """A panel that keeps a host's GPUs busy opens only after a yes, on a host with a shell."""
        from gpuconsole.ui.screens.confirm import ConfirmScreen

        target = self._target_for(host)
        if target is None:
            self._refuse(refusal)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.push_screen(panel(target))

        self.push_screen(ConfirmScreen(question, detail), answered)

    def write_bundle(self, host: str) -> None:
        """Write an incident bundle of ``host`` as the console shows it now, in the background;
        a notice says where."""
        from gpuconsole.actions.bundle.live import live_bundle_inputs

        target = self._target_for(host)
        self._bundle_in_background(
            host, live_bundle_inputs(self.fleet, host, self.label, target), target
        )

    def _bundle_in_background(self, host: str, build: InputsBuilder, target: Target | None) -> None:
        """Build the inputs and write the bundle on a worker thread (it may run commands on the
        host for a minute), then tell the user."""
        from gpuconsole.actions.bundle.archive import BundleError
        from gpuconsole.actions.bundle.live import done_message, write_bundle

        self.notify(f"writing an incident bundle of {host}…", timeout=3)

        def work() -> None:
            try:
                result = write_bundle(build, target)
            except BundleError as error:
                self.call_from_thread(self.notify, str(error), severity="error", timeout=15)
                return
            self.call_from_thread(self.notify, done_message(result), timeout=15)

        self.run_worker(
            work,
            thread=True,
            group="bundle",
            exit_on_error=False,
            description=f"incident bundle of {host}",
        )

    def show_gpu(self, host: str, gpu: int) -> None:
        """Open the GPU screen of ``host``'s GPU ``gpu``: its plots from the store's history
        and, where the console records, the older part of the span from its recording."""
        from gpuconsole.ui.screens.gpu import GpuScreen

        earlier = None if self._recorder is None else self._recorded_earlier
        self.push_screen(GpuScreen(host, gpu, earlier=earlier))

    def _recorded_earlier(self, host: str, seconds: float) -> RecordedPast:
        """``host``'s last ``seconds`` in the console's own recording (a worker calls this)."""
        from gpuconsole.fleet.record.reader import Recording
        from gpuconsole.ui.screens.gpu import RecordedPast

        assert self._recorder is not None
        recording = Recording(self._recorder.path)
        try:
            return RecordedPast.read(recording, host, self.last_round or self.now(), seconds)
        finally:
            recording.close()

    def action_triage(self) -> None:
        from gpuconsole.ui.screens.triage import TriageScreen

        if not isinstance(self.screen, TriageScreen):
            self.push_screen(TriageScreen())

    def action_command_line(self) -> None:
        from gpuconsole.ui.screens.command_line import CommandLineScreen

        self.push_screen(CommandLineScreen(self.store), self._go_to)

    def _go_to(self, destination: Destination | None) -> None:
        """Where the command line said: a screen from the fleet's, so Esc leads back there."""
        from gpuconsole.ui.screens.host import HostScreen

        if destination is None:
            return
        if destination.screen == "alerts":
            self.action_alerts()
            return
        if destination.screen == "triage":
            self.action_triage()
            return
        fleet = back_to_fleet(self)
        if destination.host is not None:
            self.push_screen(HostScreen(destination.host, destination.gpu))
            if destination.gpu is not None:
                self.show_gpu(destination.host, destination.gpu)
        elif destination.job is not None and fleet is not None:
            fleet.filter_by(destination.job)

    def action_alerts(self) -> None:
        from gpuconsole.ui.screens.alerts import AlertsScreen

        if not isinstance(self.screen, AlertsScreen):
            self.push_screen(AlertsScreen())

    def action_redraw(self) -> None:
        """Ctrl+L: paint every cell again, as a shell's clear does after a stray message."""
        from gpuconsole.ui.terminal.driver import DiffDriver

        if isinstance(self._driver, DiffDriver):
            self._driver.forget_screen()
        self.screen.refresh(repaint=True)

    def action_toggle_pause(self) -> None:
        self.paused_at = None if self.paused else self.now()
        self._fleet_updated(None)

    def _refuse(self, why: str) -> None:
        """A key that cannot act here says why; pressed again, its notice replaces itself."""
        self.notify(why, severity="warning", kind=why)

    def _copyables(self) -> list[Copyable]:
        """What the screen offers to copy for the row under its cursor; a notice if nothing."""
        found = self.screen.copyables() if isinstance(self.screen, ConsoleScreen) else []
        if not found:
            self.notify("nothing to copy here", severity="warning", timeout=3, kind="copy")
        return found

    def action_copy(self) -> None:
        """Copy the first value the screen offers for the row under its cursor."""
        found = self._copyables()
        if found:
            self.copy(found[0].what, found[0].value)

    def action_copy_what(self) -> None:
        """Choose which of the row's values to copy."""
        found = self._copyables()
        if not found:
            return

        def chosen(index: int | None) -> None:
            if index is not None:
                self.copy(found[index].what, found[index].value)

        self.push_screen(CopyScreen(found), chosen)

    def deliver_screenshot(
        self, filename: str | None = None, path: str | None = None, time_format: str | None = None
    ) -> str | None:
        """The palette's Screenshot, written into the screenshot folder, and a notice that says
        where, or why not. (Textual's default folder, the user's Downloads, is missing on most
        servers, and its notice then said only that the save failed.)"""
        from gpuconsole.core.private_files import make_private_dirs

        folder = Path(path) if path is not None else paths.SCREENSHOTS.path()
        try:
            make_private_dirs(folder)
            written = self.save_screenshot(filename, str(folder), time_format)
        except OSError as error:
            reason = error.strerror or str(error)
            self.notify(f"screenshot not saved to {folder}: {reason}", severity="error")
            return None
        self.notify(f"screenshot saved: {written}", timeout=6, kind="screenshot")
        return None

    def copy(self, what: str, value: str) -> None:
        """``value`` to the clipboard (OSC 52, which the terminal applies), and a notice."""
        self.copy_to_clipboard(value)
        self.notify(f"copied {what}: {fit(value, 60)}", timeout=4, kind="copy")

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(type(self.screen)))


class _Start(NamedTuple):
    fleet: FleetSession
    first: Round


@dataclass
class _Notice(Notification):
    """A notification that replaces the shown one of its ``kind`` (see `GpuConsoleApp.notify`)."""

    kind: str | None = None
