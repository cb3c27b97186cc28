"""What the boundary for readings from outside (`gpuconsole.core.untrusted.vetted`) costs per GPU.

    python benchmarks/vetting_cost.py [--hosts 64] [--rounds 50]

Reads every host of a simulated rack of ``--hosts`` hosts once (H100 SXM, A100 PCIe and L40S
hosts with their processes and NVLink topology: the shape an agent's reading has), then times
``vetted`` over all of those readings, ``--rounds`` times, in one thread. The anchor, measured in
the same run, is the health rules' evaluation of the same readings (what each reading costs
next, in the console and the recorder alike). A clean reading is returned
as it is, so the figure is the cost of checking, not of copying; a reading with hostile text is
timed too.

Prints the figures and one JSON line with them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable

from gpuconsole.core.model import HostSnapshot
from gpuconsole.core.untrusted import vetted
from gpuconsole.rules.health import evaluate
from gpuconsole.telemetry.sim import SimSource, demo_rack

EPOCH = 1_767_225_600.0


def readings(hosts: int) -> list[HostSnapshot]:
    """One reading of each reachable host of the simulated rack."""
    source = SimSource(demo_rack(hosts=hosts), lambda: EPOCH + 900)
    taken = []
    for host in source.hosts:
        try:
            taken.append(source.read(host))
        except Exception:  # a simulated host that is down has no reading to check
            continue
    return taken


def per_gpu(
    work: Callable[[HostSnapshot], object], snapshots: list[HostSnapshot], rounds: int
) -> float:
    """CPU seconds per GPU of ``work`` over every reading, averaged over ``rounds``."""
    gpus = sum(len(s.gpus) for s in snapshots)
    start = time.process_time()
    for _ in range(rounds):
        for snapshot in snapshots:
            work(snapshot)
    return (time.process_time() - start) / rounds / gpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    snapshots = readings(args.hosts)
    gpus = sum(len(s.gpus) for s in snapshots)
    processes = sum(len(s.processes) for s in snapshots)
    clean = per_gpu(vetted, snapshots, args.rounds)
    anchor = per_gpu(evaluate, snapshots, args.rounds)
    hostile = [
        dataclasses.replace(
            s,
            processes=tuple(
                dataclasses.replace(p, command=f"{p.command}\x1b]52;c;SE9TVElMRQ==\x07")
                for p in s.processes
            ),
        )
        for s in snapshots
    ]
    dirty = per_gpu(vetted, hostile, args.rounds)
    figures = {
        "hosts": len(snapshots),
        "gpus": gpus,
        "processes": processes,
        "vetted_us_per_gpu": round(clean * 1e6, 2),
        "vetted_hostile_us_per_gpu": round(dirty * 1e6, 2),
        "anchor_health_evaluate_us_per_gpu": round(anchor * 1e6, 2),
        "share_of_a_core_128_hosts_8_gpus_1hz": round(clean * 128 * 8, 4),
    }
    print(
        f"{len(snapshots)} hosts, {gpus} GPUs, {processes} processes: vetted "
        f"{figures['vetted_us_per_gpu']} µs per GPU clean, {figures['vetted_hostile_us_per_gpu']} "
        f"µs with hostile command lines; anchor: the health rules "
        f"{figures['anchor_health_evaluate_us_per_gpu']} µs per GPU"
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
