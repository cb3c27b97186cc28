"""What a process and everything it started cost, for the benchmarks that measure a program."""

from __future__ import annotations

import psutil


def tree_cpu_seconds(process: psutil.Process) -> float:
    """User and system CPU of the process and its descendants, including children they have
    already reaped (an agent's nvidia-smi calls end between two samples)."""
    total = 0.0
    for member in [process, *process.children(recursive=True)]:
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def tree_rss_mib(process: psutil.Process) -> float:
    """Resident memory of the process and its live descendants, MiB."""
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20
