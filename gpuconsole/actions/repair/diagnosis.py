"""Why does the NVIDIA driver not work on this host? A walk over the known causes, in a fixed
order, each answered from the verify checks' verdicts and a few probes of its own.

The walk has two halves. The first asks why the driver does not load (not loaded at all, not
installed, nouveau in the way, Secure Boot, headers, DKMS): when the module is loaded and
nvidia-smi answers, none of these is a reason for a failure now, so each is ruled out with a note
even where its check warns (missing headers matter for the next kernel update, not for today).
The second half asks what is wrong with a driver that runs (library mismatch, Fabric Manager,
persistence, a GPU off the bus, a pending row remap); most of it is read through nvidia-smi, so
while the driver does not answer it is "cannot tell", not "ruled out".

Detection rules follow shared/reference/gpu-facts.md ("Driver failure modes", "XID errors",
"nvidia-smi exit codes").
"""

from __future__ import annotations

import csv
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.repair.model import Cause, Diagnosis, Distro, Family, Walked
from gpuconsole.actions.verify.checks import CHECKS, dkms, row_remap, xid_log
from gpuconsole.actions.verify.model import Check, CheckResult, Evidence, Probe, Status
from gpuconsole.actions.verify.probes import (
    NO_GPU_REMEDY,
    NVIDIA_PCI,
    SMI,
    SMI_QUERY,
    UNAME,
    WITH_SBIN,
    nvidia_gpus_on_bus,
)
from gpuconsole.actions.verify.runner import distinct_probes, judge_all
from gpuconsole.core.xid import FALLEN_OFF_THE_BUS
from gpuconsole.hosts.targets import Context
from gpuconsole.telemetry.kernel_log import parse_xid_lines

# Debian and Ubuntu install modinfo in sbin, which a non-root login's PATH may lack.
OS_RELEASE = Probe("os-release", "cat /etc/os-release")
PERSISTENCED = Probe(
    "persistenced",
    "command -v systemctl >/dev/null 2>&1 || exit 127; systemctl is-active nvidia-persistenced",
)
"""One word: "active", "inactive" (also for a unit that does not exist), "failed"..."""
MODULE_FILE = Probe(
    "module-file",
    f"{WITH_SBIN}command -v modinfo >/dev/null 2>&1 || exit 127; modinfo -F version nvidia",
)
"""The version of the nvidia module file the running kernel would load (it need not be loaded);
"modinfo: ERROR: Module nvidia not found." and exit 1 when there is none for this kernel."""
DRIVER_PACKAGES = Probe(
    "driver-packages",
    "if command -v dpkg-query >/dev/null 2>&1; then "
    "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' '*nvidia*' 2>/dev/null "
    "| awk '$1 == \"ii\" { print $2, $3 }'; exit 0; fi; "
    "if command -v rpm >/dev/null 2>&1; then "
    "rpm -qa --qf '%{NAME} %{VERSION}-%{RELEASE}\\n' '*nvidia*'; exit 0; fi; exit 127",
    timeout=30.0,
)
"""One line per installed package with "nvidia" in its name: "name version"; exit 127 when the
host has neither dpkg nor rpm."""
UBUNTU_DRIVERS = Probe(
    "ubuntu-drivers",
    "command -v ubuntu-drivers >/dev/null 2>&1 || exit 127; ubuntu-drivers devices",
    timeout=60.0,
)
"""Per device, lines "driver   : nvidia-driver-535-server - distro non-free recommended"."""
MODULE_LOAD_LOG = Probe(
    "module-load-log",
    "pattern='Key was rejected by service|Required key not available|"
    "unsigned module loading is restricted|module verification failed'; "
    "if command -v journalctl >/dev/null 2>&1"
    ' && [ -n "$(journalctl -b -q --no-pager -n 1 2>/dev/null)" ]; then'
    ' journalctl -b -q --no-pager | grep -E "$pattern" | tail -n 20; exit 0; fi; '
    "command -v dmesg >/dev/null 2>&1 || exit 127; "
    'dmesg 2>/dev/null | grep -E "$pattern" | tail -n 20; exit 0',
    timeout=30.0,
)
"""This boot's lines where the kernel or modprobe refused a module for its signature: modprobe's
"Key was rejected by service" reaches the journal through systemd-modules-load, the kernel's
lockdown message reaches dmesg."""

_REPAIR_PROBES = (
    OS_RELEASE,
    PERSISTENCED,
    MODULE_FILE,
    DRIVER_PACKAGES,
    UBUNTU_DRIVERS,
    MODULE_LOAD_LOG,
)

_CHECK_IDS = (
    "driver-loaded",
    "nvidia-smi",
    "nouveau",
    "secure-boot",
    "kernel-headers",
    "dkms",
    "nvml-driver-match",
    "fabric-manager",
    "persistence-mode",
    "row-remap",
    "xid-log",
    "gpu-count",
)
_ALL_CHECKS = {check.id: check for check in CHECKS}
DIAGNOSIS_CHECKS: tuple[Check, ...] = tuple(_ALL_CHECKS[i] for i in _CHECK_IDS)


def probes() -> list[Probe]:
    """Every probe the diagnosis reads, each once: the checks' first, then its own."""
    found = {probe.name: probe for probe in distinct_probes(DIAGNOSIS_CHECKS)}
    for probe in _REPAIR_PROBES:
        found.setdefault(probe.name, probe)
    return list(found.values())


# -- the distribution ------------------------------------------------------------------------

_DEBIAN_IDS = {"debian", "ubuntu"}
_RHEL_IDS = {"rhel", "fedora", "centos", "rocky", "almalinux"}


def _os_release_fields(text: str) -> dict[str, str]:
    """KEY=value lines of os-release(5), values unquoted the way a shell would."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or not key or key.startswith("#"):
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            words = [value.strip("\"'")]
        fields[key] = " ".join(words)
    return fields


def parse_distro(os_release: CommandOutput, uname: CommandOutput | None = None) -> Distro:
    """The family from ID, then ID_LIKE (Rocky says "rhel centos fedora", Ubuntu "debian");
    the kernel from `uname -r`."""
    fields = _os_release_fields(os_release.stdout) if os_release.ok else {}
    distro_id = fields.get("ID", "").lower() or None
    names = [distro_id or "", *fields.get("ID_LIKE", "").lower().split()]
    family = Family.UNKNOWN
    for name in names:
        if name in _DEBIAN_IDS:
            family = Family.DEBIAN
            break
        if name in _RHEL_IDS:
            family = Family.RHEL
            break
    kernel = uname.stdout.strip() if uname is not None and uname.ok else ""
    return Distro(family, distro_id, fields.get("VERSION_ID") or None, kernel or None)


# -- what the walk reads -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Seen:
    """The evidence and the checks' verdicts on it."""

    evidence: Evidence
    results: Mapping[str, CheckResult]

    def said(self, check_id: str) -> str:
        result = self.results[check_id]
        return f"{check_id}: {result.summary}"

    def status(self, check_id: str) -> Status:
        return self.results[check_id].status

    @property
    def loaded(self) -> bool:
        """The kernel module is loaded (/proc/driver/nvidia/version names a version)."""
        return self.status("driver-loaded") is Status.PASS

    @property
    def answers(self) -> bool:
        """nvidia-smi ran: what the GPUs report can be read."""
        return self.evidence[SMI.name].ok


def _text(output: CommandOutput) -> str:
    return f"{output.stdout}\n{output.stderr}"


def _lines_saying(output: CommandOutput, *phrases: str) -> list[str]:
    """The lines of stdout and stderr holding any of ``phrases`` (case-insensitive)."""
    wanted = [p.casefold() for p in phrases]
    return [
        line.strip()
        for line in _text(output).splitlines()
        if any(p in line.casefold() for p in wanted)
    ]


def nvidia_dkms_entries(evidence: Evidence) -> list[dkms.DkmsEntry]:
    """The nvidia DKMS entries ("nvidia", or "nvidia-srv" for Ubuntu's -server packages).

    Read with the dkms check's own reader, which knows both dkms 2's and dkms 3's formats.
    """
    entries = dkms.dkms_entries(evidence[dkms.DKMS.name])
    return [e for e in entries if e.module.startswith("nvidia")]


def installed_packages(evidence: Evidence) -> list[tuple[str, str]]:
    """(name, version) of each installed package with "nvidia" in its name."""
    output = evidence[DRIVER_PACKAGES.name]
    if not output.ok:
        return []
    pairs = (line.split() for line in output.stdout.splitlines())
    return [(words[0], words[1]) for words in pairs if len(words) == 2]


_DRIVER_PACKAGE_PREFIXES = (
    "nvidia-driver",  # Ubuntu's nvidia-driver-<N>[-server], Debian's nvidia-driver, NVIDIA's RPMs
    "nvidia-dkms",
    "nvidia-kernel-dkms",  # Debian
    "nvidia-open",  # NVIDIA's CUDA repository, open kernel modules
    "linux-modules-nvidia",  # Ubuntu's prebuilt, signed modules
    "kmod-nvidia",
    "akmod-nvidia",  # RPM Fusion
)


def _module_packages(evidence: Evidence) -> list[str]:
    """The installed packages that carry the kernel module (not the container toolkit or
    other tools that merely have "nvidia" in their names)."""
    return [
        f"{name} {version}"
        for name, version in installed_packages(evidence)
        if name.startswith(_DRIVER_PACKAGE_PREFIXES)
    ]


def module_file_version(evidence: Evidence) -> str | None:
    """The version of the nvidia module file for the running kernel; None when there is none."""
    output = evidence[MODULE_FILE.name]
    words = output.stdout.split() if output.ok else []
    return words[0] if words else None


# -- the causes ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _About:
    title: str
    question: str
    explanation: str


ABOUT: dict[str, _About] = {
    "no-nvidia-gpu": _About(
        "No NVIDIA GPU on this machine",
        "Does the PCI bus show an NVIDIA GPU?",
        "The PCI bus lists no NVIDIA display controller, so installing or loading a driver "
        "changes nothing, and the walk's other answers follow from this one. " + NO_GPU_REMEDY,
    ),
    "driver-not-loaded": _About(
        "The NVIDIA driver is not loaded",
        "Is the NVIDIA kernel module loaded, and does nvidia-smi reach it?",
        "The kernel has no NVIDIA driver running, so nvidia-smi and every CUDA program fail "
        "with 'couldn't communicate with the NVIDIA driver'. This is the symptom, not the "
        "reason: the usual reasons follow in this list (no driver installed, nouveau in the "
        "way, Secure Boot refusing an unsigned module, no headers or no DKMS build for a "
        "newly installed kernel). Trying `modprobe nvidia` prints the reason when none of "
        "those is found.",
    ),
    "no-driver-installed": _About(
        "No NVIDIA driver is installed",
        "Is any NVIDIA driver installed (a package, a DKMS entry, a module file, nvidia-smi)?",
        "Nothing of an NVIDIA driver is on this host: no driver package, no DKMS entry, no "
        "nvidia module file for the running kernel and no nvidia-smi. The fix is to install "
        "one, then reboot; on Ubuntu the server flavour nvidia-driver-<branch>-server from the "
        "distribution's own archive.",
    ),
    "nouveau-loaded": _About(
        "The nouveau driver holds the GPU",
        "Is nouveau, the open-source driver, loaded?",
        "nouveau, the open-source graphics driver built into the kernel, has claimed the GPU "
        "first, and the NVIDIA driver cannot load while it holds it. It has to be blacklisted "
        "in /etc/modprobe.d, the initramfs rebuilt (nouveau is loaded from there at boot) and "
        "the host rebooted.",
    ),
    "secure-boot-unsigned": _About(
        "Secure Boot refuses the unsigned NVIDIA module",
        "Does Secure Boot refuse the nvidia module because it is not signed?",
        "Secure Boot is on, and under it the kernel loads only modules signed with a key it "
        "trusts. The nvidia module was built on this host (DKMS) and is unsigned or signed "
        "with a key the firmware does not know, so loading it fails with 'Key was rejected by "
        "service'. Sign it with a Machine Owner Key and enroll that key: enrolling needs "
        "someone at the console during the next boot to type a one-time password. Turning "
        "Secure Boot off in the firmware is the other way out.",
    ),
    "kernel-headers-missing": _About(
        "No headers for the running kernel",
        "Are the headers of the running kernel installed (/lib/modules/<kernel>/build)?",
        "The driver's kernel module is compiled on this host against the running kernel's "
        "headers, and they are not installed: typically a kernel update arrived without its "
        "headers package, so DKMS could not build the module for it. Install the headers; the "
        "module can then be built.",
    ),
    "dkms-not-built": _About(
        "DKMS has not built the driver for this kernel",
        "Has DKMS built and installed the nvidia module for the running kernel?",
        "The driver's source is registered with DKMS, but no module was built and installed "
        "for the kernel now running, so there is nothing to load. This is what a kernel "
        "update leaves behind when the build failed or never ran. Build and install it for "
        "this kernel; if the build fails, the kernel may be too new for this driver branch.",
    ),
    "library-mismatch": _About(
        "Driver/library version mismatch",
        "Do the NVML library and the loaded kernel module have the same version?",
        "The driver packages were upgraded (often by unattended upgrades) while the old kernel "
        "module stayed loaded: the new user-space library refuses to talk to the old module, "
        "and nvidia-smi says 'Driver/library version mismatch'. Running jobs keep running; new "
        "ones fail. A reboot loads the new module; holding the packages stops it from "
        "happening again behind your back.",
    ),
    "fabric-manager-down": _About(
        "Fabric Manager is not running on an NVSwitch system",
        "On an NVSwitch system (HGX/DGX), is nvidia-fabricmanager running?",
        "This is an NVSwitch system, where the GPUs talk to each other through NVSwitches "
        "that the Fabric Manager service sets up. It is not running, so CUDA programs fail "
        "with error 802 'system not yet initialized' although nvidia-smi looks fine. It must "
        "be installed at exactly the driver's version and started.",
    ),
    "persistence-off": _About(
        "Persistence mode is off",
        "Is persistence mode on, with the nvidia-persistenced daemon running?",
        "Without persistence the driver tears the GPUs down whenever no program uses them and "
        "sets them up again for the next: every job start waits seconds, and settings are lost "
        "between jobs. The nvidia-persistenced daemon keeps them initialised; it should be "
        "enabled at boot (`nvidia-smi -pm 1` is the deprecated way).",
    ),
    "gpu-fallen-off-bus": _About(
        "A GPU has fallen off the bus",
        "Has a GPU fallen off the PCIe bus (XID 79, or nvidia-smi calling a GPU lost)?",
        "A GPU stopped answering on the PCIe bus (XID 79 in the kernel log): the driver has "
        "given up on it and nothing can use it until the node is rebooted. It is usually "
        "hardware (power, cooling, a loose card or riser): if it happens again after the "
        "reboot, reseat the GPU and check its power and temperatures.",
    ),
    "row-remap-pending": _About(
        "A GPU memory row remap is pending",
        "Does a GPU wait for a reset to remap a bad memory row, or has a remap failed?",
        "A GPU found a failing row of its memory and will replace it with a spare one, but "
        "only at its next reset: until then the bad row stays in use. Reset the GPU when no "
        "job uses it, or reboot. A failed remap means the GPU ran out of spare rows: if it "
        "persists after the reset, the GPU needs replacing.",
    ),
}


def _walked(cause_id: str, found: bool | None, *evidence: str) -> Walked:
    return Walked(cause_id, ABOUT[cause_id].question, found, tuple(e for e in evidence if e))


_CANNOT_COMMUNICATE = "couldn't communicate with the nvidia driver"
_DRIVER_NOT_LOADED_EXIT = 9  # nvidia-smi's exit code (gpu-facts.md, "nvidia-smi exit codes")


def _no_nvidia_gpu(seen: _Seen) -> Walked:
    count = nvidia_gpus_on_bus(seen.evidence)
    if count is None:
        return _walked("no-nvidia-gpu", None, "the PCI bus could not be read (no sysfs)")
    if count == 0:
        classes = seen.evidence[NVIDIA_PCI.name].lines(3)
        shown = f"NVIDIA devices of other classes: {', '.join(classes)}" if classes else ""
        return _walked(
            "no-nvidia-gpu", True, "the PCI bus shows no NVIDIA display controller", shown
        )
    return _walked("no-nvidia-gpu", False, f"the PCI bus shows {count} NVIDIA GPU(s)")


def _driver_not_loaded(seen: _Seen) -> Walked:
    smi = seen.evidence[SMI.name]
    unreachable = smi.exit_code == _DRIVER_NOT_LOADED_EXIT or _lines_saying(
        smi, _CANNOT_COMMUNICATE
    )
    lines = (seen.said("driver-loaded"), seen.said("nvidia-smi"), *smi.lines(2))
    if not seen.loaded or unreachable:
        return _walked("driver-not-loaded", True, *lines)
    return _walked("driver-not-loaded", False, seen.said("driver-loaded"), seen.said("nvidia-smi"))


def _signs_of_a_driver(seen: _Seen) -> list[str]:
    """What shows an NVIDIA driver is installed, though perhaps not for this kernel."""
    signs = []
    smi = seen.evidence[SMI.name]
    if not smi.missing:
        signs.append(f"nvidia-smi is installed (it exited {smi.exit_code})")
    version = module_file_version(seen.evidence)
    if version:
        signs.append(f"modinfo finds an nvidia {version} module for this kernel")
    signs += [
        f"DKMS holds {e.module}/{e.version}: {e.state}" for e in nvidia_dkms_entries(seen.evidence)
    ]
    signs += [f"installed: {package}" for package in _module_packages(seen.evidence)]
    return signs


def _no_driver_installed(seen: _Seen) -> Walked:
    if seen.loaded:
        return _walked("no-driver-installed", False, "the nvidia kernel module is loaded")
    signs = _signs_of_a_driver(seen)
    if signs:
        return _walked("no-driver-installed", False, *signs[:4])
    modinfo, packages = seen.evidence[MODULE_FILE.name], seen.evidence[DRIVER_PACKAGES.name]
    if (modinfo.missing or modinfo.timed_out) and (packages.missing or packages.timed_out):
        return _walked(
            "no-driver-installed",
            None,
            "neither modinfo nor a package tool (dpkg-query, rpm) answered",
        )
    return _walked(
        "no-driver-installed",
        True,
        "nvidia-smi is not installed",
        f"modinfo nvidia: {' '.join(modinfo.lines(1)) or f'exit {modinfo.exit_code}'}",
        "DKMS holds no nvidia module",
        "no NVIDIA driver package is installed",
    )


def _nouveau_loaded(seen: _Seen) -> Walked:
    result = seen.results["nouveau"]
    found = {Status.FAIL: True, Status.PASS: False}.get(result.status)
    return _walked("nouveau-loaded", found, seen.said("nouveau"), *result.evidence[:2])


_REJECTED = ("key was rejected", "required key not available", "unsigned module loading")


def _secure_boot_unsigned(seen: _Seen) -> Walked:
    result = seen.results["secure-boot"]
    rejected = _lines_saying(seen.evidence[MODULE_LOAD_LOG.name], *_REJECTED)[-2:]
    if seen.loaded:
        return _walked(
            "secure-boot-unsigned",
            False,
            "the kernel accepted the loaded nvidia module",
            seen.said("secure-boot"),
        )
    if result.status is Status.FAIL or rejected:
        return _walked(
            "secure-boot-unsigned", True, seen.said("secure-boot"), *result.evidence, *rejected
        )
    found = False if result.status is Status.PASS else None
    return _walked("secure-boot-unsigned", found, seen.said("secure-boot"))


def _kernel_headers_missing(seen: _Seen) -> Walked:
    status = seen.status("kernel-headers")
    said = seen.said("kernel-headers")
    if status is Status.WARN and seen.loaded:
        return _walked(
            "kernel-headers-missing",
            False,
            said,
            "not a cause now: the loaded driver does not need them; the next kernel update's "
            "DKMS rebuild will",
        )
    if status is Status.WARN:
        return _walked("kernel-headers-missing", True, said)
    tree = seen.evidence[dkms.KERNEL_TREE.name].stdout.split()[:1]
    if status is Status.PASS or tree == ["absent"]:
        return _walked("kernel-headers-missing", False, said)
    return _walked("kernel-headers-missing", None, said)


def _dkms_not_built(seen: _Seen) -> Walked:
    result = seen.results["dkms"]
    said = seen.said("dkms")
    if result.status is Status.FAIL and seen.loaded:
        return _walked(
            "dkms-not-built",
            False,
            said,
            "not a cause now: a driver is loaded (it came from elsewhere, e.g. a prebuilt "
            "module package)",
        )
    if result.status is Status.FAIL:
        return _walked("dkms-not-built", True, said, *result.evidence[:3])
    if result.status in (Status.PASS, Status.SKIP):
        return _walked("dkms-not-built", False, said)
    return _walked("dkms-not-built", None, said)


def _library_mismatch(seen: _Seen) -> Walked:
    result = seen.results["nvml-driver-match"]
    said = seen.said("nvml-driver-match")
    if result.status is Status.FAIL:
        return _walked("library-mismatch", True, said, *result.evidence[:3])
    if result.status is Status.PASS or not seen.loaded:
        return _walked("library-mismatch", False, said)
    return _walked("library-mismatch", None, said)


def _fabric_manager_down(seen: _Seen) -> Walked:
    result = seen.results["fabric-manager"]
    said = seen.said("fabric-manager")
    if result.status is Status.FAIL:
        return _walked("fabric-manager-down", True, said, *result.evidence[:4])
    if not seen.answers:
        return _walked(
            "fabric-manager-down",
            None,
            "NVSwitches and fabric states are read through the driver, which does not answer",
        )
    found = False if result.status in (Status.PASS, Status.SKIP) else None
    return _walked("fabric-manager-down", found, said)


def _persistence_off(seen: _Seen) -> Walked:
    if not seen.answers:
        return _walked(
            "persistence-off", None, "persistence mode is read through nvidia-smi, which fails"
        )
    daemon = seen.evidence[PERSISTENCED.name]
    # systemctl outside a systemd boot (a container) prints nothing on stdout: no word, no news
    state = next(iter(daemon.stdout.split()), None)
    daemon_down = state is not None and state != "active"
    daemon_line = (
        f"systemctl is-active nvidia-persistenced: {state}"
        if state
        else f"nvidia-persistenced's state unknown: {' '.join(daemon.lines(1)) or 'no systemctl'}"
    )
    status = seen.status("persistence-mode")
    lines = (seen.said("persistence-mode"), daemon_line)
    if status is Status.WARN or daemon_down:
        return _walked("persistence-off", True, *lines)
    return _walked("persistence-off", False if status is Status.PASS else None, *lines)


_LOST_GPU = ("unable to determine the device handle", "gpu is lost", "fallen off the bus")
_SMI_LOST_GPU_EXIT = 15  # nvidia-smi: "GPU fell off the bus" (gpu-facts.md, exit codes)


def _xid_79_lines(output: CommandOutput) -> list[str]:
    return [
        line.strip()
        for line in output.stdout.splitlines()
        if any(e.xid == FALLEN_OFF_THE_BUS for e in parse_xid_lines(line, {}, now=0.0))
    ]


def _gpu_fallen_off_bus(seen: _Seen) -> Walked:
    smi, query = seen.evidence[SMI.name], seen.evidence[SMI_QUERY.name]
    off = _xid_79_lines(seen.evidence[xid_log.KERNEL_XIDS.name])
    lost = _lines_saying(smi, *_LOST_GPU) or _lines_saying(query, *_LOST_GPU)
    if smi.exit_code == _SMI_LOST_GPU_EXIT and not lost:
        lost = [f"nvidia-smi exited {_SMI_LOST_GPU_EXIT}: a GPU fell off the bus"]
    count = seen.results["gpu-count"]
    counted = seen.said("gpu-count") if count.status is Status.FAIL else ""
    if off or lost:
        return _walked("gpu-fallen-off-bus", True, *off[-3:], *lost[:3], counted)
    if count.status is Status.FAIL:
        return _walked(
            "gpu-fallen-off-bus",
            None,
            counted,
            "no XID 79 and no lost GPU in nvidia-smi's output: `lspci -d 10de:` shows what the "
            "bus still sees",
        )
    log_read = seen.status("xid-log") in (Status.PASS, Status.WARN, Status.FAIL)
    found = False if log_read or seen.answers else None
    return _walked("gpu-fallen-off-bus", found, seen.said("xid-log"), seen.said("gpu-count"))


def _yes(value: str) -> bool:
    return value.strip().casefold() == "yes"


def remap_rows(evidence: Evidence) -> list[tuple[str, bool, bool]]:
    """(GPU bus id, remap pending, remap failed) per GPU of the remapped-rows query."""
    output = evidence[row_remap.REMAPPED_ROWS.name]
    if not output.ok:
        return []
    rows = csv.reader(output.stdout.splitlines(), skipinitialspace=True)
    return [(r[0].strip(), _yes(r[3]), _yes(r[4])) for r in rows if len(r) == 5]


def _row_remap_pending(seen: _Seen) -> Walked:
    rows = remap_rows(seen.evidence)
    said = seen.said("row-remap")
    flagged = [
        f"GPU {bus}: " + ", ".join(w for w, on in (("remap pending", p), ("remap failed", f)) if on)
        for bus, p, f in rows
        if p or f
    ]
    if flagged:
        return _walked("row-remap-pending", True, *flagged, said)
    unsupported = "not supported" in _text(seen.evidence[row_remap.REMAPPED_ROWS.name]).casefold()
    found = False if rows or unsupported else None
    return _walked("row-remap-pending", found, said)


_WALK = (
    _no_nvidia_gpu,
    _driver_not_loaded,
    _no_driver_installed,
    _nouveau_loaded,
    _secure_boot_unsigned,
    _kernel_headers_missing,
    _dkms_not_built,
    _library_mismatch,
    _fabric_manager_down,
    _persistence_off,
    _gpu_fallen_off_bus,
    _row_remap_pending,
)
CAUSE_ORDER: tuple[str, ...] = tuple(ABOUT)
"""The causes in walk order."""


def _cause(walked: Walked) -> Cause:
    about = ABOUT[walked.cause_id]
    return Cause(walked.cause_id, about.title, about.explanation, walked.evidence)


def diagnose(evidence: Evidence, context: Context) -> Diagnosis:
    """Judge the checks the diagnosis reads, then walk the causes in `CAUSE_ORDER`."""
    results = judge_all(DIAGNOSIS_CHECKS, dict(evidence), context)
    seen = _Seen(evidence, {r.id: r for r in results})
    walk = tuple(step(seen) for step in _WALK)
    distro = parse_distro(evidence[OS_RELEASE.name], evidence[UNAME.name])
    found = [w for w in walk if w.found]
    if walk[0].found:  # no GPU: every other cause follows from it, and no plan can help
        found = [walk[0]]
    causes = tuple(_cause(w) for w in found)
    return Diagnosis(context.host, distro, walk, causes, results)
