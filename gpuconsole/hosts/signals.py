"""Delivering a signal to a GPU process: the transport half of stopping one (the action, which
asks and logs, is `gpuconsole.actions.processes`).

A pid can be reused between the reading and the keypress, by any command line, so the process
is identified by its pid and its start together (`reused_pid`, the agent's, which reads the start
as the reading did); a command line that no longer matches (the process ran another program)
sends nothing either. A remote host's agent applies the same guard on its side.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from gpuconsole.core.model import GpuProcess
from gpuconsole.telemetry.agent import reused_pid


@dataclass(frozen=True, slots=True)
class SignalResult:
    sent: bool
    message: str


def send_here(process: GpuProcess, sig: signal.Signals) -> SignalResult:
    """``sig`` to the process on this machine, if it is still the one that was read."""
    import psutil  # here, not at the console's start: only a signal sent needs it

    reused = reused_pid(process.pid, process.started)
    if reused is not None:
        return SignalResult(False, reused)
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
