"""The driver and software stack: is the NVIDIA kernel module loaded and does nvidia-smi answer,
do the CUDA toolkit, cuDNN, TensorRT and the frameworks fit the driver, and is anything in the
way of the module (nouveau, missing headers, DKMS, Secure Boot)?

Every probe is POSIX sh and exits 127 when its tool is not installed, so that
`CommandOutput.missing` tells "not there" (skip) from "there and broken" (warn or fail). The
remedies follow shared/reference/gpu-facts.md ("Driver failure modes", "Compatibility").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gpuconsole.actions.verify import compat, probes
from gpuconsole.actions.verify.model import Check, CommandOutput, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context
from gpuconsole.telemetry.smi.source import exit_meaning

# Debian and Ubuntu install dkms and modinfo in sbin, which a non-root login's PATH may lack.
_WITH_SBIN = 'PATH="$PATH:/usr/sbin:/sbin"; '
_PYTHON = "command -v python3 >/dev/null 2>&1 || exit 127; "

NVCC = Probe(
    "nvcc",
    "if command -v nvcc >/dev/null 2>&1; then nvcc --version; "
    "elif [ -x /usr/local/cuda/bin/nvcc ]; then /usr/local/cuda/bin/nvcc --version; "
    "else exit 127; fi",
)
CUDNN_HEADER = Probe(
    "cudnn-header",
    "for header in /usr/include/cudnn_version.h /usr/include/x86_64-linux-gnu/cudnn_version.h "
    '/usr/local/cuda/include/cudnn_version.h; do if [ -r "$header" ]; then echo "$header"; '
    "grep -E '^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)[[:space:]]' \"$header\"; exit 0; fi; done; "
    "exit 1",
)
"""The first cudnn_version.h found, then its three version #defines."""
TENSORRT = Probe(
    "tensorrt",
    "if command -v python3 >/dev/null 2>&1 && python3 -c "
    "'import tensorrt; print(\"python tensorrt\", tensorrt.__version__)' 2>/dev/null; "
    "then exit 0; fi; "
    "if command -v dpkg-query >/dev/null 2>&1 && dpkg-query -W "
    "-f='${db:Status-Abbrev} ${Package} ${Version}\\n' 'libnvinfer*' 2>/dev/null "
    '| awk \'$1 == "ii" { print "dpkg", $2, $3 }\' | grep .; then exit 0; fi; '
    "ls /usr/lib/x86_64-linux-gnu/libnvinfer.so.* /usr/lib64/libnvinfer.so.* 2>/dev/null "
    "| sed 's/^/library /' | grep . || exit 127",
    timeout=30.0,
)
"""One line per find: "python tensorrt 10.3.0", "dpkg libnvinfer10 10.3.0.26-1+cuda12.5" or
"library /usr/lib/x86_64-linux-gnu/libnvinfer.so.10.3.0"; exit 127 when none."""

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
TORCH = Probe("torch", f"{_PYTHON}python3 -c '{_TORCH_SCRIPT}'", timeout=60.0)
"""One JSON line: the torch build, what it sees, or the error that stopped it (never raises)."""

_TENSORFLOW_SCRIPT = """
import json, sys
info = {"python": sys.executable}
try:
    import tensorflow as tf
    info["tensorflow"] = tf.__version__
    info["built_with_cuda"] = tf.test.is_built_with_cuda()
    info["gpus"] = [device.name for device in tf.config.list_physical_devices("GPU")]
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    info["mixed_float16"] = True
except ImportError as error:
    info["missing"] = getattr(error, "name", None) == "tensorflow"
    info["error"] = "%s: %s" % (type(error).__name__, error)
except Exception as error:
    info["error"] = "%s: %s" % (type(error).__name__, error)
print(json.dumps(info))
"""
TENSORFLOW = Probe(
    "tensorflow",
    f"{_PYTHON}TF_CPP_MIN_LOG_LEVEL=2 python3 -c '{_TENSORFLOW_SCRIPT}'",
    timeout=60.0,
)
KERNEL_TREE = Probe(
    "kernel-tree",
    'tree="/lib/modules/$(uname -r)"; '
    'if [ -e "$tree/build" ]; then echo "present $tree/build"; '
    'elif [ -d "$tree" ]; then echo "missing $tree/build"; '
    'else echo "absent $tree"; fi',
)
"""One line: "present|missing <tree>/build", or "absent <tree>" when the kernel's module tree
itself is not there (a VM or container whose kernel and modules come from outside)."""
DKMS = Probe("dkms", f"{_WITH_SBIN}command -v dkms >/dev/null 2>&1 || exit 127; dkms status")
SECURE_BOOT = Probe(
    "secure-boot", "command -v mokutil >/dev/null 2>&1 || exit 127; mokutil --sb-state"
)
MODULE_SIGNER = Probe(
    "module-signer",
    f"{_WITH_SBIN}command -v modinfo >/dev/null 2>&1 || exit 127; modinfo -F signer nvidia",
)
PROFILERS = Probe(
    "profilers",
    "for tool in ncu nvprof; do "
    'if command -v "$tool" >/dev/null 2>&1; then echo "$tool $(command -v "$tool")"; '
    'elif [ -x "/usr/local/cuda/bin/$tool" ]; then echo "$tool /usr/local/cuda/bin/$tool"; fi; '
    "done",
)
"""One line per profiler found: "ncu /usr/local/cuda/bin/ncu"."""

_MISMATCH = "driver/library version mismatch"


# -- readers shared by the judges ------------------------------------------------------------


def _lines_with(output: CommandOutput, *words: str) -> tuple[str, ...]:
    """The lines of stdout and stderr that contain any of ``words`` (case-insensitive)."""
    text = f"{output.stdout}\n{output.stderr}"
    wanted = [w.casefold() for w in words]
    return tuple(
        line.strip() for line in text.splitlines() if any(w in line.casefold() for w in wanted)
    )


def _smi_header_driver(output: CommandOutput) -> str | None:
    """The 'Driver Version: 580.159.04' of nvidia-smi's default table header."""
    match = re.search(r"Driver Version:\s*([\d.]+)", output.stdout)
    return match.group(1) if output.ok and match else None


def _smi_driver(evidence: Evidence) -> str | None:
    """The driver version nvidia-smi (that is, the NVML library) reports."""
    rows = probes.smi_rows(evidence[probes.SMI_QUERY.name])
    reported = rows[0].get("driver_version") if rows else None
    return reported or _smi_header_driver(evidence[probes.SMI.name])


def _module_driver(evidence: Evidence) -> str | None:
    return probes.driver_module_version(evidence[probes.DRIVER_VERSION.name])


def _driver(evidence: Evidence) -> str | None:
    """The driver's version by whichever of nvidia-smi or the kernel module answered."""
    return _smi_driver(evidence) or _module_driver(evidence)


def _driver_cuda(evidence: Evidence) -> str | None:
    """The newest CUDA the driver supports, as nvidia-smi's header says; None if unreadable."""
    smi = evidence[probes.SMI.name]
    cuda = probes.smi_cuda_version(smi) if smi.ok else None
    return cuda if compat.version(cuda) else None


def _driver_answers(evidence: Evidence) -> bool:
    """A GPU host with a working driver: the module is loaded or nvidia-smi ran."""
    return _module_driver(evidence) is not None or evidence[probes.SMI.name].ok


def _json_line(output: CommandOutput) -> dict[str, Any] | None:
    """The last JSON object line a python probe printed; None if there is none."""
    for line in reversed(output.stdout.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _no_answer(probe: Probe, status: Status, remediation: str) -> Verdict:
    """A probe that timed out: the command is in the result already, there is no output."""
    return Verdict(
        status, f"{probe.name} probe gave no answer within {probe.timeout:g} s", (), remediation
    )


@dataclass(frozen=True, slots=True)
class _Fit:
    """How well the driver runs a CUDA version: PASS fully, WARN only with minor-version
    compatibility, FAIL not at all, SKIP when the driver's version is unknown."""

    status: Status
    cuda: str
    driver: str | None
    driver_cuda: str | None
    min_driver: str | None
    floor: str | None

    def lines(self) -> tuple[str, ...]:
        need = f"CUDA {self.cuda} needs driver >= {self.min_driver or 'unknown'}"
        if self.floor:
            need += f" (>= {self.floor} with minor-version compatibility)"
        if self.driver is None:
            return ("driver version unknown", need)
        return (f"driver {self.driver} supports CUDA {self.driver_cuda or 'unknown'}", need)

    def remedy(self, instead: str) -> str:
        """Upgrading the driver, or ``instead`` (a build for the driver's CUDA)."""
        target = self.min_driver or f"a driver that supports CUDA {self.cuda}"
        return f"Upgrade the driver to {target} or newer, or {instead}."


def _cuda_fit(evidence: Evidence, cuda: str) -> _Fit:
    """Whether the driver runs ``cuda``: nvidia-smi's 'CUDA Version' decides when it is there
    (it is the driver's own word), else the minimum-driver table."""
    driver, driver_cuda = _driver(evidence), _driver_cuda(evidence)
    support = compat.driver_runs_cuda(driver, cuda) if driver else None
    need = compat.min_driver_for_cuda(cuda)
    floor = compat.minor_compat_floor(cuda)
    if driver_cuda is not None:
        full = (compat.short(driver_cuda) or ()) >= (compat.short(cuda) or ())
    elif support is not None and need is not None:
        full = support.full
    else:
        return _Fit(Status.SKIP, cuda, driver, driver_cuda, need, floor)
    if full:
        status = Status.PASS
    elif support is not None and support.minor_compatible:
        status = Status.WARN
    else:
        status = Status.FAIL
    return _Fit(status, cuda, driver, driver_cuda, need, floor)


def _torch_info(evidence: Evidence) -> dict[str, Any] | None:
    return _json_line(evidence[TORCH.name])


def _cudnn_from_number(number: object) -> str | None:
    """torch.backends.cudnn.version() as a dotted version: 91900 -> 9.19.0, 8902 -> 8.9.2
    (cuDNN 9 packs major*10000 + minor*100 + patch; earlier ones major*1000 + minor*100)."""
    if not isinstance(number, int) or number <= 0:
        return None
    major, rest = divmod(number, 10000) if number >= 10000 else divmod(number, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _compute_capability(evidence: Evidence) -> str | None:
    rows = probes.smi_rows(evidence[probes.SMI_QUERY.name])
    caps = [row.get("compute_cap", "") for row in rows]
    found = next((cap for cap in caps if compat.version(cap)), None)
    return found or (_torch_info(evidence) or {}).get("capability")


# -- driver-loaded ---------------------------------------------------------------------------

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
        return _no_answer(probes.DRIVER_VERSION, Status.FAIL, _LOAD_THE_DRIVER)
    return Verdict(
        Status.FAIL,
        "the NVIDIA kernel module is not loaded (no /proc/driver/nvidia/version)",
        output.lines(),
        _LOAD_THE_DRIVER,
    )


# -- nvidia-smi ------------------------------------------------------------------------------

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
        driver, cuda = _smi_header_driver(output), probes.smi_cuda_version(output)
        return Verdict(
            Status.PASS,
            f"nvidia-smi answers: driver {driver}, CUDA {cuda}",
            _lines_with(output, "Driver Version"),
        )
    if output.timed_out:
        return _no_answer(probes.SMI, Status.FAIL, _OFF_THE_BUS)
    if output.missing:
        return Verdict(
            Status.FAIL,
            "nvidia-smi is not installed",
            output.lines(),
            "Install the NVIDIA driver's utilities at the driver's version "
            "(nvidia-utils-<branch> on Ubuntu, part of the driver package elsewhere).",
        )
    code = output.exit_code if output.exit_code is not None else -1
    if _lines_with(output, _MISMATCH):
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


# -- nvml-driver-match -----------------------------------------------------------------------

_RELOAD_THE_DRIVER = (
    "The driver's user-space libraries were upgraded while the old kernel module stayed loaded. "
    "Reboot; or stop every GPU process (`sudo lsof /dev/nvidia*`) and nvidia-persistenced, then "
    "`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`. Then "
    "hold the driver packages so unattended upgrades do not repeat it: `sudo apt-mark hold "
    "<packages>` (list them with `dpkg -l | grep -i nvidia`) or `dnf versionlock`."
)


def _judge_nvml_match(evidence: Evidence, context: Context) -> Verdict:
    smi, query = evidence[probes.SMI.name], evidence[probes.SMI_QUERY.name]
    said = _lines_with(smi, _MISMATCH, "NVML library version") or _lines_with(
        query, _MISMATCH, "NVML library version"
    )
    module = _module_driver(evidence)
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
    library = _smi_driver(evidence)
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


# -- gpu-count -------------------------------------------------------------------------------

_SMI_TABLE_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s+(\S+)")


def _gpus(evidence: Evidence) -> list[str]:
    """One line per GPU nvidia-smi lists: the query's rows, or the default table's GPU rows
    when the query failed (drivers older than 510 do not know its compute_cap field)."""
    rows = probes.smi_rows(evidence[probes.SMI_QUERY.name])
    if rows:
        return [f"GPU {r.get('index')}: {r.get('name')} ({r.get('pci.bus_id')})" for r in rows]
    smi = evidence[probes.SMI.name]
    table = smi.stdout.split("Processes:")[0] if smi.ok else ""
    matches = (_SMI_TABLE_GPU.match(line) for line in table.splitlines())
    return [f"GPU {m.group(1)}: {m.group(2)} ({m.group(3)})" for m in matches if m]


def _judge_gpu_count(evidence: Evidence, context: Context) -> Verdict:
    gpus, expected = _gpus(evidence), context.expected_gpus
    found = len(gpus)
    if expected is None:
        return Verdict(
            Status.SKIP,
            f"{found} GPU(s) visible; no expected count for this host "
            "(set `gpus = N` for it in the inventory)",
            tuple(gpus),
        )
    if found == expected:
        return Verdict(Status.PASS, f"{found} of {expected} GPUs visible", tuple(gpus))
    if found > expected:
        return Verdict(
            Status.WARN,
            f"{found} GPUs visible, the inventory expects {expected}",
            tuple(gpus),
            f"Set `gpus = {found}` for this host in the inventory if the extra GPUs are meant.",
        )
    smi_said = () if gpus else evidence[probes.SMI_QUERY.name].lines(3)
    return Verdict(
        Status.FAIL,
        f"{found} of {expected} expected GPUs visible",
        (*gpus, *smi_said),
        "Find the missing GPU: `sudo dmesg | grep -i xid` (XID 79: fallen off the bus), "
        "`nvidia-smi -q` for the GPUs that remain, `lspci -d 10de:` for what the PCIe bus still "
        "sees. Reboot the node; if the GPU stays missing, reseat it and check its power cables.",
    )


# -- cuda-driver -----------------------------------------------------------------------------


def _judge_cuda_driver(evidence: Evidence, context: Context) -> Verdict:
    smi = evidence[probes.SMI.name]
    if not smi.ok:
        return Verdict(Status.SKIP, "nvidia-smi did not run (see the nvidia-smi check)")
    cuda, header = _driver_cuda(evidence), _lines_with(smi, "CUDA Version")
    if cuda is None:
        return Verdict(
            Status.WARN,
            "nvidia-smi's header names no CUDA version",
            header or smi.lines(3),
            "Drivers older than 410 do not print it: upgrade the driver "
            "(`ubuntu-drivers list --gpgpu` names the server packages on Ubuntu).",
        )
    driver = _smi_header_driver(smi)
    return Verdict(Status.PASS, f"driver {driver} supports CUDA up to {cuda}", header)


# -- cuda-toolkit ----------------------------------------------------------------------------

_NVCC_RELEASE = re.compile(r"release (\d+\.\d+)(?:, V(\d+(?:\.\d+)+))?")


def _judge_cuda_toolkit(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[NVCC.name]
    if output.missing:
        return Verdict(
            Status.SKIP, "no CUDA toolkit: nvcc is neither on PATH nor in /usr/local/cuda/bin"
        )
    if output.timed_out:
        return _no_answer(NVCC, Status.WARN, "Run `nvcc --version` by hand to see why it hangs.")
    match = _NVCC_RELEASE.search(output.stdout)
    if match is None:
        return Verdict(
            Status.WARN,
            "nvcc printed no release version",
            output.lines(),
            "Run `nvcc --version`; reinstall the CUDA toolkit if it fails.",
        )
    toolkit = match.group(2) or match.group(1)
    fit = _cuda_fit(evidence, match.group(1))
    lines = (*_lines_with(output, "release"), *fit.lines())
    if fit.status is Status.SKIP:
        return Verdict(
            Status.SKIP, f"CUDA toolkit {toolkit}; no driver version to compare with", lines
        )
    if fit.status is Status.PASS:
        return Verdict(
            Status.PASS,
            f"CUDA toolkit {toolkit} runs on driver {fit.driver} (CUDA {fit.driver_cuda})",
            lines,
        )
    older = compat.short(fit.driver_cuda)
    remedy = fit.remedy(
        f"install the toolkit of the driver's CUDA (cuda-toolkit-{older[0]}-{older[1]} from "
        "NVIDIA's repository)"
        if older and len(older) == 2
        else "install an older toolkit"
    )
    if fit.status is Status.WARN:
        return Verdict(
            Status.WARN,
            f"CUDA toolkit {toolkit} is newer than driver {fit.driver} supports; it runs only "
            "with minor-version compatibility",
            lines,
            f"{remedy} Under minor-version compatibility the newer toolkit's features may be "
            "missing and the PTX it builds cannot be JIT-compiled by the older driver.",
        )
    return Verdict(
        Status.FAIL, f"CUDA toolkit {toolkit} cannot run on driver {fit.driver}", lines, remedy
    )


# -- cudnn -----------------------------------------------------------------------------------


def _cudnn_from_header(output: CommandOutput) -> tuple[str, str] | None:
    """(header path, version) from the cudnn-header probe; None if no header was found."""
    if not output.ok:
        return None
    defines = dict(re.findall(r"#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", output.stdout))
    if "MAJOR" not in defines:
        return None
    path = output.stdout.splitlines()[0].strip()
    parts = (defines["MAJOR"], defines.get("MINOR", "0"), defines.get("PATCHLEVEL", "0"))
    return path, ".".join(parts)


def _judge_cudnn(evidence: Evidence, context: Context) -> Verdict:
    header = _cudnn_from_header(evidence[CUDNN_HEADER.name])
    torch = _torch_info(evidence) or {}
    bundled = _cudnn_from_number(torch.get("cudnn"))
    found = []
    if header is not None:
        found.append(f"cuDNN {header[1]} ({header[0]})")
    if bundled is not None:
        found.append(f"cuDNN {bundled} in torch {torch.get('torch')}")
    if not found:
        return Verdict(
            Status.SKIP,
            "no cuDNN: no cudnn_version.h in /usr/include, /usr/include/x86_64-linux-gnu or "
            "/usr/local/cuda/include, and no torch build with cuDNN",
        )
    return Verdict(Status.PASS, "; ".join(found), tuple(found))


# -- tensorrt --------------------------------------------------------------------------------


def _tensorrt_version(line: str) -> str | None:
    source, _, rest = line.partition(" ")
    if source == "library":
        return rest.split(".so.")[-1] if ".so." in rest else None
    words = rest.split()
    return words[-1].split("-")[0] if words else None


def _judge_tensorrt(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[TENSORRT.name]
    if output.timed_out:
        return _no_answer(TENSORRT, Status.WARN, "Run `python3 -c 'import tensorrt'` by hand.")
    finds = [line for line in output.lines(20) if _tensorrt_version(line)] if output.ok else []
    if not finds:
        return Verdict(
            Status.SKIP,
            "TensorRT is not installed (no tensorrt Python package, libnvinfer package or library)",
        )
    versions = [_tensorrt_version(line) or "" for line in finds]
    newest = max(versions, key=lambda v: compat.version(v) or ())
    source = finds[versions.index(newest)].split()[0]
    return Verdict(Status.PASS, f"TensorRT {newest} ({source})", tuple(finds[:6]))


# -- pytorch ---------------------------------------------------------------------------------


def _torch_index_url(release: str, driver_cuda: str | None) -> str:
    """The PyTorch wheel index of the newest CUDA build of ``release`` the driver runs."""
    builds = compat.torch_builds(release)
    known = (*builds.stable, *builds.experimental) if builds else ()
    limit = compat.short(driver_cuda)
    fitting = [cuda for cuda in known if limit and (compat.short(cuda) or ()) <= limit]
    if fitting:
        tag = "cu" + max(fitting, key=lambda c: compat.short(c) or ()).replace(".", "")
    elif driver_cuda:
        tag = f"cu{''.join(map(str, compat.short(driver_cuda) or ()))}"
    else:
        tag = "cu<XY>"
    return f"https://download.pytorch.org/whl/{tag}"


def _reinstall_torch(release: str, driver_cuda: str | None) -> str:
    return (
        f"install a build for the driver's CUDA {driver_cuda or '(see cuda-driver)'}: "
        f"`pip install --force-reinstall torch=={release} --index-url "
        f"{_torch_index_url(release, driver_cuda)}`"
    )


def _torch_summary(info: dict[str, Any]) -> str:
    parts = [f"torch {info.get('torch')}", f"CUDA {info.get('cuda')}"]
    cudnn = _cudnn_from_number(info.get("cudnn"))
    if cudnn:
        parts.append(f"cuDNN {cudnn}")
    devices = info.get("devices") or 0
    parts.append(f"{devices} GPU" + ("" if devices == 1 else "s"))
    return ", ".join(parts)


def _torch_lines(info: dict[str, Any], output: CommandOutput) -> tuple[str, ...]:
    described = [f"{k}: {info[k]}" for k in ("python", "torch", "cuda", "available") if k in info]
    if "name" in info:
        described.append(f"device 0: {info['name']} (compute capability {info.get('capability')})")
    warnings = [line for line in output.stderr.splitlines() if "warning" in line.casefold()]
    return (*described, *warnings[:3])


def _judge_pytorch(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[TORCH.name]
    info = _torch_info(evidence)
    if info is None:
        if output.missing:
            return Verdict(Status.SKIP, "python3 is not installed")
        if output.timed_out:
            return _no_answer(
                TORCH, Status.WARN, "Run `python3 -c 'import torch'` by hand to see what hangs."
            )
        return Verdict(
            Status.FAIL,
            f"the torch probe crashed (exit {output.exit_code})",
            output.lines(),
            "Run `python3 -c 'import torch; print(torch.cuda.is_available())'` to see the error.",
        )
    if info.get("missing"):
        return Verdict(Status.SKIP, f"torch is not installed for {info.get('python')}")
    if "torch" not in info or "error" in info:
        return Verdict(
            Status.FAIL,
            f"torch {info['torch']} fails: {info.get('error')}"
            if "torch" in info
            else f"torch does not import: {info.get('error')}",
            _torch_lines(info, output),
            "Reinstall torch into this environment (`pip install --force-reinstall torch`); "
            "`python3 -c 'import torch'` shows the whole traceback.",
        )
    return _judge_torch_build(evidence, info, output)


def _judge_torch_build(evidence: Evidence, info: dict[str, Any], output: CommandOutput) -> Verdict:
    version, cuda = str(info["torch"]), info.get("cuda")
    release, lines = version.split("+")[0], _torch_lines(info, output)
    driver_cuda = _driver_cuda(evidence)
    if not _driver_answers(evidence):
        return Verdict(
            Status.SKIP,
            f"torch {version} (CUDA {cuda}); no NVIDIA driver answers here (see driver-loaded)",
            lines,
        )
    if cuda is None:
        return Verdict(
            Status.FAIL,
            f"torch {version} is a CPU-only build on a GPU host",
            lines,
            f"A CPU-only build never uses the GPU: {_reinstall_torch(release, driver_cuda)}.",
        )
    fit = _cuda_fit(evidence, str(cuda))
    lines = (*lines, *fit.lines())
    fix_build = fit.remedy(_reinstall_torch(release, driver_cuda))
    if not info.get("available"):
        too_new = fit.status in (Status.FAIL, Status.WARN)
        return Verdict(
            Status.FAIL,
            f"torch {version} cannot use the GPU: torch.cuda.is_available() is False"
            + (f" (built for CUDA {cuda}, the driver supports {driver_cuda})" if too_new else ""),
            lines,
            fix_build
            if too_new
            else "Read torch's warning above; check CUDA_VISIBLE_DEVICES, that /dev/nvidia* "
            "exist and are readable, and in a container that it runs with the GPUs "
            "(`--gpus all` with the NVIDIA Container Toolkit).",
        )
    if fit.status is Status.FAIL:
        return Verdict(
            Status.FAIL,
            f"torch {version} is built for CUDA {cuda}; driver {fit.driver} cannot run it",
            lines,
            fix_build,
        )
    if fit.status is Status.WARN:
        return Verdict(
            Status.WARN,
            f"torch {version} is built for CUDA {cuda}, newer than the driver's "
            f"{driver_cuda}: it runs on minor-version compatibility",
            lines,
            fix_build,
        )
    return _judge_torch_release(info, release, str(cuda), lines)


def _judge_torch_release(
    info: dict[str, Any], release: str, cuda: str, lines: tuple[str, ...]
) -> Verdict:
    """Whether the release was ever built for this CUDA (pytorch/pytorch RELEASE.md)."""
    summary = _torch_summary(info)
    builds = compat.torch_builds(release)
    if builds is None:
        return Verdict(Status.PASS, summary, lines)
    wanted, series = compat.short(cuda), ".".join(map(str, compat.short(release) or ()))
    if wanted in map(compat.short, builds.experimental):
        return Verdict(
            Status.PASS,
            f"{summary} (CUDA {cuda} is an experimental build of torch {series})",
            lines,
        )
    if wanted in map(compat.short, builds.stable):
        return Verdict(Status.PASS, summary, lines)
    known = ", ".join((*builds.stable, *builds.experimental))
    return Verdict(
        Status.WARN,
        f"{summary}: torch {series} has no official CUDA {cuda} build (known: {known})",
        lines,
        f"Install an official build: pip install --force-reinstall torch=={release} "
        f"--index-url https://download.pytorch.org/whl/cu{builds.stable[-1].replace('.', '')}",
    )


# -- tensorflow ------------------------------------------------------------------------------


def _judge_tensorflow(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[TENSORFLOW.name]
    info = _json_line(output)
    if info is None:
        if output.missing:
            return Verdict(Status.SKIP, "python3 is not installed")
        if output.timed_out:
            return _no_answer(
                TENSORFLOW, Status.WARN, "Run `python3 -c 'import tensorflow'` by hand."
            )
        return Verdict(
            Status.WARN,
            f"the tensorflow probe crashed (exit {output.exit_code})",
            output.lines(),
            "Run `python3 -c 'import tensorflow'` to see the error.",
        )
    if info.get("missing"):
        return Verdict(Status.SKIP, f"tensorflow is not installed for {info.get('python')}")
    version = info.get("tensorflow")
    if version is None:
        return Verdict(
            Status.FAIL,
            f"tensorflow does not import: {info.get('error')}",
            (),
            "Reinstall it: `pip install --force-reinstall 'tensorflow[and-cuda]'`.",
        )
    gpus = info.get("gpus") or []
    lines = (
        f"GPUs: {', '.join(gpus) or 'none'}",
        f"built with CUDA: {info.get('built_with_cuda')}",
    )
    if not gpus and _driver_answers(evidence):
        return Verdict(
            Status.FAIL,
            f"TensorFlow {version} sees no GPU on a GPU host",
            (*lines, *([info["error"]] if "error" in info else [])),
            "`pip install 'tensorflow[and-cuda]'` installs a GPU build with the CUDA and cuDNN "
            "it was tested with (tensorflow.org/install/source#gpu lists them); a CPU-only or "
            "mismatched build sees no GPU.",
        )
    if not gpus:
        return Verdict(Status.SKIP, f"TensorFlow {version}; no NVIDIA driver answers here", lines)
    if not info.get("mixed_float16"):
        return Verdict(
            Status.WARN,
            f"TensorFlow {version} sees {len(gpus)} GPU(s); the mixed_float16 policy cannot be set",
            (*lines, str(info.get("error"))),
            "Install the Keras that matches this TensorFlow (`pip install 'tensorflow[and-cuda]'` "
            "pulls it), then `tf.keras.mixed_precision.set_global_policy('mixed_float16')`.",
        )
    return Verdict(
        Status.PASS,
        f"TensorFlow {version} sees {len(gpus)} GPU(s); mixed_float16 can be set",
        lines,
    )


# -- nouveau ---------------------------------------------------------------------------------


def _judge_nouveau(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[probes.KERNEL_MODULES.name]
    if not output.ok:
        return Verdict(Status.SKIP, "cannot read /proc/modules", output.lines(2))
    if "nouveau" not in probes.loaded_modules(output):
        nvidia = tuple(
            line for line in output.stdout.splitlines() if line.split()[:1] == ["nvidia"]
        )
        return Verdict(Status.PASS, "nouveau is not loaded", nvidia)
    return Verdict(
        Status.FAIL,
        "nouveau (the open-source driver) is loaded and holds the GPU",
        tuple(line for line in output.stdout.splitlines() if line.startswith("nouveau ")),
        "Write `blacklist nouveau` and `options nouveau modeset=0` to "
        "/etc/modprobe.d/blacklist-nouveau.conf, rebuild the initramfs (`sudo update-initramfs "
        "-u` on Debian/Ubuntu, `sudo dracut --force` on RHEL) and reboot.",
    )


# -- kernel-headers --------------------------------------------------------------------------


def _judge_kernel_headers(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[KERNEL_TREE.name]
    state, _, path = (output.lines(1) or ("",))[0].partition(" ")
    if not output.ok or state not in ("present", "missing", "absent"):
        return Verdict(Status.SKIP, "cannot look at /lib/modules", output.lines(2))
    kernel = path.split("/")[3] if path.count("/") >= 3 else "the running kernel"
    if state == "present":
        return Verdict(Status.PASS, f"kernel headers for {kernel} are installed", (path,))
    if state == "absent" and evidence[DKMS.name].missing:
        return Verdict(
            Status.SKIP,
            f"no {path} and no DKMS: this system's kernel modules come from outside it "
            "(a VM or container image), so nothing is built here",
            (f"{path} does not exist",),
        )
    return Verdict(
        Status.WARN,
        f"no kernel headers for {kernel}: a DKMS rebuild of the driver will fail",
        (f"{path} does not exist",),
        "`sudo apt install linux-headers-$(uname -r)` (Debian/Ubuntu) or "
        "`sudo dnf install kernel-devel-$(uname -r)` (RHEL), then rebuild the driver with DKMS.",
    )


# -- dkms ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DkmsEntry:
    """One `dkms status` line."""

    module: str
    version: str
    kernel: str | None
    state: str
    line: str


def dkms_entries(output: CommandOutput) -> list[DkmsEntry]:
    """`dkms status` lines, both "nvidia/535.129.03, 6.5.0-14-generic, x86_64: installed" (dkms
    3) and "nvidia, 470.82.00, 5.4.0-91-generic, x86_64: installed" (dkms 2)."""
    entries = []
    for line in output.stdout.splitlines():
        where, sep, state = line.rpartition(": ")
        if not sep:
            continue
        fields = [f.strip() for f in where.split(",")]
        if "/" in fields[0]:
            fields = [*fields[0].split("/", 1), *fields[1:]]
        if len(fields) < 2:
            continue
        kernel = fields[2] if len(fields) > 2 else None
        entries.append(DkmsEntry(fields[0], fields[1], kernel, state.strip(), line.strip()))
    return entries


def _judge_dkms(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[DKMS.name]
    if output.missing:
        return Verdict(Status.SKIP, "dkms is not installed (the driver is not built here)")
    if output.timed_out:
        return _no_answer(DKMS, Status.WARN, "Run `sudo dkms status` by hand.")
    kernel = evidence[probes.UNAME.name].stdout.strip()
    nvidia = [e for e in dkms_entries(output) if e.module.startswith("nvidia")]
    if not nvidia:
        return Verdict(
            Status.SKIP,
            "DKMS holds no nvidia module (the driver comes prebuilt for the kernel)",
            output.lines(),
        )
    missing = sorted(
        {e.module for e in nvidia}
        - {e.module for e in nvidia if e.kernel == kernel and e.state.startswith("installed")}
    )
    lines = tuple(e.line for e in nvidia)
    if not missing:
        return Verdict(Status.PASS, f"DKMS nvidia module installed for {kernel}", lines)
    entry = next(e for e in reversed(nvidia) if e.module == missing[0])
    return Verdict(
        Status.FAIL,
        f"DKMS has no installed {', '.join(missing)} module for the running kernel {kernel}",
        lines,
        f"sudo dkms build -m {entry.module} -v {entry.version} -k $(uname -r) && sudo dkms "
        f"install -m {entry.module} -v {entry.version} -k $(uname -r); if the build fails, read "
        f"/var/lib/dkms/{entry.module}/{entry.version}/build/make.log (missing headers: see "
        "kernel-headers; a kernel too new for this driver branch needs the previous kernel or a "
        "newer driver).",
    )


# -- secure-boot -----------------------------------------------------------------------------

_SIGN_THE_MODULE = (
    'Under Secure Boot the kernel refuses an unsigned module ("Key was rejected by service" in '
    "`dmesg`). Sign the nvidia modules with a Machine Owner Key and enroll it: `sudo mokutil "
    "--import <key.der>`, reboot and confirm the key in the MOK manager (DKMS signs with "
    "/var/lib/dkms/mok.pub once enrolled); or disable Secure Boot in the firmware."
)


def _judge_secure_boot(evidence: Evidence, context: Context) -> Verdict:
    state, signer = evidence[SECURE_BOOT.name], evidence[MODULE_SIGNER.name]
    if state.missing:
        return Verdict(Status.SKIP, "mokutil is not installed: Secure Boot state unknown")
    said = _lines_with(state, "secureboot", "secure boot", "efi variables")
    words = " ".join(said).casefold()
    if "enabled" not in words:
        if "disabled" in words or "support" in words:
            return Verdict(Status.PASS, "Secure Boot is off", said)
        return Verdict(
            Status.WARN,
            "cannot read the Secure Boot state",
            state.lines(3),
            "Run `mokutil --sb-state` as root.",
        )
    name = signer.stdout.strip()
    if signer.ok and name:
        return Verdict(
            Status.PASS, f"Secure Boot on; nvidia module signed by {name}", (*said, name)
        )
    if signer.ok:
        return Verdict(
            Status.FAIL,
            "Secure Boot on and the nvidia module is unsigned",
            (*said, "modinfo -F signer nvidia: (empty)"),
            _SIGN_THE_MODULE,
        )
    if _module_driver(evidence) is not None:
        return Verdict(
            Status.PASS,
            "Secure Boot on; the loaded nvidia module was accepted by the kernel",
            (*said, *signer.lines(1)),
        )
    return Verdict(
        Status.WARN,
        "Secure Boot on and no nvidia module found to check its signature",
        (*said, *signer.lines(1)),
        f"Install or build the driver for this kernel (see dkms), then sign it. {_SIGN_THE_MODULE}",
    )


# -- profiler --------------------------------------------------------------------------------


def _judge_profiler(evidence: Evidence, context: Context) -> Verdict:
    found = dict(
        line.split(" ", 1) for line in evidence[PROFILERS.name].stdout.splitlines() if " " in line
    )
    capability = _compute_capability(evidence)
    on = f" (compute capability {capability})" if capability else ""
    if "ncu" in found:
        return Verdict(Status.PASS, f"Nsight Compute: {found['ncu']}{on}", (f"ncu {found['ncu']}",))
    if "nvprof" not in found:
        return Verdict(Status.SKIP, "no GPU profiler: neither ncu nor nvprof is installed")
    lines = (f"nvprof {found['nvprof']}", f"compute capability {capability or 'unknown'}")
    if (compat.version(capability) or ()) >= (8, 0):
        return Verdict(
            Status.WARN,
            f"only nvprof, which does not support compute capability {capability}",
            lines,
            "Install Nsight Compute (`ncu`, in the CUDA toolkit); nvprof metrics map to its "
            "sections, e.g. gld_efficiency -> "
            "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct.",
        )
    return Verdict(Status.PASS, f"nvprof: {found['nvprof']}{on}", lines)


CHECKS: tuple[Check, ...] = (
    Check(
        "driver-loaded",
        "NVIDIA kernel module loaded",
        (probes.DRIVER_VERSION,),
        _judge_driver_loaded,
    ),
    Check("nvidia-smi", "nvidia-smi answers", (probes.SMI,), _judge_smi),
    Check(
        "nvml-driver-match",
        "NVML library matches the kernel module",
        (probes.SMI, probes.SMI_QUERY, probes.DRIVER_VERSION),
        _judge_nvml_match,
    ),
    Check(
        "gpu-count",
        "Expected GPUs visible",
        (probes.SMI_QUERY, probes.SMI),
        _judge_gpu_count,
    ),
    Check("cuda-driver", "CUDA version of the driver", (probes.SMI,), _judge_cuda_driver),
    Check(
        "cuda-toolkit",
        "CUDA toolkit fits the driver",
        (NVCC, probes.SMI, probes.SMI_QUERY, probes.DRIVER_VERSION),
        _judge_cuda_toolkit,
    ),
    Check("cudnn", "cuDNN installed", (CUDNN_HEADER, TORCH), _judge_cudnn),
    Check("tensorrt", "TensorRT installed", (TENSORRT,), _judge_tensorrt),
    Check(
        "pytorch",
        "PyTorch uses the GPU",
        (TORCH, probes.SMI, probes.SMI_QUERY, probes.DRIVER_VERSION),
        _judge_pytorch,
    ),
    Check(
        "tensorflow",
        "TensorFlow uses the GPU",
        (TENSORFLOW, probes.SMI, probes.DRIVER_VERSION),
        _judge_tensorflow,
    ),
    Check("nouveau", "nouveau not loaded", (probes.KERNEL_MODULES,), _judge_nouveau),
    Check(
        "kernel-headers",
        "Headers for the running kernel",
        (KERNEL_TREE, DKMS),
        _judge_kernel_headers,
    ),
    Check("dkms", "DKMS built the driver for this kernel", (DKMS, probes.UNAME), _judge_dkms),
    Check(
        "secure-boot",
        "Secure Boot accepts the driver",
        (SECURE_BOOT, MODULE_SIGNER, probes.DRIVER_VERSION),
        _judge_secure_boot,
    ),
    Check(
        "profiler",
        "A profiler for this GPU",
        (PROFILERS, probes.SMI_QUERY, TORCH),
        _judge_profiler,
    ),
)
