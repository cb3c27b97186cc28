"""The agent on a real GPU host, every field of its readings against the in-process NVML source,
and what a reading costs.

    python benchmarks/agent_on_gpu.py [--ticks 20] [--interval 0.5] [--save DIR]

Runs the agent exactly as the console does over SSH (the same remote command, the script on its
stdin), here on the local host, once in `nvml` mode and once in `smi` mode. Each mode's readings
go through the console's decoder (`AgentStream`); the last one is compared, field by field over
every field of the field table (`gpuconsole.core.fields`), with `NvmlSource.read()` taken at the
same moment. A field the table says a mode cannot carry must be N/A there; every other must be
equal, or within `TOLERANCE` for those that move from one instant to the next. It also reports
each mode's CPU per tick (the agent and its children, measured with psutil), its bytes per line,
and the wall time of one `NvmlSource.read()` per GPU.

``--save DIR`` writes each mode's agent lines (``agent-nvml.jsonl``, ``agent-smi.jsonl``) and the
in-process reading taken with its last (``local-nvml.row`` and ``.json``, likewise ``local-smi``),
for ``tests/test_gpu_screen_paths.py``. Exits 1 when a
comparison fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from process_tree import tree_cpu_seconds

from gpuconsole.core.fields import FIELDS, QUERY_GPU
from gpuconsole.core.model import GpuState, HostSnapshot
from gpuconsole.fleet.record import codec
from gpuconsole.telemetry.nvml import NvmlSource
from gpuconsole.telemetry.wire import AgentStream, AgentTick, agent_command, agent_script

Tolerance = Callable[[float], float]
TOLERANCE: dict[str, Tolerance] = {
    "utilization_pct": lambda _: 5.0,
    "memory_utilization_pct": lambda _: 5.0,
    "temperature_c": lambda _: 2.0,
    "power_w": lambda watts: max(0.05 * watts, 1.0),
    "memory_used_mib": lambda used: max(0.01 * used, 2.0),
    "sm_clock_mhz": lambda mhz: max(0.1 * mhz, 50.0),
    "memory_clock_mhz": lambda mhz: max(0.1 * mhz, 50.0),
    # NVML samples each direction over 20 ms: two reads a moment apart differ by the traffic's
    # own variation, which is large at idle (a few KiB/s of housekeeping)
    "pcie_tx_kib_s": lambda kib: max(0.5 * kib, 1024.0),
    "pcie_rx_kib_s": lambda kib: max(0.5 * kib, 1024.0),
}
"""Fields that move from one instant to the next, with the difference allowed given the NVML
source's value; every other field must be equal."""
MOVING = frozenset({"throttle_reasons", "pstate"})
"""Fields that may change between two reads a moment apart (a clock-event reason comes and goes
with the load): compared, but a difference is reported, not failed."""
MODE_PATH = {"nvml": None, "smi": QUERY_GPU}
"""The field table's path each mode reads through (nvml mode reads what `NvmlSource` reads)."""


def value_of(gpu: GpuState, name: str) -> Any:
    part, _, attribute = name.rpartition(".")
    holder = getattr(gpu, part) if part else gpu
    return None if holder is None else getattr(holder, attribute)


def run_mode(mode: str, ticks: int, interval: float) -> tuple[list[AgentTick], list[bytes], dict]:
    script = agent_script()
    command = agent_command(len(script), interval, mode)
    agent = subprocess.Popen(
        ["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False
    )
    assert agent.stdin is not None and agent.stdout is not None
    agent.stdin.write(script)
    agent.stdin.flush()
    stream = AgentStream("here")
    readings: list[AgentTick] = []
    lines: list[bytes] = []
    watched = psutil.Process(agent.pid)
    sizes: list[int] = []
    before = None
    while len(readings) < ticks + 1:
        line = agent.stdout.readline()
        if not line:
            raise SystemExit(f"{mode}: the agent exited: status {agent.wait()}")
        lines.append(line)
        event = stream.feed(line.decode())
        if isinstance(event, AgentTick):
            readings.append(event)
            sizes.append(len(line))
            if before is None:  # start the clock after the first reading (start-up excluded)
                before = tree_cpu_seconds(watched)
    cpu = tree_cpu_seconds(watched) - (before or 0.0)
    agent.stdin.close()
    agent.wait(timeout=10)
    return (
        readings,
        lines,
        {
            "cpu_ms_per_tick": 1000 * cpu / ticks,
            "bytes_per_line": sum(sizes) / len(sizes),
            "malformed": float(stream.malformed),
        },
    )


def compare(mode: str, ours: GpuState, theirs: GpuState) -> tuple[list[str], int]:
    """Every field of the table: (the failures, how many fields were compared)."""
    failures = []
    path = MODE_PATH[mode]
    for spec in FIELDS:
        a, b = value_of(ours, spec.name), value_of(theirs, spec.name)
        if path is not None and path in spec.absent:
            ok, how = a in (None, ()), f"N/A in {mode} mode ({spec.absent[path]})"
        elif spec.name in TOLERANCE:
            close = TOLERANCE[spec.name]
            ok = a == b or (a is not None and b is not None and abs(a - b) <= close(b))
            how = "within tolerance"
        else:
            ok, how = a == b, "equal"
        if not ok and spec.name in MOVING:
            how, ok = "moved between the two reads", True
        verdict = "ok  " if ok else "FAIL"
        print(f"{mode:4} {verdict} GPU {ours.index} {spec.name}: {a!r} vs {b!r} ({how})")
        if not ok:
            failures.append(f"{mode} GPU {ours.index} {spec.name}")
    return failures, len(FIELDS)


def save_local(stem: Path, snapshot: HostSnapshot) -> None:
    """The in-process reading as a recording keeps it (``STEM.row``, and ``STEM.json`` with its
    time and the recording's schema), for a test to decode with `codec.Decoder`."""
    row = codec.HostEncoder().encode(snapshot)
    stem.with_suffix(".row").write_bytes(row.data)
    meta = {"host": snapshot.host, "t": row.t, "schema": codec.schema()}
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1))


def local_cost(reference: NvmlSource, reads: int) -> float:
    """Milliseconds per GPU of one `NvmlSource.read()`, after a warm-up."""
    host = reference.hosts[0]
    gpus = len(reference.read(host).gpus)
    for _ in range(3):
        reference.read(host)
    start = time.perf_counter()
    for _ in range(reads):
        reference.read(host)
    return (time.perf_counter() - start) / reads * 1000 / gpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--reads", type=int, default=100, help="timed NvmlSource.read() calls")
    parser.add_argument("--save", type=Path, help="write the agent lines and the local reading")
    args = parser.parse_args()
    reference = NvmlSource()
    failures: list[str] = []
    costs: dict[str, Any] = {"local_ms_per_gpu": local_cost(reference, args.reads)}
    compared = 0
    for mode in ("nvml", "smi"):
        began = time.monotonic()
        readings, lines, cost = run_mode(mode, args.ticks, args.interval)
        truth = reference.read(reference.hosts[0])
        cost["seconds"] = time.monotonic() - began
        costs[mode] = cost
        for ours in readings[-1].snapshot.gpus:
            theirs = truth.gpu(ours.index)
            assert theirs is not None
            failed, count = compare(mode, ours, theirs)
            failures += failed
            compared += count
        if args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"agent-{mode}.jsonl").write_bytes(b"".join(lines))
            save_local(args.save / f"local-{mode}", truth)
        print(
            f"{mode}: {args.ticks} ticks, {cost['cpu_ms_per_tick']:.2f} ms CPU per tick, "
            f"{cost['bytes_per_line']:.0f} bytes per reading, {cost['malformed']:.0f} malformed"
        )
    print(f"NvmlSource.read(): {costs['local_ms_per_gpu']:.3f} ms per GPU")
    print(json.dumps({"ticks": args.ticks, "interval": args.interval, "costs": costs}))
    print(
        f"{len(failures)} of {compared} field comparisons failed: {failures}"
        if failures
        else f"all {compared} field comparisons passed"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
