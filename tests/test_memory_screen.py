"""The memory panel: trials of a recipe on this machine's CPU fill the table as they finish, the
recommendation is shown, and `a` launches the recipe with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from notices import Notice, notices
from pilot_wait import until

from gpuconsole.actions.memory.session import DoctorRequest, Schedule
from gpuconsole.actions.memory.trials import parse_fixes
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.ui.screens.memory import MemoryScreen
from gpuconsole.ui.screens.run import RunScreen

HERE = Target("here", None, Context("here"))
TINY = ("--tiny", "--device", "cpu")


pytestmark = pytest.mark.usefixtures("cpu_torch_host")
RUN_S = 240.0  # a recipe run on a loaded 2-core CI machine


async def test_the_trials_fill_the_table_and_a_applies_the_recommendation(
    make_app, audit_log: Path
) -> None:
    request = DoctorRequest(
        "bert",
        target_gib=0.03,
        only=(parse_fixes("bf16+checkpoint"),),
        extra=TINY,
        schedule=Schedule(steps=2, warmup=1),
        preset="baseline",  # eager: compiling for a CPU takes minutes
    )
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        screen = MemoryScreen(HERE, request)
        app.push_screen(screen)
        await until(pilot, lambda: screen.finished is not None, timeout=RUN_S)
        report = screen.finished
        assert report.recommended is not None, report
        table = screen.query_one("#memory-trials")
        assert table.row_count == len(report.trials) >= 2
        first = table.get_row_at(0)
        assert first[0].plain == "bf16+checkpoint" and first[-1].plain == "fits"
        result = str(screen.query_one("#memory-result").render())
        assert "recommended: bf16+checkpoint" in result
        assert "largest batch under the target" in result
        await pilot.press("a")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        assert run.spec.preset == "baseline"  # the job's preset, as the trials ran it
        extra = list(run.spec.extra)
        assert extra[extra.index("--checkpoint-every") + 1] == "1"
        assert extra[extra.index("--precision") + 1] == "bf16"
        assert extra[-len(TINY) :] == list(TINY)
        await until(pilot, lambda: run.outcome != "", timeout=RUN_S)
        assert run.result is not None and run.result.ok, run.outcome
    # each trial wrote the recipe and ran it; then the launch did
    entries = [json.loads(line) for line in audit_log.read_text().splitlines()]
    trial = [("memory-trial", "install"), ("memory-trial", "run")]
    launched = [("launch", "install"), ("launch", "run")]
    assert [(e["action"], e["step"]) for e in entries] == trial * len(report.trials) + launched
    assert all(e["host"] == "here" for e in entries)
    assert [e["exit_code"] for e in entries[-2:]] == [0, 0]
    assert entries[-1]["command"] == run.result.command


async def test_a_simulated_host_has_no_memory_trials(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(140, 40), notifications=True) as pilot:
        await pilot.press("enter")  # the first host of the demo rack
        await pilot.pause()
        await pilot.press("m")
        await pilot.pause()
        assert not isinstance(app.screen, MemoryScreen)
        shown = await notices(pilot)
        said = Notice("a simulated host cannot run the memory trials", "warning")
        assert said in shown, shown
