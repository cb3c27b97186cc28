"""NVML's numbers and bitmasks as the model's words, and the plain calls every part of the
NVML source makes."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pynvml

T = TypeVar("T")
Handle = Any
"""An NVML device handle (a ctypes pointer)."""

# What pynvml raises for a call that cannot be answered. NVMLLibraryMismatchError is what its
# unversioned wrappers raise for a function this driver's library does not have.
_REFUSED = (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)

# --- pure mappings from NVML's values to the model's words ---------------------------------------

# nvmlClocksEventReason* bits -> the model's codes (gpuconsole.core.model.THROTTLE_REASONS), in bit
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
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; spelled as gpuconsole.rules.health expects.
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

_MIG_PROFILE = re.compile(r"\bMIG\s+(\S+)")
_PSTATE_MAX = 15  # P0..P15; NVML_PSTATE_UNKNOWN is 32


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


def mig_profile(device_name: str | None) -> str | None:
    """The profile in a MIG device's name: "NVIDIA H200 MIG 1g.18gb" -> "1g.18gb"."""
    if device_name is None:
        return None
    match = _MIG_PROFILE.search(device_name)
    return match.group(1) if match else device_name


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


def init_failure_reason(error: Exception) -> str:
    """One plain line for why nvmlInit failed."""
    reasons: dict[type, str] = {
        pynvml.NVMLError_LibraryNotFound: "NVIDIA driver not loaded (libnvidia-ml.so not found)",
        pynvml.NVMLError_DriverNotLoaded: "NVIDIA driver not loaded (no nvidia kernel module)",
        pynvml.NVMLError_LibRmVersionMismatch: "NVML: Driver/library version mismatch",
        pynvml.NVMLError_NoPermission: "NVML: no permission to open the GPU devices (/dev/nvidia*)",
    }
    return reasons.get(type(error), f"NVML: {error}")


# --- calls ---------------------------------------------------------------------------------------


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _nvml(function: Callable[..., T], *args: Any) -> T | None:
    """One call whose failure, whatever it is, just means "no value"."""
    try:
        return function(*args)
    except _REFUSED:
        return None
