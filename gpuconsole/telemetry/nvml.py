"""The local host read in-process through NVML (``pynvml``, from the nvidia-ml-py package).

This is the fast path: a reading is a few dozen library calls per GPU, where nvidia-smi spawns a
process that initialises the driver's library each time.

Every field has its own call. A call the GPU or the driver refuses (not supported, no permission,
a function this driver lacks) gives None for that field alone, never 0 and never a dropped GPU. A
GPU that answers "GPU is lost", or "unknown error" to every call, is reported ``lost`` with what
was known of it; the other GPUs are read as usual.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pynvml

from gpuconsole.clock import Clock, wall_clock
from gpuconsole.model import (
    EccCounts,
    GpuProcess,
    GpuState,
    HostSnapshot,
    MigInstance,
    PcieLink,
    RowRemap,
    Topology,
    XidEvent,
)
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.containers import container_of_pid
from gpuconsole.telemetry.kernel_log import PciAddress, pci_address, read_kernel_xids

T = TypeVar("T")
Handle = Any
"""An NVML device handle (a ctypes pointer)."""

# What pynvml raises for a call that cannot be answered. NVMLLibraryMismatchError is what its
# unversioned wrappers raise for a function this driver's library does not have.
_REFUSED = (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)

# --- pure mappings from NVML's values to the model's words ---------------------------------------

# nvmlClocksEventReason* bits -> the model's codes (gpuconsole.model.THROTTLE_REASONS), in bit
# order. NVML's board-limit and reliability bits have no code in the model and are left out.
THROTTLE_BITS: dict[int, str] = {
    pynvml.nvmlClocksEventReasonGpuIdle: "gpu-idle",
    pynvml.nvmlClocksEventReasonApplicationsClocksSetting: "applications-clocks",
    pynvml.nvmlClocksEventReasonSwPowerCap: "sw-power-cap",
    pynvml.nvmlClocksEventReasonHwSlowdown: "hw-slowdown",
    pynvml.nvmlClocksEventReasonSyncBoost: "sync-boost",
    pynvml.nvmlClocksEventReasonSwThermalSlowdown: "sw-thermal",
    pynvml.nvmlClocksEventReasonHwThermalSlowdown: "hw-thermal",
    pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown: "hw-power-brake",
    pynvml.nvmlClocksEventReasonDisplayClockSetting: "display-clocks",
}

# nvmlDeviceGetTopologyCommonAncestor's levels as `nvidia-smi topo -m` prints them.
ANCESTOR_WORDS: dict[int, str] = {
    # Two GPUs of one board (a K80, say) meet at the board's own PCIe switch: one bridge.
    pynvml.NVML_TOPOLOGY_INTERNAL: "PIX",
    pynvml.NVML_TOPOLOGY_SINGLE: "PIX",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
    pynvml.NVML_TOPOLOGY_NODE: "NODE",
    pynvml.NVML_TOPOLOGY_SYSTEM: "SYS",
}
UNKNOWN_LINK = "N/A"

# nvmlDeviceGpuRecoveryAction_t (NVML_GPU_RECOVERY_ACTION_*), read through the field value
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; spelled as gpuconsole.health expects.
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu-reset",
    2: "node-reboot",
    3: "drain-p2p",
    4: "drain-and-reset",
    5: "recover-imex-domain",
    6: "bus-reset",
    7: "system-reboot",
}

COMPUTE_MODES: dict[int, str] = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "Default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "Exclusive_Thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "Prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "Exclusive_Process",
}

# c_nvmlFieldValue_t.valueType -> the member of its value union that holds the number.
_FIELD_MEMBERS: dict[int, str] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

SWITCH = -1
"""The peer of an NVLink that ends at an NVSwitch rather than at a GPU."""

_MIG_PROFILE = re.compile(r"\bMIG\s+(\S+)")
_PSTATE_MAX = 15  # P0..P15; NVML_PSTATE_UNKNOWN is 32
_NODE_WORDS = 4  # 64-bit words of NUMA node mask asked for: up to 256 nodes


def throttle_codes(mask: int) -> tuple[str, ...]:
    """A clock-event reasons bitmask as the model's codes, e.g. 0x21 -> gpu-idle, sw-thermal."""
    return tuple(code for bit, code in THROTTLE_BITS.items() if mask & bit)


def ancestor_word(level: int | None) -> str:
    return UNKNOWN_LINK if level is None else ANCESTOR_WORDS.get(level, UNKNOWN_LINK)


def pstate_name(value: int | None) -> str | None:
    return f"P{value}" if value is not None and 0 <= value <= _PSTATE_MAX else None


def recovery_action_name(value: int | None) -> str | None:
    if value is None:
        return None
    return RECOVERY_ACTIONS.get(value, f"unknown-{value}")


def compute_mode_name(value: int | None) -> str | None:
    return None if value is None else COMPUTE_MODES.get(value)


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version number as nvidia-smi prints it: 12080 -> "12.8"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def mig_profile(device_name: str | None) -> str | None:
    """The profile in a MIG device's name: "NVIDIA H200 MIG 1g.18gb" -> "1g.18gb"."""
    if device_name is None:
        return None
    match = _MIG_PROFILE.search(device_name)
    return match.group(1) if match else device_name


def field_number(field_value: Any) -> float | int | None:
    """The number in a c_nvmlFieldValue_t, or None when NVML could not read that field."""
    member = _FIELD_MEMBERS.get(field_value.valueType)
    if field_value.nvmlReturn != pynvml.NVML_SUCCESS or member is None:
        return None
    return getattr(field_value.value, member)


def set_bits(mask: Sequence[int], word_bits: int = 64) -> list[int]:
    """The numbers an NVML affinity bitmask holds (words of ``word_bits``, lowest first)."""
    return [
        word_index * word_bits + bit
        for word_index, word in enumerate(mask)
        for bit in range(word_bits)
        if word >> bit & 1
    ]


def cpu_ranges(mask: Sequence[int]) -> str | None:
    """A CPU affinity bitmask as nvidia-smi prints it: "0-55,112-167"."""
    cpus = set_bits(mask)
    spans = []
    for _, run in itertools.groupby(enumerate(cpus), key=lambda pair: pair[1] - pair[0]):
        members = [cpu for _, cpu in run]
        first, last = members[0], members[-1]
        spans.append(str(first) if first == last else f"{first}-{last}")
    return ",".join(spans) or None


def link_peer(
    remote_type: int | None, remote: PciAddress | None, gpus: Mapping[PciAddress, int]
) -> int | None:
    """Where one active NVLink ends: a GPU's index, `SWITCH`, or None (a CPU, a GPU not seen).

    Drivers that cannot say the remote's type get it from its PCI address: an end that is none
    of the GPUs is taken for an NVSwitch.
    """
    if remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
        return SWITCH
    if remote is not None and remote in gpus:
        return gpus[remote]
    if remote_type in (None, pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN):
        return SWITCH
    return None


def nvlink_words(peers: Sequence[Iterable[int]]) -> dict[tuple[int, int], str]:
    """``NV<links>`` for each pair of GPUs that NVLink joins; ``peers[i]`` holds the far end of
    each active link of GPU ``i`` (see `link_peer`).

    Links between the two GPUs count first. Through NVSwitches every GPU reaches every other one
    that also has switch links, at the pace of the one with fewer: that is how nvidia-smi shows
    an HGX board (NV18 between every pair of H100s or H200s).
    """
    counts = [Counter(ends) for ends in peers]
    words: dict[tuple[int, int], str] = {}
    for a, b in itertools.combinations(range(len(counts)), 2):
        links = max(counts[a][b], counts[b][a]) or min(counts[a][SWITCH], counts[b][SWITCH])
        if links:
            words[a, b] = words[b, a] = f"NV{links}"
    return words


def topology_matrix(
    pcie: Sequence[Sequence[str]], nvlinks: Mapping[tuple[int, int], str]
) -> tuple[tuple[str, ...], ...]:
    """The GPU x GPU matrix: "X" on the diagonal, NVLink where there is one, else the PCIe path."""
    size = len(pcie)
    return tuple(
        tuple("X" if a == b else nvlinks.get((a, b), pcie[a][b]) for b in range(size))
        for a in range(size)
    )


def sysfs_pci_name(bus_id: str) -> str | None:
    """NVML's "00000000:3B:00.0" as sysfs names the device: "0000:3b:00.0"."""
    address = pci_address(bus_id)
    if address is None:
        return None
    domain, bus, device = address
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


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


def init_failure_reason(error: Exception) -> str:
    """One plain line for why nvmlInit failed."""
    reasons: dict[type, str] = {
        pynvml.NVMLError_LibraryNotFound: "NVIDIA driver not loaded (libnvidia-ml.so not found)",
        pynvml.NVMLError_DriverNotLoaded: "NVIDIA driver not loaded (no nvidia kernel module)",
        pynvml.NVMLError_LibRmVersionMismatch: "NVML: Driver/library version mismatch",
        pynvml.NVMLError_NoPermission: "NVML: no permission to open the GPU devices (/dev/nvidia*)",
    }
    return reasons.get(type(error), f"NVML: {error}")


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


# --- calls ---------------------------------------------------------------------------------------


def _mib(size: int | None) -> float | None:
    return None if size is None else size / 2**20


def _number(value: float | None) -> float | None:
    return None if value is None else float(value)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _nvml(function: Callable[..., T], *args: Any) -> T | None:
    """One call whose failure, whatever it is, just means "no value"."""
    try:
        return function(*args)
    except _REFUSED:
        return None


def _succeeds(function: Callable[..., Any], *args: Any) -> bool:
    try:
        function(*args)
    except _REFUSED:
        return False
    return True


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


@dataclass(frozen=True, slots=True)
class _Static:
    """What does not change while the driver runs, read once per GPU (the maximum clocks alone
    cost 1.8 ms each on an H200)."""

    identity: _Identity
    sm_clock_max_mhz: float | None
    memory_clock_max_mhz: float | None
    slowdown_temperature_c: float | None
    pcie_max_gen: int | None
    pcie_max_width: int | None


@dataclass(slots=True)
class _Modes:
    ecc: bool | None
    mig: bool | None
    read_at: float


@dataclass(slots=True)
class _Memo:
    """What one GPU's readings carry from one to the next: its static values, the calls it does
    not support, and its ECC and MIG modes (0.17 ms each on an H200), re-read every
    `MODE_REFRESH_S`. A change of MIG mode forgets the unsupported calls: utilization, for one,
    is not supported in MIG mode only."""

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
    )


def _static(calls: _Calls, handle: Handle) -> _Static:
    sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    slowdown = pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    return _Static(
        identity=_identity(calls, handle),
        sm_clock_max_mhz=_number(calls(pynvml.nvmlDeviceGetMaxClockInfo, handle, sm)),
        memory_clock_max_mhz=_number(calls(pynvml.nvmlDeviceGetMaxClockInfo, handle, mem)),
        slowdown_temperature_c=_number(
            calls(pynvml.nvmlDeviceGetTemperatureThreshold, handle, slowdown)
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
    modes = _Modes(
        ecc=None if ecc is None else ecc[0] == pynvml.NVML_FEATURE_ENABLED,
        mig=None if mig is None else mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE,
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
) -> GpuState:
    util = calls(pynvml.nvmlDeviceGetUtilizationRates, handle)
    used, total = _memory(calls, handle)
    sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    identity = static.identity
    return GpuState(
        index=index,
        name=identity.name,
        uuid=identity.uuid,
        pci_bus_id=identity.pci_bus_id,
        utilization_pct=None if util is None else float(util.gpu),
        memory_utilization_pct=None if util is None else float(util.memory),
        memory_used_mib=used,
        memory_total_mib=total,
        temperature_c=_number(_temperature(calls, handle)),
        slowdown_temperature_c=static.slowdown_temperature_c,
        power_w=_watts(calls(pynvml.nvmlDeviceGetPowerUsage, handle)),
        power_limit_w=_watts(calls(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
        sm_clock_mhz=_number(calls(pynvml.nvmlDeviceGetClockInfo, handle, sm)),
        sm_clock_max_mhz=static.sm_clock_max_mhz,
        memory_clock_mhz=_number(calls(pynvml.nvmlDeviceGetClockInfo, handle, mem)),
        memory_clock_max_mhz=static.memory_clock_max_mhz,
        pstate=pstate_name(calls(pynvml.nvmlDeviceGetPerformanceState, handle)),
        fan_pct=_number(calls(pynvml.nvmlDeviceGetFanSpeed, handle)),
        throttle_reasons=_throttle(calls, handle),
        ecc=_ecc(calls, handle, modes.ecc),
        remap=_remap(calls, handle),
        recovery_action=_recovery_action(calls, handle),
        pcie=_pcie(calls, handle, static),
        persistence_mode=_enabled(calls(pynvml.nvmlDeviceGetPersistenceMode, handle)),
        compute_mode=compute_mode_name(calls(pynvml.nvmlDeviceGetComputeMode, handle)),
        mig_mode=modes.mig,
        mig_instances=tuple(_mig_instance(calls, device) for device in migs),
    )


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


def _processes(
    calls: _Calls, gpu: int, handle: Handle, mig_instance: int | None = None
) -> list[GpuProcess]:
    running = merge_running(
        calls(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or (),
        calls(pynvml.nvmlDeviceGetGraphicsRunningProcesses, handle) or (),
    )
    processes = []
    for pid, used, kind in running:
        user, command = _user_and_command(pid)
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
            )
        )
    return processes


# --- topology ------------------------------------------------------------------------------------


def _nvlink_peers(handle: Handle, gpus: Mapping[PciAddress, int]) -> list[int]:
    """The far end (`link_peer`) of each active NVLink of one GPU."""
    peers = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        if _nvml(pynvml.nvmlDeviceGetNvLinkState, handle, link) != pynvml.NVML_FEATURE_ENABLED:
            continue
        remote_pci = _nvml(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        remote = None if remote_pci is None else pci_address(_text(remote_pci.busId))
        remote_type = _nvml(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        peer = link_peer(remote_type, remote, gpus)
        if peer is not None:
            peers.append(peer)
    return peers


def _cpu_affinity(handle: Handle) -> str | None:
    words = max(1, -(-(os.cpu_count() or 1) // 64))
    mask = _nvml(pynvml.nvmlDeviceGetCpuAffinity, handle, words)
    return None if mask is None else cpu_ranges(list(mask))


def sysfs_numa_node(bus_id: str | None) -> int | None:
    """The NUMA node the kernel puts the GPU's PCI device on; None where it does not say (-1)."""
    name = None if bus_id is None else sysfs_pci_name(bus_id)
    if name is None:
        return None
    try:
        node = int(Path("/sys/bus/pci/devices", name, "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return None if node < 0 else node


def _numa_node(handle: Handle, bus_id: str | None) -> int | None:
    """nvidia-smi's "NUMA Affinity": the one NUMA node NVML gives the GPU's memory affinity to,
    else the kernel's word for it.

    On a host of one NUMA node NVML says node 0 where sysfs says -1 (seen on an H200 VM).
    nvmlDeviceGetNumaNodeId is not this: it is nvidia-smi's "GPU NUMA ID", the node of the
    GPU's own memory on the platforms where that is one (Grace Hopper).
    """
    mask = _nvml(
        pynvml.nvmlDeviceGetMemoryAffinity, handle, _NODE_WORDS, pynvml.NVML_AFFINITY_SCOPE_NODE
    )
    nodes = [] if mask is None else set_bits(list(mask))
    return nodes[0] if len(nodes) == 1 else sysfs_numa_node(bus_id)


def read_topology(handles: Sequence[Handle], bus_ids: Sequence[str | None]) -> Topology:
    """The GPU x GPU links, each GPU's CPUs and NUMA node; a pair NVML cannot place is "N/A"."""
    size = len(handles)
    pcie = [[UNKNOWN_LINK] * size for _ in range(size)]
    for a, b in itertools.combinations(range(size), 2):
        level = _nvml(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
        pcie[a][b] = pcie[b][a] = ancestor_word(level)
    gpus = {address: i for i, bus in enumerate(bus_ids) if bus and (address := pci_address(bus))}
    peers = [_nvlink_peers(handle, gpus) for handle in handles]
    return Topology(
        matrix=topology_matrix(pcie, nvlink_words(peers)),
        cpu_affinity=tuple(_cpu_affinity(handle) for handle in handles),
        numa_affinity=tuple(_numa_node(h, bus) for h, bus in zip(handles, bus_ids, strict=True)),
    )


# --- XID events ----------------------------------------------------------------------------------


def _address(handle: Handle) -> int | None:
    """A device handle's pointer value: NVML hands out one handle per device."""
    return ctypes.cast(handle, ctypes.c_void_p).value


class XidWatcher:
    """A daemon thread that collects the XID errors NVML reports, and the kernel log's.

    It registers ``nvmlEventTypeXidCriticalError`` on every GPU that accepts it and waits for
    events ``wait_ms`` at a time until `stop`, keeping the latest ``capacity`` of them. Every
    ``kernel_interval_s`` (and right after an NVML event, to get the driver's message for it) it
    re-reads the kernel log through ``kernel_log``, if given. Without NVML events (no GPU accepts
    them, or NVML is not initialised) it still reads the kernel log.
    """

    def __init__(
        self,
        handles: Mapping[int, Handle],
        kernel_log: Callable[[], Sequence[XidEvent]] | None = None,
        *,
        wait_ms: int = 500,
        kernel_interval_s: float = 60.0,
        capacity: int = 256,
        clock: Clock = wall_clock,
    ) -> None:
        self._handles = dict(handles)
        self._kernel_log = kernel_log
        self._wait_ms = wait_ms
        self._kernel_interval_s = kernel_interval_s
        self._clock = clock
        self._events: deque[XidEvent] = deque(maxlen=capacity)
        self._kernel: tuple[XidEvent, ...] = ()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._gpu_at: dict[int | None, int] = {}
        self._thread = threading.Thread(target=self._run, name="gpuconsole-xid", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def events(self) -> tuple[XidEvent, ...]:
        """The XID events NVML reported since `start`, oldest first."""
        with self._lock:
            return tuple(self._events)

    def kernel_events(self) -> tuple[XidEvent, ...]:
        """The XID events of the latest kernel log read."""
        return self._kernel

    def _run(self) -> None:
        event_set = self._register()
        next_kernel_read = 0.0
        try:
            while not self._stopping.is_set():
                if self._kernel_log is not None and time.monotonic() >= next_kernel_read:
                    self._read_kernel_log()
                    next_kernel_read = time.monotonic() + self._kernel_interval_s
                if event_set is None:
                    self._stopping.wait(self._wait_ms / 1000)
                elif self._wait(event_set):
                    next_kernel_read = 0.0
        finally:
            if event_set is not None:
                _nvml(pynvml.nvmlEventSetFree, event_set)

    def _register(self) -> Any | None:
        """An event set with XID events of every GPU that accepts them; None if none does."""
        event_set = _nvml(pynvml.nvmlEventSetCreate)
        if event_set is None:
            return None
        xid = pynvml.nvmlEventTypeXidCriticalError
        for index, handle in self._handles.items():
            if _succeeds(pynvml.nvmlDeviceRegisterEvents, handle, xid, event_set):
                self._gpu_at[_address(handle)] = index
        if not self._gpu_at:
            _nvml(pynvml.nvmlEventSetFree, event_set)
            return None
        return event_set

    def _wait(self, event_set: Any) -> bool:
        """Wait for one event; True when an XID came."""
        try:
            data = pynvml.nvmlEventSetWait(event_set, self._wait_ms)
        except pynvml.NVMLError_Timeout:
            return False
        except _REFUSED:
            # A GPU gone bad can make every wait fail at once: do not spin on it.
            self._stopping.wait(self._wait_ms / 1000)
            return False
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return False
        event = XidEvent(
            xid=int(data.eventData), gpu=self._gpu_at.get(_address(data.device)), time=self._clock()
        )
        with self._lock:
            self._events.append(event)
        return True

    def _read_kernel_log(self) -> None:
        assert self._kernel_log is not None
        try:
            self._kernel = tuple(self._kernel_log())
        except Exception:  # a failing reader must not end the thread that waits for NVML events
            return


def merge_xids(
    kernel: Iterable[XidEvent], nvml: Iterable[XidEvent], window_s: float = 5.0
) -> tuple[XidEvent, ...]:
    """The kernel log's XID events (they carry the driver's message) and those of NVML's that
    the log lacks, oldest first.

    An NVML event is the logged one when a logged event has the same XID and GPU within
    ``window_s``: the two stamps come from different clocks (and, for plain dmesg, from boot
    time plus seconds since boot).
    """
    logged = list(dict.fromkeys(kernel))
    unlogged = [
        event
        for event in nvml
        if not any(
            seen.xid == event.xid
            and seen.gpu == event.gpu
            and abs(seen.time - event.time) <= window_s
            for seen in logged
        )
    ]
    return tuple(sorted(logged + unlogged, key=lambda event: event.time))


# --- the source ----------------------------------------------------------------------------------


class NvmlSource:
    """This host's GPUs read through NVML: the `Source` for ``localhost`` where NVML loads.

    NVML is initialised on the first `read` (a failure raises `SourceError` with the reason) and
    shut down by `close`. The topology is read once, when every GPU has a handle. The XID
    watcher starts on the first read, so the kernel log's XIDs appear from a later reading on.
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

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self._host,)

    def read(self, host: str) -> HostSnapshot:
        if host != self._host:
            raise SourceError(f"{host}: NVML reads only this host ({self._host})")
        with self._lock:
            self._initialise()
            now = self._clock()
            gpus, processes = [], []
            for index in range(self._count):
                state, on_gpu = self._read_gpu(index)
                gpus.append(state)
                processes.extend(on_gpu)
            self._start_watcher()
            return HostSnapshot(
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

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        return []

    def close(self) -> None:
        """Stop the XID watcher and shut NVML down; a later `read` starts again."""
        with self._lock:
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None
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

    def _read_gpu(self, index: int) -> tuple[GpuState, list[GpuProcess]]:
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
            state = _gpu_state(index, handle, static, modes, migs, calls)
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
            index=index, name=known.name, uuid=known.uuid, pci_bus_id=known.pci_bus_id, lost=lost
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
            return _Identity(None, None, None)
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
