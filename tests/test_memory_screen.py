"""The memory panel: trials of a recipe on this machine's CPU fill the table as they finish, the
recommendation is shown, and `a` launches the recipe with it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from standin import write_standin_smi

from gpuconsole.actions.memory.session import DoctorRequest, Schedule
from gpuconsole.actions.memory.trials import parse_fixes
from gpuconsole.actions.verify.model import Context, Target
from gpuconsole.screens.memory import MemoryScreen
from gpuconsole.screens.run import RunScreen

HERE = Target("here", None, Context("here"))
TINY = ("--tiny", "--device", "cpu")


@pytest.fixture(autouse=True)
def cpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_standin_smi(bin_dir, gpus=1)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


async def _until(pilot, condition, timeout: float = 240.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.2)):
        if condition():
            return
        await pilot.pause(0.2)
    raise AssertionError("timed out")


async def test_the_trials_fill_the_table_and_a_applies_the_recommendation(make_app) -> None:
    request = DoctorRequest(
        "bert",
        target_gib=0.03,
        only=parse_fixes("bf16+checkpoint"),
        extra=TINY,
        schedule=Schedule(steps=2, warmup=1),
    )
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        screen = MemoryScreen(HERE, request)
        app.push_screen(screen)
        await _until(pilot, lambda: screen.finished is not None)
        report = screen.finished
        assert report.recommended is not None, report
        table = screen.query_one("#memory-trials")
        assert table.row_count == len(report.trials) >= 2
        first = table.get_row_at(0)
        assert first[0] == "bf16+checkpoint" and first[-1] == "fits"
        result = str(screen.query_one("#memory-result").render())
        assert "recommended: bf16+checkpoint" in result
        assert "largest batch under the target" in result
        await pilot.press("a")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        assert run.spec.preset == "baseline"
        extra = list(run.spec.extra)
        assert extra[extra.index("--checkpoint-every") + 1] == "1"
        assert extra[extra.index("--precision") + 1] == "bf16"
        assert extra[-len(TINY) :] == list(TINY)
        await _until(pilot, lambda: run.outcome != "")
        assert run.result is not None and run.result.ok, run.outcome


async def test_a_simulated_host_has_no_memory_trials(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("enter")  # the first host of the demo rack
        await pilot.pause()
        await pilot.press("m")
        await pilot.pause()
        assert not isinstance(app.screen, MemoryScreen)
        assert any("cannot run the memory trials" in n.message for n in app._notifications)
