"""Where the CPU of one NVML reading of this host goes: by stage and by NVML function.

    python benchmarks/nvml_calls.py [--reads N]

On a GPU host it makes an `NvmlSource`, reads three times to warm up, measures the process's
CPU over 10 idle seconds (the XID watcher's thread waits on NVML's events meanwhile), then
reads N times back to back. For the N reads it prints the process's CPU per reading (every
thread: the PCIe throughput is sampled on threads of its own), the reading thread's, the
wall time, the reading thread's CPU in each stage (the NVML reader, decoding, vetting, the
processes' owners), and for every NVML function its calls, CPU and wall time per reading
(the thread's CPU time around each call, wherever it was made). Readings within
`PCIE_SAMPLE_S` of a sample carry it, so back-to-back reads sample the PCIe throughput once:
`--every-reading` sets that interval to 0, as every reading was before 2026-12-07.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuconsole.telemetry import agent
from gpuconsole.telemetry.nvml import source as nvml_source

IDLE_SECONDS = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=40)
    parser.add_argument("--every-reading", action="store_true", help="sample PCIe every read")
    args = parser.parse_args()
    if (reason := nvml_source.nvml_unavailable_reason()) is not None:
        print(f"nvml_calls: {reason}", file=sys.stderr)
        return 1
    if args.every_reading:
        agent.PCIE_SAMPLE_S = 0.0
    calls: Counter[str] = Counter()
    cpu: defaultdict[str, float] = defaultdict(float)
    wall: defaultdict[str, float] = defaultdict(float)
    stages: defaultdict[str, float] = defaultdict(float)
    _count_calls(calls, cpu, wall)
    _time_stages(stages)
    source = nvml_source.NvmlSource()
    host = source.hosts[0]
    for _ in range(3):
        source.read(host)
    began = time.process_time()
    time.sleep(IDLE_SECONDS)
    idle = (time.process_time() - began) / IDLE_SECONDS
    for counted in (calls, cpu, wall, stages):
        counted.clear()
    process, thread, clock = time.process_time(), time.thread_time(), time.perf_counter()
    for _ in range(args.reads):
        source.read(host)
    n = args.reads
    process = (time.process_time() - process) / n
    thread = (time.thread_time() - thread) / n
    clock = (time.perf_counter() - clock) / n
    source.close()
    print(f"idle: {idle * 1000:.3f} ms of CPU a second (the XID watcher waiting)")
    print(
        f"per reading ({n}): process CPU {process * 1000:.3f} ms, reading thread "
        f"{thread * 1000:.3f} ms, wall {clock * 1000:.1f} ms"
    )
    for stage, seconds in sorted(stages.items(), key=lambda item: -item[1]):
        print(f"  stage {stage:16s} {seconds / n * 1000:7.3f} ms")
    print("NVML function: calls, CPU ms, wall ms per reading")
    for name in sorted(calls, key=lambda name: -cpu[name]):
        print(
            f"  {name:46s} {calls[name] / n:5.1f} {cpu[name] / n * 1000:7.3f} "
            f"{wall[name] / n * 1000:7.3f}"
        )
    return 0


def _count_calls(calls: Counter[str], cpu: dict[str, float], wall: dict[str, float]) -> None:
    """Every NVML call the reader makes, counted and timed (`Nvml.call` is its one door)."""
    call = agent.Nvml.call

    def counted(self: agent.Nvml, name: str, *args: object) -> int:
        began, clock = time.thread_time(), time.perf_counter()
        try:
            return call(self, name, *args)
        finally:
            calls[name] += 1
            cpu[name] += time.thread_time() - began
            wall[name] += time.perf_counter() - clock

    agent.Nvml.call = counted  # type: ignore[method-assign]


def _time_stages(stages: dict[str, float]) -> None:
    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            began = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                stages[name] += time.thread_time() - began

        return run

    agent.Nvml.read = timed("NVML reader", agent.Nvml.read)  # type: ignore[method-assign]
    nvml_source.wire.decode_nvml = timed("decoding", nvml_source.wire.decode_nvml)
    nvml_source.vetted = timed("vetting", nvml_source.vetted)
    owners = nvml_source.LocalOwners
    owners.attach = timed("owners", owners.attach)  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.exit(main())
