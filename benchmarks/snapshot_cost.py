"""What one reading of this host's GPUs costs, by four ways of reading them, measured in one run.

    python benchmarks/snapshot_cost.py [--reads N]

On a GPU host it measures, each as the mean over N timed rounds after a warm-up:

- ``NvmlSource.read()``: every field of every GPU, processes, topology (cached) and XIDs;
- the 9 raw NVML calls a minimal dashboard makes per GPU (utilization, memory, temperature,
  power, power limit, SM clock, memory clock, pstate, clock-event reasons);
- one ``nvidia-smi --query-gpu=<those fields> --format=csv`` process (at most 20 spawns);
- nvitop's ``Device.as_snapshot()`` per GPU, when nvitop is importable.

It prints a table (milliseconds, per GPU and per round for all GPUs) and then one JSON line with
the same figures. It exits with a message when NVML cannot be used here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WARM_UP = 3
MAX_SPAWNS = 20
SMI_FIELDS = (
    "utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,power.limit,"
    "clocks.sm,clocks.mem,pstate,clocks_event_reasons.active"
)


def mean_ms(work: Callable[[], object], rounds: int, warm_up: int = WARM_UP) -> float:
    """Mean wall time of one call of ``work``, in milliseconds, after ``warm_up`` calls."""
    for _ in range(warm_up):
        work()
    start = time.perf_counter()
    for _ in range(rounds):
        work()
    return (time.perf_counter() - start) / rounds * 1000


def raw_nvml_round(pynvml: Any, handles: list[Any]) -> None:
    """The 9 calls per GPU that a minimal dashboard makes."""
    for handle in handles:
        pynvml.nvmlDeviceGetUtilizationRates(handle)
        pynvml.nvmlDeviceGetMemoryInfo(handle)
        pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        pynvml.nvmlDeviceGetPowerUsage(handle)
        pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)
        pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        pynvml.nvmlDeviceGetPerformanceState(handle)
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)


def smi_spawn() -> None:
    subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv"],
        capture_output=True,
        check=True,
        timeout=30,
    )


def nvitop_round() -> Callable[[], object] | str:
    """One round of nvitop snapshots of every GPU, or why there is none."""
    try:
        from nvitop import Device
    except ImportError:
        return "nvitop not installed"
    devices = Device.all()
    return lambda: [device.as_snapshot() for device in devices]


def measure(reads: int) -> dict[str, Any]:
    import pynvml

    from gpuconsole.telemetry.nvml import NvmlSource

    source = NvmlSource()
    host = source.hosts[0]
    start = time.perf_counter()
    first = source.read(host)
    first_ms = (time.perf_counter() - start) * 1000
    gpus = len(first.gpus)
    rounds: dict[str, float | str] = {"nvml-source": mean_ms(lambda: source.read(host), reads)}
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
    rounds["nvml-raw-9"] = mean_ms(lambda: raw_nvml_round(pynvml, handles), reads)
    if shutil.which("nvidia-smi"):
        rounds["nvidia-smi"] = mean_ms(smi_spawn, min(reads, MAX_SPAWNS), warm_up=1)
    else:
        rounds["nvidia-smi"] = "nvidia-smi not found"
    nvitop = nvitop_round()
    rounds["nvitop"] = nvitop if isinstance(nvitop, str) else mean_ms(nvitop, reads)
    source.close()
    return {
        "gpus": gpus,
        "gpu": first.gpus[0].name,
        "driver": first.driver_version,
        "processes": len(first.processes),
        "reads": reads,
        "first_read_ms": round(first_ms, 3),
        "ms_per_round": {k: v if isinstance(v, str) else round(v, 4) for k, v in rounds.items()},
        "ms_per_gpu": {
            k: v if isinstance(v, str) else round(v / gpus, 4) for k, v in rounds.items()
        },
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{result['gpus']} x {result['gpu']}, driver {result['driver']}, "
        f"{result['processes']} GPU processes, {result['reads']} reads"
    )
    print(
        f"first NvmlSource.read() (NVML init, topology, XID watcher): {result['first_read_ms']} ms"
    )
    print(f"{'way':<14}{'ms / GPU':>12}{'ms / round':>14}")
    for way, per_round in result["ms_per_round"].items():
        if isinstance(per_round, str):
            print(f"{way:<14}{per_round:>26}")
        else:
            print(f"{way:<14}{result['ms_per_gpu'][way]:>12.3f}{per_round:>14.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=200, help="timed rounds per way (default 200)")
    args = parser.parse_args(argv)
    if args.reads < 1:
        parser.error("--reads must be at least 1")
    sys.path.insert(0, str(REPO))
    from gpuconsole.telemetry.nvml import nvml_unavailable_reason

    reason = nvml_unavailable_reason()
    if reason is not None:
        print(f"snapshot_cost: cannot measure, NVML is unavailable here: {reason}", file=sys.stderr)
        return 2
    result = measure(args.reads)
    print_table(result)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
