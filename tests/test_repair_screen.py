"""The repair panel on this machine (no NVIDIA driver; its bus shown with one GPU): diagnosis on
open, then each plan run only after a yes, with the system tools as recording stand-ins."""

from __future__ import annotations

from pathlib import Path

import pytest
from pilot_wait import until
from test_repair_execute import calls, sysfs_with_one_gpu, write_tools

from gpuconsole.actions.verify.probes import SYSFS_VARIABLE
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.ui.screens.confirm import ConfirmScreen
from gpuconsole.ui.screens.repair import RepairScreen

PLAN_S = 30.0


CHANGERS = ("apt-get", "modprobe", "update-initramfs")


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.log"
    tools = write_tools(tmp_path / "bin", path, CHANGERS)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setenv(SYSFS_VARIABLE, str(sysfs_with_one_gpu(tmp_path / "sys")))
    return path


async def test_the_panel_diagnoses_then_runs_a_plan_only_after_yes(make_app, log: Path) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = RepairScreen(Target("here", None, Context("here")))
        app.push_screen(screen)
        await until(pilot, lambda: screen.report is not None, timeout=PLAN_S)
        assert screen.report is not None
        assert "no-driver-installed" in [c.id for c in screen.report.diagnosis.causes]
        plan_text = str(screen.query_one("#repair-plan").render())
        assert "$ apt-get install -y" in plan_text and "dry run: nothing was run" in plan_text
        assert calls(log) == []

        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=PLAN_S)
        await pilot.press("n")
        await until(
            pilot,
            lambda: "done" in str(screen.query_one("#repair-status").render()),
            timeout=PLAN_S,
        )
        assert calls(log) == []

        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=PLAN_S)
        assert "$ apt-get install -y" in app.screen.detail
        await pilot.press("y")
        await until(
            pilot,
            lambda: "verified again" in str(screen.query_one("#repair-status").render()),
            timeout=PLAN_S,
        )
        assert [c.split()[0] for c in calls(log)] == ["apt-get", "apt-get"]
        output = "\n".join(str(line) for line in screen.query_one("#repair-output").lines)
        assert "apt-get: working on install -y" in output


async def test_a_simulated_host_has_nothing_to_repair(make_app) -> None:
    from gpuconsole.ui.screens.host import HostScreen

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HostScreen(app.fleet.store.hosts[0]))
        await pilot.pause()
        await pilot.press("R")
        await pilot.pause()
        assert not isinstance(app.screen, RepairScreen)
