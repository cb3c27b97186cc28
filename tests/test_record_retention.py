"""Retention: readings past it are deleted, older ones thinned to one per step, recent ones kept
whole; every reading kept still decodes to exactly what was read."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from conftest import EPOCH

from gpuconsole.core.clock import ManualClock
from gpuconsole.fleet.poller import collect, ingest
from gpuconsole.fleet.record.reader import Recording
from gpuconsole.fleet.record.recorder import Recorder, RecordingWriter, tick_of
from gpuconsole.fleet.record.retention import CHUNK_S, Maintenance, Retention, Tier, parse_duration
from gpuconsole.fleet.record.schema import create, open_for_writing
from gpuconsole.fleet.store import FleetStore
from gpuconsole.telemetry.sim import SimRack, SimSource

START = EPOCH + 300.0
SECONDS = 1500
POLICY = Retention(keep_s=1200.0, tiers=(Tier(300.0, 10.0), Tier(600.0, 60.0)))


@pytest.fixture
def small_rack() -> SimRack:
    return SimRack({"h100-01": "h100-sxm-8", "l40s-01": "l40s-4"}, seed=3, epoch=EPOCH)


def write_recording(path: Path, rack: SimRack, seconds: int) -> RecordingWriter:
    create(path)
    connection, meta = open_for_writing(path)
    writer = RecordingWriter(connection, meta, audit_log=path.with_suffix(".audit"))
    clock = ManualClock(START)
    source = SimSource(rack, clock)
    store = FleetStore(source.hosts)
    for _ in range(seconds):
        readings = collect(source)
        writer.write(tick_of(store, readings, ingest(store, readings)))
        writer.commit()
        clock.advance(1.0)
    return writer


def counts_per_bucket(times: list[float], step: float) -> set[int]:
    buckets: dict[int, int] = {}
    for t in times:
        buckets[int(t // step)] = buckets.get(int(t // step), 0) + 1
    return set(buckets.values())


def test_old_readings_are_thinned_and_expired_and_the_rest_decode_exactly(
    tmp_path: Path, small_rack: SimRack
) -> None:
    path = tmp_path / "bounded.sqlite"
    writer = write_recording(path, small_rack, SECONDS)
    now = START + SECONDS - 1
    maintenance = Maintenance(writer._db, writer.decoder, POLICY)
    steps = 0
    while maintenance.step(now):
        steps += 1
    assert steps > 0
    assert not maintenance.step(now)  # done: a second round has nothing to do
    recording = Recording(path)
    try:
        for host in small_rack.hosts:
            kept = recording.snapshots(host, START - 1, now)
            times = [s.time for s in kept]
            # Retention: nothing older than 1200 s (cut at a keyframe, so up to a minute less).
            assert min(times) >= now - POLICY.keep_s
            assert min(times) <= now - POLICY.keep_s + 60
            # Older than 600 s: at most one reading a minute.
            assert counts_per_bucket([t for t in times if t < now - 600 - 60], 60.0) == {1}
            # 300 to 600 s old: at most one per 10 s.
            middle = [t for t in times if now - 600 <= t < now - 300 - 60]
            assert counts_per_bucket(middle, 10.0) == {1}
            # The last 300 s: every reading.
            recent = [t for t in times if t > now - 300]
            assert recent == [now - 299 + i for i in range(300)]
            for snapshot in kept:
                assert snapshot == small_rack.read(host, snapshot.time)
        assert len(recording.snapshots("h100-01", START - 1, now)) < 300 + 30 + 10 + 60
    finally:
        recording.close()
        writer.close()


def test_the_recorder_thins_in_between_ticks(tmp_path: Path, small_rack: SimRack) -> None:
    """The same bound reached through the recorder's own thread (maintenance between commits)."""
    path = tmp_path / "live.sqlite"
    recorder = Recorder(
        path, retention=POLICY, commit_every_s=0.01, maintain_every_s=0.0, audit_log=tmp_path / "a"
    )
    clock = ManualClock(START)
    source = SimSource(small_rack, clock)
    store = FleetStore(source.hosts)
    never = threading.Event()  # take waits for the writer, as the headless recorder does
    seconds = int(POLICY.keep_s + CHUNK_S) + 600  # expiry has run more than once
    try:
        for _ in range(seconds):
            readings = collect(source)
            assert recorder.take(tick_of(store, readings, ingest(store, readings)), never)
            clock.advance(1.0)
        now = START + seconds - 1
        deadline = time.monotonic() + 120
        while not bounded(path, now) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        recorder.close()
    assert recorder.error is None
    assert bounded(path, now), "the recorder did not thin and expire within 120 s"


def bounded(path: Path, now: float) -> bool:
    """Whether every host's readings are within retention and thinned past the 600 s tier.

    Expiry runs again once its cutoff has moved on by a chunk: a recorder that keeps pace with
    its ticks (maintenance between them) keeps up to `CHUNK_S` more than retention.
    """
    recording = Recording(path)
    try:
        if recording.end != now:
            return False
        for host in recording.hosts:
            times = [s.time for s in recording.snapshots(host, START - 1, now)]
            if min(times) < now - POLICY.keep_s - CHUNK_S:
                return False
            if counts_per_bucket([t for t in times if t < now - 700], 60.0) != {1}:
                return False
        return True
    finally:
        recording.close()


def test_thinning_keeps_findings_at_full_resolution(tmp_path: Path, small_rack: SimRack) -> None:
    path = tmp_path / "episodes.sqlite"
    small_rack.set_fault("l40s-01", "pcie-degraded", 2, since=START + 100.0)
    writer = write_recording(path, small_rack, SECONDS)
    maintenance = Maintenance(writer._db, writer.decoder, POLICY)
    while maintenance.step(START + SECONDS - 1):
        pass
    recording = Recording(path)
    try:
        began = [e.since for e in recording.episodes(host="l40s-01") if e.code == "pcie-degraded"]
        assert began == [START + 100.0]  # older than every tier, still to the second
    finally:
        recording.close()
        writer.close()


def test_expiry_is_recorded_so_it_resumes_where_it_stopped(
    tmp_path: Path, small_rack: SimRack
) -> None:
    path = tmp_path / "meta.sqlite"
    writer = write_recording(path, small_rack, 200)
    maintenance = Maintenance(writer._db, writer.decoder, Retention(keep_s=100.0, tiers=()))
    while maintenance.step(START + 199):
        pass
    meta = dict(writer._db.execute("SELECT key, value FROM meta"))
    assert int(meta["expired_until"]) == round((START + 99) * 1000)
    assert json.loads(meta["schema"])
    writer.close()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("6h", 21600.0), ("7d", 604800.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5m", "0", "5y"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_tiers_must_grow_older() -> None:
    with pytest.raises(ValueError, match="increasing order"):
        Retention(tiers=(Tier(600.0, 60.0), Tier(300.0, 10.0)))
