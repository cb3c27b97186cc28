"""The XID errors an NVIDIA driver reports, what they mean and what to do about each.

Sources (written from them, not copied): NVIDIA's Xid catalog
(docs.nvidia.com/deploy/xid-errors) for meanings and immediate actions; Azure's node health checks
(azurehpc-health-checks, ``check_gpu_xid``) for the XIDs a fleet treats as a failed node
(``fleet_flags``); NVIDIA's k8s-device-plugin for the XIDs that mean an application fault rather
than a GPU fault (``app_error``). See ``shared/reference/gpu-facts.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuconsole.core.model import Severity


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One catalog row: an XID, its meaning and the immediate action an admin should take."""

    xid: int
    meaning: str
    action: str
    fleet_flags: bool = False
    app_error: bool = False


FALLEN_OFF_THE_BUS = 79
"""The XID of a GPU that fell off the bus: the health rules' ``gpu-lost``, not a second problem."""

_RESTART_APP = "restart the application; if it recurs on healthy code, check this GPU"
_RESET_GPU = "reset the GPU once no process uses it (nvidia-smi -r -i <gpu>), or reboot the node"

_CATALOG: dict[int, XidInfo] = {
    info.xid: info
    for info in (
        XidInfo(13, "Graphics engine exception", _RESTART_APP, app_error=True),
        XidInfo(31, "GPU memory page fault", _RESTART_APP, app_error=True),
        XidInfo(32, "Invalid or corrupted push buffer", _RESTART_APP),
        XidInfo(
            43,
            "GPU stopped processing",
            "none: the faulting application was stopped",
            app_error=True,
        ),
        XidInfo(
            45,
            "Preemptive cleanup after earlier errors",
            "follow the action of the XID reported before it",
            app_error=True,
        ),
        XidInfo(
            48,
            "Double-bit ECC error",
            "drain the GPU's jobs, then reset it (nvidia-smi -r -i <gpu>)",
            fleet_flags=True,
        ),
        XidInfo(62, "Internal micro-controller halt", _RESET_GPU, fleet_flags=True),
        XidInfo(
            63,
            "Row remap / page retirement event",
            "none; if a row remap is pending, reset the GPU when idle",
            fleet_flags=True,
        ),
        XidInfo(
            64,
            "Row remap failure",
            "reset the GPU, then contact NVIDIA support if it fails again",
            fleet_flags=True,
        ),
        XidInfo(68, "NVDEC0 exception", _RESTART_APP, fleet_flags=True, app_error=True),
        XidInfo(
            74,
            "NVLink error",
            "run NVIDIA's NVLink troubleshooting workflow, then contact NVIDIA support",
            fleet_flags=True,
        ),
        XidInfo(
            79,
            "GPU has fallen off the bus",
            "reboot the node; if it recurs, check the GPU's PCIe seating, power and cooling",
            fleet_flags=True,
        ),
        XidInfo(
            92,
            "High single-bit ECC error rate",
            "none now; watch the ECC counters and plan a replacement if they keep rising",
            fleet_flags=True,
        ),
        XidInfo(94, "Contained memory error", _RESTART_APP),
        XidInfo(95, "Uncontained memory error", _RESET_GPU),
        XidInfo(109, "Context-switch timeout", _RESET_GPU, app_error=True),
        XidInfo(119, "GSP RPC timeout", _RESET_GPU, fleet_flags=True),
        XidInfo(120, "GSP error", _RESET_GPU, fleet_flags=True),
        XidInfo(136, "Link training failed", _RESET_GPU),
        XidInfo(140, "Unrecovered ECC escape", _RESET_GPU),
        XidInfo(143, "GPU initialization error", _RESET_GPU),
        XidInfo(
            154,
            "GPU recovery action changed",
            "informational: follow the action of the XID reported with it",
        ),
    )
}

# XIDs whose immediate action is a GPU reset or a node reboot: the GPU is unusable until then, so
# they are CRITICAL even where neither list above flags them (95, 136, 140, 143) and even where the
# device plugin blames the application (109: a context-switch timeout still needs a reset).
_NEEDS_RESET = frozenset({48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143})

# Events that report rather than fail. 63 and 92 are WARNING, not INFO: a retired page or a rising
# single-bit rate is worth a look, but the GPU keeps working (a pending remap is reported on its
# own, from the row-remap state). 154 is INFO: it only points at another XID, reported separately.
_INFORMATIONAL: dict[int, Severity] = {
    63: Severity.WARNING,
    92: Severity.WARNING,
    154: Severity.INFO,
}


def describe(xid: int) -> XidInfo:
    """The catalog row for ``xid``; an unlisted XID gets a generic row rather than an error."""
    return _CATALOG.get(xid) or XidInfo(
        xid, f"unlisted XID {xid}", "look it up in NVIDIA's Xid catalog"
    )


def severity(xid: int) -> Severity:
    """How bad an XID is: CRITICAL when the node fails fleet checks or the GPU needs a reset.

    Application faults and unlisted XIDs are WARNING: something went wrong, the GPU still works.
    """
    if xid in _INFORMATIONAL:
        return _INFORMATIONAL[xid]
    info = describe(xid)
    if xid in _NEEDS_RESET or info.fleet_flags:
        return Severity.CRITICAL
    return Severity.WARNING
