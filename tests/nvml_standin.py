"""A stand-in for libnvidia-ml as ctypes calls it, answering from tables: what the NVML reader
(`gpuconsole.telemetry.agent.Nvml`, in the agent on a host and in-process in `NvmlSource`) is
tested against where there is no GPU.

Each GPU (and each MIG device) is a table of answers keyed by NVML function name without its
version suffix, each answer what pynvml's function would return: a value, a dict keyed by the
call's first whole-number argument, or a function of the handle and the call's whole-number
arguments, which may raise ``pynvml.NVMLError`` to answer with its code. The stand-in writes the
answer where the C function would (its out-parameters, its struct, its array). A device call
its table has no answer for is refused as NVML refuses an unsupported one; a function in
``missing`` is not in the library at all (an older driver's). `h200` is one busy H200's table.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 2**20
GIB = 2**30
SUCCESS, NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE = 0, 3, 6, 7
GPU_IS_LOST, UNKNOWN = 15, 999
VALUE_NOT_AVAILABLE = 2**64 - 1
FAULTS = {"lost": GPU_IS_LOST, "unknown": UNKNOWN}
"""What every call on a GPU answers once it has a fault."""
SM, MEM = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
CORRECTED, UNCORRECTED = (
    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
)
VOLATILE, AGGREGATE = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
TX, RX = pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES

_VERSION = re.compile(r"_v\d+$")
_MIG_SHIFT = 16
"""A GPU's handle is its index + 1; a MIG device's is (index + 1) << 16 | its slot."""
_LISTS = {
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
}


def h200(index: int) -> dict[str, Any]:
    """The answers of one busy H200 on an NVSwitch board, by NVML function name; the topology's
    are pynvml's (`NvmlSource` reads the topology through pynvml)."""
    return {
        "nvmlDeviceGetName": "NVIDIA H200",
        "nvmlDeviceGetUUID": f"GPU-{index:08x}-1111-2222-3333-444444444444",
        "nvmlDeviceGetPciInfo": SimpleNamespace(busId=f"0000BEEF:{0x18 + index:02X}:00.0".encode()),
        "nvmlDeviceGetSerial": f"165492200{index:04d}",
        "nvmlDeviceGetVbiosVersion": "96.00.A5.00.01",
        "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=87, memory=41),
        # Version 2 (a version argument) leaves out the driver's reserved memory.
        "nvmlDeviceGetMemoryInfo": lambda _, *version: SimpleNamespace(
            total=143771 * MIB, used=(80000 if version else 80500) * MIB
        ),
        "nvmlDeviceGetTemperatureV": 61,
        # The H200's thresholds through NVML: slowdown 89 °C, shutdown 95 °C.
        "nvmlDeviceGetTemperatureThreshold": {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 95,
        },
        "nvmlDeviceGetPowerUsage": 612_340,
        "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetPowerManagementLimitConstraints": [200_000, 700_000],
        "nvmlDeviceGetPowerManagementDefaultLimit": 700_000,
        "nvmlDeviceGetClockInfo": {SM: 1980, MEM: 3201},
        "nvmlDeviceGetMaxClockInfo": {SM: 1980, MEM: 3201},
        "nvmlDeviceGetApplicationsClock": {SM: 1980, MEM: 3201},
        # KB/s over 20 ms, as the loaded H200's nvidia-smi -q gave them.
        "nvmlDeviceGetPcieThroughput": {TX: 7712, RX: 15966},
        "nvmlDeviceGetPerformanceState": 0,
        "nvmlDeviceGetCurrentClocksEventReasons": pynvml.nvmlClocksEventReasonSwPowerCap,
        "nvmlDeviceGetEccMode": [1, 1],
        "nvmlDeviceGetTotalEccErrors": lambda _, kind, counter: {
            (CORRECTED, VOLATILE): 3,
            (UNCORRECTED, VOLATILE): 0,
            (CORRECTED, AGGREGATE): 12,
            (UNCORRECTED, AGGREGATE): 1,
        }[kind, counter],
        "nvmlDeviceGetRemappedRows": (2, 0, 1, 0),
        "nvmlDeviceGetRetiredPagesPendingStatus": 0,
        # Field id -> its number; NVML_GPU_RECOVERY_ACTION_GPU_RESET.
        "nvmlDeviceGetFieldValues": {pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 1},
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetPersistenceMode": 1,
        "nvmlDeviceGetComputeMode": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        "nvmlDeviceGetMigMode": [0, 0],
        "nvmlDeviceGetComputeRunningProcesses": [
            SimpleNamespace(pid=os.getpid(), usedGpuMemory=4 * GIB)
        ],
        "nvmlDeviceGetGraphicsRunningProcesses": [],
        "nvmlDeviceGetTopologyCommonAncestor": pynvml.NVML_TOPOLOGY_SYSTEM,
        "nvmlDeviceGetNvLinkState": lambda _, link: 1 if link < 18 else refuse()(),
        "nvmlDeviceGetNvLinkRemoteDeviceType": pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
        "nvmlDeviceGetNvLinkRemotePciInfo": SimpleNamespace(busId=b"0000BEEF:A0:00.0"),
        "nvmlDeviceGetCpuAffinity": lambda _, words: [0xFFFF] + [0] * (words - 1),
        # GPUs 0 and 1 on NUMA node 0, the others on node 1.
        "nvmlDeviceGetMemoryAffinity": lambda _, words, scope: (
            [1 << (index >= 2)] + [0] * (words - 1)
        ),
    }


def mig_device(gpu_instance: int, profile: str, total_mib: int, used_mib: int) -> dict[str, Any]:
    """One MIG device of an H200; GPU instance 1 runs this test's process, the others one that
    is not on this machine."""
    return {
        "nvmlDeviceGetGpuInstanceId": gpu_instance,
        "nvmlDeviceGetComputeInstanceId": 0,
        "nvmlDeviceGetName": f"NVIDIA H200 MIG {profile}",
        "nvmlDeviceGetUUID": f"MIG-{gpu_instance:08x}-aaaa-bbbb-cccc-dddddddddddd",
        "nvmlDeviceGetMemoryInfo": SimpleNamespace(total=total_mib * MIB, used=used_mib * MIB),
        "nvmlDeviceGetComputeRunningProcesses": [
            SimpleNamespace(pid=os.getpid() if gpu_instance == 1 else 999_999, usedGpuMemory=None)
        ],
    }


def in_mig_mode(table: dict[str, Any]) -> None:
    """``table``'s GPU switched to MIG mode: seven MIG device slots, and no utilization (NVML
    has none for a GPU in MIG mode)."""
    table["nvmlDeviceGetMigMode"] = [1, 1]
    table["nvmlDeviceGetMaxMigDeviceCount"] = 7
    del table["nvmlDeviceGetUtilizationRates"]


def refuse(code: int = NOT_SUPPORTED) -> Callable[..., Any]:
    """An answer that is NVML's error ``code``."""

    def refused(*_: Any) -> Any:
        raise pynvml.NVMLError(code)

    return refused


class StandinLibrary:
    """libnvidia-ml answering from ``gpus``' tables (see the module's docstring).

    ``migs[i]`` are GPU ``i``'s MIG devices' tables, by slot; ``faults[i]`` ("lost" or
    "unknown") makes every call on GPU ``i`` fail so; ``handle_errors[i]`` is the error GPU
    ``i``'s handle is refused with. ``asked`` counts the tables' answers by function name (what
    pynvml would have been asked: an array asked for twice, its size then its entries, is one
    answer), ``calls`` the C calls by their own names. A subclass answers a C call its own way
    with a method named ``_`` + the call's name, given the arguments after the handle.
    """

    DRIVER = "580.159.04"
    CUDA = 13000

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self.gpus = gpus
        self.migs: dict[int, list[dict[str, Any]]] = {}
        self.faults: dict[int, str] = {}
        self.handle_errors: dict[int, int] = {}
        self.missing: set[str] = set()
        self.asked: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.inits = 0
        """NVML's count of initialisations: up by each init, down by each shutdown."""
        self._pending: dict[tuple[str, int], list[Any]] = {}

    def __getattr__(self, name: str) -> Callable[..., int]:
        if not name.startswith("nvml") or name in self.missing:
            raise AttributeError(name)

        def call(*args: Any) -> int:
            self.calls[name] += 1
            return self._call(name, args)

        return call

    # --- calls without a device ------------------------------------------------------------

    def _call(self, name: str, args: tuple[Any, ...]) -> int:
        if name in ("nvmlInit", "nvmlInit_v2"):
            self.inits += 1
            return SUCCESS
        if name == "nvmlShutdown":
            self.inits -= 1
            return SUCCESS
        if name == "nvmlSystemGetDriverVersion":
            args[0].value = self.DRIVER.encode()
            return SUCCESS
        if name.startswith("nvmlSystemGetCudaDriverVersion"):
            args[0]._obj.value = self.CUDA
            return SUCCESS
        if name == "nvmlDeviceGetCount_v2":
            args[0]._obj.value = len(self.gpus)
            return SUCCESS
        if name == "nvmlDeviceGetHandleByIndex_v2":
            index, handle = args
            if index in self.handle_errors:
                return self.handle_errors[index]
            handle._obj.value = index + 1  # a pointer's value: NVML's handles are never NULL
            return SUCCESS
        if name.startswith("nvmlDevice"):
            return self._device_call(name, args[0].value, args[1:])
        return NOT_SUPPORTED

    # --- calls on a device -----------------------------------------------------------------

    def _device_call(self, name: str, handle: int, args: tuple[Any, ...]) -> int:
        gpu, slot = (handle - 1, None) if handle >> _MIG_SHIFT == 0 else self._mig_of(handle)
        if gpu in self.faults:
            return FAULTS[self.faults[gpu]]
        own = getattr(type(self), "_" + name, None)
        if own is not None:
            return own(self, *args)
        if name == "nvmlDeviceGetMigDeviceHandleByIndex":
            index, mig = args
            if index >= len(self.migs.get(gpu, ())):
                return NOT_FOUND
            mig._obj.value = (gpu + 1) << _MIG_SHIFT | index
            return SUCCESS
        table = self.gpus[gpu] if slot is None else self.migs[gpu][slot]
        base = _VERSION.sub("", name)
        if base in _LISTS:
            return self._list(base, table, handle, args)
        if base == "nvmlDeviceGetFieldValues":
            return self._field_values(table, args)
        numbers = tuple(arg for arg in args if isinstance(arg, int))
        if name == "nvmlDeviceGetMemoryInfo_v2":
            numbers = (2,)  # pynvml passes nvmlMemory_v2's version
        try:
            answer = self._answer(base, table, handle, numbers)
        except pynvml.NVMLError as error:
            return error.value
        _write(answer, [arg for arg in args if not isinstance(arg, int)])
        return SUCCESS

    @staticmethod
    def _mig_of(handle: int) -> tuple[int, int]:
        return (handle >> _MIG_SHIFT) - 1, handle & ((1 << _MIG_SHIFT) - 1)

    def _answer(self, name: str, table: dict[str, Any], handle: int, numbers: tuple) -> Any:
        """The table's answer to ``name``, as pynvml would return it; NVMLError for a refusal."""
        self.asked[name] += 1
        value = table.get(name)
        if value is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        if callable(value):
            return value(handle, *numbers)
        if isinstance(value, dict):
            if numbers[0] not in value:
                raise pynvml.NVMLError(NOT_SUPPORTED)
            return value[numbers[0]]
        return value

    def _list(self, name: str, table: dict[str, Any], handle: int, args: tuple) -> int:
        """A call that fills an array, answered as NVML does: the size first where the array
        has no room (the table asked once for both calls), then the entries."""
        if name == "nvmlDeviceGetProcessUtilization":
            array, count, since = args
            numbers: tuple = (since.value,)
        else:
            (count, array), numbers = args, ()
        answer = self._pending.pop((name, handle), None)
        if answer is None:
            try:
                answer = list(self._answer(name, table, handle, numbers))
            except pynvml.NVMLError as error:
                return error.value
        if array is None and not answer:
            count._obj.value = 0
            return SUCCESS
        if array is None or count._obj.value < len(answer):
            self._pending[name, handle] = answer
            count._obj.value = len(answer)
            return INSUFFICIENT_SIZE
        for slot, entry in zip(array, answer, strict=False):
            if name == "nvmlDeviceGetProcessUtilization":
                for field, _ in slot._fields_:
                    setattr(slot, field, getattr(entry, field))
            else:
                used = entry.usedGpuMemory
                slot.pid = entry.pid
                slot.usedGpuMemory = VALUE_NOT_AVAILABLE if used is None else used
                slot.gpuInstanceId = slot.computeInstanceId = 0xFFFFFFFF
        count._obj.value = len(answer)
        return SUCCESS

    def _field_values(self, table: dict[str, Any], args: tuple) -> int:
        """nvmlDeviceGetFieldValues: each field its number from the table's dict, a field not
        there answered NOT_SUPPORTED in its own return (the call itself succeeds)."""
        count, values = args
        self.asked["nvmlDeviceGetFieldValues"] += 1
        numbers = table.get("nvmlDeviceGetFieldValues")
        if numbers is None:
            return NOT_SUPPORTED
        for value in values[:count]:
            if value.fieldId in numbers:
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = numbers[value.fieldId]
                value.nvmlReturn = SUCCESS
            else:
                value.nvmlReturn = NOT_SUPPORTED
        return SUCCESS


def _write(answer: Any, outs: Sequence[Any]) -> None:
    """Put pynvml's ``answer`` where the C function writes it: a text buffer, one or several
    out-parameters, or a struct's fields (nvmlTemperature_v1_t's temperature)."""
    if isinstance(outs[0], ctypes.Array):
        outs[0].value = answer.encode()
        return
    targets = [out._obj for out in outs]
    if len(targets) > 1:
        for target, value in zip(targets, answer, strict=True):
            target.value = value
    elif not isinstance(targets[0], ctypes.Structure):
        targets[0].value = answer
    elif isinstance(answer, int):
        targets[0].temperature = answer
    else:
        for field, _ in targets[0]._fields_:
            if hasattr(answer, field):
                setattr(targets[0], field, getattr(answer, field))
