"""The service panel: take a host's node out of its scheduler (Slurm drain, Kubernetes cordon) or
bring it back. What will run is asked of the host first and shown exactly; it runs only after a
yes, through the action's audited shell; the scheduler's own word on the node comes back."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from gpuconsole.actions.service import (
    DRAIN,
    MAX_REASON,
    RESUME,
    Change,
    ServiceError,
    ServicePlan,
    ServiceResult,
    apply_service,
    checked_reason,
    plan_service,
)
from gpuconsole.actions.session import open_shell
from gpuconsole.core.untrusted import visible
from gpuconsole.hosts.ssh import ConnectFailure
from gpuconsole.hosts.targets import Target
from gpuconsole.ui.screens.action import ActionScreen

_EFFECT = {
    DRAIN: "no new jobs land on it; the running ones finish",
    RESUME: "jobs may land on it again",
}


class ReasonScreen(ModalScreen[str | None]):
    """Asks why a node is taken out; only a reason the scheduler will keep is taken
    (`checked_reason`), anything else is said under the box. Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="service.reason-cancel")]
    CSS = """
    ReasonScreen { align: center middle; }
    ReasonScreen #reason-body {
        width: 76;
        max-width: 100%;
        height: auto;
        padding: 1 2;
        border: round $warning;
        background: $surface;
    }
    ReasonScreen #reason-error { color: $error; height: auto; }
    """

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host

    def compose(self) -> ComposeResult:
        with Vertical(id="reason-body"):
            yield Static(f"Drain {self.host}: why? (sinfo -R shows it)", markup=False)
            yield Input(placeholder="e.g. GPU 3 fell off the bus", max_length=MAX_REASON)
            yield Static(id="reason-error", markup=False)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        try:
            reason = checked_reason(event.value)
        except ServiceError as error:
            self.query_one("#reason-error", Static).update(str(error).removeprefix("--reason: "))
            return
        self.dismiss(reason)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ServiceScreen(ActionScreen):
    """Plans on open (nothing changes), asks with the exact command, then runs it and shows the
    scheduler's answer."""

    HELP_TITLE = "Drain / resume"
    HELP_ORDER = 85

    BINDINGS = [Binding("escape", "app.pop_screen", "Back", id="service.back")]
    CSS = """
    ServiceScreen #service-status, ServiceScreen #service-plan, ServiceScreen #service-answer {
        height: auto;
        padding: 0 1;
    }
    ServiceScreen #service-plan { margin: 1 0; }
    """

    def __init__(self, target: Target, change: Change, reason: str | None = None) -> None:
        super().__init__()
        self.target = target
        self.change = change
        self.reason = reason
        self.plan: ServicePlan | None = None
        self.outcome: ServiceResult | str | None = None
        """The scheduler's answer, or why nothing ran; None while the action runs."""

    def where(self) -> str:
        return f"{self.change} {self.target.name}"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="service-status", markup=False)
        yield Static(id="service-plan", markup=False)
        yield Static(id="service-answer", markup=False)
        yield self.key_bar()

    def on_mount(self) -> None:
        super().on_mount()
        self._status(f"asking {self.target.name} which scheduler it runs (nothing changes yet)")
        self.act(self._service, self._ended, group="service")

    async def _service(self) -> ServiceResult | str:
        """On the action's loop: plan, ask, apply, in one shell; a string says why nothing ran."""
        try:
            async with open_shell(self.target, self.change) as shell:
                plan = await plan_service(shell, self.change, self.reason)
                self.from_thread(self._planned, plan)
                question = f"{self.change.capitalize()} {plan.node} on {plan.host}?"
                detail = f"{_EFFECT[plan.change]}.\n$ {plan.command}"
                if not await self.confirm(question, detail):
                    return f"{plan.host}: nothing run"
                return await apply_service(shell, plan)
        except ServiceError as error:
            return str(error)
        except ConnectFailure as failure:
            return failure.reason

    def _planned(self, plan: ServicePlan) -> None:
        self.plan = plan
        self._status(f"{plan.host}: {plan.scheduler} node {plan.node}; asking before it runs")
        self.query_one("#service-plan", Static).update(Text(f"$ {plan.command}", style="bold"))

    def _ended(self, outcome: ServiceResult | str) -> None:
        self.outcome = outcome
        if isinstance(outcome, str):
            self._status(visible(outcome))
            return
        self._status("done" if outcome.ok else "failed")
        style = self.palette["util-high" if outcome.ok else "severity-critical"]
        said = f"{outcome.plan.host}: {visible(outcome.message)}"
        self.query_one("#service-answer", Static).update(Text(said, style=style))

    def _status(self, text: str) -> None:
        self.query_one("#service-status", Static).update(text)
