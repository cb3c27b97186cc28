"""The driver: is the NVIDIA kernel module loaded, does nvidia-smi answer, and do the NVML library
and the kernel module agree on the version?

The remedies follow shared/reference/gpu-facts.md ("Driver failure modes", "nvidia-smi exit
codes").
"""

from __future__ import annotations

from gpuconsole.actions.verify import probes
from gpuconsole.actions.verify.judging import lines_with, no_answer
from gpuconsole.actions.verify.model import Check, Evidence, Status, Verdict
from gpuconsole.hosts.targets import Context
from gpuconsole.telemetry.smi.source import exit_meaning

_MISMATCH = "driver/library version mismatch"

# -- driver-loaded -------------------------------------------------------------------------------

_LOAD_THE_DRIVER = (
    "Load it and read why it refuses: `sudo modprobe nvidia; sudo dmesg | grep -i -e nvrm "
    "-e nvidia | tail -20`. After a kernel upgrade it is usually one of: Secure Boot rejecting "
    'an unsigned module ("Key was rejected by service"), no headers for the running kernel, '
    "no DKMS build for it, or nouveau holding the GPU; the secure-boot, kernel-headers, dkms "
    "and nouveau checks look at each."
)


def _judge_driver_loaded(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[probes.DRIVER_VERSION.name]
    version = probes.driver_module_version(output)
    if version is not None:
        kind = "open" if "Open Kernel Module" in output.stdout else "proprietary"
        return Verdict(
            Status.PASS, f"NVIDIA kernel module {version} ({kind}) is loaded", output.lines(1)
        )
    if output.timed_out:
        return no_answer(probes.DRIVER_VERSION, Status.FAIL, _LOAD_THE_DRIVER)
    if probes.nvidia_gpus_on_bus(evidence) == 0:
        return Verdict(
            Status.FAIL,
            "no NVIDIA GPU on this machine: its PCI bus shows no NVIDIA display controller",
            evidence[probes.NVIDIA_PCI.name].lines(),
            probes.NO_GPU_REMEDY,
        )
    return Verdict(
        Status.FAIL,
        "the NVIDIA kernel module is not loaded (no /proc/driver/nvidia/version)",
        output.lines(),
        _LOAD_THE_DRIVER,
    )


# -- nvidia-smi ----------------------------------------------------------------------------------

_OFF_THE_BUS = (
    "Look for XID 79 (GPU fallen off the bus) in `sudo dmesg | grep -i xid`, then reboot the "
    "node; if it recurs, reseat or replace the GPU and check its power and cooling."
)
_SMI_REMEDIES = {
    4: "Run as root, or give the user access to /dev/nvidia* (the video group on most "
    "distributions).",
    8: "Connect the GPU's auxiliary power cables, then reboot.",
    9: "The driver is not loaded: see the driver-loaded check for the usual causes and the fix.",
    10: "The kernel saw an interrupt problem with a GPU: read `sudo dmesg | grep -i nvrm`, "
    "then reboot; if it recurs, reseat the GPU.",
    12: "The NVML library (libnvidia-ml.so.1) is missing: install the driver's user-space "
    "libraries at the kernel module's version (libnvidia-compute-<branch> on Ubuntu).",
    14: "The GPU's InfoROM is corrupted: `nvidia-smi -q | grep -i -A3 inforom`; contact the "
    "vendor (an InfoROM update or a replacement).",
    15: _OFF_THE_BUS,
}
_READ_THE_LOG = (
    "Read nvidia-smi's message and the kernel log: `sudo dmesg | grep -i -e nvrm -e xid`."
)


def _judge_smi(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[probes.SMI.name]
    if output.ok:
        driver, cuda = probes.smi_header_driver(output), probes.smi_cuda_version(output)
        return Verdict(
            Status.PASS,
            f"nvidia-smi answers: driver {driver}, CUDA {cuda}",
            lines_with(output, "Driver Version"),
        )
    if output.timed_out:
        return no_answer(probes.SMI, Status.FAIL, _OFF_THE_BUS)
    if output.missing:
        return Verdict(
            Status.FAIL,
            "nvidia-smi is not installed",
            output.lines(),
            "Install the NVIDIA driver's utilities at the driver's version "
            "(nvidia-utils-<branch> on Ubuntu, part of the driver package elsewhere).",
        )
    code = output.exit_code if output.exit_code is not None else -1
    if lines_with(output, _MISMATCH):
        return Verdict(
            Status.FAIL,
            f"nvidia-smi exited with {code}: NVML driver/library version mismatch",
            output.lines(),
            "See the nvml-driver-match check: the loaded kernel module is older or newer than "
            "the installed NVML library.",
        )
    return Verdict(
        Status.FAIL,
        f"nvidia-smi exited with {code} ({exit_meaning(code)})",
        output.lines(),
        _SMI_REMEDIES.get(code, _READ_THE_LOG),
    )


# -- nvml-driver-match ---------------------------------------------------------------------------

_RELOAD_THE_DRIVER = (
    "The driver's user-space libraries were upgraded while the old kernel module stayed loaded. "
    "Reboot; or stop every GPU process (`sudo lsof /dev/nvidia*`) and nvidia-persistenced, then "
    "`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`. Then "
    "hold the driver packages so unattended upgrades do not repeat it: `sudo apt-mark hold "
    "<packages>` (list them with `dpkg -l | grep -i nvidia`) or `dnf versionlock`."
)


def _judge_nvml_match(evidence: Evidence, context: Context) -> Verdict:
    smi, query = evidence[probes.SMI.name], evidence[probes.SMI_QUERY.name]
    said = lines_with(smi, _MISMATCH, "NVML library version") or lines_with(
        query, _MISMATCH, "NVML library version"
    )
    module = probes.module_driver(evidence)
    if any(_MISMATCH in line.casefold() for line in said):
        library = next(
            (
                line.rpartition(":")[2].strip()
                for line in said
                if line.casefold().startswith("nvml library version")
            ),
            "unknown",
        )
        return Verdict(
            Status.FAIL,
            f"driver/library version mismatch: NVML {library}, kernel module {module or 'unknown'}",
            said,
            _RELOAD_THE_DRIVER,
        )
    library = probes.smi_driver(evidence)
    if library is None or module is None:
        missing = "nvidia-smi reports no driver" if library is None else "no kernel module"
        return Verdict(Status.SKIP, f"nothing to compare: {missing}")
    lines = (f"nvidia-smi (NVML): {library}", f"/proc/driver/nvidia/version: {module}")
    if library == module:
        return Verdict(Status.PASS, f"NVML and the kernel module are both {module}", lines)
    return Verdict(
        Status.FAIL,
        f"nvidia-smi reports driver {library}, the loaded kernel module is {module}",
        lines,
        _RELOAD_THE_DRIVER,
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "driver-loaded",
        "NVIDIA kernel module loaded",
        (probes.DRIVER_VERSION, probes.NVIDIA_PCI),
        _judge_driver_loaded,
    ),
    Check("nvidia-smi", "nvidia-smi answers", (probes.SMI,), _judge_smi),
    Check(
        "nvml-driver-match",
        "NVML library matches the kernel module",
        (probes.SMI, probes.SMI_QUERY, probes.DRIVER_VERSION),
        _judge_nvml_match,
    ),
)
