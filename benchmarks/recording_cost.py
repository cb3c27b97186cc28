"""What recording costs, and how fast a day-long recording opens and jumps.

    python benchmarks/recording_cost.py [--hosts 64] [--seconds 600] [--skip-day] [--keep FILE]

1. Recording cost: a simulated rack of ``--hosts`` hosts of 8 GPUs (H100 SXM and A100 PCIe,
   a few faults on) read at 1 Hz for ``--seconds`` of simulated time, each round fed to the
   store and the alert engine as the console does (not timed), then recorded: the tick built,
   encoded, inserted and committed (timed, CPU and wall). Figures: share of one core at 1 Hz,
   bytes per host-hour (the file after a WAL checkpoint), and the cost of thinning an hour of
   1 Hz readings to the default 10 s step (amortised per second of recording).
2. A 24-hour recording of the same rack in the shape the default retention leaves it (the last
   6 h at 1 Hz, the 18 h before at one reading per 10 s): real simulated readings (a pool of
   ``--pool`` seconds per host, laid out again and again with new times), written through the
   recorder's writer with their findings. Then: opening it (`Recording`), a jump (the reading
   of every host at a random time into a fresh fleet session: what the replay shows at once),
   the same with the history before it (`JUMP_HISTORY_S` per host into a fresh session: the
   store, the alerts and the onsets primed with it, as the replay does after a jump), and the
   replay app itself (headless) opening and jumping to the next finding, each until
   the fleet shows the moment and until the history is there.

It prints the figures and a JSON line with them. Run on an idle machine: figures are CPU time
where they can be (process time, one thread), wall time otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuconsole.core.clock import ManualClock  # noqa: E402
from gpuconsole.core.model import Finding, HostSnapshot, HostState  # noqa: E402
from gpuconsole.fleet.alerts.defaults import DEFAULT_RULES  # noqa: E402
from gpuconsole.fleet.alerts.engine import AlertEngine  # noqa: E402
from gpuconsole.fleet.poller import collect, ingest  # noqa: E402
from gpuconsole.fleet.record.reader import Recording  # noqa: E402
from gpuconsole.fleet.record.recorder import RecordingWriter, Tick, tick_of  # noqa: E402
from gpuconsole.fleet.record.replay import ReplaySource  # noqa: E402
from gpuconsole.fleet.record.retention import Maintenance, Retention, Tier  # noqa: E402
from gpuconsole.fleet.record.schema import create, open_for_writing  # noqa: E402
from gpuconsole.fleet.session import FleetSession  # noqa: E402
from gpuconsole.fleet.store import FleetStore, HostStatus  # noqa: E402
from gpuconsole.telemetry.sim import DEFAULT_EPOCH, SimRack, SimSource  # noqa: E402
from gpuconsole.ui.replay_app import JUMP_HISTORY_S  # noqa: E402

DAY_S = 86400
FULL_S = 6 * 3600
THIN_STEP_S = 10
FAULTS = (
    ("thermal-throttle", 2, 0.0),
    ("xid-79", 3, 120.0),
    ("ecc-uncorrectable", 6, 240.0),
    ("memory-leak", 4, 60.0),
    ("pcie-degraded", 1, 0.0),
)


def rack_of(hosts: int) -> SimRack:
    names = {
        f"{'h100' if i % 2 == 0 else 'a100'}-{i + 1:02d}": (
            "h100-sxm-8" if i % 2 == 0 else "a100-pcie-8"
        )
        for i in range(hosts)
    }
    rack = SimRack(names, seed=7, epoch=DEFAULT_EPOCH)
    for n, host in enumerate(list(names)[:: max(1, hosts // len(FAULTS))][: len(FAULTS)]):
        fault, gpu, delay = FAULTS[n]
        rack.set_fault(host, fault, gpu, since=DEFAULT_EPOCH + delay)
    return rack


def open_writer(path: Path, keyframe_every_s: float = 60.0) -> RecordingWriter:
    if not path.exists():
        create(path, "benchmark")
    connection, meta = open_for_writing(path)
    return RecordingWriter(
        connection, meta, keyframe_every_s=keyframe_every_s, audit_log=path.with_suffix(".audit")
    )


def file_bytes(writer: RecordingWriter, path: Path) -> int:
    writer._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


# --- 1. the cost of recording -------------------------------------------------------------------


def recording_cost(hosts: int, seconds: int, folder: Path) -> dict[str, float]:
    rack = rack_of(hosts)
    clock = ManualClock(DEFAULT_EPOCH + 900)
    source = SimSource(rack, clock)
    store = FleetStore(source.hosts)
    alerts = AlertEngine()
    path = folder / "cost.sqlite"
    writer = open_writer(path)
    ingest(store, collect(source))  # the sim integrates its first 900 s here, not timed
    cpu = wall = 0.0
    for _ in range(seconds):
        clock.advance(1.0)
        readings = collect(source)
        changed = ingest(store, readings)
        alerts.evaluate([r.snapshot for r in readings if r.snapshot], clock())
        cpu0, wall0 = time.process_time(), time.perf_counter()
        writer.write(tick_of(store, readings, changed, alerts.active()))
        writer.commit()
        cpu += time.process_time() - cpu0
        wall += time.perf_counter() - wall0
    size = file_bytes(writer, path)
    thin_cpu, thin_host_hours = thinning_cost(writer, clock(), seconds, hosts)
    writer.close()
    host_hours = hosts * seconds / 3600
    return {
        "hosts": hosts,
        "seconds": seconds,
        "record_cpu_share_pct": 100 * cpu / seconds,
        "record_wall_ms_per_tick": 1000 * wall / seconds,
        "bytes_per_host_hour": size / host_hours,
        "mb_per_host_day_full_resolution": size / host_hours * 24 / 1e6,
        "thin_cpu_s_per_host_hour": thin_cpu / thin_host_hours,
        "thin_cpu_share_pct": 100 * (thin_cpu / thin_host_hours) * hosts / 3600,
    }


def thinning_cost(
    writer: RecordingWriter, now: float, seconds: int, hosts: int
) -> tuple[float, float]:
    """CPU seconds to thin what was recorded to one reading per 10 s (all but the last 70 s:
    thinning stops at the last keyframe), and the host-hours it thinned."""
    age = 70.0
    maintenance = Maintenance(
        writer._db, writer.decoder, Retention(keep_s=10 * DAY_S, tiers=(Tier(age, THIN_STEP_S),))
    )
    start = time.process_time()
    while maintenance.step(now):
        pass
    return time.process_time() - start, hosts * (seconds - age) / 3600


# --- 2. a day-long recording ----------------------------------------------------------------------


def build_day(hosts: int, pool_s: int, path: Path) -> tuple[float, float, int]:
    """The 24-hour recording; returns its start, end and size in bytes."""
    rack = rack_of(hosts)
    clock = ManualClock(DEFAULT_EPOCH + 900)
    source = SimSource(rack, clock)
    store = FleetStore(source.hosts)
    pool: list[tuple[list[HostSnapshot], dict[str, tuple[Finding, ...]]]] = []
    for _ in range(pool_s):
        readings = collect(source)
        ingest(store, readings)
        snapshots = [r.snapshot for r in readings if r.snapshot is not None]
        pool.append((snapshots, {h: store.findings(h) for h in store.hosts}))
        clock.advance(1.0)
    end = time.time() // 60 * 60
    start = end - DAY_S
    live = {host: HostStatus(HostState.LIVE) for host in store.hosts}
    t, i = start, 0
    # The older 18 h as thinning leaves them (a keyframe every 100 s), then 6 h at 1 Hz.
    for until, step, keyframe_every in (
        (end - FULL_S, THIN_STEP_S, 10.0 * THIN_STEP_S),
        (end, 1, 60.0),
    ):
        writer = open_writer(path, keyframe_every)
        while t < until or (until == end and t <= end):
            snapshots, findings = pool[i % pool_s]
            retimed = tuple(dataclasses.replace(s, time=t) for s in snapshots)
            writer.write(Tick(time=t, snapshots=retimed, statuses=live, findings=findings))
            if i % 60 == 0:
                writer.commit()
            i += 1
            t += step
        writer.commit()
        size = file_bytes(writer, path)
        writer.close()
    return start, end, size


def day_figures(path: Path, start: float, end: float, jumps: int) -> dict[str, float]:
    rng = random.Random(1)
    opened = []
    for _ in range(3):
        began = time.perf_counter()
        recording = Recording(path)
        onsets = recording.onsets()
        opened.append(time.perf_counter() - began)
        recording.close()
    recording = Recording(path)
    source = ReplaySource(recording)
    quick, full = [], []
    for _ in range(jumps):
        at = rng.uniform(start + 300, end)
        began = time.perf_counter()
        source.move_to(at)
        FleetSession(source.hosts, DEFAULT_RULES).take(collect(source))
        source.episodes_at()
        quick.append(time.perf_counter() - began)
        began = time.perf_counter()
        fleet = FleetSession(source.hosts, DEFAULT_RULES)
        fleet.prime(source, JUMP_HISTORY_S)
        fleet.take(collect(source))
        full.append(time.perf_counter() - began)
    recording.close()
    app = asyncio.run(app_figures(path, end - FULL_S / 2))
    return {
        **app,
        "open_s_median": statistics.median(opened),
        "onsets": len(onsets),
        "jump_s_median": statistics.median(quick),
        "jump_s_max": max(quick),
        "jump_with_history_s_median": statistics.median(full),
        "jump_with_history_s_max": max(full),
    }


async def app_figures(path: Path, at: float) -> dict[str, float]:
    """The replay app (headless): from start until the fleet shows the readings at the cursor,
    then until the history is there too; the same for `n` (the next finding)."""
    from gpuconsole.ui.replay_app import ReplayApp

    recording = Recording(path)
    began = time.perf_counter()
    app = ReplayApp(recording, at=at)
    figures = {}
    async with app.run_test(size=(160, 48)) as pilot:
        host = app.fleet.store.hosts[0]
        while app.fleet.store.latest(host) is None:
            await pilot.pause(0.002)
        figures["app_open_s"] = time.perf_counter() - began
        while len(app.fleet.store.history(host)) < 2:
            await pilot.pause(0.002)
        figures["app_open_history_s"] = time.perf_counter() - began
        await app.workers.wait_for_complete()
        while not app.onsets:
            await pilot.pause(0.002)
        target = next(t for t, _ in app.onsets if t > app.replay.cursor + 0.5)
        reading = recording.snapshot_at(host, target)
        assert reading is not None
        began = time.perf_counter()
        app.action_finding(1)
        while (s := app.fleet.store.latest(host)) is None or s.time != reading.time:
            await pilot.pause(0.002)
        figures["app_jump_s"] = time.perf_counter() - began
        while len(app.fleet.store.history(host)) < 2:
            await pilot.pause(0.002)
        figures["app_jump_history_s"] = time.perf_counter() - began
        await app.workers.wait_for_complete()
    recording.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=600, help="recorded seconds for part 1")
    parser.add_argument("--pool", type=int, default=300, help="distinct seconds for part 2")
    parser.add_argument("--jumps", type=int, default=20)
    parser.add_argument("--skip-day", action="store_true", help="only part 1")
    parser.add_argument(
        "--keep", type=Path, help="keep the day-long recording here (one already there is used)"
    )
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        cost = recording_cost(args.hosts, args.seconds, Path(folder))
        print(
            f"recording {args.hosts} hosts x 8 GPUs at 1 Hz for {args.seconds} s:\n"
            f"  CPU {cost['record_cpu_share_pct']:.2f} % of one core "
            f"({cost['record_wall_ms_per_tick']:.1f} ms wall per tick)\n"
            f"  {cost['bytes_per_host_hour'] / 1e6:.2f} MB per host-hour at full resolution "
            f"({cost['mb_per_host_day_full_resolution']:.1f} MB per host-day)\n"
            f"  thinning to 10 s: {cost['thin_cpu_s_per_host_hour']:.2f} CPU s per host-hour "
            f"({cost['thin_cpu_share_pct']:.2f} % of one core for the rack)",
            flush=True,
        )
        figures: dict[str, object] = {"cost": cost}
        if not args.skip_day:
            path = args.keep or Path(folder) / "day.sqlite"
            began = time.perf_counter()
            if path.exists():  # a day kept from an earlier run
                kept = Recording(path)
                assert kept.start is not None and kept.end is not None
                start, end, size = kept.start, kept.end, path.stat().st_size
                kept.close()
            else:
                start, end, size = build_day(args.hosts, args.pool, path)
            print(
                f"24-hour recording: {size / 1e6:.0f} MB ({size / args.hosts / 1e6:.1f} MB per "
                f"host-day), built in {time.perf_counter() - began:.0f} s",
                flush=True,
            )
            day = day_figures(path, start, end, args.jumps)
            day["bytes"] = size
            figures["day"] = day
            print(
                f"  open {day['open_s_median'] * 1000:.0f} ms ({day['onsets']} onsets)\n"
                f"  jump: every host at the cursor {day['jump_s_median'] * 1000:.0f} ms "
                f"median, {day['jump_s_max'] * 1000:.0f} ms max; "
                f"with {JUMP_HISTORY_S} s of history "
                f"{day['jump_with_history_s_median'] * 1000:.0f} ms median, "
                f"{day['jump_with_history_s_max'] * 1000:.0f} ms max\n"
                f"  replay app: open {day['app_open_s'] * 1000:.0f} ms (history "
                f"{day['app_open_history_s'] * 1000:.0f} ms), n (next finding) "
                f"{day['app_jump_s'] * 1000:.0f} ms (history "
                f"{day['app_jump_history_s'] * 1000:.0f} ms)",
                flush=True,
            )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
