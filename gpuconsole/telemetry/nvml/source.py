"""The `Source` of this host's GPUs read through NVML."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Mapping, Sequence

import pynvml

from gpuconsole.core.clock import Clock, wall_clock
from gpuconsole.core.model import HostSnapshot, Topology, XidEvent
from gpuconsole.core.untrusted import MAX_NOTES, vetted
from gpuconsole.telemetry import SourceError, wire
from gpuconsole.telemetry.agent import Nvml, Unavailable
from gpuconsole.telemetry.jobs import LocalOwners
from gpuconsole.telemetry.kernel_log import read_kernel_xids
from gpuconsole.telemetry.nvml.mapping import _REFUSED, Handle, _nvml, init_failure_reason
from gpuconsole.telemetry.nvml.topology import read_topology
from gpuconsole.telemetry.nvml.xids import XidWatcher, merge_xids

# `wire` is imported whole: it imports `nvml.mapping`, and so this package, as it loads.

# --- the source ----------------------------------------------------------------------------------


def nvml_unavailable_reason() -> str | None:
    """None when NVML initialises and sees at least one GPU, else one line that says why not."""
    try:
        pynvml.nvmlInit()
    except _REFUSED as error:
        return init_failure_reason(error)
    try:
        count = pynvml.nvmlDeviceGetCount()
    except _REFUSED as error:
        return f"NVML: cannot count GPUs ({error})"
    finally:
        with contextlib.suppress(*_REFUSED):
            pynvml.nvmlShutdown()
    return None if count else "no NVIDIA GPU found"


class NvmlSource:
    """This host's GPUs read through NVML: the `Source` for ``localhost`` where NVML loads.

    The GPUs are read by the agent's NVML reader (`gpuconsole.telemetry.agent.Nvml`), here in
    the console's process, and decoded as an SSH host's agent readings are
    (`gpuconsole.telemetry.wire.decode_nvml`), so this host and an SSH host read the same fields
    the same way. The reader keeps what each GPU's readings carry from one to the next (what
    cannot change, the calls the GPU does not support, its modes for 10 s) and asks every GPU's
    PCIe throughput at once on threads of its own, once every 5 s: such a reading takes about
    21 ms longer.

    NVML is initialised on the first `read` (a failure raises `SourceError` with the reason) and
    shut down by `close`. pynvml shares the library with the reader (NVML counts its
    initialisations) for the topology, read once every GPU has a pynvml handle, and the XID
    watcher, which starts on the first read, so the kernel log's XIDs appear from a later
    reading on.
    """

    def __init__(
        self,
        host: str | None = None,
        clock: Clock = wall_clock,
        kernel_log: Callable[[Mapping[str, int]], Sequence[XidEvent]] = read_kernel_xids,
    ) -> None:
        self._host = host or socket.gethostname()
        self._clock = clock
        self._kernel_log = kernel_log
        self._owners = LocalOwners()
        self._lock = threading.Lock()
        self._nvml: Nvml | None = None
        self._driver_version: str | None = None
        self._cuda_version: str | None = None
        self._handles: dict[int, Handle] = {}
        """pynvml's handles of the GPUs, for the topology and the XID watcher."""
        self._topology: Topology | None = None
        self._topology_read = False
        self._watcher: XidWatcher | None = None

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self._host,)

    def read(self, host: str) -> HostSnapshot:
        if host != self._host:
            raise SourceError(f"{host}: NVML reads only this host ({self._host})")
        with self._lock:
            nvml = self._initialise()
            now = self._clock()
            try:
                entries, listed = nvml.read()
            except Unavailable as error:
                raise SourceError(f"{self._host}: NVML: {error}") from None
            gpus, processes, notes = wire.decode_nvml(entries, listed)
            bus_ids = [gpu.pci_bus_id for gpu in gpus]
            self._take_handles(len(gpus))
            self._start_watcher(bus_ids)
            snapshot = HostSnapshot(
                host=self._host,
                time=now,
                gpus=tuple(gpus),
                processes=tuple(processes),
                topology=self._read_topology(bus_ids),
                driver_version=self._driver_version,
                cuda_version=self._cuda_version,
                xid_events=self._xid_events(),
                source="nvml",
                bad_values=len(notes),
                bad_value_notes=tuple(notes[:MAX_NOTES]),
            )
            return vetted(self._owners.attach(snapshot))

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        return []

    def close(self) -> None:
        """Stop the XID watcher and shut NVML down; a later `read` starts again."""
        with self._lock:
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None
            if self._nvml is not None:
                self._nvml.shutdown()
                self._nvml = None
                self._handles.clear()
                with contextlib.suppress(*_REFUSED):
                    pynvml.nvmlShutdown()

    def _initialise(self) -> Nvml:
        """The reader, made on the first read after pynvml, in the library pynvml loaded."""
        if self._nvml is not None:
            return self._nvml
        try:
            pynvml.nvmlInit()
        except _REFUSED as error:
            raise SourceError(f"{self._host}: {init_failure_reason(error)}") from None
        try:
            nvml = Nvml(pynvml.nvmlLib)
        except Unavailable as error:
            with contextlib.suppress(*_REFUSED):
                pynvml.nvmlShutdown()
            raise SourceError(f"{self._host}: NVML: {error}") from None
        if not nvml.gpu_count():
            nvml.shutdown()
            with contextlib.suppress(*_REFUSED):
                pynvml.nvmlShutdown()
            raise SourceError(f"{self._host}: no NVIDIA GPU found")
        self._nvml = nvml
        self._driver_version = nvml.driver_version()
        self._cuda_version = nvml.cuda_version()
        return nvml

    def _take_handles(self, count: int) -> None:
        """pynvml's handle of each GPU that has none yet (kept once got)."""
        for index in range(count):
            if index not in self._handles:
                handle = _nvml(pynvml.nvmlDeviceGetHandleByIndex, index)
                if handle is not None:
                    self._handles[index] = handle

    def _read_topology(self, bus_ids: Sequence[str | None]) -> Topology | None:
        if not self._topology_read and len(self._handles) == len(bus_ids):
            self._topology_read = True
            handles = [self._handles[index] for index in range(len(bus_ids))]
            self._topology = read_topology(handles, bus_ids)
        return self._topology

    def _start_watcher(self, bus_ids: Sequence[str | None]) -> None:
        if self._watcher is None:
            bus_to_gpu = {bus: index for index, bus in enumerate(bus_ids) if bus}
            self._watcher = XidWatcher(self._handles, lambda: self._kernel_log(bus_to_gpu))
            self._watcher.start()

    def _xid_events(self) -> tuple[XidEvent, ...]:
        if self._watcher is None:
            return ()
        return merge_xids(self._watcher.kernel_events(), self._watcher.events())
