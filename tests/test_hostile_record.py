"""A recording a ticket brings may be corrupt or hostile: it replays what can be read and names
what cannot (screen, `--list`, `bundle`), every value read from it is checked, work on it is
bounded, `gpuconsole record` stops on a signal with a consistent file, and recordings and
bundles are private."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import tarfile
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from cli_runner import start_gpuconsole
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_record import START, full_snapshot, record_incident

from gpuconsole.cli.commands.options import MAX_DEMO_HOSTS
from gpuconsole.cli.main import main
from gpuconsole.core import paths
from gpuconsole.core.model import HostState
from gpuconsole.fleet.poller import HostReading
from gpuconsole.fleet.record import codec, reader
from gpuconsole.fleet.record.reader import DamagedReading, Recording
from gpuconsole.fleet.record.recorder import MAX_QUEUED_TICKS, Recorder, Tick
from gpuconsole.fleet.record.replay import ReplaySource
from gpuconsole.fleet.record.retention import Maintenance, Retention, Tier
from gpuconsole.fleet.record.schema import (
    MAX_META_CHARS,
    RecordingError,
    create,
    open_for_writing,
)
from gpuconsole.fleet.record.when import stamp
from gpuconsole.fleet.session import FleetSession
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.sim import SimRack
from gpuconsole.ui.replay_app import ReplayApp
from gpuconsole.ui.widgets.damage_bar import DamageBar

SECONDS = 60
DAMAGED_FROM = 20
DAMAGED_UNTIL = 29
STOP_BOUND_S = 5.0
"""Generous: the recorder stops within a second; the rest is slack for a loaded machine."""


@pytest.fixture
def recorded(tmp_path: Path, rack: SimRack, audit_log: Path) -> Path:
    """A minute of the demo rack (six hosts), intact; the recorder copies the test's own audit
    log."""
    path = tmp_path / "ticket.sqlite"
    record_incident(path, rack, seconds=SECONDS)
    return path


def edit(path: Path, sql: str, *values: object) -> None:
    """Change the recording behind the reader's back, as a damaged or forged file would be."""
    with sqlite3.connect(path) as db:
        db.execute(sql, values)


def host_id(path: Path, host: str) -> int:
    with sqlite3.connect(path) as db:
        (ident,) = db.execute("SELECT id FROM hosts WHERE name = ?", (host,)).fetchone()
    return ident


def ms(second: int) -> int:
    return codec.to_ms(START + second)


def garble(path: Path, host: str = "h100-01", data: bytes = b"\x00\x11\x22\x33") -> None:
    """Seconds DAMAGED_FROM to DAMAGED_UNTIL of the host's readings hold ``data``."""
    edit(
        path,
        "UPDATE readings SET data = ? WHERE host = ? AND t BETWEEN ? AND ?",
        data,
        host_id(path, host),
        ms(DAMAGED_FROM),
        ms(DAMAGED_UNTIL),
    )


def drop_keyframe(path: Path, host: str = "h100-02") -> None:
    """The host's first keyframe is gone: every delta of its first minute refers to nothing."""
    edit(path, "DELETE FROM readings WHERE host = ? AND t = ?", host_id(path, host), ms(0))


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


# --- 1. a corrupt recording replays what it can and names the rest ------------------------------


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"\x00\x11\x22\x33", "not zlib data"),
        (zlib.compress(b"{not json"), "not JSON"),
        (zlib.compress(b"[1, 2]"), "JSON list, not an object"),
        (zlib.compress(b'{"g": 1}')[:-3], "truncated zlib data"),
    ],
)
def test_a_garbled_stretch_is_named_and_the_rest_reads(
    recorded: Path, data: bytes, what: str
) -> None:
    garble(recorded, data=data)
    with pytest.raises(RecordingError) as raised:  # all or nothing: the first damage, named
        Recording(recorded).snapshots("h100-01", START, START + SECONDS)
    message = one_line(str(raised.value))
    assert str(recorded) in message and "h100-01" in message and what in message
    assert stamp(START + DAMAGED_FROM) in message

    recording = Recording(recorded, skip_damaged=True)
    try:
        kept = recording.snapshots("h100-01", START, START + SECONDS)
        damaged = set(range(DAMAGED_FROM, DAMAGED_UNTIL + 1))
        assert [s.time - START for s in kept] == [i for i in range(SECONDS) if i not in damaged]
        assert len(recording.snapshots("h100-03", START, START + SECONDS)) == SECONDS
        (stretch,) = recording.damage.stretches()
        assert (stretch.host, stretch.start, stretch.end) == (
            "h100-01",
            START + DAMAGED_FROM,
            START + DAMAGED_UNTIL,
        )
        assert what in stretch.what and stretch.rows == len(damaged)
    finally:
        recording.close()


def test_a_delta_whose_keyframe_is_missing_is_damage_not_a_reading(recorded: Path) -> None:
    drop_keyframe(recorded)
    recording = Recording(recorded, skip_damaged=True)
    try:
        (found,) = recording.check(contents=False)  # SQL alone finds it
        assert found.host == "h100-02" and "keyframe" in found.what and "missing" in found.what
        assert (found.start, found.end, found.rows) == (START + 1, START + 59, 59)
        with pytest.raises(DamagedReading, match=r"keyframe \(at .*\) is missing"):
            recording.snapshot_at("h100-02", START + 30)
        assert recording.snapshots("h100-02", START, START + SECONDS) == []
    finally:
        recording.close()


def test_the_source_shows_a_damaged_host_as_stale_saying_why(recorded: Path) -> None:
    garble(recorded)
    recording = Recording(recorded, skip_damaged=True)
    try:
        source = ReplaySource(recording, at=START + 25)
        with pytest.raises(SourceError) as raised:
            source.read("h100-01")
        assert raised.value.state is HostState.STALE
        assert "recording is damaged here" in str(raised.value)
        assert source.read("h100-03").host == "h100-03"
        backfill = [s.time - START for s in source.backfill("h100-01", 10)]
        assert backfill == [15, 16, 17, 18, 19]  # 20 to 25 damaged, left out
        source.move_to(START + 35)
        assert source.read("h100-01").time == START + 35
    finally:
        recording.close()


async def test_the_replay_screen_says_the_recording_is_damaged(recorded: Path) -> None:
    garble(recorded)
    drop_keyframe(recorded)
    recording = Recording(recorded, skip_damaged=True)
    app = ReplayApp(recording, at=START + 25)
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert "DAMAGED (2)" in app.label
            bar = app.screen.query_one(DamageBar)
            assert bar.display
            shown = str(bar.render())  # the first stretch in time, and how many more
            assert shown.startswith("recording damaged (2 parts, `replay --list` names them): ")
            assert f"h100-02 {stamp(START + 1).removesuffix(' UTC')}" in shown
            assert "its keyframe" in shown and "is missing" in shown
            for host in ("h100-01", "h100-02"):
                status = app.fleet.store.status(host)
                assert status.state is HostState.STALE and "damaged" in (status.reason or "")
            assert app.fleet.store.status("h100-03").state is HostState.LIVE  # the rest replays
            assert app.fleet.store.latest("h100-03").time == START + 25
            app.move_to(START + 40)  # out of the garbled stretch: h100-01 reads again
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.fleet.store.status("h100-01").state is HostState.LIVE
    finally:
        recording.close()


def test_replay_list_names_the_damaged_parts_with_the_rest(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garble(recorded)
    drop_keyframe(recorded)
    assert main(["replay", str(recorded), "--list"]) == 3
    captured = capsys.readouterr()
    assert one_line(captured.err) == (
        f"gpuconsole: {recorded}: 2 damaged parts, listed with the rest"
    )
    damaged = [line for line in captured.out.splitlines() if line.startswith("! damaged: ")]
    assert len(damaged) == 2  # in the order of the recording
    assert damaged[0].startswith(f"! damaged: h100-02 {stamp(START + 1).removesuffix(' UTC')}")
    assert "59 readings: its keyframe" in damaged[0]
    from_ = stamp(START + DAMAGED_FROM).removesuffix(" UTC")
    until = stamp(START + DAMAGED_UNTIL)[11:]
    assert damaged[1] == f"! damaged: h100-01 {from_}–{until}, 10 readings: " + (
        "not zlib data (Error -3 while decompressing data: incorrect header check)"
    )
    assert "CRITICAL" in captured.out  # the episodes are listed all the same

    assert main(["replay", str(recorded), "--list", "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert {(d["host"], d["rows"]) for d in data["damage"]} == {("h100-01", 10), ("h100-02", 59)}
    assert data["episodes"] and data["contents_checked"] is True


def test_replay_list_of_an_intact_recording_says_nothing_of_damage(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(recorded), "--list"]) == 0
    captured = capsys.readouterr()
    assert "damaged" not in captured.out and captured.err == ""


def test_a_bundle_from_a_damaged_stretch_is_a_one_line_error(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garble(recorded)
    out = tmp_path / "b.tar.gz"
    at = str(START + 25)
    assert main(["bundle", "h100-01", "--record", str(recorded), "--at", at, "-o", str(out)]) == 3
    line = one_line(capsys.readouterr().err)
    assert "damaged recording (h100-01" in line and "not zlib data" in line
    assert not out.exists()


async def test_a_bundle_from_the_replay_screen_says_what_it_lacks(
    recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    garble(recorded)
    monkeypatch.setenv("GPUCONSOLE_BUNDLE_DIR", str(tmp_path / "bundles"))
    recording = Recording(recorded, skip_damaged=True)
    app = ReplayApp(recording, at=START + 40, host="h100-01")
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.press("B")
            await app.workers.wait_for_complete()
            await pilot.pause()
    finally:
        recording.close()
    (bundle,) = (tmp_path / "bundles").glob("*.tar.gz")
    with tarfile.open(bundle) as tar:
        root = bundle.name.removesuffix(".tar.gz")
        summary = tar.extractfile(f"{root}/summary.md").read().decode()  # type: ignore[union-attr]
        readings = tar.extractfile(f"{root}/readings.jsonl").read().decode()  # type: ignore[union-attr]
    assert "damaged recording: h100-01" in summary and "not zlib data" in summary
    assert len(readings.splitlines()) == SECONDS - (DAMAGED_UNTIL - DAMAGED_FROM + 1)


# --- 2. values that are not what they say -------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("version", "one", "format version 'one' is not a version number"),
        ("version", "9" * 400, "format version '99999999"),
        ("version", "", "format version '' is not a version number"),
        ("version", "2", "recording format 2 is newer than this gpuconsole reads (1)"),
        ("schema", "{nope", "its schema is not lists of field names"),
        ("schema", '{"GpuState": [1, 2]}', "its schema is not lists of field names"),
        ("schema", "x" * (MAX_META_CHARS + 1), f"longer than {MAX_META_CHARS} chars"),
        ("label", b"\x00blob", "meta label is blob, not text"),
    ],
)
def test_a_meta_value_that_is_not_one_is_a_line_naming_file_and_value(
    recorded: Path, capsys: pytest.CaptureFixture[str], key: str, value: object, said: str
) -> None:
    edit(recorded, "UPDATE meta SET value = ? WHERE key = ?", value, key)
    with pytest.raises(RecordingError) as raised:
        Recording(recorded)
    message = one_line(str(raised.value))
    assert message.startswith(f"{recorded}: ") and said in message
    assert len(message) < 300  # a 400-digit value is cut, not printed whole
    assert main(["replay", str(recorded), "--list"]) == 3
    assert one_line(capsys.readouterr().err) == f"gpuconsole: {message}"


@pytest.mark.parametrize(
    ("sql", "value", "said"),
    [
        ("UPDATE episodes SET severity = ? WHERE id = 1", "high", "severity 'high' is not"),
        ("UPDATE episodes SET severity = ? WHERE id = 1", "9" * 400, "severity inf is not"),
        ("UPDATE episodes SET severity = ? WHERE id = 1", 7, "severity 7 is not a severity"),
        ("UPDATE episodes SET since = ? WHERE id = 1", "yesterday", "since 'yesterday' is not"),
        ("UPDATE episodes SET since = ? WHERE id = 1", 1e300, "since 1e+300 is not a time"),
        ("UPDATE episodes SET gpu = ? WHERE id = 1", 10**15, "GPU a 16-digit number is not"),
        ("UPDATE episodes SET labels = ? WHERE id = 1", "[[1]]", "labels are not a list"),
        ("UPDATE sessions SET started = ?", "noon", "started 'noon' not a time"),
        ("UPDATE sessions SET ended = ?", float("inf"), "ended inf not a time"),
        ("UPDATE actions SET entry = ? WHERE id = 1", "rm -rf /", "not a logged action"),
        ("UPDATE hosts SET name = ? WHERE id = 2", b"\xff", "host 2 has no name"),
    ],
)
def test_a_row_value_that_is_not_one_is_named_and_the_rest_lists(
    recorded: Path,
    capsys: pytest.CaptureFixture[str],
    audit_log_entry: None,
    sql: str,
    value: object,
    said: str,
) -> None:
    edit(recorded, sql, value)
    with pytest.raises(RecordingError) as raised:  # strict: the first damage is the error
        recording = Recording(recorded)
        try:
            recording.check()
        finally:
            recording.close()
    message = one_line(str(raised.value))
    assert message.startswith(f"{recorded}: damaged recording (") and said in message
    assert main(["replay", str(recorded), "--list"]) == 3  # skipping: listed with the rest
    captured = capsys.readouterr()
    assert one_line(captured.err).endswith("1 damaged part, listed with the rest")
    (line,) = [line for line in captured.out.splitlines() if line.startswith("! damaged")]
    assert said in line


@pytest.fixture
def audit_log_entry(recorded: Path) -> None:
    """An action in the recording, so that its table has a row to damage."""
    edit(
        recorded,
        "INSERT INTO actions (t, host, action, entry) VALUES (?, 'h100-01', 'signal', ?)",
        START + 5,
        json.dumps({"time": START + 5, "host": "h100-01", "action": "signal"}),
    )


def test_readings_at_no_time_or_of_no_host_are_named(recorded: Path) -> None:
    ident = host_id(recorded, "h100-01")
    edit(recorded, "INSERT INTO readings VALUES (?, 'noon', 0, x'00')", ident)
    edit(recorded, "INSERT INTO readings VALUES (99, 5, 5, x'00')")
    edit(recorded, "INSERT INTO readings VALUES (?, ?, ?, x'00')", ident, ms(70), ms(80))
    recording = Recording(recorded, skip_damaged=True)
    try:
        lines = {d.line() for d in recording.check()}
        assert "readings: 1 of h100-01 at no time" in lines
        assert "readings: 1 of host 99, which the hosts table lacks" in lines
        assert any(line.startswith("h100-01") and "later than itself" in line for line in lines)
    finally:
        recording.close()


def test_a_time_asked_for_past_any_time_is_one_line(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(recorded), "--list", "--at", "9" * 30]) == 2
    assert f"--at {'9' * 30}: not in {recorded}, which holds 2026-01-01 " in one_line(
        capsys.readouterr().err
    )


def test_hostile_audit_lines_neither_stop_recording_nor_enter_it(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    path = tmp_path / "r.sqlite"
    recorder = Recorder(path, audit_log=log)  # copies what is logged from now on
    now = time.time()
    lines = [
        "[" * 100_000,  # nested past the JSON parser's recursion limit
        json.dumps({"time": float("inf"), "host": "n1", "action": "forged"}),
        json.dumps({"time": now + 1, "host": {"not": "text"}, "action": ["x"]}),
        json.dumps({"time": now + 2, "host": "n1", "action": "signal-process"}),
    ]
    log.write_text("\n".join(lines) + "\n")
    assert recorder.take(Tick(time=START))
    recorder.close()
    assert recorder.error is None
    recording = Recording(path)
    try:
        assert [a["action"] for a in recording.actions()] == [["x"], "signal-process"]
        assert [a["action"] for a in recording.actions(host="n1")] == ["signal-process"]
    finally:
        recording.close()


def test_text_from_the_recording_is_made_visible(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = "cleared\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J"
    edit(recorded, "UPDATE episodes SET message = ?", forged)
    assert main(["replay", str(recorded), "--list"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "cleared␛]52;c;cm0gLXJmIH4=␇␛[2J" in out


# --- 3. bounded work ---------------------------------------------------------------------------


def test_a_zlib_bomb_is_refused_without_inflating_it() -> None:
    bomb = zlib.compress(b'{"g": [' + b" " * (64 << 20) + b"]}", 9)  # 64 MiB in ~64 KiB
    assert len(bomb) < codec.MAX_ROW_BYTES
    tracemalloc.start()
    try:
        with pytest.raises(codec.RowError, match=f"inflates past {codec.MAX_ROW_BYTES} bytes"):
            codec.Decoder.unpack(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * codec.MAX_ROW_BYTES


def test_a_row_longer_than_a_row_may_be_is_refused_unread(recorded: Path) -> None:
    edit(
        recorded,
        "UPDATE readings SET data = zeroblob(?) WHERE host = ? AND t = ?",
        codec.MAX_ROW_BYTES + 1,
        host_id(recorded, "h100-01"),
        ms(30),
    )
    recording = Recording(recorded, skip_damaged=True)
    try:
        with pytest.raises(
            DamagedReading, match=f"more than a row may hold \\({codec.MAX_ROW_BYTES}"
        ):
            recording.snapshot_at("h100-01", START + 30)
        (found,) = recording.check(contents=False)
        assert found.start == START + 30
    finally:
        recording.close()


@pytest.mark.parametrize(
    "content",
    [b"", b"SQLite format 2\x00" + bytes(200), os.urandom(4096), b"hello\n"],
    ids=["empty", "almost", "random", "text"],
)
def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "ticket.sqlite"
    path.write_bytes(content)
    with pytest.raises(RecordingError, match="not a gpuconsole recording"):
        Recording(path)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ticket.sqlite"]  # no -wal, no -shm


def test_a_table_that_is_a_view_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "forged.sqlite"
    create(path)
    edit(path, "DROP TABLE readings")
    edit(path, "CREATE VIEW readings AS SELECT 1 AS host, 2 AS t, 2 AS key, x'00' AS data")
    with pytest.raises(RecordingError, match=r"damaged recording \(a view, not a table: readings"):
        Recording(path)


def test_too_many_hosts_is_refused_in_one_line(
    recorded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "MAX_HOSTS", 5)
    with pytest.raises(RecordingError, match="6 hosts, more than gpuconsole reads \\(5\\)"):
        Recording(recorded)


def test_at_most_so_many_readings_are_read_at_once(
    recorded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "MAX_READINGS", 10)
    recording = Recording(recorded, skip_damaged=True)
    try:
        kept = recording.snapshots("h100-01", START, START + SECONDS)
        assert [s.time for s in kept] == [START + SECONDS - 10 + i for i in range(10)]
        assert "more than 10 readings" in recording.damage.stretches()[0].what
    finally:
        recording.close()


@pytest.mark.usefixtures("audit_log")
def test_retention_leaves_a_damaged_row_for_the_reader_to_name(
    tmp_path: Path, rack: SimRack
) -> None:
    path = tmp_path / "thinned.sqlite"
    record_incident(path, rack, seconds=90)  # keyframes at 0, 60: the first minute is thinned
    garble(path)
    before = Recording(path, skip_damaged=True)
    counts = {h: len(before.snapshots(h, START, START + 59)) for h in ("h100-01", "h100-03")}
    before.close()
    connection, meta = open_for_writing(path)
    try:
        decoder = codec.Decoder(json.loads(meta["schema"]))
        maintenance = Maintenance(
            connection, decoder, Retention(keep_s=3600.0, tiers=(Tier(1.0, 10.0),))
        )
        while maintenance.step(START + 70):  # no exception from the damaged rows
            pass
    finally:
        connection.close()
    after = Recording(path, skip_damaged=True)
    try:
        assert len(after.snapshots("h100-03", START, START + 59)) == 6 < counts["h100-03"]
        assert len(after.snapshots("h100-01", START, START + 59)) == counts["h100-01"]
        assert after.damage.stretches()[0].host == "h100-01"  # left for the reader to name
    finally:
        after.close()


# --- 4. the recorder stops on a signal, and its memory is bounded --------------------------------


def start_recorder(path: Path, *extra: str) -> subprocess.Popen[str]:
    return start_gpuconsole(
        "record", "--demo", "--record", str(path), *extra, stdout=subprocess.DEVNULL
    )


def readings_in(path: Path) -> int:
    try:
        recording = Recording(path)
    except RecordingError:
        return 0
    try:
        return recording.count_readings()
    finally:
        recording.close()


def stop(process: subprocess.Popen[str], number: signal.Signals) -> tuple[float, str]:
    """Send the signal; how long the process took to exit, and its stderr."""
    sent = time.monotonic()
    process.send_signal(number)
    try:
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return time.monotonic() - sent, err


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_record_stops_on_a_signal_between_rounds_with_a_file_that_replays(
    tmp_path: Path, number: signal.Signals
) -> None:
    path = tmp_path / "signalled.sqlite"
    process = start_recorder(path, "--refresh", "0.2")
    deadline = time.monotonic() + 120
    while readings_in(path) < 5 * 6:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    took, err = stop(process, number)
    assert process.returncode == 0, err
    assert took < STOP_BOUND_S
    assert err.strip().splitlines()[-1].startswith(f"gpuconsole: stopped by {number.name}: {path}")
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    recording = Recording(path)
    try:
        (session,) = recording.sessions
        assert session.ended is not None  # a clean end: the session says when
        assert recording.end is not None and recording.check() == []
        for host in recording.hosts:
            assert recording.snapshots(host, session.started, recording.end)
    finally:
        recording.close()


def test_record_stops_on_sigterm_while_it_reads_a_large_racks_past(tmp_path: Path) -> None:
    """200 simulated hosts take many seconds to prime; SIGTERM does not wait for that."""
    path = tmp_path / "large.sqlite"
    process = start_recorder(path, "--demo-hosts", "200")
    assert process.stderr is not None
    assert "recording 200 hosts" in process.stderr.readline()  # priming begins now
    time.sleep(0.5)
    took, err = stop(process, signal.SIGTERM)
    assert process.returncode == 0, err
    assert took < STOP_BOUND_S
    assert err.strip().endswith(f"stopped by SIGTERM: {path} holds no readings yet")
    recording = Recording(path)  # a recording, consistent, with nothing in it
    try:
        assert recording.end is None and recording.sessions == ()
    finally:
        recording.close()


def test_an_absurd_demo_rack_is_refused_before_anything_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "huge.sqlite"
    with pytest.raises(SystemExit) as exited:
        main(["record", "--demo", "--demo-hosts", "20000", "--record", str(path)])
    assert exited.value.code == 2
    said = f"more hosts than a simulated rack has (at most {MAX_DEMO_HOSTS}"
    assert said in capsys.readouterr().err
    assert not path.exists()


@pytest.fixture
def stalled_recorder(tmp_path: Path) -> Iterator[tuple[Recorder, threading.Event]]:
    """A recorder whose writer waits (a stuck disk) until the event is set."""
    recorder = Recorder(tmp_path / "stalled.sqlite", audit_log=tmp_path / "audit")
    go = threading.Event()
    write = recorder._writer.write

    def stuck(tick: Tick) -> None:
        go.wait(30)
        write(tick)

    recorder._writer.write = stuck  # type: ignore[method-assign]
    yield recorder, go
    go.set()
    recorder.close()


def test_ticks_do_not_pile_up_behind_a_stalled_writer(
    stalled_recorder: tuple[Recorder, threading.Event],
) -> None:
    recorder, _ = stalled_recorder
    taken = [recorder.take(Tick(time=START + i)) for i in range(MAX_QUEUED_TICKS + 5)]
    assert taken == [True] * MAX_QUEUED_TICKS + [False] * 5  # the UI thread never waits
    stopping = threading.Event()
    threading.Timer(0.3, stopping.set).start()
    assert recorder.take(Tick(time=START + 99), stopping) is False  # waits until stop, no longer


def test_the_headless_recorder_hands_a_tick_over_once_the_last_is_written(
    stalled_recorder: tuple[Recorder, threading.Event],
) -> None:
    recorder, go = stalled_recorder
    never = threading.Event()
    assert recorder.take(Tick(time=START), never)
    second = threading.Thread(target=recorder.take, args=(Tick(time=START + 1), never))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting: the first is not written yet
    go.set()
    second.join(30)
    assert not second.is_alive()


def test_the_console_is_told_once_that_the_recording_falls_behind(
    stalled_recorder: tuple[Recorder, threading.Event],
) -> None:
    recorder, _ = stalled_recorder
    fleet = FleetSession(["n1"], (), recorder=recorder)
    rounds = [[HostReading("n1", full_snapshot(START + i))] for i in range(MAX_QUEUED_TICKS + 3)]
    told = [fleet.take(readings).problem for readings in rounds]
    assert told[:MAX_QUEUED_TICKS] == [None] * MAX_QUEUED_TICKS
    assert (
        told[MAX_QUEUED_TICKS]
        == f"{recorder.path}: the recording falls behind: some rounds not recorded"
    )
    assert told[MAX_QUEUED_TICKS + 1 :] == [None, None]
    assert fleet._unrecorded == {"n1"}  # stated again with the next round taken


# --- 5. private by default ---------------------------------------------------------------------


@pytest.fixture
def open_umask() -> Iterator[None]:
    """umask 0: the modes below are the code's own, not the umask's."""
    before = os.umask(0)
    yield
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_default_recording_and_its_folders_are_private(open_umask: None) -> None:
    path = paths.RECORDING.path()
    assert not path.parent.parent.exists()  # the XDG data dir itself is made too
    recorder = Recorder(path)
    try:
        for sidecar in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            assert mode(sidecar) == 0o600, sidecar
        assert mode(path.parent) == 0o700 and mode(path.parent.parent) == 0o700
    finally:
        recorder.close()


def test_an_existing_folder_keeps_its_mode_and_the_recording_is_private(
    tmp_path: Path, open_umask: None
) -> None:
    shared = tmp_path / "team"
    shared.mkdir(mode=0o755)
    Recorder(shared / "r.sqlite").close()
    assert mode(shared) == 0o755 and mode(shared / "r.sqlite") == 0o600


def test_a_bundle_and_its_folder_are_private(
    open_umask: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUCONSOLE_BUNDLE_DIR", raising=False)
    monkeypatch.setenv(paths.AUDIT_LOG.variable, os.devnull)
    assert main(["bundle", "h100-01", "--demo", "--json"]) == 0
    path = Path(json.loads(capsys.readouterr().out)["path"])
    assert mode(path) == 0o600 and mode(path.parent) == 0o700  # the default bundles folder
    with tarfile.open(path) as tar:
        assert {member.mode for member in tar.getmembers()} == {0o600}


# --- 6. fuzzing: decode, or say in one line why not ----------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=3), inner, max_size=6)
    ),
    max_leaves=40,
)
GPU_FIELDS = len(codec.schema()["GpuState"])
gpu_vectors = st.lists(json_values, min_size=GPU_FIELDS, max_size=GPU_FIELDS)
positions = st.integers(-2, GPU_FIELDS + 2) | json_values
gpu_changes = st.lists(st.tuples(positions, json_values), max_size=4).map(
    lambda pairs: [item for pair in pairs for item in pair]
)
gpus = (
    st.lists(gpu_vectors | gpu_changes | json_values, max_size=3)
    | st.lists(gpu_changes, min_size=2, max_size=2)  # a delta of full_snapshot's two GPUs
    | json_values
)
header = {
    "p": json_values,
    "x": json_values,
    "t": st.lists(json_values, max_size=4) | json_values,
    "d": json_values,
    "s": json_values,
}
row_objects = st.fixed_dictionaries({"g": gpus}, optional=header) | st.fixed_dictionaries(
    {}, optional={"g": gpus, **header}
)
FUZZ = settings(
    max_examples=300,
    deadline=timedelta(seconds=5),
    database=None,  # nothing written into the shared tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def decodes_or_says_why(decode: object, *args: object) -> None:
    try:
        decode(*args)  # type: ignore[operator]
    except codec.RowError as error:
        assert "\n" not in str(error)


@FUZZ
@given(st.binary(max_size=512))
def test_the_row_decoder_takes_any_bytes(data: bytes) -> None:
    decoder = codec.Decoder(codec.schema())
    decodes_or_says_why(decoder.keyframe, "n1", codec.to_ms(START), data)
    decodes_or_says_why(decoder.delta, full_snapshot(START), codec.to_ms(START) + 1, data)


@FUZZ
@given(row_objects, st.booleans())
def test_the_row_decoder_takes_any_json(raw: dict[str, object], older: bool) -> None:
    recorded = codec.schema()
    if older:  # a recording made with fewer fields takes the decoder's other path
        recorded["GpuState"] = recorded["GpuState"][:-2]
    decoder = codec.Decoder(recorded)
    data = zlib.compress(json.dumps(raw).encode())
    decodes_or_says_why(decoder.keyframe, "n1", codec.to_ms(START), data)
    decodes_or_says_why(decoder.delta, full_snapshot(START), codec.to_ms(START) + 1, data)


sqlite_values = (
    st.none()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
    | st.binary(max_size=30)
    | st.sampled_from([0, 1, 2, START, codec.to_ms(START), "finding", "alert", "live", "[]"])
    | st.sampled_from(["", "x", -1, 1e300, float("inf"), 2**62, "[[1]]", "{}"])  # almost
)
PLAUSIBLE: dict[str, tuple[object, ...]] = {
    "hosts": (2, "n2"),
    "readings": (1, 2000, 1000, zlib.compress(b'{"g": []}')),
    "states": (1, 1500, "live", None),
    "episodes": (None, "finding", "n1//x", "n1", 0, "x", 2, "m", "r", START, None, '[["a","b"]]'),
    "actions": (None, START, "n1", "signal", '{"time": 1.0}'),
    "sessions": (None, 0.5, 100.0, None, "", 1),
}
"""A row of each table that reads; rows a value or two away from it reach the checks past the
first one."""


def rows(table: str) -> st.SearchStrategy[tuple[object, ...]]:
    """Mostly the plausible row with one value swapped for any; at times two, or all."""
    base = PLAUSIBLE[table]

    def swapped(swaps: dict[int, object]) -> tuple[object, ...]:
        return tuple(swaps.get(i, value) for i, value in enumerate(base))

    column = st.integers(0, len(base) - 1)
    one = st.builds(lambda i, value: swapped({i: value}), column, sqlite_values)
    two = st.dictionaries(column, sqlite_values, min_size=2, max_size=2).map(swapped)
    return st.one_of(one, one, one, two, st.tuples(*[sqlite_values] * len(base)))


rows_of = st.fixed_dictionaries({table: st.lists(rows(table), max_size=4) for table in PLAUSIBLE})


@pytest.fixture(scope="module")
def blank_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("blank") / "blank.sqlite"
    create(path)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode = DELETE")  # one file to copy
    return path


def open_and_read(path: Path, skip: bool) -> None:
    """Everything a replay, a list and a bundle read; only RecordingError may come of it."""
    try:
        recording = Recording(path, skip_damaged=skip)
    except RecordingError as error:
        assert "\n" not in str(error)
        return
    try:
        recording.check()
        for host in recording.hosts:
            recording.snapshots(host, 0, 2**40)
            with contextlib.suppress(DamagedReading):
                recording.snapshot_at(host, START + 10)
            recording.state_at(host, START + 10)
        recording.episodes()
        recording.open_episodes(START)
        recording.onsets()
        recording.actions()
        recording.covers(START)
    except RecordingError as error:
        assert "\n" not in str(error)
    finally:
        recording.close()
    for words in ([], ["--json"], ["--at", str(START + 1)]):
        listed(path, words)


def listed(path: Path, words: list[str]) -> None:
    """`replay FILE --list`: the list (with what is damaged), or one line saying why not (a
    time the recording does not hold: one naming what it holds)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["replay", str(path), "--list", *words])
    assert code in ((0, 2, 3) if "--at" in words else (0, 3))
    if code == 3:
        one_line(err.getvalue())
    if code == 2:
        assert ": not in " in one_line(err.getvalue())
    if "--json" in words and out.getvalue():
        json.loads(out.getvalue())


@FUZZ
@given(rows_of, st.booleans(), st.lists(row_objects, max_size=3))
def test_the_reader_takes_any_rows(
    tmp_path: Path,
    blank_recording: Path,
    rows: dict[str, list[tuple[object, ...]]],
    skip: bool,
    blobs: list[dict[str, object]],
) -> None:
    path = tmp_path / f"fuzz-{os.getpid()}-{time.monotonic_ns()}.sqlite"
    shutil.copyfile(blank_recording, path)
    with sqlite3.connect(path) as db:
        db.execute("INSERT OR IGNORE INTO hosts (id, name) VALUES (1, 'n1')")
        for i, raw in enumerate(blobs):  # rows that inflate to JSON, to reach the decoder
            data = zlib.compress(json.dumps(raw).encode())
            db.execute("INSERT OR IGNORE INTO readings VALUES (1, ?, ?, ?)", (1000 + i, 1000, data))
        db.execute("INSERT INTO sessions (started, last) VALUES (0.5, 100.0)")
        for table, values in rows.items():
            marks = ", ".join("?" * len(PLAUSIBLE[table]))
            for row in values:
                with contextlib.suppress(sqlite3.Error):  # a constraint the schema holds
                    db.execute(f"INSERT INTO {table} VALUES ({marks})", row)
    try:
        open_and_read(path, skip)
    finally:
        path.unlink()


@FUZZ
@given(st.binary(min_size=0, max_size=4096), st.booleans())
def test_the_reader_takes_any_file(tmp_path: Path, content: bytes, sqlite_header: bool) -> None:
    path = tmp_path / f"any-{time.monotonic_ns()}.sqlite"
    path.write_bytes((b"SQLite format 3\x00" if sqlite_header else b"") + content)
    try:
        open_and_read(path, skip=True)
    finally:
        for leftover in tmp_path.glob(f"{path.name}*"):
            leftover.unlink()
