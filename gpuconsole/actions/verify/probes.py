"""Probes that several checks share, and the readers of their outputs.

A probe that only one check needs lives beside that check; these are read by checks in more
than one module, so that each runs once per host.
"""

from __future__ import annotations

import csv

from gpuconsole.actions.verify.model import CommandOutput, Probe

SMI_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "compute_cap",
    "persistence_mode",
    "ecc.mode.current",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)

DRIVER_VERSION = Probe("driver-version", "cat /proc/driver/nvidia/version")
"""The loaded kernel module's version line ("NVRM version: ... 580.159.04 ...")."""
SMI = Probe("smi", "nvidia-smi")
"""nvidia-smi's default table: its exit code says whether the driver answers; its header names
the driver and the CUDA version the driver supports."""
SMI_QUERY = Probe("smi-query", f"nvidia-smi --query-gpu={','.join(SMI_FIELDS)} --format=csv")
"""One CSV row per GPU, with a header line (the fields above)."""
KERNEL_MODULES = Probe("modules", "cat /proc/modules")
"""Loaded kernel modules, one per line, name first (what `lsmod` reads)."""
UNAME = Probe("uname", "uname -r")


def smi_rows(output: CommandOutput) -> list[dict[str, str]]:
    """The rows of `SMI_QUERY` as {field: value}, values stripped; [] when it did not run.

    nvidia-smi names a field it does not know in an error line instead of the CSV: such an
    output reads as no rows.
    """
    if not output.ok:
        return []
    rows = [row for row in csv.reader(output.stdout.splitlines(), skipinitialspace=True) if row]
    if not rows:
        return []
    header = [cell.split(" [")[0].strip() for cell in rows[0]]
    return [dict(zip(header, (c.strip() for c in row), strict=False)) for row in rows[1:]]


def loaded_modules(output: CommandOutput) -> set[str]:
    """The names of the loaded kernel modules in `KERNEL_MODULES`'s output."""
    return {line.split()[0] for line in output.stdout.splitlines() if line.strip()}


def driver_module_version(output: CommandOutput) -> str | None:
    """The version in /proc/driver/nvidia/version ("NVRM version: ... 580.159.04 ...")."""
    for line in output.stdout.splitlines():
        if line.startswith("NVRM version:"):
            words = [w for w in line.split() if w[:1].isdigit() and "." in w]
            return words[0] if words else None
    return None


def smi_cuda_version(output: CommandOutput) -> str | None:
    """The 'CUDA Version: 13.0' of nvidia-smi's default table header."""
    for line in output.stdout.splitlines():
        if "CUDA Version:" in line:
            return line.split("CUDA Version:")[1].split()[0].strip(" |")
    return None
