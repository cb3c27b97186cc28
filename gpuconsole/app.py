"""The Textual application: wires a source to the fleet store and the store to the screens."""

from __future__ import annotations

from textual.app import App
from textual.binding import Binding
from textual.worker import Worker, WorkerState

from gpuconsole.actions.processes import ProcessSignals
from gpuconsole.actions.verify.model import TargetFinder
from gpuconsole.poller import Reading, collect, ingest, prime
from gpuconsole.screens.base import ConsoleScreen
from gpuconsole.screens.commands import ConsoleCommands
from gpuconsole.screens.fleet import FleetScreen
from gpuconsole.screens.help import HelpScreen
from gpuconsole.store import FleetStore
from gpuconsole.telemetry import Source
from gpuconsole.themes import DEFAULT_THEME, THEMES
from gpuconsole.widgets.cells import Palette


class GpuConsoleApp(App[None]):
    """The console. Readings arrive from a worker thread; screens render from the store."""

    CSS_PATH = "app.tcss"
    TITLE = "gpuconsole"
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    BINDINGS = [
        Binding("question_mark", "help", "Help", id="help"),
        Binding("q", "quit", "Quit", id="quit"),
    ]

    def __init__(
        self,
        source: Source,
        *,
        label: str = "demo rack",
        refresh: float = 1.0,
        theme: str = DEFAULT_THEME,
        auto_poll: bool = True,
        history_seconds: int = 120,
        signals: ProcessSignals | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        if signals is None and isinstance(source, ProcessSignals):
            signals = source
        self.signals = signals
        """Who can signal which host's processes; None: no host's (the demo)."""
        self.targets = source if isinstance(source, TargetFinder) else None
        """How to reach hosts to verify them; None: none can be (the demo)."""
        self.label = label
        self.refresh_seconds = refresh
        self.auto_poll = auto_poll
        self.store = FleetStore(source.hosts, history_length=history_seconds)
        self._history_seconds = history_seconds
        for registered in THEMES.values():
            self.register_theme(registered)
        self.theme = theme

    @property
    def palette(self) -> Palette:
        return Palette(self.current_theme.variables)

    def on_mount(self) -> None:
        prime(self.store, self.source, self._history_seconds)
        ingest(self.store, collect(self.source))
        self.push_screen(FleetScreen())
        if self.auto_poll:
            self._schedule_poll()

    def poll_now(self) -> Worker[list[Reading]]:
        """Start one polling round now (the timer chain calls this; so can tests)."""
        return self.run_worker(
            lambda: collect(self.source),
            thread=True,
            exclusive=True,
            group="poll",
            exit_on_error=False,
            description="read every host once",
        )

    def _schedule_poll(self) -> None:
        self.set_timer(self.refresh_seconds, self.poll_now, name="poll")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "poll":
            return
        if event.state is WorkerState.SUCCESS:
            self.apply_readings(event.worker.result or [])
        elif event.state is WorkerState.ERROR:
            self.notify(f"reading failed: {event.worker.error}", severity="error")
        else:
            return
        if self.auto_poll:
            self._schedule_poll()

    def apply_readings(self, readings: list[Reading]) -> None:
        """Record readings and let the screen on top show what changed."""
        changed = ingest(self.store, readings)
        if changed and isinstance(self.screen, ConsoleScreen):
            self.screen.refresh_view(changed)

    def verify(self, hosts: list[str]) -> None:
        """Open the verification screen on those of ``hosts`` that can be reached."""
        from gpuconsole.screens.verify import VerifyScreen

        found = [self.targets.verify_target(h) for h in hosts] if self.targets else []
        targets = [t for t in found if t is not None]
        if not targets:
            self.notify(
                "nothing to verify: simulated hosts have no shell to run the checks in",
                severity="warning",
            )
            return
        self.push_screen(VerifyScreen(targets))

    def repair(self, host: str) -> None:
        """Open the repair panel on ``host`` if it can be reached."""
        from gpuconsole.screens.repair import RepairScreen

        target = self.targets.verify_target(host) if self.targets else None
        if target is None:
            self.notify(
                "nothing to repair: a simulated host has no driver to fix", severity="warning"
            )
            return
        self.push_screen(RepairScreen(target))

    def benchmark(self, host: str) -> None:
        """Ask, then run the default benchmark on ``host`` in the run panel."""
        from gpuconsole.screens.confirm import ConfirmScreen
        from gpuconsole.screens.run import DEFAULT_BENCHMARK, RunScreen

        target = self.targets.verify_target(host) if self.targets else None
        if target is None:
            self.notify("a simulated host cannot run a benchmark", severity="warning")
            return
        spec = DEFAULT_BENCHMARK

        def answered(yes: bool | None) -> None:
            if yes:
                self.push_screen(RunScreen(target, spec))

        question = f"Run the {spec.preset} {spec.recipe} benchmark on {host}?"
        detail = (
            f"{spec.steps} steps on every GPU of {host} (about a minute, compilation included); "
            "the GPUs are busy meanwhile. s stops it."
        )
        self.push_screen(ConfirmScreen(question, detail), answered)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())
