"""The repair panel: why a host's NVIDIA driver does not work, the plans that fix it shown
exactly as they will run, and, after a yes for each plan, their output as it streams."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import RichLog, Static

from gpuconsole.actions.repair.model import Plan
from gpuconsole.actions.repair.output import report_text
from gpuconsole.actions.repair.session import RepairReport, repair_target
from gpuconsole.hosts.targets import Target
from gpuconsole.ui.screens.action import ActionScreen

OUTPUT_LINES = 2000


class RepairScreen(ActionScreen):
    """Diagnoses on open (a dry run: nothing changes); `x` runs the plans, each confirmed."""

    HELP_TITLE = "Repair"
    HELP_ORDER = 80

    CSS = """
    RepairScreen #repair-status {
        height: 1;
        padding: 0 1;
    }
    RepairScreen #repair-plan-box {
        height: 2fr;
        padding: 0 1;
    }
    RepairScreen #repair-output {
        height: 1fr;
        min-height: 5;
        border-top: solid $panel;
        padding: 0 1;
    }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="repair.back"),
        Binding(
            "x",
            "run_plans",
            "Run the plans",
            id="repair.run",
            tooltip="run each plan on the host after a yes for it; output streams below",
        ),
        Binding("r", "diagnose", "Diagnose again", id="repair.diagnose"),
    ]
    OUTPUT = "repair-output"

    def __init__(self, target: Target) -> None:
        super().__init__()
        self.target = target
        self.report: RepairReport | None = None

    def where(self) -> str:
        return f"repair {self.target.name}"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="repair-status", markup=False)
        with VerticalScroll(id="repair-plan-box"):
            yield Static(id="repair-plan", markup=False)
        yield RichLog(id="repair-output", max_lines=OUTPUT_LINES, markup=False, wrap=True)
        yield self.key_bar()

    def on_mount(self) -> None:
        super().on_mount()
        self.action_diagnose()

    def action_diagnose(self) -> None:
        if self.acting:
            return
        self._status(f"diagnosing {self.target.name}: reading the driver's state (nothing changes)")
        self._run_repair(dry_run=True)

    def action_run_plans(self) -> None:
        if self.acting or self.report is None or not self.report.plans:
            self.notify("nothing to run", severity="warning")
            return
        self._status(f"running the plans on {self.target.name}, each after a yes")
        self._run_repair(dry_run=False)

    def _run_repair(self, dry_run: bool) -> None:
        repair = partial(
            repair_target,
            self.target,
            confirm=self._confirm,
            dry_run=dry_run,
            on_line=self.output_from_thread,
        )
        self.act(repair, lambda report: self._show(report, dry_run), group="repair")

    async def _confirm(self, plan: Plan, commands: Sequence[str]) -> bool:
        question = f"Run {len(commands)} command(s) on {self.target.name}: {plan.title}?"
        detail = "\n".join(f"$ {c}" for c in commands)
        if plan.reboot:
            detail += "\n(then reboot the host yourself)"
        return await self.confirm(question, detail)

    def _show(self, report: RepairReport, dry_run: bool) -> None:
        if report.error is None or self.report is None:
            self.report = report
        self.query_one("#repair-plan", Static).update(report_text(report))
        if report.error is not None:
            self._status(f"{self.target.name} not reached: {report.error}")
        elif report.diagnosis is not None and report.diagnosis.healthy:
            self._status(f"{self.target.name}: no cause found: the driver works")
        elif dry_run:
            self._status(f"{len(report.plans)} plan(s): x runs them, each after a yes")
        else:
            for run in report.runs:
                self.output(f"{run.plan.title}: {run.message}")
            after = report.after
            self._status("done" if after is None else f"done; verified again: {after.status.value}")

    def _status(self, text: str) -> None:
        self.query_one("#repair-status", Static).update(text)
