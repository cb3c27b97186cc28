"""Recording: the compact encoding, a simulated incident recorded and found again at its time,
actions from the audit log, and files that are not recordings (refused, left untouched)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from pathlib import Path

import pytest
from conftest import EPOCH

from gpuconsole.core import audit, paths
from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import (
    EccCounts,
    GpuProcess,
    GpuState,
    HostSnapshot,
    HostState,
    KubePod,
    MigInstance,
    PcieLink,
    ProcessLoad,
    RowRemap,
    SchedulerNode,
    Severity,
    SlurmJob,
    Topology,
    XidEvent,
)
from gpuconsole.fleet.headless import record_fleet
from gpuconsole.fleet.record import codec
from gpuconsole.fleet.record.reader import Recording
from gpuconsole.fleet.record.recorder import Recorder, Tick
from gpuconsole.fleet.record.schema import RecordingError
from gpuconsole.telemetry.sim import SimRack, SimSource, demo_rack

START = EPOCH + 600.0


def full_snapshot(t: float, **changes: object) -> HostSnapshot:
    """A reading with every kind of field set, None where a GPU has nothing to say."""
    gpu = GpuState(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-1",
        pci_bus_id="00000000:18:00.0",
        utilization_pct=97.0,
        memory_used_mib=1234.5625,
        memory_total_mib=81559.0,
        temperature_c=61.0,
        power_w=651.237,
        power_limit_w=700.0,
        throttle_reasons=("sw-power-cap",),
        ecc=EccCounts(0, 0, 3, None),
        remap=RowRemap(1, 0, False, False),
        recovery_action="none",
        pcie=PcieLink(5, 16, 5, 16),
        persistence_mode=True,
        mig_mode=True,
        mig_instances=(MigInstance(1, 0, "3g.40gb", 40192.0, 512.25, "MIG-1"),),
    )
    snapshot = HostSnapshot(
        host="n1",
        time=t,
        gpus=(gpu, GpuState(index=1, lost=True)),
        processes=(
            GpuProcess(
                4242,
                0,
                1200.0,
                "alice",
                "python train.py",
                mig_instance=1,
                job=SlurmJob(
                    41327,
                    "llama-ft",
                    "alice",
                    "gpu",
                    "2026-01-01T00:00:00",
                    "1-00:00:00",
                    "RUNNING",
                ),
                started=t - 3600.5,
                load=ProcessLoad(87.0, 41.0, 0.0, None),
            ),
            GpuProcess(
                5252,
                0,
                None,
                "root",
                "python3 serve.py",
                container="k8s-pod:5f1c2e9a-7b3d-4c8e-9a61-2d4f8b0c7e13/containerd:0123456789ab",
                pod=KubePod("5f1c2e9a-7b3d-4c8e-9a61-2d4f8b0c7e13", "infer", "llama", "server"),
                container_name="server",
            ),
        ),
        topology=Topology((("X", "NV18"), ("NV18", "X")), ("0-55", None), (0, None)),
        driver_version="570.133.20",
        cuda_version="12.8",
        xid_events=(XidEvent(79, 1, t - 5.5, "GPU has fallen off the bus."),),
        source="nvml",
        node=SchedulerNode("slurm", "n1", "MIXED+DRAIN", "bad GPU 1"),
    )
    return dataclasses.replace(snapshot, **changes)  # type: ignore[arg-type]


def decode(rows: list[codec.Row], host: str = "n1") -> list[HostSnapshot]:
    decoder = codec.Decoder(codec.schema())
    keyframes: dict[int, HostSnapshot] = {}
    out = []
    for row in rows:
        if row.is_keyframe:
            keyframes[row.t] = decoder.keyframe(host, row.t, row.data)
            out.append(keyframes[row.t])
        else:
            out.append(decoder.delta(keyframes[row.key], row.t, row.data))
    return out


# --- the encoding -----------------------------------------------------------------------------


def test_every_field_survives_encoding_and_deltas_refer_to_their_keyframe() -> None:
    encoder = codec.HostEncoder(keyframe_every_s=60)
    first = full_snapshot(START)
    hotter = dataclasses.replace(first.gpus[0], temperature_c=88.0, throttle_reasons=None)
    second = full_snapshot(START + 1, gpus=(hotter, first.gpus[1]), processes=())
    rows = [encoder.encode(first), encoder.encode(second)]
    assert rows[0].is_keyframe and not rows[1].is_keyframe
    assert rows[1].key == rows[0].t
    assert decode(rows) == [first, second]
    assert len(rows[1].data) < len(rows[0].data) / 2  # only the changed values


def test_a_whole_float_comes_back_a_float_and_missing_stays_none() -> None:
    row = codec.HostEncoder().encode(full_snapshot(START))
    (back,) = decode([row])
    gpu = back.gpus[0]
    assert isinstance(gpu.temperature_c, float) and gpu.temperature_c == 61.0
    assert gpu.fan_pct is None and back.gpus[1].utilization_pct is None
    assert back.gpus[0].ecc == EccCounts(0, 0, 3, None)


def test_a_drained_node_and_its_return_are_recorded_in_deltas() -> None:
    encoder = codec.HostEncoder(keyframe_every_s=60)
    drained = full_snapshot(START)
    resumed = full_snapshot(START + 1, node=SchedulerNode("slurm", "n1", "MIXED"))
    unknown = full_snapshot(START + 2, node=None)
    rows = [encoder.encode(s) for s in (drained, resumed, unknown)]
    assert [r.is_keyframe for r in rows] == [True, False, False]
    assert [s.node for s in decode(rows)] == [drained.node, resumed.node, None]


def test_a_new_keyframe_when_the_gpus_change_or_a_minute_passed() -> None:
    encoder = codec.HostEncoder(keyframe_every_s=60)
    snapshot = full_snapshot(START)
    assert encoder.encode(snapshot).is_keyframe
    assert not encoder.encode(full_snapshot(START + 59)).is_keyframe
    assert encoder.encode(full_snapshot(START + 60)).is_keyframe
    one_gpu = full_snapshot(START + 61, gpus=snapshot.gpus[:1])
    assert encoder.encode(one_gpu).is_keyframe


def test_a_recording_made_before_a_field_existed_still_decodes() -> None:
    """Rows written with an older GpuState (no ``fan_pct``) decode with the field's default."""
    older = codec.schema()
    older["GpuState"] = [name for name in older["GpuState"] if name != "fan_pct"]
    snapshot = full_snapshot(START)
    vector = [codec._wire(getattr(snapshot.gpus[0], name)) for name in older["GpuState"]]
    raw = {"g": [vector], "t": None, "d": "570", "c": None, "s": "nvml", "p": [], "x": []}
    data = codec._pack(raw)
    back = codec.Decoder(older).keyframe("n1", codec.to_ms(START), data)
    assert back.gpus[0].fan_pct is None
    assert back.gpus[0].power_w == snapshot.gpus[0].power_w
    assert back.gpus[0].mig_instances == snapshot.gpus[0].mig_instances


# --- recording a simulated incident ------------------------------------------------------------


def record_incident(
    path: Path, rack: SimRack, seconds: int = 60, fault_at: int = 30
) -> tuple[float, list[str]]:
    """Record ``seconds`` of the rack at 1 Hz through the headless loop, switching XID 79 on
    l40s-01's GPU 1 on at ``fault_at``; returns the fault's time and the audit actions logged."""
    clock = ManualClock(START)
    source = SimSource(rack, clock)
    recorder = Recorder(path, label="test rack")
    stop = threading.Event()
    fault_time = START + fault_at

    def tick(rounds: int) -> None:
        clock.advance(1.0)
        if clock() == fault_time:
            rack.set_fault("l40s-01", "xid-79", 1, since=fault_time)
            audit.record("signal-process", host="l40s-01", pid=4242, signal="SIGTERM")
        if rounds >= seconds:
            stop.set()

    try:
        problem = record_fleet(source, recorder, interval=0.0, stop=stop, on_round=tick)
    finally:
        recorder.close()
    assert problem is None
    return fault_time, ["signal-process"]


def test_a_reading_the_writer_cannot_encode_stops_recording_with_a_reason(tmp_path: Path) -> None:
    """A bug in encoding must not leave the headless loop waiting for the writer forever."""
    path = tmp_path / "r.gpurec"
    recorder = Recorder(path)
    stop = threading.Event()
    try:
        unencodable = full_snapshot(START, source=object())
        assert recorder.take(Tick(START, (unencodable,)), stop)
        assert not recorder.take(Tick(START + 1, (full_snapshot(START + 1),)), stop)
    finally:
        recorder.close()
    assert recorder.error is not None
    assert recorder.error.startswith(f"{path}: recording stopped: TypeError: ")


def test_a_fault_switched_on_mid_run_is_found_at_its_time(
    tmp_path: Path, rack: SimRack, audit_log: Path
) -> None:
    path = tmp_path / "incident.sqlite"
    fault_time, _ = record_incident(path, rack)
    recording = Recording(path)
    try:
        assert recording.hosts == rack.hosts
        assert recording.start == START and recording.end == START + 59
        assert len(recording.snapshots("l40s-01", START, START + 59)) == 60
        before = recording.snapshot_at("l40s-01", fault_time - 1)
        after = recording.snapshot_at("l40s-01", fault_time)
        assert before is not None and after is not None
        assert not before.gpus[1].lost and after.gpus[1].lost
        assert after == rack.read("l40s-01", fault_time)  # exactly the reading taken then
        began = [e for e in recording.episodes(host="l40s-01") if e.since == fault_time]
        assert {(e.code, e.gpu, e.severity) for e in began} >= {
            ("gpu-lost", 1, Severity.CRITICAL),
            ("xid", 1, Severity.CRITICAL),
        }
        assert fault_time in [t for t, _ in recording.onsets()]
        assert recording.state_at("l40s-01", fault_time) == (HostState.LIVE, None)
        (action,) = recording.actions(host="l40s-01")
        assert action["action"] == "signal-process" and action["pid"] == 4242
        (session,) = recording.sessions
        assert session.label == "test rack" and session.ended == START + 59
        # h100-01's GPU 3 fell off the bus 120 s after the epoch, before recording began: its
        # XID episode begins at the XID's own time.
        xid = [e for e in recording.episodes(host="h100-01") if e.code == "xid"]
        assert [e.since for e in xid] == [EPOCH + 120.0]
    finally:
        recording.close()


def test_appending_to_a_recording_is_a_new_session(
    tmp_path: Path, rack: SimRack, audit_log: Path
) -> None:
    path = tmp_path / "twice.sqlite"
    record_incident(path, demo_rack(hosts=6, seed=7, epoch=EPOCH), seconds=10)
    record_incident(path, rack, seconds=5)  # same times again: nothing recorded twice
    recording = Recording(path)
    try:
        assert len(recording.sessions) == 2
        assert len(recording.snapshots("h100-01", START, START + 60)) == 10
    finally:
        recording.close()


def test_a_second_recorder_on_the_same_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "locked.sqlite"
    first = Recorder(path)
    try:
        with pytest.raises(RecordingError, match="another gpuconsole is recording into it"):
            Recorder(path)
    finally:
        first.close()
    Recorder(path).close()  # released with the first one


@pytest.mark.parametrize("content", [b"hello, not a database\n", b""])
def test_a_file_that_is_not_a_recording_is_refused_and_left_untouched(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(RecordingError, match=f"{path}: not a gpuconsole recording"):
        Recorder(path)
    with pytest.raises(RecordingError, match=f"{path}: not a gpuconsole recording"):
        Recording(path)
    assert path.read_bytes() == content


def test_another_sqlite_database_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('format', 'something-else')")
    with pytest.raises(RecordingError, match="not a gpuconsole recording"):
        Recording(path)


def test_a_missing_recording_is_named(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match=r"absent\.sqlite: no such recording"):
        Recording(tmp_path / "absent.sqlite")


def test_the_schema_of_the_recording_is_kept_in_it(tmp_path: Path) -> None:
    path = tmp_path / "schema.sqlite"
    Recorder(path).close()
    with sqlite3.connect(path) as db:
        meta = dict(db.execute("SELECT key, value FROM meta"))
        (mode,) = db.execute("PRAGMA journal_mode").fetchone()
    assert meta["format"] == "gpuconsole-recording"
    assert json.loads(meta["schema"])["GpuState"][0] == "index"
    assert mode == "wal"


async def test_the_console_records_what_it_shows(make_app, clock, tmp_path: Path) -> None:
    from test_app import tick

    path = tmp_path / "console.sqlite"
    recorder = Recorder(path, label="demo rack")
    app = make_app(recorder=recorder)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(5):
                tick(app, clock)
            await pilot.press("T")
            await pilot.pause()
    finally:
        recorder.close()
    recording = Recording(path)
    try:
        assert recording.hosts == app.fleet.store.hosts
        assert recording.end == clock()
        for host in app.fleet.store.hosts:
            assert recording.snapshot_at(host, clock()) == app.fleet.store.latest(host)
        shown = {
            (f.host, f.gpu, f.code)
            for h in app.fleet.store.hosts
            for f in app.fleet.store.findings(h)
        }
        recorded = {(e.host, e.gpu, e.code) for e in recording.open_episodes(clock())}
        assert shown <= recorded
        firing = {(a.rule, a.host, a.gpu) for a in app.fleet.alerts.active() if a.state == "firing"}
        alerts = {(e.code, e.host, e.gpu) for e in recording.open_episodes(clock())}
        assert firing and firing <= alerts
    finally:
        recording.close()


@pytest.mark.parametrize(
    "module",
    [
        "gpuconsole.fleet.record.recorder",
        "gpuconsole.fleet.record.reader",
        "gpuconsole.fleet.record.replay",
        "gpuconsole.fleet.record.retention",
        "gpuconsole.fleet.headless",
        "gpuconsole.cli.commands.record",
        "gpuconsole.cli.commands.replay",
        "gpuconsole.actions.bundle.make",
        "gpuconsole.cli.commands.bundle",
        "gpuconsole.fleet.triage_list",
    ],
)
def test_recording_replay_and_bundles_never_import_textual(module: str) -> None:
    import subprocess
    import sys

    from test_import_hygiene import PROBE, ROOT

    done = subprocess.run(
        [sys.executable, "-c", PROBE, module], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True", "[]"]


def _console_args(**options: object) -> object:
    import argparse

    defaults = {"no_record": False, "demo": False, "record": None}
    return argparse.Namespace(**{**defaults, **options})


def test_the_console_records_by_default_but_not_the_demo_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuconsole.cli.commands.console import console_recorder

    assert console_recorder(_console_args(no_record=True), "rack") is None
    assert console_recorder(_console_args(demo=True), "demo rack") is None
    recorder = console_recorder(_console_args(), "rack")
    assert recorder is not None and recorder.path == paths.RECORDING.path()
    try:
        # While it records the default file, a second console watches without recording...
        assert console_recorder(_console_args(), "rack") is None
        assert "not recording: " in capsys.readouterr().err
        # ...but a file asked for by name is an error.
        with pytest.raises(RecordingError, match="another gpuconsole is recording into it"):
            console_recorder(_console_args(record=paths.RECORDING.path()), "rack")
    finally:
        recorder.close()
    asked = console_recorder(_console_args(demo=True, record=tmp_path / "demo.sqlite"), "demo")
    assert asked is not None
    asked.close()


def test_record_refuses_a_file_that_is_not_a_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuconsole.cli.main import main

    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    assert main(["record", "--demo", "--record", str(notes), "--duration", "1s"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"gpuconsole: {notes}: not a gpuconsole recording (file is not a database)"
    assert notes.read_text() == "mine\n"


def test_a_flapping_finding_is_one_episode_that_ends_when_it_went_away() -> None:
    from gpuconsole.core.model import Finding
    from gpuconsole.fleet.record.episodes import OnsetTracker

    capped = Finding(Severity.INFO, "power-cap", "at its cap", "expected", "n1", 0)
    tracker = OnsetTracker(grace_s=30.0)
    opened, closed = [], []
    for t in range(0, 80):
        present = t < 6 or 11 <= t < 20  # away for 5 s (within the grace), then for good
        changes = tracker.update_host("n1", float(t), [capped] if present else [])
        opened += [e.since for e in changes.opened]
        closed += [until for _, until in changes.closed]
        if t == 15:
            assert tracker.since("n1/0/power-cap") == 0.0
    assert opened == [0.0] and closed == [20.0]  # ended at 50 s, as of when it went away
    tracker.update_host("n1", 100.0, [capped])
    tracker.update_host("n1", 101.0, [])
    assert tracker.flush() == [("n1/0/power-cap", 101.0)]
    assert tracker.since("n1/0/power-cap") is None
