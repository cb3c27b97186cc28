"""Signal a GPU process on the local host: TERM first, KILL if it will not go.

A pid can be reused between the reading and the keypress, so the process is identified by its
pid and its command line together: if the command no longer matches, nothing is sent.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import psutil

from gpuconsole import audit
from gpuconsole.model import GpuProcess


@dataclass(frozen=True, slots=True)
class SignalResult:
    sent: bool
    message: str


@runtime_checkable
class ProcessSignals(Protocol):
    """Who can signal the processes of which hosts: this machine its own, an agent its host's."""

    def can_signal(self, host: str) -> bool: ...

    def signal(self, host: str, process: GpuProcess, sig: signal.Signals) -> SignalResult: ...


class LocalSignals:
    """Signals for the hosts whose processes run on this machine."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self._hosts = frozenset(hosts)

    def can_signal(self, host: str) -> bool:
        return host in self._hosts

    def signal(self, host: str, process: GpuProcess, sig: signal.Signals) -> SignalResult:
        return signal_process(process, sig, host)


def describe(process: GpuProcess) -> str:
    """'pid 4242 (alice) on GPU 3 holding 12.0 GiB: python train.py'."""
    memory = (
        "N/A" if process.used_memory_mib is None else f"{process.used_memory_mib / 1024:.1f} GiB"
    )
    return (
        f"pid {process.pid} ({process.user or 'unknown user'}) on GPU {process.gpu} "
        f"holding {memory}: {process.command or 'unknown command'}"
    )


Sender = Callable[[GpuProcess, signal.Signals], SignalResult]


def signal_process(
    process: GpuProcess, sig: signal.Signals, host: str, send: Sender | None = None
) -> SignalResult:
    """Send ``sig`` to the process if it is still the one that was read; log what happened.

    ``send`` delivers it elsewhere (a remote host's agent); by default, to this machine.
    """
    result = (send or _send)(process, sig)
    audit.record(
        "signal-process",
        host=host,
        pid=process.pid,
        signal=sig.name,
        command=process.command,
        sent=result.sent,
        result=result.message,
    )
    return result


def _send(process: GpuProcess, sig: signal.Signals) -> SignalResult:
    try:
        current = psutil.Process(process.pid)
        command = " ".join(current.cmdline()) or current.name()
    except psutil.NoSuchProcess:
        return SignalResult(False, f"pid {process.pid} has already exited")
    except psutil.AccessDenied:
        command = None  # cannot read it, but the kernel will still judge the signal itself
    if command is not None and process.command and command != process.command:
        return SignalResult(
            False, f"pid {process.pid} is now {command!r}, not the GPU process: nothing sent"
        )
    try:
        os.kill(process.pid, sig)
    except ProcessLookupError:
        return SignalResult(False, f"pid {process.pid} has already exited")
    except PermissionError:
        owner = process.user or "another user"
        return SignalResult(
            False, f"not permitted to signal pid {process.pid}: it belongs to {owner}"
        )
    return SignalResult(True, f"sent {sig.name} to pid {process.pid}")
