"""The run panel: a recipe launched on this machine's CPU (a stand-in nvidia-smi names one GPU),
followed live, its result judged and kept; and a run stopped from the panel."""

from __future__ import annotations

import psutil
import pytest
from pilot_wait import until

from gpuconsole.actions.launch.commands import LaunchSpec
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.ui.screens.confirm import ConfirmScreen
from gpuconsole.ui.screens.run import RunScreen

CPU = ("--tiny", "--device", "cpu", "--warmup-steps", "1", "--log-every", "1")
HERE = Target("here", None, Context("here"))


pytestmark = pytest.mark.usefixtures("cpu_torch_host")
RUN_S = 240.0  # a recipe run on a loaded 2-core CI machine


def recipe_processes() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any("recipes/resnet50.py" in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


async def test_a_run_is_followed_live_and_its_result_judged(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = RunScreen(HERE, LaunchSpec("resnet50", "baseline", 4, CPU))
        app.push_screen(screen)
        await until(pilot, lambda: screen.outcome != "", timeout=RUN_S)
        assert screen.result is not None and screen.result.ok, screen.outcome
        assert len(screen.steps) >= 2
        assert "samples/s" in str(screen.query_one("#run-trend").render())
        assert "resnet50 baseline:" in screen.outcome
        assert "this host's median" in screen.outcome  # too few runs yet: it says so


async def test_a_run_stopped_from_the_panel_leaves_nothing_running(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = RunScreen(HERE, LaunchSpec("resnet50", "baseline", 100000, CPU))
        app.push_screen(screen)
        await until(pilot, lambda: len(screen.steps) >= 1, timeout=RUN_S)
        await pilot.press("s")
        await until(pilot, lambda: screen.outcome != "", timeout=RUN_S)
        assert screen.outcome.startswith("stopped")
        await until(pilot, lambda: not recipe_processes(), timeout=10)


async def test_b_asks_before_it_runs_anything(make_app) -> None:
    from static_source import StaticSource

    from gpuconsole.core.model import GpuState, HostSnapshot
    from gpuconsole.hosts.source import FleetSource
    from gpuconsole.ui.app import GpuConsoleApp
    from gpuconsole.ui.screens.host import HostScreen

    source = FleetSource(StaticSource(HostSnapshot("here", 1.0, (GpuState(0),))), None)
    app = GpuConsoleApp(source, auto_poll=False, background_start=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HostScreen("here"))
        await pilot.pause()
        await pilot.press("b")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert not isinstance(app.screen, RunScreen)
