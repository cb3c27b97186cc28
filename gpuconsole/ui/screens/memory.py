"""The memory panel: a recipe's short trials with each memory fix on one GPU of a host, filling a
table as they finish, then the recommendation; `a` launches the recipe with it."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.widgets import Static

from gpuconsole.actions.memory.output import TRIAL_COLUMNS, report_text, trial_cells
from gpuconsole.actions.memory.session import (
    DoctorRequest,
    MemoryDoctorError,
    MemoryReport,
    launch_spec,
    run_doctor,
)
from gpuconsole.actions.memory.trials import Trial
from gpuconsole.hosts.targets import Target
from gpuconsole.ui.screens.action import ActionScreen
from gpuconsole.ui.widgets.cells import fit
from gpuconsole.ui.widgets.keyed_table import ColumnSpec, KeyedTable, fit_columns

_KEPT = frozenset({"trial", "peak", "target"})
"""The trial table's columns that stay whatever the width: which fixes, their peak, whether it
fits the target."""
_DROP = {"samples/s": 1, "vs fp32": 2, "loss": 3, "vs mixed": 4, "mode": 5, "spread": 6}
"""Where the width is short, the other columns go, the highest first (any not named here before
these)."""
_MOST = 28
"""The widest a column gets (a failed trial's reason is cut where a word ends)."""

DEFAULT_JOB = DoctorRequest("bert", extra=("--padding", "fixed"))
"""What `m` tries: BERT-base at sequence 512, the recipe's batch of 32, as `launch` runs it
(the tuned preset: compiled), against the card less the guide's 20 % reserve."""


class MemoryScreen(ActionScreen):
    """Starts the trials on mount; `s` stops them; `a` applies the recommendation."""

    HELP_TITLE = "Memory trials"
    HELP_ORDER = 95

    CSS = """
    MemoryScreen #memory-status, MemoryScreen #memory-result {
        height: auto;
        padding: 0 1;
    }
    MemoryScreen #memory-result {
        border-top: solid $panel;
    }
    """
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
        self.report = MemoryReport(
            target.name, request.recipe, preset=request.preset, amp=request.amp
        )
        self.finished: MemoryReport | None = None

    def where(self) -> str:
        return f"memory trials of {self.request.recipe} on {self.target.name}"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="memory-status", markup=False)
        yield KeyedTable(id="memory-trials")
        yield Static(id="memory-result", markup=False)
        yield self.key_bar()

    def on_mount(self) -> None:
        super().on_mount()
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
        self._show_trials()

    def _done(self, report: MemoryReport) -> None:
        self.finished = report
        self.report = report
        self._show_trials()
        summary = report_text(report).split("\n\n", 1)[-1]
        self.query_one("#memory-result", Static).update(summary)
        ready = "a launches the recipe with it" if report.recommended else "nothing to apply"
        self._status(f"finished: {len(report.trials)} trials; {ready}")

    def on_resize(self, _event: Resize) -> None:
        self._show_trials()

    def _show_trials(self) -> None:
        """The trials, in the columns that fit the width (`_DROP`), each cell cut to its
        column where a word ends."""
        rows = [trial_cells(trial, self.report) for trial in self.report.trials]
        specs = [
            ColumnSpec(
                name,
                name,
                min(_MOST, max([len(name), *(len(row[i]) for row in rows)])),
                drop=0 if name in _KEPT else _DROP.get(name, len(_DROP) + 1),
            )
            for i, name in enumerate(TRIAL_COLUMNS)
        ]
        columns = fit_columns(specs, self.size.width or 80)
        kept = [(TRIAL_COLUMNS.index(spec.key), spec.width or 0) for spec in columns]
        table = self.query_one("#memory-trials", KeyedTable)
        table.set_columns(columns)
        table.sync(
            [
                (str(n), tuple(Text(fit(row[i], width)) for i, width in kept))
                for n, row in enumerate(rows)
            ]
        )

    def _status(self, text: str) -> None:
        self.query_one("#memory-status", Static).update(text)

    def stopping(self) -> None:
        self._status("stopping: the trial's processes on the host are being killed")

    def action_apply(self) -> None:
        from gpuconsole.ui.screens.run import RunScreen

        spec = launch_spec(self.request, self.finished) if self.finished else None
        if spec is None:
            self.notify("no recommendation to apply yet", severity="warning")
            return
        self.app.push_screen(RunScreen(self.target, spec))
