"""Stop a GPU process (k TERM, K KILL on the host screen): who may, sending it, logging it.

Delivery is the hosts' (`gpuconsole.hosts.signals`: this machine, or a remote host's agent);
this module decides who can signal which host's processes and puts every attempt in the audit
log, sent or refused.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from gpuconsole.core import audit
from gpuconsole.core.model import GpuProcess
from gpuconsole.hosts.signals import SignalResult, send_here


@runtime_checkable
class ProcessSignals(Protocol):
    """Who can signal the processes of which hosts: this machine its own, an agent its host's."""

    def can_signal(self, host: str) -> bool: ...

    def send_signal(self, host: str, process: GpuProcess, sig: signal.Signals) -> SignalResult:
        """Deliver ``sig`` (not logged: `signal_process` logs it)."""
        ...


class LocalSignals:
    """Signals for the hosts whose processes run on this machine."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self._hosts = frozenset(hosts)

    def can_signal(self, host: str) -> bool:
        return host in self._hosts

    def send_signal(self, host: str, process: GpuProcess, sig: signal.Signals) -> SignalResult:
        return send_here(process, sig)


def describe(process: GpuProcess) -> str:
    """'pid 4242 (alice) on GPU 3 holding 12.0 GiB: python train.py'."""
    memory = (
        "N/A" if process.used_memory_mib is None else f"{process.used_memory_mib / 1024:.1f} GiB"
    )
    return (
        f"pid {process.pid} ({process.user or 'unknown user'}) on GPU {process.gpu} "
        f"holding {memory}: {process.command or 'unknown command'}"
    )


def signal_process(
    signals: ProcessSignals, host: str, process: GpuProcess, sig: signal.Signals
) -> SignalResult:
    """Send ``sig`` to the process on ``host`` if it is still the one that was read; log what
    happened."""
    result = signals.send_signal(host, process, sig)
    audit.record(
        "signal-process",
        host=host,
        pid=process.pid,
        signal=sig.name,
        command=process.command,
        started=process.started,
        sent=result.sent,
        result=result.message,
    )
    return result
