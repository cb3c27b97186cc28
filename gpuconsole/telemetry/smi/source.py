"""`SmiSource`: the local host read through the nvidia-smi command, with a timeout on every
call, and what nvidia-smi's exit codes mean."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuconsole.core.clock import Clock, wall_clock
from gpuconsole.core.model import HostSnapshot, Topology
from gpuconsole.core.untrusted import vetted
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.jobs import LocalOwners
from gpuconsole.telemetry.smi.dump import parse_xml
from gpuconsole.telemetry.smi.topo import parse_topo_m
from gpuconsole.telemetry.smi.values import SmiParseError

# --- the source ----------------------------------------------------------------------------------

Runner = Callable[[Sequence[str], float], tuple[int, str, str]]
"""Runs a command within a timeout: (exit code, stdout, stderr), or raises
`subprocess.TimeoutExpired`, or `FileNotFoundError` when the program is missing."""

_REAP_WAIT_S = 1.0


def run_command(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    """Run ``argv``; past ``timeout`` kill it and raise `subprocess.TimeoutExpired`.

    Unlike `subprocess.run`, it does not wait without end for the killed child: an nvidia-smi
    blocked in the driver on a GPU that fell off the bus may not die until the driver lets go.
    """
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=_REAP_WAIT_S)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        raise
    return process.returncode, stdout, stderr


# nvidia-smi's exit codes (its man page, "RETURN VALUE"; shared/reference/gpu-facts.md).
EXIT_CODES = {
    2: "invalid argument",
    3: "operation not available on the GPU",
    4: "permission denied",
    6: "no such GPU or object found",
    8: "power cables not attached",
    9: "NVIDIA driver not loaded",
    10: "the kernel detected an interrupt issue with a GPU",
    12: "NVML library not found",
    13: "the NVML library lacks a function (version mismatch)",
    14: "InfoROM corrupted",
    15: "a GPU fell off the bus",
    255: "other error or internal driver error",
}


def exit_meaning(code: int) -> str:
    if code < 0:
        return f"killed by signal {-code}"
    if code in EXIT_CODES:
        return EXIT_CODES[code]
    return f"killed by signal {code - 128}" if 128 < code < 255 else "unknown exit code"


def _first_line(*texts: str) -> str:
    line = next((ln.strip() for text in texts for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= 160 else line[:157] + "..."


class SmiSource:
    """The local host read with ``nvidia-smi -q -x`` (and ``topo -m`` once, for the topology).

    Every call has a timeout: a GPU that fell off the bus makes nvidia-smi hang. ``runner``
    replaces the subprocess call (tests inject failures through it).
    """

    def __init__(
        self,
        host: str | None = None,
        timeout: float = 5.0,
        runner: Runner = run_command,
        clock: Clock = wall_clock,
    ) -> None:
        self._host = host or socket.gethostname()
        self._timeout = timeout
        self._runner = runner
        self._clock = clock
        self._topology: Topology | None = None
        self._topology_read = False
        self._owners = LocalOwners()

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self._host,)

    def read(self, host: str) -> HostSnapshot:
        if host != self._host:
            raise SourceError(f"{host}: nvidia-smi reads only this host ({self._host})")
        output = self._run("-q", "-x")
        try:
            snapshot = parse_xml(output, self._host, self._clock())
        except SmiParseError as error:
            raise SourceError(
                f"{self._host}: unreadable nvidia-smi -q -x output: {error}"
            ) from None
        return vetted(self._owners.attach(replace(snapshot, topology=self._read_topology())))

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        return []

    def _read_topology(self) -> Topology | None:
        """``topo -m`` once: the wiring does not change while the host runs. None if it fails."""
        if not self._topology_read:
            self._topology_read = True
            with contextlib.suppress(SourceError, SmiParseError):
                self._topology = parse_topo_m(self._run("topo", "-m"))
        return self._topology

    def _run(self, *args: str) -> str:
        command = " ".join(("nvidia-smi", *args))
        try:
            code, stdout, stderr = self._runner(("nvidia-smi", *args), self._timeout)
        except FileNotFoundError:
            raise SourceError(
                f"{self._host}: nvidia-smi not found (no NVIDIA driver utilities on PATH)"
            ) from None
        except subprocess.TimeoutExpired:
            raise SourceError(
                f"{self._host}: {command} gave no answer within {self._timeout:g} s "
                "(a GPU that fell off the bus hangs it: look for XID 79 in dmesg)"
            ) from None
        except OSError as error:
            raise SourceError(f"{self._host}: cannot run nvidia-smi ({error})") from None
        if code != 0:
            detail = _first_line(stderr, stdout)
            raise SourceError(
                f"{self._host}: {command} exited with {code} ({exit_meaning(code)})"
                + (f": {detail}" if detail else "")
            )
        return stdout
