"""The memory panel: a recipe's short trials with each memory fix on one GPU of a host, filling a
table as they finish, then the recommendation; `a` launches the recipe with it."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from gpuconsole.actions.launch.commands import LaunchSpec
from gpuconsole.actions.memory.output import TRIAL_COLUMNS, report_text, trial_cells
from gpuconsole.actions.memory.session import (
    DoctorRequest,
    MemoryDoctorError,
    MemoryReport,
    run_doctor,
)
from gpuconsole.actions.memory.trials import Trial
from gpuconsole.hosts.targets import Target
from gpuconsole.screens.action import ActionScreen

DEFAULT_JOB = DoctorRequest("bert", extra=("--padding", "fixed"))
"""What `m` tries: BERT-base at sequence 512, the recipe's batch of 32, against the card less
the guide's 20 % reserve."""


class MemoryScreen(ActionScreen):
    """Starts the trials on mount; `s` stops them; `a` applies the recommendation."""

    HELP_TITLE = "Memory trials"
    HELP_ORDER = 95

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="memory.back"),
        Binding("s", "stop", "Stop", id="memory.stop", tooltip="stop the trials on the host"),
        Binding(
            "a",
            "apply",
            "Apply",
            id="memory.apply",
            tooltip="launch the recipe with the recommended fixes",
        ),
    ]

    def __init__(self, target: Target, request: DoctorRequest = DEFAULT_JOB) -> None:
        super().__init__()
        self.target = target
        self.request = request
        self.report = MemoryReport(target.name, request.recipe)
        self.finished: MemoryReport | None = None

    def where(self) -> str:
        return f"memory trials of {self.request.recipe} on {self.target.name}"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="memory-status", markup=False)
        yield DataTable(id="memory-trials", cursor_type="row", zebra_stripes=True)
        yield Static(id="memory-result", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#memory-trials", DataTable).add_columns(*TRIAL_COLUMNS)
        self._status(
            f"trying each memory fix on {self.request.recipe}, GPU {self.request.gpu} of "
            f"{self.target.name}: one short run per trial; s stops"
        )
        self._trials()

    def _trials(self) -> None:
        self.act(self._run_trials, self._outcome, group="memory")

    async def _run_trials(self) -> MemoryReport | str:
        """The trials' report, or why there is none."""
        try:
            return await run_doctor(
                self.target,
                self.request,
                on_trial=lambda trial: self.from_thread(self._add_trial, trial),
            )
        except asyncio.CancelledError:
            return "stopped: the trials were stopped by you"
        except MemoryDoctorError as error:
            return f"could not run the trials: {error}"

    def _outcome(self, outcome: MemoryReport | str) -> None:
        if isinstance(outcome, str):
            self._status(outcome)
        else:
            self._done(outcome)

    def _add_trial(self, trial: Trial) -> None:
        self.report.trials.append(trial)
        self.query_one("#memory-trials", DataTable).add_row(
            *map(Text, trial_cells(trial, self.report))
        )

    def _done(self, report: MemoryReport) -> None:
        self.finished = report
        table = self.query_one("#memory-trials", DataTable)
        table.clear()
        self.report = report
        for trial in report.trials:
            table.add_row(*map(Text, trial_cells(trial, self.report)))
        summary = report_text(report).split("\n\n", 1)[-1]
        self.query_one("#memory-result", Static).update(summary)
        ready = "a launches the recipe with it" if report.recommended else "nothing to apply"
        self._status(f"finished: {len(report.trials)} trials; {ready}")

    def _status(self, text: str) -> None:
        self.query_one("#memory-status", Static).update(text)

    def stopping(self) -> None:
        self._status("stopping: the trial's processes on the host are being killed")

    def action_apply(self) -> None:
        from gpuconsole.screens.run import RunScreen

        report = self.finished
        if report is None or report.recommended is None:
            self.notify("no recommendation to apply yet", severity="warning")
            return
        flags = report.recommended.fixes.arguments(report.batch_size or 1)
        spec = LaunchSpec(self.request.recipe, "baseline", extra=(*flags, *self.request.extra))
        self.app.push_screen(RunScreen(self.target, spec))
