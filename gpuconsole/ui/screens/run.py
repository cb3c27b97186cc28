"""The run panel: a benchmark recipe running on a host, live (throughput trend, loss, memory,
the GPUs' load), then its result against references and the host's history."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import RichLog, Static

from gpuconsole.actions.launch.commands import LaunchError, LaunchSpec
from gpuconsole.actions.launch.output import result_text
from gpuconsole.actions.launch.record import record_run
from gpuconsole.actions.launch.run import Event, RunResult
from gpuconsole.actions.launch.session import Launch, launch
from gpuconsole.bench.history import BenchHistory, HistoryError
from gpuconsole.core.fields import gib
from gpuconsole.hosts.targets import Target
from gpuconsole.ui.screens.action import ActionScreen
from gpuconsole.ui.widgets.trend import sparkline

DEFAULT_BENCHMARK = LaunchSpec("resnet50", "tuned", steps=100)
"""What `b` launches: tuned resnet50 on every GPU, about a minute with compilation."""
LOG_LINES = 1000
_TREND_WIDTH = 60


class RunScreen(ActionScreen):
    """Launches on mount; `s` stops the run (its processes on the host are killed)."""

    HELP_TITLE = "Benchmark run"
    HELP_ORDER = 90

    CSS = """
    RunScreen #run-status, RunScreen #run-trend, RunScreen #run-numbers {
        height: 1;
        padding: 0 1;
    }
    RunScreen #run-result {
        height: auto;
        padding: 0 1;
        border-top: solid $panel;
    }
    RunScreen #run-log {
        height: 1fr;
        border-top: solid $panel;
        padding: 0 1;
    }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="run.back"),
        Binding("s", "stop", "Stop", id="run.stop", tooltip="stop the run on the host"),
    ]
    OUTPUT = "run-log"

    def __init__(self, target: Target, spec: LaunchSpec = DEFAULT_BENCHMARK) -> None:
        super().__init__()
        self.target = target
        self.spec = spec
        self.steps: list[Event] = []
        self.result: RunResult | None = None
        self.outcome = ""

    def where(self) -> str:
        return f"run {self.spec.recipe} on {self.target.name}"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="run-status", markup=False)
        yield Static(id="run-trend", markup=False)
        yield Static(id="run-numbers", markup=False)
        yield Static(id="run-result", markup=False)
        yield RichLog(id="run-log", max_lines=LOG_LINES, markup=False, wrap=True)
        yield self.key_bar()

    def on_mount(self) -> None:
        super().on_mount()
        self._status(f"starting {self.spec.recipe} ({self.spec.preset}) on {self.target.name}")
        self._run()

    def stopping(self) -> None:
        self._status("stopping: the run's processes on the host are being killed")

    def _run(self) -> None:
        self.act(self._launch, lambda finished: self._finished(*finished), group="run")

    async def _launch(self) -> tuple[RunResult | None, str]:
        """The run, then its result kept and judged (on the worker: it writes the history)."""
        try:
            _plan, gpus, result = await launch(
                [self.target],
                self.spec,
                on_plan=lambda plan, _gpus: self.from_thread(self._planned, plan),
                on_event=lambda event: self.from_thread(self._event, event),
                on_line=self.output_from_thread,
            )
        except asyncio.CancelledError:
            return None, "stopped: the run was stopped by you"
        except LaunchError as error:
            return None, f"could not start: {error}"
        try:
            _stored, judgement = record_run(BenchHistory(), result, gpus.driver)
            outcome = result_text(result, judgement)
        except HistoryError as error:
            outcome = f"{result_text(result, None)}\n(not kept: {error})"
        return result, outcome

    def _planned(self, plan: Launch) -> None:
        gpus = ", ".join(str(g) for g in plan.gpus) or "from Slurm"
        self._status(f"running on {self.target.name} with {plan.engine}, GPUs {gpus}; s stops")
        for host, command in plan.commands.items():
            self.output(f"{host}: $ {command}")

    def _event(self, event: Event) -> None:
        if event.get("event") == "step":
            self.steps.append(event)
            self.refresh_view(None)
        elif event.get("event") == "error":
            self.output(f"error ({event.get('kind')}): {event.get('message')}")

    def _finished(self, result: RunResult | None, outcome: str) -> None:
        self.result = result
        self.outcome = outcome
        self._status("finished" if result is not None and result.ok else "not finished")
        self.query_one("#run-result", Static).update(outcome)

    def _status(self, text: str) -> None:
        self.query_one("#run-status", Static).update(text)

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        rates = [
            float(e["samples_per_s"]) for e in self.steps if _is_number(e.get("samples_per_s"))
        ]
        trend = Text("samples/s ")
        if rates:
            trend.append(sparkline(rates, 0.0, max(rates), _TREND_WIDTH), style="bold")
            trend.append(f" {rates[-1]:,.0f}")
        self.query_one("#run-trend", Static).update(trend)
        self.query_one("#run-numbers", Static).update(self._numbers())

    def _numbers(self) -> str:
        last = self.steps[-1] if self.steps else {}
        parts = [
            f"step {last.get('step', '-')}",
            f"loss {_fmt(last.get('loss'), 3)}",
            f"peak memory {_gib(last.get('peak_memory_mib'))}",
        ]
        if self.target.name in self.store.hosts:
            snapshot = self.store.latest(self.target.name)
            if snapshot is not None:
                loads = [g.utilization_pct for g in snapshot.gpus if g.utilization_pct is not None]
                if loads:
                    parts.append("GPU load " + " ".join(f"{v:.0f}%" for v in loads))
        return "   ".join(parts)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float))


def _gib(mib: object) -> str:
    return f"{gib(float(mib))} GiB" if isinstance(mib, (int, float)) else "N/A"


def _fmt(value: object, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if _is_number(value) else "N/A"
