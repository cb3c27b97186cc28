"""Every check, one module per check or per family of checks that share a probe: each module
holds its probes, judges and remedies, and ends with its own `CHECKS`. Probes that checks of
several modules read are in `verify.probes`, what judges share in `verify.judging`.

`FAMILIES` states the order reports list the checks in: the driver and software stack first
(`STACK`), then the hardware and the system around it (`HARDWARE`). tests/test_verify_checks.py
fails when a module here is missing from it.
"""

from __future__ import annotations

from types import ModuleType

from gpuconsole.actions.verify.checks import (
    cuda_driver,
    cuda_toolkit,
    cudnn,
    disk_free,
    disk_read,
    dkms,
    driver,
    ecc,
    fabric_manager,
    gpu_count,
    nouveau,
    nvlink,
    nvme,
    p2p_bandwidth,
    pcie,
    persistence_mode,
    profiler,
    pytorch,
    row_remap,
    secure_boot,
    tensorflow,
    tensorrt,
    xid_log,
)
from gpuconsole.actions.verify.model import Check

STACK: tuple[ModuleType, ...] = (
    driver,
    gpu_count,
    cuda_driver,
    cuda_toolkit,
    cudnn,
    tensorrt,
    pytorch,
    tensorflow,
    nouveau,
    dkms,
    secure_boot,
    profiler,
)
"""The driver and the software stack: is the kernel module loaded and does nvidia-smi answer, do
the CUDA toolkit, cuDNN, TensorRT and the frameworks fit the driver, and is anything in the way of
the module (nouveau, missing headers, DKMS, Secure Boot)?"""

HARDWARE: tuple[ModuleType, ...] = (
    persistence_mode,
    ecc,
    row_remap,
    pcie,
    nvlink,
    p2p_bandwidth,
    fabric_manager,
    xid_log,
    nvme,
    disk_free,
    disk_read,
)
"""The GPUs' hardware and the system around them: memory health, links, the fabric, the kernel's
XID log, local disks."""

FAMILIES: tuple[ModuleType, ...] = (*STACK, *HARDWARE)


def checks_of(families: tuple[ModuleType, ...]) -> tuple[Check, ...]:
    """The checks of ``families``, in their order and each family's own."""
    return tuple(check for family in families for check in family.CHECKS)


CHECKS: tuple[Check, ...] = checks_of(FAMILIES)
