"""One GPU read through NVML: its state, its MIG devices and the processes on it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

import psutil
import pynvml

from gpuconsole.model import (
    EccCounts,
    GpuProcess,
    GpuState,
    MigInstance,
    PcieLink,
    ProcessLoad,
    RowRemap,
)
from gpuconsole.telemetry.agent import load_of, load_window_start, newest_loads
from gpuconsole.telemetry.containers import container_of_pid
from gpuconsole.telemetry.nvml.mapping import (
    _REFUSED,
    Handle,
    T,
    _text,
    compute_mode_name,
    field_number,
    mig_profile,
    pstate_name,
    recovery_action_name,
    throttle_codes,
)

# --- calls ---------------------------------------------------------------------------------------


def _mib(size: int | None) -> float | None:
    return None if size is None else size / 2**20


def _number(value: float | None) -> float | None:
    return None if value is None else float(value)


class _GpuLost(Exception):
    """The GPU under a reading answered "GPU is lost"."""


class _Calls:
    """The NVML calls of one GPU's reading. A refused call gives None; a lost GPU raises
    `_GpuLost`; "unknown error" is counted, since a GPU that gives nothing else is gone too.

    A call on the GPU's own handle that NVML answers "not supported" is put in ``refused`` and
    not made again: such an answer can cost 0.2 ms (fan speed on an H200).
    """

    def __init__(self, handle: Handle, refused: set[tuple[Any, ...]]) -> None:
        self._handle = handle
        self._refused = refused
        self.made = 0
        self.unknown = 0

    def __call__(self, function: Callable[..., T], *args: Any) -> T | None:
        key = self._key(function, args)
        if key in self._refused:
            return None
        self.made += 1
        try:
            return function(*args)
        except pynvml.NVMLError_GpuIsLost:
            raise _GpuLost from None
        except pynvml.NVMLError_NotSupported:
            if key is not None:
                self._refused.add(key)
            return None
        except pynvml.NVMLError_Unknown:
            self.unknown += 1
            return None
        except _REFUSED:
            return None

    def _key(self, function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if not args or args[0] is not self._handle:
            return None
        return (function, *(tuple(a) if isinstance(a, list) else a for a in args[1:]))

    def first(self, *attempts: tuple[str, tuple[Any, ...]]) -> Any | None:
        """The first answer among pynvml functions named newest first (older bindings lack
        some of them)."""
        for name, args in attempts:
            function = getattr(pynvml, name, None)
            if function is not None and (value := self(function, *args)) is not None:
                return value
        return None

    @property
    def all_unknown(self) -> bool:
        return self.made > 0 and self.unknown == self.made


# --- one GPU -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Identity:
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    serial: str | None
    vbios_version: str | None


@dataclass(frozen=True, slots=True)
class _Static:
    """What does not change while the driver runs, read once per GPU (the maximum clocks alone
    cost 1.8 ms each on an H200)."""

    identity: _Identity
    sm_clock_max_mhz: float | None
    memory_clock_max_mhz: float | None
    slowdown_temperature_c: float | None
    shutdown_temperature_c: float | None
    power_limit_min_w: float | None
    power_limit_max_w: float | None
    power_limit_default_w: float | None
    pcie_max_gen: int | None
    pcie_max_width: int | None


@dataclass(slots=True)
class _Modes:
    """Settings an admin may change while the driver runs, re-read every `MODE_REFRESH_S`."""

    ecc: bool | None
    mig: bool | None
    sm_clock_application_mhz: float | None
    """``nvidia-smi -ac`` sets the application clocks; a read costs 1.3 ms on an H200."""
    memory_clock_application_mhz: float | None
    read_at: float


@dataclass(slots=True)
class _Memo:
    """What one GPU's readings carry from one to the next: its static values, the calls it does
    not support, and its ECC and MIG modes (0.17 ms each on an H200) and application clocks,
    re-read every `MODE_REFRESH_S`. A change of MIG mode forgets the unsupported calls:
    utilization, for one, is not supported in MIG mode only."""

    static: _Static | None = None
    refused: set[tuple[Any, ...]] = field(default_factory=set)
    modes: _Modes | None = None


MODE_REFRESH_S = 10.0


@dataclass(frozen=True, slots=True)
class _MigDevice:
    gpu_instance_id: int
    compute_instance_id: int | None
    handle: Handle


def _identity(calls: _Calls, handle: Handle) -> _Identity:
    pci = calls(pynvml.nvmlDeviceGetPciInfo, handle)
    return _Identity(
        name=calls(pynvml.nvmlDeviceGetName, handle),
        uuid=calls(pynvml.nvmlDeviceGetUUID, handle),
        pci_bus_id=None if pci is None else _text(pci.busId),
        serial=calls(pynvml.nvmlDeviceGetSerial, handle),
        vbios_version=calls(pynvml.nvmlDeviceGetVbiosVersion, handle),
    )


def _static(calls: _Calls, handle: Handle) -> _Static:
    sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM

    def threshold(kind: int) -> float | None:
        return _number(calls(pynvml.nvmlDeviceGetTemperatureThreshold, handle, kind))

    constraints = calls(pynvml.nvmlDeviceGetPowerManagementLimitConstraints, handle)
    low, high = (None, None) if constraints is None else constraints
    return _Static(
        identity=_identity(calls, handle),
        sm_clock_max_mhz=_number(calls(pynvml.nvmlDeviceGetMaxClockInfo, handle, sm)),
        memory_clock_max_mhz=_number(calls(pynvml.nvmlDeviceGetMaxClockInfo, handle, mem)),
        slowdown_temperature_c=threshold(pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        shutdown_temperature_c=threshold(pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        power_limit_min_w=_watts(low),
        power_limit_max_w=_watts(high),
        power_limit_default_w=_watts(
            calls(pynvml.nvmlDeviceGetPowerManagementDefaultLimit, handle)
        ),
        pcie_max_gen=calls(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        pcie_max_width=calls(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
    )


def _modes(calls: _Calls, handle: Handle, memo: _Memo) -> _Modes:
    """The GPU's ECC and MIG modes, read again once they are `MODE_REFRESH_S` old."""
    now = time.monotonic()
    if memo.modes is not None and now - memo.modes.read_at < MODE_REFRESH_S:
        return memo.modes
    ecc = calls(pynvml.nvmlDeviceGetEccMode, handle)
    mig = calls(pynvml.nvmlDeviceGetMigMode, handle)
    sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    modes = _Modes(
        ecc=None if ecc is None else ecc[0] == pynvml.NVML_FEATURE_ENABLED,
        mig=None if mig is None else mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE,
        sm_clock_application_mhz=_number(calls(pynvml.nvmlDeviceGetApplicationsClock, handle, sm)),
        memory_clock_application_mhz=_number(
            calls(pynvml.nvmlDeviceGetApplicationsClock, handle, mem)
        ),
        read_at=now,
    )
    if memo.modes is not None and memo.modes.mig != modes.mig:
        memo.refused.clear()
    memo.modes = modes
    return modes


def _memory(calls: _Calls, handle: Handle) -> tuple[float | None, float | None]:
    """(used, total) MiB; version 2 leaves out what the driver reserves, as nvidia-smi does."""
    info = None
    if hasattr(pynvml, "nvmlMemory_v2"):
        info = calls(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
    if info is None:
        info = calls(pynvml.nvmlDeviceGetMemoryInfo, handle)
    return (None, None) if info is None else (_mib(info.used), _mib(info.total))


def _temperature(calls: _Calls, handle: Handle) -> int | None:
    sensor = pynvml.NVML_TEMPERATURE_GPU
    return calls.first(
        ("nvmlDeviceGetTemperatureV", (handle, sensor)),
        ("nvmlDeviceGetTemperature", (handle, sensor)),
    )


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def _throttle(calls: _Calls, handle: Handle) -> tuple[str, ...] | None:
    mask = calls.first(
        ("nvmlDeviceGetCurrentClocksEventReasons", (handle,)),
        ("nvmlDeviceGetCurrentClocksThrottleReasons", (handle,)),
    )
    return None if mask is None else throttle_codes(mask)


def _ecc(calls: _Calls, handle: Handle, enabled: bool | None) -> EccCounts | None:
    if not enabled:
        return None

    def total(error_type: int, counter: int) -> int | None:
        return calls(pynvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter)

    corrected, uncorrected = (
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    )
    return EccCounts(
        volatile_corrected=total(corrected, pynvml.NVML_VOLATILE_ECC),
        volatile_uncorrected=total(uncorrected, pynvml.NVML_VOLATILE_ECC),
        aggregate_corrected=total(corrected, pynvml.NVML_AGGREGATE_ECC),
        aggregate_uncorrected=total(uncorrected, pynvml.NVML_AGGREGATE_ECC),
    )


def _remap(calls: _Calls, handle: Handle) -> RowRemap | None:
    rows = calls(pynvml.nvmlDeviceGetRemappedRows, handle)
    if rows is None:
        return None
    correctable, uncorrectable, pending, failure = rows
    return RowRemap(correctable, uncorrectable, bool(pending), bool(failure))


def _recovery_action(calls: _Calls, handle: Handle) -> str | None:
    field_id = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field_id is None:
        return None
    values = calls(pynvml.nvmlDeviceGetFieldValues, handle, [field_id])
    number = None if values is None else field_number(values[0])
    return recovery_action_name(None if number is None else int(number))


def _pcie(calls: _Calls, handle: Handle, static: _Static) -> PcieLink | None:
    link = PcieLink(
        gen=calls(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        width=calls(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        max_gen=static.pcie_max_gen,
        max_width=static.pcie_max_width,
    )
    return None if link == PcieLink(None, None, None, None) else link


PCIE_DIRECTIONS = (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES)
"""What the GPU sends, then what it receives, as `ask_pcie_traffic` asks for them."""


def ask_pcie_traffic(
    pool: Executor, handle: Handle, refused: set[tuple[Any, ...]]
) -> list[Future[int | None]]:
    """The GPU's PCIe throughput, TX then RX, asked for on ``pool``'s threads.

    NVML samples each direction for 20 ms and returns only then: 21 ms a call on an H200, 42 ms a
    GPU read in turn. Calls on separate threads overlap (8 at once took 23 ms there), so the
    source asks for every GPU's two before it reads the GPUs, and a reading takes about 21 ms
    longer whatever the number of GPUs. NVML's byte counters (``NVML_FI_DEV_PCIE_COUNT_TX_BYTES``
    and ``_RX_BYTES``) cost no wait, but on the H200 they went backwards between two reads 1 s
    apart while the GPU copied 55 GB/s: they wrap too often to give a rate between readings.

    Each call has its own `_Calls`, sharing the GPU's ``refused`` calls (a set is safe to add to
    from threads): the reading's own `_Calls` counts on one thread.
    """
    return [
        pool.submit(_Calls(handle, refused), pynvml.nvmlDeviceGetPcieThroughput, handle, direction)
        for direction in PCIE_DIRECTIONS
    ]


def _pcie_traffic(asked: Sequence[Future[int | None]]) -> tuple[float | None, float | None]:
    """(TX, RX) KiB/s as `ask_pcie_traffic` asked; `_GpuLost` when the GPU answered so. None
    where nothing was asked: the GPU had no handle yet when its reading began."""
    if not asked:
        return None, None
    tx, rx = (_number(answer.result()) for answer in asked)
    return tx, rx


def _enabled(value: int | None) -> bool | None:
    return None if value is None else value == pynvml.NVML_FEATURE_ENABLED


def _mig_devices(calls: _Calls, handle: Handle) -> list[_MigDevice]:
    """The GPU's MIG devices: one per compute instance, each named by its GPU instance."""
    devices = []
    for slot in range(calls(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = calls(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        gpu_instance = None if mig is None else calls(pynvml.nvmlDeviceGetGpuInstanceId, mig)
        if gpu_instance is not None:
            compute_instance = calls(pynvml.nvmlDeviceGetComputeInstanceId, mig)
            devices.append(_MigDevice(gpu_instance, compute_instance, mig))
    return devices


def _mig_instance(calls: _Calls, device: _MigDevice) -> MigInstance:
    memory = calls(pynvml.nvmlDeviceGetMemoryInfo, device.handle)
    return MigInstance(
        gpu_instance_id=device.gpu_instance_id,
        compute_instance_id=device.compute_instance_id,
        profile=mig_profile(calls(pynvml.nvmlDeviceGetName, device.handle)),
        memory_total_mib=None if memory is None else _mib(memory.total),
        memory_used_mib=None if memory is None else _mib(memory.used),
        uuid=calls(pynvml.nvmlDeviceGetUUID, device.handle),
    )


def _gpu_state(
    index: int,
    handle: Handle,
    static: _Static,
    modes: _Modes,
    migs: Sequence[_MigDevice],
    calls: _Calls,
    traffic: Sequence[Future[int | None]],
) -> GpuState:
    """The GPU's reading; ``traffic`` is its PCIe throughput as `ask_pcie_traffic` asked."""
    util = calls(pynvml.nvmlDeviceGetUtilizationRates, handle)
    used, total = _memory(calls, handle)
    sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    identity = static.identity
    tx, rx = _pcie_traffic(traffic)
    return GpuState(
        index=index,
        name=identity.name,
        uuid=identity.uuid,
        pci_bus_id=identity.pci_bus_id,
        serial=identity.serial,
        vbios_version=identity.vbios_version,
        utilization_pct=None if util is None else float(util.gpu),
        memory_utilization_pct=None if util is None else float(util.memory),
        memory_used_mib=used,
        memory_total_mib=total,
        temperature_c=_number(_temperature(calls, handle)),
        slowdown_temperature_c=static.slowdown_temperature_c,
        shutdown_temperature_c=static.shutdown_temperature_c,
        power_w=_watts(calls(pynvml.nvmlDeviceGetPowerUsage, handle)),
        power_limit_w=_watts(calls(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
        power_limit_min_w=static.power_limit_min_w,
        power_limit_max_w=static.power_limit_max_w,
        power_limit_default_w=static.power_limit_default_w,
        sm_clock_mhz=_number(calls(pynvml.nvmlDeviceGetClockInfo, handle, sm)),
        sm_clock_max_mhz=static.sm_clock_max_mhz,
        sm_clock_application_mhz=modes.sm_clock_application_mhz,
        memory_clock_mhz=_number(calls(pynvml.nvmlDeviceGetClockInfo, handle, mem)),
        memory_clock_max_mhz=static.memory_clock_max_mhz,
        memory_clock_application_mhz=modes.memory_clock_application_mhz,
        pstate=pstate_name(calls(pynvml.nvmlDeviceGetPerformanceState, handle)),
        fan_pct=_number(calls(pynvml.nvmlDeviceGetFanSpeed, handle)),
        throttle_reasons=_throttle(calls, handle),
        ecc=_ecc(calls, handle, modes.ecc),
        remap=_remap(calls, handle),
        recovery_action=_recovery_action(calls, handle),
        pcie=_pcie(calls, handle, static),
        pcie_tx_kib_s=tx,
        pcie_rx_kib_s=rx,
        persistence_mode=_enabled(calls(pynvml.nvmlDeviceGetPersistenceMode, handle)),
        compute_mode=compute_mode_name(calls(pynvml.nvmlDeviceGetComputeMode, handle)),
        mig_mode=modes.mig,
        mig_instances=tuple(_mig_instance(calls, device) for device in migs),
    )


def merge_running(
    compute: Iterable[Any], graphics: Iterable[Any]
) -> list[tuple[int, int | None, str]]:
    """NVML's compute and graphics process lists as (pid, used bytes, kind), one per process.

    A process in both lists is "compute+graphics" (nvidia-smi's C+G) with the larger of its
    two memory figures; a figure NVML cannot give is None.
    """
    found: dict[int, tuple[int | None, list[str]]] = {}
    for kind, listing in (("compute", compute), ("graphics", graphics)):
        for process in listing:
            used, kinds = found.get(process.pid, (None, []))
            figures = [f for f in (used, process.usedGpuMemory) if f is not None]
            kinds = kinds if kind in kinds else [*kinds, kind]
            found[process.pid] = (max(figures) if figures else None, kinds)
    return [(pid, used, "+".join(kinds)) for pid, (used, kinds) in found.items()]


def _ask_psutil(question: Callable[[], T]) -> T | None:
    try:
        return question()
    except psutil.Error:
        return None


def _user_and_command(pid: int) -> tuple[str | None, str | None]:
    """Who runs the process and its command line; None for what has vanished or is hidden."""
    try:
        process = psutil.Process(pid)
    except psutil.Error:
        return None, None
    with process.oneshot():
        cmdline = _ask_psutil(process.cmdline)
        command = " ".join(cmdline) if cmdline else _ask_psutil(process.name)
        return _ask_psutil(process.username), command


def _load_samples(handle: Handle) -> list[Any]:
    """The GPU's process utilization samples of the agent's load window (`newest_loads` reads
    them); none where no process used the GPU in it. One function, whatever the time, so that
    `_Calls` remembers a GPU that does not sample processes."""
    try:
        return pynvml.nvmlDeviceGetProcessUtilization(handle, load_window_start(time.time()))
    except pynvml.NVMLError_NotFound:
        return []


def _loads(calls: _Calls, handle: Handle) -> dict[int, dict[str, float]] | None:
    samples = calls(_load_samples, handle)
    return None if samples is None else newest_loads(samples)


def _processes(
    calls: _Calls, gpu: int, handle: Handle, mig_instance: int | None = None
) -> list[GpuProcess]:
    running = merge_running(
        calls(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or (),
        calls(pynvml.nvmlDeviceGetGraphicsRunningProcesses, handle) or (),
    )
    loads = _loads(calls, handle) if running else None
    processes = []
    for pid, used, kind in running:
        user, command = _user_and_command(pid)
        load = load_of(pid, loads)
        processes.append(
            GpuProcess(
                pid=pid,
                gpu=gpu,
                used_memory_mib=_mib(used),
                user=user,
                command=command,
                kind=kind,
                container=container_of_pid(pid),
                mig_instance=mig_instance,
                load=None if load is None else ProcessLoad(**load),
            )
        )
    return processes
