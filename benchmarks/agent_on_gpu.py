"""The agent on a real GPU host: its readings against the in-process NVML source, and its cost.

    python benchmarks/agent_on_gpu.py [--ticks 20] [--interval 0.5]

Runs the agent exactly as the console does over SSH (the same remote command, the script on its
stdin), here on the local host, once in `nvml` mode and once in `smi` mode. Each mode's readings
go through the console's decoder (`AgentStream`); the last one is compared field by field with
`NvmlSource.read()` taken at the same moment: identity and totals exact, utilization within 5
points, temperature within 2 °C, power within 5 %, memory used within 1 %. It also reports each
mode's CPU per tick (the agent and its children, measured with psutil) and bytes per line.
Exits 1 when a comparison fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import psutil
from process_tree import tree_cpu_seconds

from gpuconsole.telemetry.nvml import NvmlSource
from gpuconsole.telemetry.wire import AgentStream, Reading, agent_command, agent_script

EXACT = ("name", "uuid", "pci_bus_id", "memory_total_mib", "power_limit_w", "pstate")
# (field, allowed difference given the NVML source's value)
CLOSE = (
    ("utilization_pct", lambda _: 5.0),
    ("temperature_c", lambda _: 2.0),
    ("power_w", lambda watts: max(0.05 * watts, 1.0)),
    ("memory_used_mib", lambda used: max(0.01 * used, 2.0)),
)


def run_mode(mode: str, ticks: int, interval: float) -> tuple[list[Reading], dict[str, float]]:
    script = agent_script()
    command = agent_command(len(script), interval, mode)
    agent = subprocess.Popen(
        ["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False
    )
    assert agent.stdin is not None and agent.stdout is not None
    agent.stdin.write(script)
    agent.stdin.flush()
    stream = AgentStream("here")
    readings: list[Reading] = []
    watched = psutil.Process(agent.pid)
    sizes: list[int] = []
    before = None
    while len(readings) < ticks + 1:
        line = agent.stdout.readline()
        if not line:
            raise SystemExit(f"{mode}: the agent exited: status {agent.wait()}")
        event = stream.feed(line.decode())
        if isinstance(event, Reading):
            readings.append(event)
            sizes.append(len(line))
            if before is None:  # start the clock after the first reading (start-up excluded)
                before = tree_cpu_seconds(watched)
    cpu = tree_cpu_seconds(watched) - (before or 0.0)
    agent.stdin.close()
    agent.wait(timeout=10)
    return readings, {
        "cpu_ms_per_tick": 1000 * cpu / ticks,
        "bytes_per_line": sum(sizes) / len(sizes),
        "malformed": float(stream.malformed),
    }


def compare(mode: str, reading: Reading, reference: NvmlSource) -> list[str]:
    truth = reference.read(reference.hosts[0])
    failures = []
    for ours in reading.snapshot.gpus:
        theirs = truth.gpu(ours.index)
        assert theirs is not None
        for field in EXACT:
            a, b = getattr(ours, field), getattr(theirs, field)
            ok = a == b
            print(f"{mode:4} {'ok  ' if ok else 'FAIL'} GPU {ours.index} {field}: {a} vs {b}")
            if not ok:
                failures.append(f"{mode} {field}")
        for field, tolerance in CLOSE:
            a, b = getattr(ours, field), getattr(theirs, field)
            ok = a is not None and b is not None and abs(a - b) <= tolerance(b)
            print(f"{mode:4} {'ok  ' if ok else 'FAIL'} GPU {ours.index} {field}: {a} vs {b}")
            if not ok:
                failures.append(f"{mode} {field}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.5)
    args = parser.parse_args()
    reference = NvmlSource()
    failures: list[str] = []
    costs = {}
    for mode in ("nvml", "smi"):
        began = time.monotonic()
        readings, cost = run_mode(mode, args.ticks, args.interval)
        cost["seconds"] = time.monotonic() - began
        costs[mode] = cost
        failures += compare(mode, readings[-1], reference)
        print(
            f"{mode}: {args.ticks} ticks, {cost['cpu_ms_per_tick']:.2f} ms CPU per tick, "
            f"{cost['bytes_per_line']:.0f} bytes per reading, {cost['malformed']:.0f} malformed"
        )
    print(json.dumps({"ticks": args.ticks, "interval": args.interval, "modes": costs}))
    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
