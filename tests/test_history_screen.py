"""The bench history view (`H` on the host screen): a host's runs and its peers', newest first,
flagged as `launch` flagged them, the comparisons of the run under the cursor, and a history file
that cannot be read or is busy."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import pytest
from conftest import EPOCH
from textual.pilot import Pilot

from gpuconsole.bench.history import BenchHistory, BenchResult
from gpuconsole.bench.review import host_review
from gpuconsole.core import paths
from gpuconsole.ui.screens.history import HistoryScreen
from gpuconsole.ui.screens.host import HostScreen

H100 = "NVIDIA H100 80GB HBM3"
DAY = 86_400.0


def run(
    host: str,
    rate: float | None,
    days_ago: float,
    *,
    gpu: str = H100,
    status: str = "ok",
    message: str | None = None,
) -> BenchResult:
    return BenchResult(
        time=EPOCH - days_ago * DAY,
        host=host,
        gpu_model=gpu,
        driver="580.159.04",
        torch="2.13.0+cu130",
        recipe="resnet50",
        preset="tuned",
        knobs={"precision": "bf16", "compile": True, "batch_size": 256},
        samples_per_s=rate,
        peak_memory_mib=None if rate is None else 61_440.0,
        world_size=8,
        status=status,  # type: ignore[arg-type]
        message=message,
    )


RUNS = (  # oldest first, as they were kept
    run("h100-02", 24_100.0, 9),
    run("h100-02", 23_900.0, 8),
    run("h100-01", 24_000.0, 7),
    run("a100-01", 11_000.0, 6.5, gpu="NVIDIA A100-SXM4-80GB"),
    run("h100-01", 24_200.0, 6),
    run("h100-02", 24_050.0, 5),
    run("h100-01", 23_800.0, 4),
    run("h100-01", None, 3, status="failed", message="nccl: NCCL failed between the processes"),
    run("h100-01", 20_500.0, 2),  # 15 % below its median: flagged
    run("h100-01", 24_100.0, 1),  # level again: the flag above stays
)


@pytest.fixture
def history() -> BenchHistory:
    """The default history (in the test's XDG data dir), filled with RUNS."""
    stored = BenchHistory(paths.BENCH_DB.path())
    for result in RUNS:
        stored.record(result)
    return stored


async def loaded(pilot: Pilot, screen: HistoryScreen) -> None:
    for _ in range(100):
        if screen.runs is not None or screen.error is not None:
            await pilot.pause()
            return
        await pilot.pause(0.05)
    raise AssertionError("the history was not read")


def cell(screen: HistoryScreen, key: str, column: str) -> str:
    table = screen.query_one("#history-runs")
    return str(table.get_cell(key, column))


def detail(screen: HistoryScreen) -> str:
    return str(screen.query_one("#history-detail").render())


async def test_h_opens_the_hosts_runs_and_its_peers_newest_first(make_app, history) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.push_screen(HostScreen("h100-01"))
        await pilot.pause()
        await pilot.press("H")
        screen = app.screen
        assert isinstance(screen, HistoryScreen) and screen.host == "h100-01"
        await loaded(pilot, screen)
        assert screen.runs is not None
        hosts = [judged.run.host for judged in screen.runs]
        assert hosts == [
            "h100-01", "h100-01", "h100-01", "h100-01", "h100-02",
            "h100-01", "h100-01", "h100-02", "h100-02",
        ]  # fmt: skip
        times = [judged.run.time for judged in screen.runs]
        assert times == sorted(times, reverse=True)
        assert [judged.peer for judged in screen.runs].count(True) == 3
        status = str(screen.query_one("#history-status").render())
        assert "6 run(s) of h100-01, 3 of its peers, 1 flagged, 1 failed" in status
        await pilot.press("escape")
        assert isinstance(app.screen, HostScreen)


async def test_a_regression_stays_flagged_and_its_comparisons_are_shown(make_app, history) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        screen = HistoryScreen("h100-01")
        app.push_screen(screen)
        await loaded(pilot, screen)
        assert screen.runs is not None
        flags = {j.run.samples_per_s: j.judgement.flagged for j in screen.runs}
        assert flags[20_500.0] and not flags[24_100.0] and not flags[24_050.0]
        newest, flagged = (str(j.run.run_id) for j in screen.runs[:2])
        assert cell(screen, flagged, "flag") == "REGRESSION"
        assert cell(screen, newest, "flag") == ""
        newest_detail = detail(screen)
        assert "24,100 img/s is 1 % above this host's median of 23,900 over 4 runs" in newest_detail
        await pilot.press("down")
        shown = detail(screen)
        assert "FLAG 20,500 img/s is 15 % below this host's median of 24,000 over 3 runs" in shown
        assert "FLAG 20,500 img/s is 15 % below the peer median of 24,050 over 3 runs" in shown
        assert "reference" in shown
        await pilot.press("down")
        assert "failed: nccl: NCCL failed between the processes" in detail(screen)


async def test_the_verdicts_are_those_launch_printed_when_it_kept_each_run(history) -> None:
    from gpuconsole.bench.history import judge

    stored: list[BenchResult] = []
    for judged in reversed(host_review(history, "h100-01")):
        earlier = [r for r in history.runs() if r.run_id < judged.run.run_id]
        assert judged.judgement == judge(judged.run, earlier)
        stored.append(judged.run)
    assert len(stored) == 9


async def test_a_file_that_is_not_a_history_is_named_and_left_alone(make_app) -> None:
    path = paths.BENCH_DB.path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database at all, " * 100)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = HistoryScreen("h100-01")
        app.push_screen(screen)
        await loaded(pilot, screen)
        status = str(screen.query_one("#history-status").render())
        assert f"cannot use bench history {path}" in status
        assert screen.query_one("#history-runs").row_count == 0
    assert path.read_bytes() == b"not a database at all, " * 100


async def test_no_runs_yet_says_how_to_make_one(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = HistoryScreen("l40s-01")
        app.push_screen(screen)
        await loaded(pilot, screen)
        assert "no benchmark runs of l40s-01" in str(screen.query_one("#history-status").render())


async def test_a_busy_history_is_read_off_the_ui_path(make_app, history) -> None:
    """A launch holding the database locked: the screen says it is reading and answers keys;
    the runs come once the lock is gone, and `r` reads again."""
    blocker = sqlite3.connect(history.path, timeout=0)
    blocker.execute("PRAGMA locking_mode=EXCLUSIVE")
    blocker.execute("BEGIN EXCLUSIVE")
    app = make_app()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            screen = HistoryScreen("h100-01")
            app.push_screen(screen)
            await pilot.pause(0.5)
            assert screen.runs is None and screen.error is None
            assert "reading the bench history" in str(screen.query_one("#history-status").render())
            await pilot.press("down")  # the UI answers while the worker waits on the lock
            blocker.rollback()
            blocker.close()
            await loaded(pilot, screen)
            assert screen.runs is not None and len(screen.runs) == 9
            history.record(run("h100-01", 24_000.0, 0))
            await pilot.press("r")
            await loaded(pilot, screen)
            assert len(screen.runs) == 10
    finally:
        blocker.close()


def test_history_120x40(snap_compare: Callable[..., bool], make_app, history) -> None:
    async def open_history(pilot: Pilot) -> None:
        screen = HistoryScreen("h100-01")
        pilot.app.push_screen(screen)
        await loaded(pilot, screen)
        await pilot.press("down")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=open_history)
