"""Probes that several checks share, what their commands are built from, and the readers of
their outputs.

A probe that only one check module needs lives beside its checks in `checks`; these are read by
checks in more than one module, so that each runs once per host. Every probe is POSIX sh and exits
127 when its tool is not installed, so that `CommandOutput.missing` tells "not there" (skip) from
"there and broken" (warn or fail).
"""

from __future__ import annotations

import csv
import json
import re
import shlex
from typing import Any

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.verify import compat
from gpuconsole.actions.verify.model import Evidence, Probe

# -- what the commands are built from ------------------------------------------------------------

WITH_SBIN = 'PATH="$PATH:/usr/sbin:/sbin"; '
"""Debian and Ubuntu install dkms and modinfo in sbin, which a non-root login's PATH may lack."""
NEEDS_PYTHON3 = "command -v python3 >/dev/null 2>&1 || exit 127; "


def smi_command(arguments: str) -> str:
    """``nvidia-smi arguments``, exiting 127 when nvidia-smi is not installed."""
    return f"command -v nvidia-smi >/dev/null 2>&1 || exit 127; nvidia-smi {arguments}"


def python_command(script: str) -> str:
    """``script`` run by the host's python3, exiting 127 when there is none."""
    return f"{NEEDS_PYTHON3}exec python3 -c {shlex.quote(script)}"


# -- the driver and nvidia-smi -------------------------------------------------------------------

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
SYSFS_VARIABLE = "GPUCONSOLE_SYSFS"
"""Where the probes find sysfs on the machine they run on, /sys unless its shell sets this: a
container that mounts the host's sysfs elsewhere (node_exporter's ``--path.sysfs`` answers the
same need)."""
NVIDIA_PCI = Probe(
    "nvidia-pci",
    f'cd "${{{SYSFS_VARIABLE}:-/sys}}/bus/pci/devices" && {{ for d in *; do '
    "grep -qsx 0x10de $d/vendor && cat $d/class; done; true; }",
)
"""The PCI class of every NVIDIA device on the bus (vendor 0x10de: GPUs are class 0x03....,
their audio functions and NVSwitches other classes), one per line; it fails without sysfs."""
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


def gpu_rows(evidence: Evidence) -> list[dict[str, str]]:
    """The rows of `SMI_QUERY` in ``evidence``: one per GPU."""
    return smi_rows(evidence[SMI_QUERY.name])


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


NO_GPU_REMEDY = (
    "There is nothing for a driver to drive: check that the GPU is seated, powered and enabled "
    "in the firmware (a GPU that fell off the bus can stay missing after a reboot), or passed "
    "through to this VM or container; `lspci -d 10de:` lists the NVIDIA devices the bus shows."
)
"""What to do where the bus shows no NVIDIA GPU (`nvidia_gpus_on_bus` is 0): the remedy of the
driver-loaded check and the note of repair's plan."""


def nvidia_gpus_on_bus(evidence: Evidence) -> int | None:
    """How many NVIDIA display controllers (GPUs) the PCI bus shows; None when not known (no
    sysfs, the probe not run or failed)."""
    output = evidence.get(NVIDIA_PCI.name)
    if output is None or not output.ok:
        return None
    return sum(1 for line in output.stdout.split() if line.startswith("0x03"))


def smi_cuda_version(output: CommandOutput) -> str | None:
    """The 'CUDA Version: 13.0' of nvidia-smi's default table header."""
    for line in output.stdout.splitlines():
        if "CUDA Version:" in line:
            return line.split("CUDA Version:")[1].split()[0].strip(" |")
    return None


def smi_header_driver(output: CommandOutput) -> str | None:
    """The 'Driver Version: 580.159.04' of nvidia-smi's default table header."""
    match = re.search(r"Driver Version:\s*([\d.]+)", output.stdout)
    return match.group(1) if output.ok and match else None


def smi_driver(evidence: Evidence) -> str | None:
    """The driver version nvidia-smi (that is, the NVML library) reports."""
    rows = gpu_rows(evidence)
    reported = rows[0].get("driver_version") if rows else None
    return reported or smi_header_driver(evidence[SMI.name])


def module_driver(evidence: Evidence) -> str | None:
    """The loaded kernel module's version; None when it is not loaded."""
    return driver_module_version(evidence[DRIVER_VERSION.name])


def driver_version(evidence: Evidence) -> str | None:
    """The driver's version by whichever of nvidia-smi or the kernel module answered."""
    return smi_driver(evidence) or module_driver(evidence)


def driver_cuda(evidence: Evidence) -> str | None:
    """The newest CUDA the driver supports, as nvidia-smi's header says; None if unreadable."""
    smi = evidence[SMI.name]
    cuda = smi_cuda_version(smi) if smi.ok else None
    return cuda if compat.version(cuda) else None


def driver_answers(evidence: Evidence) -> bool:
    """A GPU host with a working driver: the module is loaded or nvidia-smi ran."""
    return module_driver(evidence) is not None or evidence[SMI.name].ok


# -- the NVSwitch fabric -------------------------------------------------------------------------

SMI_DETAILS = Probe("smi-details", smi_command("-q"))
"""nvidia-smi's full report; read here for each GPU's ``Fabric`` state (Hopper and later)."""

NVSWITCHES = Probe(
    "nvswitches",
    "ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null; "
    "ls /dev 2>/dev/null | grep '^nvidia-nvswitch[0-9]' || true",
)
"""The NVSwitches the driver found (their PCI addresses, their device nodes); empty elsewhere."""

FABRIC_STATES = {"completed", "in progress", "not started"}
"""Fabric states a GPU reports only on an NVSwitch system; others print N/A or Not Supported."""


def fabric_states(details: CommandOutput) -> list[tuple[str, str, str]]:
    """(GPU bus id, fabric state, fabric status) per GPU in `nvidia-smi -q`'s text."""
    found, bus, in_fabric, state = [], "", False, ""
    for line in details.stdout.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if line.startswith("GPU ") and not line.startswith(" "):
            bus, in_fabric = line[4:].strip(), False
        elif line.strip() == "Fabric":
            in_fabric = True
        elif in_fabric and key == "State":
            state = value
        elif in_fabric and key == "Status":
            found.append((bus, state, value))
            in_fabric = False
    return found


def nvswitch_signals(evidence: Evidence) -> list[str]:
    """Why this looks like an NVSwitch system: the driver's NVSwitch devices, or a GPU whose
    fabric state is one that only NVSwitch systems report. GPU names are not used: an H100 SXM
    calls itself "H100 80GB HBM3", without "SXM"."""
    signals = [
        f"NVSwitch: {line}"
        for line in evidence[NVSWITCHES.name].stdout.splitlines()
        if line.strip()
    ]
    signals += [
        f"GPU {bus}: fabric state {state}"
        for bus, state, _ in fabric_states(evidence[SMI_DETAILS.name])
        if state.casefold() in FABRIC_STATES
    ]
    return signals


# -- python probes -------------------------------------------------------------------------------


def json_line(output: CommandOutput) -> dict[str, Any] | None:
    """The last JSON object line a python probe printed; None if there is none."""
    for line in reversed(output.stdout.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


_TORCH_SCRIPT = """
import json, sys
info = {"python": sys.executable}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    info["cudnn"] = torch.backends.cudnn.version()
    info["available"] = torch.cuda.is_available()
    info["devices"] = torch.cuda.device_count()
    if info["available"] and info["devices"]:
        info["name"] = torch.cuda.get_device_name(0)
        info["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
except ImportError as error:
    info["missing"] = getattr(error, "name", None) == "torch"
    info["error"] = "%s: %s" % (type(error).__name__, error)
except Exception as error:
    info["error"] = "%s: %s" % (type(error).__name__, error)
print(json.dumps(info))
"""
TORCH = Probe("torch", f"{NEEDS_PYTHON3}python3 -c '{_TORCH_SCRIPT}'", timeout=60.0)
"""One JSON line: the torch build, what it sees, or the error that stopped it (never raises)."""


def torch_info(evidence: Evidence) -> dict[str, Any] | None:
    """What `TORCH` printed; None when it printed no JSON."""
    return json_line(evidence[TORCH.name])


def cudnn_from_number(number: object) -> str | None:
    """torch.backends.cudnn.version() as a dotted version: 91900 -> 9.19.0, 8902 -> 8.9.2
    (cuDNN 9 packs major*10000 + minor*100 + patch; earlier ones major*1000 + minor*100)."""
    if not isinstance(number, int) or number <= 0:
        return None
    major, rest = divmod(number, 10000) if number >= 10000 else divmod(number, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


COPY_PRELUDE = """
import json, os, subprocess, sys, threading, time
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

def finish(report):
    print(json.dumps(report))
    sys.exit(0)

try:
    import torch
except Exception as error:
    finish({"skip": "torch is not importable by %s (%s)" % (sys.executable, error)})
if not torch.cuda.is_available():
    finish({"skip": "torch %s sees no CUDA device" % torch.__version__})

def smi(fields):
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=" + fields, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line]

def identities():
    # torch device -> (nvidia-smi index, uuid, PCI bus id), matched by uuid, else by position
    rows = [r for r in smi("index,uuid,pci.bus_id") if len(r) == 3]
    by_uuid = {r[1]: r for r in rows}
    found = []
    for device in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        uuid = None if uuid is None else "GPU-" + str(uuid).replace("GPU-", "")
        row = by_uuid.get(uuid) or (rows[device] if uuid is None and device < len(rows) else None)
        found.append((int(row[0]), row[1], row[2]) if row else (device, uuid, None))
    return found

def gbs(size, reps, seconds):
    return round(size * reps / seconds / 1e9, 1)
"""
"""What both copy scripts (`checks.pcie`'s host<->device, `checks.p2p_bandwidth`'s peer copies)
share: the JSON answer, torch or a skip, nvidia-smi's view of the GPUs. CUDA_DEVICE_ORDER=PCI_BUS_ID
numbers torch's devices as nvidia-smi does."""
