"""The `Source` of this host's GPUs read through NVML."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import pynvml

from gpuconsole.clock import Clock, wall_clock
from gpuconsole.model import GpuProcess, GpuState, HostSnapshot, Topology, XidEvent
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.jobs import LocalOwners
from gpuconsole.telemetry.kernel_log import read_kernel_xids
from gpuconsole.telemetry.nvml.device import (
    _Calls,
    _gpu_state,
    _GpuLost,
    _Identity,
    _Memo,
    _mig_devices,
    _modes,
    _processes,
    _static,
    ask_pcie_traffic,
)
from gpuconsole.telemetry.nvml.mapping import (
    _REFUSED,
    Handle,
    _nvml,
    cuda_version_text,
    init_failure_reason,
)
from gpuconsole.telemetry.nvml.topology import read_topology
from gpuconsole.telemetry.nvml.xids import XidWatcher, merge_xids
from gpuconsole.untrusted import vetted

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

    NVML is initialised on the first `read` (a failure raises `SourceError` with the reason) and
    shut down by `close`. The topology is read once, when every GPU has a handle. The XID
    watcher starts on the first read, so the kernel log's XIDs appear from a later reading on.
    The GPUs' PCIe throughput is asked for on a pool of two threads per GPU, all at once
    (`ask_pcie_traffic` says why): a reading takes about 21 ms longer.
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
        self._initialised = False
        self._count = 0
        self._driver_version: str | None = None
        self._cuda_version: str | None = None
        self._handles: dict[int, Handle] = {}
        self._memos: dict[int, _Memo] = {}
        self._topology: Topology | None = None
        self._topology_read = False
        self._watcher: XidWatcher | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self._host,)

    def read(self, host: str) -> HostSnapshot:
        if host != self._host:
            raise SourceError(f"{host}: NVML reads only this host ({self._host})")
        with self._lock:
            self._initialise()
            now = self._clock()
            traffic = [self._ask_traffic(index) for index in range(self._count)]
            gpus, processes = [], []
            for index in range(self._count):
                state, on_gpu = self._read_gpu(index, traffic[index])
                gpus.append(state)
                processes.extend(on_gpu)
            self._start_watcher()
            snapshot = HostSnapshot(
                host=self._host,
                time=now,
                gpus=tuple(gpus),
                processes=tuple(processes),
                topology=self._read_topology(),
                driver_version=self._driver_version,
                cuda_version=self._cuda_version,
                xid_events=self._xid_events(),
                source="nvml",
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
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            if self._initialised:
                self._initialised = False
                self._handles.clear()
                self._memos.clear()
                with contextlib.suppress(*_REFUSED):
                    pynvml.nvmlShutdown()

    def _initialise(self) -> None:
        if self._initialised:
            return
        try:
            pynvml.nvmlInit()
        except _REFUSED as error:
            raise SourceError(f"{self._host}: {init_failure_reason(error)}") from None
        count = _nvml(pynvml.nvmlDeviceGetCount)
        if not count:
            with contextlib.suppress(*_REFUSED):
                pynvml.nvmlShutdown()
            raise SourceError(f"{self._host}: no NVIDIA GPU found")
        self._initialised = True
        self._count = count
        self._pool = ThreadPoolExecutor(2 * count, thread_name_prefix="nvml-pcie")
        self._driver_version = _nvml(pynvml.nvmlSystemGetDriverVersion)
        cuda = _nvml(pynvml.nvmlSystemGetCudaDriverVersion)
        self._cuda_version = None if cuda is None else cuda_version_text(cuda)

    def _handle(self, index: int) -> tuple[Handle | None, bool]:
        """The GPU's handle (kept once got), and whether it is lost when there is none."""
        if index not in self._handles:
            try:
                self._handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
            except (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_Unknown):
                return None, True
            except _REFUSED:
                return None, False
        return self._handles[index], False

    def _ask_traffic(self, index: int) -> list[Future[int | None]]:
        """The GPU's PCIe throughput, asked for on the pool; nothing for a GPU without a handle."""
        handle, _ = self._handle(index)
        if handle is None:
            return []
        assert self._pool is not None, "made by _initialise"
        memo = self._memos.setdefault(index, _Memo())
        return ask_pcie_traffic(self._pool, handle, memo.refused)

    def _read_gpu(
        self, index: int, traffic: list[Future[int | None]]
    ) -> tuple[GpuState, list[GpuProcess]]:
        handle, lost = self._handle(index)
        if handle is None:
            return self._unreadable(index, lost), []
        memo = self._memos.setdefault(index, _Memo())
        calls = _Calls(handle, memo.refused)
        try:
            static = memo.static or _static(calls, handle)
            if not calls.unknown:
                memo.static = static
            modes = _modes(calls, handle, memo)
            migs = _mig_devices(calls, handle) if modes.mig else []
            state = _gpu_state(index, handle, static, modes, migs, calls, traffic)
            if migs:
                found = [_processes(calls, index, m.handle, m.gpu_instance_id) for m in migs]
                processes = [process for listing in found for process in listing]
            else:
                processes = _processes(calls, index, handle)
        except _GpuLost:
            return self._unreadable(index, lost=True), []
        if calls.all_unknown:
            return self._unreadable(index, lost=True), []
        return state, processes

    def _unreadable(self, index: int, lost: bool) -> GpuState:
        """What is known of a GPU that gives no reading: its identity, if it was ever read."""
        known = self._identity_of(index)
        return GpuState(
            index=index,
            name=known.name,
            uuid=known.uuid,
            pci_bus_id=known.pci_bus_id,
            serial=known.serial,
            vbios_version=known.vbios_version,
            lost=lost,
        )

    def _read_topology(self) -> Topology | None:
        if not self._topology_read and len(self._handles) == self._count:
            self._topology_read = True
            handles = [self._handles[i] for i in range(self._count)]
            bus_ids = [self._identity_of(i).pci_bus_id for i in range(self._count)]
            self._topology = read_topology(handles, bus_ids)
        return self._topology

    def _identity_of(self, index: int) -> _Identity:
        memo = self._memos.get(index)
        if memo is None or memo.static is None:
            return _Identity(None, None, None, None, None)
        return memo.static.identity

    def _bus_to_gpu(self) -> dict[str, int]:
        buses = {index: self._identity_of(index).pci_bus_id for index in range(self._count)}
        return {bus: index for index, bus in buses.items() if bus}

    def _start_watcher(self) -> None:
        if self._watcher is None:
            bus_to_gpu = self._bus_to_gpu()
            self._watcher = XidWatcher(self._handles, lambda: self._kernel_log(bus_to_gpu))
            self._watcher.start()

    def _xid_events(self) -> tuple[XidEvent, ...]:
        if self._watcher is None:
            return ()
        return merge_xids(self._watcher.kernel_events(), self._watcher.events())
