"""Each GPU process's SM %, as the console reads it, against ``nvidia-smi pmon`` on a real GPU.

    python benchmarks/process_load_vs_pmon.py [--rounds 10] [--json OUT.json]

Runs torch processes on GPU 0 in two phases: first one multiplying bf16 matrices without pause
("busy") beside one holding 1 GiB and sleeping ("idle"); then, the busy one gone, one that
multiplies for 100 ms and sleeps for 100 ms ("half") beside the idle one. Each round of a phase
reads the processes' loads through the local NVML source (pynvml), through the agent's own NVML
reader (ctypes, as on an SSH host) and through ``nvidia-smi pmon -c 1 -s u``, one right after
the other, and prints each process's SM % by each reader, and the cost of the console's call.

Exits 1 when the console disagrees with pmon: the busy process's mean SM % more than 10 points
from pmon's or under 80 %, or the idle process not idle (pmon shows ``-`` for a process without
a sample, which the console reads as 0 %). The half-busy process's figures are reported only:
each reader's sample falls at another moment of its cycle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gpuconsole.telemetry import agent as agent_module
from gpuconsole.telemetry.nvml import NvmlSource

WORKER = """
import sys, time, torch
kind = sys.argv[1]
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
held = torch.empty(2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    if kind == "idle":
        time.sleep(1)
        continue
    until = time.monotonic() + 0.1
    while time.monotonic() < until:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()
    if kind == "half":
        time.sleep(0.1)
"""
BUSY_FLOOR_PCT = 80.0
AGREEMENT_PCT = 10.0


@contextmanager
def worker(kind: str) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, kind], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"the {kind} worker did not start (said {line!r})")
        yield process
    finally:
        process.kill()
        process.wait(timeout=30)


def pmon() -> dict[int, float | None]:
    """SM % by pid from ``nvidia-smi pmon -c 1 -s u``; None where it prints ``-``."""
    text = subprocess.run(
        ["nvidia-smi", "pmon", "-c", "1", "-s", "u"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    lines = text.splitlines()
    header = lines[0].lstrip("#").split()
    pid_at, sm_at = header.index("pid"), header.index("sm")
    found: dict[int, float | None] = {}
    for line in lines:
        words = line.split()
        if line.startswith("#") or len(words) <= sm_at or not words[pid_at].isdigit():
            continue
        found[int(words[pid_at])] = None if words[sm_at] == "-" else float(words[sm_at])
    return found


def local_loads(source: NvmlSource) -> dict[int, float | None]:
    snapshot = source.read(source.hosts[0])
    return {p.pid: None if p.load is None else p.load.sm_pct for p in snapshot.processes}


def agent_loads(nvml: agent_module.Nvml) -> dict[int, float | None]:
    _, processes = nvml.read()
    return {p["pid"]: None if p["load"] is None else p["load"]["sm_pct"] for p in processes}


def call_cost_ms(nvml: agent_module.Nvml, calls: int = 200) -> float:
    device = agent_module.NvmlDevice(nvml, 0)
    handle, _ = device.handle()
    assert handle is not None, "GPU 0 gives no handle"
    start = time.perf_counter()
    for _ in range(calls):
        device._loads(handle)
    return (time.perf_counter() - start) / calls * 1000


def mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


Readings = dict[str, dict[str, list[float | None]]]
"""SM % by process kind, then by reader, one value a round (None: no load or not listed)."""


def measure(
    readers: dict[str, Callable[[], dict[int, float | None]]],
    running: dict[str, subprocess.Popen],
    rounds: int,
    seen: Readings,
) -> None:
    time.sleep(3.0)  # past the first samples
    for _ in range(rounds):
        for reader, read in readers.items():
            loads = read()
            for kind, process in running.items():
                seen.setdefault(kind, {}).setdefault(reader, []).append(loads.get(process.pid))
        time.sleep(1.0)


def report(seen: Readings) -> None:
    print(f"{'process':8} {'reader':6} {'mean SM %':>9}  each round")
    for kind, by_reader in seen.items():
        for reader, values in by_reader.items():
            average = mean(values)
            shown = "-" if average is None else f"{average:9.1f}"
            each = " ".join("-" if v is None else f"{v:.0f}" for v in values)
            print(f"{kind:8} {reader:6} {shown:>9}  {each}")


def disagreements(seen: Readings) -> list[str]:
    failures = []
    pmon_busy = mean(seen["busy"]["pmon"])
    for reader in ("local", "agent"):
        busy = mean(seen["busy"][reader])
        if busy is None or pmon_busy is None or busy < BUSY_FLOOR_PCT:
            failures.append(f"{reader}: busy process at {busy} % (pmon {pmon_busy} %)")
        elif abs(busy - pmon_busy) > AGREEMENT_PCT:
            failures.append(f"{reader}: busy {busy:.1f} % against pmon's {pmon_busy:.1f} %")
        if any(v != 0.0 for v in seen["idle"][reader]):
            failures.append(f"{reader}: the idle process read {seen['idle'][reader]}")
    if any(v not in (None, 0.0) for v in seen["idle"]["pmon"]):
        failures.append(f"pmon: the idle process read {seen['idle']['pmon']}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    source, nvml = NvmlSource(), agent_module.Nvml()
    readers = {
        "local": lambda: local_loads(source),
        "agent": lambda: agent_loads(nvml),
        "pmon": pmon,
    }
    seen: Readings = {}
    with worker("idle") as idle:
        with worker("busy") as busy:
            measure(readers, {"busy": busy, "idle": idle}, args.rounds, seen)
            cost = call_cost_ms(nvml)
        with worker("half") as half:
            measure(readers, {"half": half, "idle": idle}, args.rounds, seen)
    source.close()
    report(seen)
    failures = disagreements(seen)
    print(f"nvmlDeviceGetProcessUtilization through the agent: {cost:.3f} ms a call")
    for failure in failures:
        print("FAIL", failure)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"seen": seen, "call_ms": cost, "failures": failures}, out, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
