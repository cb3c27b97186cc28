"""Replay: a recording read as a source at a time cursor, the console's screens on it (jump to
the fault, step, go to a time, triage, bundle), and `gpuconsole replay` on the command line."""

from __future__ import annotations

import asyncio
import json
import tarfile
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from conftest import EPOCH
from notices import Notice, notices
from test_record import START, record_incident

from gpuconsole.cli.main import main
from gpuconsole.core.model import HostState
from gpuconsole.fleet.record.reader import Recording
from gpuconsole.fleet.record.replay import ReplaySource
from gpuconsole.fleet.record.when import clock
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.sim import SimRack
from gpuconsole.ui.replay_app import ReplayApp
from gpuconsole.ui.screens.goto import GoToScreen
from gpuconsole.ui.screens.host import HostScreen
from gpuconsole.ui.screens.triage import TriageScreen
from gpuconsole.ui.widgets.cursor_bar import CursorBar

FAULT_AT = 30


@pytest.fixture
def recorded(tmp_path: Path, rack: SimRack, audit_log: Path) -> tuple[Path, float]:
    """60 s of the demo rack with XID 79 on l40s-01's GPU 1 from second 30; a100-02 stops
    answering from second 40. The recorder copies the test's own audit log."""
    rack.set_fault("a100-02", "host-unresponsive", since=START + 40)
    path = tmp_path / "incident.sqlite"
    fault_time, _ = record_incident(path, rack, seconds=60, fault_at=FAULT_AT)
    return path, fault_time


# --- the source ------------------------------------------------------------------------------


def test_the_source_reads_each_host_at_the_cursor(recorded: tuple[Path, float]) -> None:
    path, fault_time = recorded
    recording = Recording(path)
    try:
        source = ReplaySource(recording, at=fault_time - 1)
        assert not source.read("l40s-01").gpus[1].lost
        source.move_to(fault_time)
        assert source.read("l40s-01").gpus[1].lost
        history = source.backfill("l40s-01", 10)
        assert [s.time for s in history] == [fault_time - 10 + i for i in range(11)]
        assert source.move_to(EPOCH) == recording.start  # clamped to the recording
    finally:
        recording.close()


def test_a_host_that_stopped_answering_reads_as_the_console_saw_it(
    recorded: tuple[Path, float],
) -> None:
    path, _ = recorded
    recording = Recording(path)
    try:
        source = ReplaySource(recording, at=START + 39)
        assert source.read("a100-02").host == "a100-02"
        source.move_to(START + 59)  # ten missed rounds: down
        with pytest.raises(SourceError) as raised:
            source.read("a100-02")
        assert raised.value.state is HostState.DOWN
        states = [recording.state_at("a100-02", START + s) for s in (39, 44, 59)]
        assert [s[0] if s else None for s in states] == [
            HostState.LIVE,
            HostState.STALE,
            HostState.DOWN,
        ]
    finally:
        recording.close()


# --- the screens ------------------------------------------------------------------------------


async def settle(app: ReplayApp, pilot) -> None:  # type: ignore[no-untyped-def]
    await app.workers.wait_for_complete()
    await pilot.pause()


async def test_jumping_from_finding_to_finding_reaches_the_fault_at_its_time(
    recorded: tuple[Path, float],
) -> None:
    path, fault_time = recorded
    recording = Recording(path)
    app = ReplayApp(recording, at=START + 5)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(app, pilot)
            assert app.replay.cursor == START + 5
            assert not app.fleet.store.latest("l40s-01").gpus[1].lost
            while app.replay.cursor < fault_time:
                before = app.replay.cursor
                await pilot.press("n")
                await settle(app, pilot)
                assert app.replay.cursor > before, "n did not move the cursor"
            assert app.replay.cursor == fault_time  # no jump went past it
            assert app.fleet.store.latest("l40s-01").gpus[1].lost
            codes = {f.code for f in app.fleet.store.gpu_findings("l40s-01", 1)}
            assert {"gpu-lost", "xid"} <= codes
            bar = app.screen.query_one(CursorBar)
            assert clock(fault_time) in str(bar.render())

            await pilot.press("T")
            await settle(app, pilot)
            assert isinstance(app.screen, TriageScreen)
            lost = [i for i in app.screen.items if i.host == "l40s-01" and i.code == "gpu-lost"]
            assert [i.since for i in lost] == [fault_time]
            await pilot.press("escape")

            await pilot.press("comma")  # a second back: before the fault
            await settle(app, pilot)
            assert app.replay.cursor == fault_time - 1
            assert not app.fleet.store.latest("l40s-01").gpus[1].lost
            await pilot.press("full_stop")  # and forward again, read on
            await settle(app, pilot)
            assert app.fleet.store.latest("l40s-01").gpus[1].lost
    finally:
        recording.close()


async def test_go_to_a_time_and_play(recorded: tuple[Path, float]) -> None:
    path, _ = recorded
    recording = Recording(path)
    app = ReplayApp(recording)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(app, pilot)
            assert app.replay.cursor == recording.end
            await pilot.press("g")
            assert isinstance(app.screen, GoToScreen)
            await pilot.press(*clock(START + 12), "enter")
            await settle(app, pilot)
            assert app.replay.cursor == START + 12
            await pilot.press("g")
            await pilot.press(*"+5s", "enter")
            await settle(app, pilot)
            assert app.replay.cursor == START + 17
            await pilot.press("g")
            await pilot.press(*"noon-ish", "enter")
            await settle(app, pilot)
            assert app.replay.cursor == START + 17  # a bad time moves nothing
            app.refresh_seconds = 0.05
            await pilot.press("P")
            await pilot.pause(0.5)
            await pilot.press("P")
            await settle(app, pilot)
            assert app.replay.cursor > START + 17 and not app.playing
    finally:
        recording.close()


async def test_a_bundle_from_a_replay_is_about_the_cursor(
    recorded: tuple[Path, float], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, fault_time = recorded
    bundles = tmp_path / "bundles"
    monkeypatch.setenv("GPUCONSOLE_BUNDLE_DIR", str(bundles))
    recording = Recording(path)
    app = ReplayApp(recording, at=fault_time, host="l40s-01")
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(app, pilot)
            assert isinstance(app.screen, HostScreen)
            await pilot.press("B")
            await settle(app, pilot)
    finally:
        recording.close()
    (bundle,) = bundles.glob("*.tar.gz")
    with tarfile.open(bundle) as tar:
        root = bundle.name.removesuffix(".tar.gz")
        summary = tar.extractfile(f"{root}/summary.md").read().decode()  # type: ignore[union-attr]
        findings = json.load(tar.extractfile(f"{root}/findings.json"))  # type: ignore[arg-type]
    assert f"l40s-01 at {clock(fault_time)}" in summary.replace("2026-01-01 ", "")
    assert "made from a recording" in summary
    assert {f["code"] for f in findings["findings"]} >= {"gpu-lost", "xid"}


# --- the command line ---------------------------------------------------------------------------


def test_replay_list_says_what_happened_at_a_time(
    recorded: tuple[Path, float], capsys: pytest.CaptureFixture[str]
) -> None:
    path, fault_time = recorded
    code = main(["replay", str(path), "--list", "--at", clock(fault_time), "--host", "l40s-01"])
    out = capsys.readouterr().out
    assert code == 0
    lost = [line for line in out.splitlines() if "gpu-lost" in line]
    assert lost and lost[0].startswith(f"* {clock(fault_time)}")
    assert "a100-02" not in out
    main(["replay", str(path), "--list", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert any(e["code"] == "host-down" and e["host"] == "a100-02" for e in data["episodes"])


@pytest.mark.parametrize(
    ("words", "code", "message"),
    [
        (["--host", "gpu99"], 2, "no host 'gpu99' in this recording"),
        (["--at", "lunchtime"], 2, "--at lunchtime: not a time (try 03:12"),
    ],
)
def test_replay_refuses_bad_input_in_one_line(
    recorded: tuple[Path, float],
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    code: int,
    message: str,
) -> None:
    path, _ = recorded
    assert main(["replay", str(path), "--list", *words]) == code
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_replay_of_a_file_that_is_not_a_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a recording\n")
    assert main(["replay", str(notes)]) == 3
    assert (
        capsys.readouterr().err.strip()
        == f"gpuconsole: {notes}: not a gpuconsole recording (file is not a database)"
    )
    assert notes.read_text() == "not a recording\n"


# --- --at: a moment the recording holds, or a refusal naming what it holds ----------------------

HOLDS = "2026-01-01 00:10:00 to 00:10:59 UTC"
"""What the `recorded` fixture holds."""


@pytest.mark.parametrize(
    "listed", [["--list"], ["--list", "--json"], []], ids=["list", "json", "tui"]
)
def test_replay_at_a_time_the_recording_does_not_hold_is_refused_in_one_line(
    recorded: tuple[Path, float], listed: list[str]
) -> None:
    """07:00 of a recording of 00:10: before, main answered for 07:00 after the recording's end
    (the list: nothing happened; the TUI: opened at the end)."""
    path, _ = recorded
    done = gpuconsole("replay", str(path), *listed, "--at", "07:00")
    assert done.returncode == 2
    assert done.stderr == f"gpuconsole: --at 07:00: not in {path}, which holds {HOLDS}\n"
    assert done.stdout == ""


def test_replay_list_at_a_time_of_day_lists_around_its_moment_in_the_recording(
    recorded: tuple[Path, float],
) -> None:
    path, fault_time = recorded
    done = gpuconsole("replay", str(path), "--list", "--at", "00:10", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["at"] == START  # 00:10:00, the recording's first second
    done = gpuconsole("replay", str(path), "--list", "--at", clock(fault_time) + " UTC")
    assert done.returncode == 0, done.stderr
    assert f"around 2026-01-01 {clock(fault_time)} UTC (±10 min):" in done.stdout


def opened_at(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Makes `ReplayApp.run` open the app under a pilot instead of the terminal; the list gets
    the cursor each app opened at."""
    cursors: list[float] = []

    async def pilot_run(app: ReplayApp) -> None:
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(app, pilot)
            cursors.append(app.replay.cursor)

    monkeypatch.setattr(ReplayApp, "run", lambda app: asyncio.run(pilot_run(app)))
    # the pilot is its terminal
    monkeypatch.setattr("gpuconsole.cli.commands.replay.refuse_without_terminal", lambda _: None)
    return cursors


def test_the_tui_replay_opens_at_the_moment_resolved_in_the_recording(
    recorded: tuple[Path, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, fault_time = recorded
    cursors = opened_at(monkeypatch)
    assert main(["replay", str(path), "--at", clock(fault_time)]) == 0
    assert main(["replay", str(path), "--at", "2026-01-01T08:10:12+08:00"]) == 0
    assert cursors == [fault_time, START + 12]


def test_the_tui_replay_refuses_before_it_opens(
    recorded: tuple[Path, float],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, _ = recorded
    cursors = opened_at(monkeypatch)
    assert main(["replay", str(path), "--at", "2026-01-01 00:11"]) == 2
    assert capsys.readouterr().err == (
        f"gpuconsole: --at '2026-01-01 00:11': not in {path}, which holds {HOLDS}\n"
    )
    assert cursors == []  # no app was opened


async def test_go_to_a_time_the_recording_does_not_hold_says_what_it_holds(
    recorded: tuple[Path, float],
) -> None:
    path, _ = recorded
    recording = Recording(path)
    app = ReplayApp(recording, at=START + 20)
    try:
        async with app.run_test(size=(140, 40), notifications=True) as pilot:
            await settle(app, pilot)
            await pilot.press("g", *"07:00", "enter")
            await settle(app, pilot)
            assert app.replay.cursor == START + 20  # not moved to the end, nor anywhere
            said = Notice(f"07:00: not in {path.name}, which holds {HOLDS}", "error")
            assert said in await notices(pilot)
            await pilot.press("g", *"00:10:40", "enter")
            await settle(app, pilot)
            assert app.replay.cursor == START + 40
    finally:
        recording.close()
