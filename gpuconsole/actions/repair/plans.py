"""What fixes each cause, as exact command lines for the host's distribution family.

Every value put in a command (a package, a version, a kernel release, a GPU's bus id) comes from
the host's own output, so it is validated against a strict pattern and shell-quoted; a value that
fails gives a plan with no steps and a note naming it, never a command holding it. Commands are
plain: the engine runs them through `sudo -n` unless a step says `root=False`.

Plans whose commands are the same everywhere (modprobe, dkms, systemctl, nvidia-smi, the signing
tools) have steps on any distribution. Those that need the package manager or the initramfs tool
have, on a distribution of unknown family, no steps and notes saying what to do by hand: a
half-applied fix (nouveau blacklisted but the initramfs not rebuilt) would look done and not be.

Facts come from shared/reference/gpu-facts.md ("Driver failure modes", its note on the guide's
flow) unless a comment names another source.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from gpuconsole.actions.repair.diagnosis import (
    UBUNTU_DRIVERS,
    installed_packages,
    module_file_version,
    nvidia_dkms_entries,
    remap_rows,
)
from gpuconsole.actions.repair.model import Cause, Diagnosis, Distro, Family, Plan, Step
from gpuconsole.actions.verify.model import Evidence, Status
from gpuconsole.actions.verify.probes import DRIVER_VERSION, NO_GPU_REMEDY, driver_module_version

PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~_-]{0,127}")
"""Package names, versions, kernel releases, DKMS module names: nothing a shell would read."""
PCI_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
"""A GPU as nvidia-smi names it: 00000000:3B:00.0."""


@dataclass(frozen=True, slots=True)
class PlanFacts:
    """What the plans need to know about the host's driver, read from the evidence."""

    loaded_version: str | None = None
    """The kernel module running now (/proc/driver/nvidia/version)."""
    packaged_version: str | None = None
    """The driver installed on disk: the module file's version, else DKMS's, else a package's."""
    branch: str | None = None
    """The driver's major version, "535": Ubuntu and NVIDIA name packages after it."""
    kernel: str | None = None
    dkms_module: str | None = None
    """The nvidia module's DKMS name: "nvidia", or "nvidia-srv" for Ubuntu's -server flavour."""
    dkms_version: str | None = None
    nvswitch: bool = False
    recommended: str | None = None
    """The server driver package `ubuntu-drivers devices` offers for these GPUs."""
    driver_packages: tuple[str, ...] = ()
    """Installed packages at the installed driver's version: what to hold."""
    fabric_manager_installed: bool = False
    remap_gpus: tuple[str, ...] = ()
    """Bus ids of the GPUs with a row remap pending or failed."""


# -- facts from the evidence -----------------------------------------------------------------


def _upstream(version: str) -> str:
    """535.154.05 from a package version such as 535.154.05-0ubuntu0.22.04.1 or 535.154.05-1.el9."""
    return version.split(":")[-1].split("-")[0]


def _same_release(package_version: str, driver: str) -> bool:
    upstream = _upstream(package_version)
    return upstream == driver or upstream.startswith(f"{driver}.")


_SERVER_DRIVER = re.compile(r"nvidia-driver-(\d+)-server(-open)?")
_DESKTOP_DRIVER = re.compile(r"nvidia-driver-(\d+)(-open)?")


def _offered_drivers(output_text: str) -> tuple[list[str], str | None]:
    """The driver packages of `ubuntu-drivers devices`, and the one it marks recommended."""
    offered, recommended = [], None
    for line in output_text.splitlines():
        key, _, value = line.partition(":")
        words = value.split()
        if key.strip() != "driver" or not words:
            continue
        offered.append(words[0])
        if "recommended" in words:
            recommended = words[0]
    return offered, recommended


def recommended_server_driver(output_text: str) -> str | None:
    """The server flavour to install: the recommended package when it is one, else the server
    package of the recommended branch and flavour (open or not), else the newest server package
    offered, the open flavour first (ubuntu-drivers offers it only for GPUs that support it;
    NVIDIA recommends the open modules from Turing on and requires them from Blackwell on).
    ubuntu-drivers often recommends the desktop flavour even on a server."""
    offered, recommended = _offered_drivers(output_text)
    servers = [p for p in offered if _SERVER_DRIVER.fullmatch(p)]
    if recommended in servers:
        return recommended
    desktop = _DESKTOP_DRIVER.fullmatch(recommended or "")
    if desktop:
        twin = f"nvidia-driver-{desktop[1]}-server{desktop[2] or ''}"
        if twin in servers:
            return twin
    if not servers:
        return None
    return max(servers, key=lambda package: (int(package.split("-")[2]), package.endswith("-open")))


def _packaged_version(evidence: Evidence) -> str | None:
    dkms = [entry.version for entry in nvidia_dkms_entries(evidence)]
    packages = [
        _upstream(version)
        for name, version in installed_packages(evidence)
        if name.startswith(("nvidia-driver", "libnvidia-compute"))
    ]
    return (
        module_file_version(evidence) or (dkms[-1] if dkms else None) or next(iter(packages), None)
    )


def _dkms_entry(evidence: Evidence, kernel: str | None) -> tuple[str | None, str | None]:
    """The nvidia DKMS entry to build: the last one not installed for the running kernel."""
    entries = nvidia_dkms_entries(evidence)
    unbuilt = [e for e in entries if not (e.kernel == kernel and e.state.startswith("installed"))]
    if not (unbuilt or entries):
        return None, None
    chosen = (unbuilt or entries)[-1]
    return chosen.module, chosen.version


def facts_from(evidence: Evidence, diagnosis: Diagnosis) -> PlanFacts:
    """The facts the plans need, from the probes' outputs and the diagnosis' check results."""
    loaded = driver_module_version(evidence[DRIVER_VERSION.name])
    packaged = _packaged_version(evidence)
    driver = packaged or loaded
    kernel = diagnosis.distro.kernel
    module, version = _dkms_entry(evidence, kernel)
    results = {r.id: r.status for r in diagnosis.results}
    names = [name for name, _ in installed_packages(evidence)]
    drivers_ubuntu_offers = evidence[UBUNTU_DRIVERS.name]
    return PlanFacts(
        loaded_version=loaded,
        packaged_version=packaged,
        branch=driver.split(".")[0] if driver else None,
        kernel=kernel,
        dkms_module=module,
        dkms_version=version,
        nvswitch=results.get("fabric-manager", Status.SKIP) is not Status.SKIP,
        recommended=recommended_server_driver(drivers_ubuntu_offers.stdout)
        if drivers_ubuntu_offers.ok
        else None,
        driver_packages=tuple(
            name
            for name, package_version in installed_packages(evidence)
            if driver and _same_release(package_version, driver)
        ),
        fabric_manager_installed=any(
            name.startswith(("nvidia-fabricmanager", "cuda-drivers-fabricmanager"))
            for name in names
        ),
        remap_gpus=tuple(bus for bus, pending, failed in remap_rows(evidence) if pending or failed),
    )


# -- building commands safely ----------------------------------------------------------------


class _NoSteps(Exception):
    """The plan cannot be given as commands; the notes say why and what to do instead."""

    def __init__(self, *notes: str) -> None:
        super().__init__(notes[0])
        self.notes = notes


def _valid(value: str | None, what: str, pattern: re.Pattern[str] = PLAIN_NAME) -> str:
    """``value`` when it fits ``pattern`` whole; otherwise no command may be built with it."""
    if value is None:
        raise _NoSteps(f"The {what} is not known, so no command can name it.")
    if not pattern.fullmatch(value):
        raise _NoSteps(
            f"Refused: the {what} {value!r} is not a plain name (letters, digits and . + ~ _ - "
            "only), so no command was built with it. Check the host by hand."
        )
    return value


def _words(*words: str) -> str:
    """A command line of validated words, each shell-quoted."""
    return " ".join(shlex.quote(word) for word in words)


def _sh(script: str, *arguments: str) -> str:
    """`sh -c` for a line with redirections or conditions; values go in as $1.. never into the
    script's text."""
    return _words("sh", "-c", script, *(("sh", *arguments) if arguments else ()))


def _by_hand(distro: Distro, what: str) -> _NoSteps:
    name = distro.id or "this distribution"
    return _NoSteps(
        f"{name} is neither Debian- nor RHEL-like, so no command is run for it. By hand: {what}"
    )


Built = tuple[tuple[Step, ...], tuple[str, ...]]


# -- the plans -------------------------------------------------------------------------------


def _load_the_driver(distro: Distro, facts: PlanFacts) -> Built:
    steps = (
        Step("Load the NVIDIA kernel module", "modprobe nvidia"),
        Step("Check that nvidia-smi answers", "nvidia-smi", root=False, timeout=60.0),
    )
    notes = (
        "Run the plans of the other causes found first: this only loads the module. If modprobe "
        "fails, its message names why: 'Key was rejected by service' (Secure Boot), 'Module "
        "nvidia not found' (not built for this kernel: headers, DKMS), 'No such device' (nouveau "
        "holds the GPU, or the kernel sees no NVIDIA GPU: `lspci -d 10de:`).",
    )
    return steps, notes


_BLACKLIST_NOUVEAU = (
    'printf "blacklist nouveau\\noptions nouveau modeset=0\\n" '
    "> /etc/modprobe.d/blacklist-nouveau.conf"
)
_INITRAMFS = {Family.DEBIAN: "update-initramfs -u", Family.RHEL: "dracut --force"}


def _blacklist_nouveau(distro: Distro, facts: PlanFacts) -> Built:
    rebuild = _INITRAMFS.get(distro.family)
    if rebuild is None:
        raise _by_hand(
            distro,
            "write `blacklist nouveau` and `options nouveau modeset=0` to "
            "/etc/modprobe.d/blacklist-nouveau.conf, rebuild the initramfs with this "
            "distribution's tool (mkinitcpio -P on Arch) and reboot.",
        )
    steps = (
        Step("Blacklist nouveau", _sh(_BLACKLIST_NOUVEAU)),
        Step("Rebuild the initramfs without nouveau", rebuild),
    )
    return steps, ()


# DKMS 3 signs the modules it builds with this key pair, creating it when absent (dkms(8),
# mok_signing_key / mok_certificate): signing with it keeps later DKMS builds loadable.
_MOK_KEY = "/var/lib/dkms/mok.key"
_MOK_CERT = "/var/lib/dkms/mok.pub"
_MAKE_KEY = (
    f"test -s {_MOK_KEY} || {{ mkdir -p /var/lib/dkms && openssl req -new -x509 -nodes "
    '-newkey rsa:2048 -days 36500 -subj "/CN=DKMS module signing key/" '
    f"-keyout {_MOK_KEY} -outform DER -out {_MOK_CERT}; }}"
)
# The kernel's own sign-file (NVIDIA driver README, "Signing the NVIDIA Kernel Module"), from the
# headers of the kernel in $1; compressed modules (.ko.zst, .ko.xz) must be unpacked first.
_SIGN_MODULES = (
    'sign="/lib/modules/$1/build/scripts/sign-file"; '
    '[ -x "$sign" ] || { echo "no $sign: install the headers of kernel $1 first" >&2; exit 1; }; '
    "signed=0; "
    "for module in nvidia nvidia_modeset nvidia_drm nvidia_uvm nvidia_peermem; do "
    'file=$(modinfo -k "$1" -n "$module" 2>/dev/null) || continue; '
    'case "$file" in *.ko) ;; *) echo "$file is compressed: unpack it, sign it, pack it" >&2; '
    "exit 1 ;; esac; "
    f'"$sign" sha256 {_MOK_KEY} {_MOK_CERT} "$file" || exit 1; '
    'echo "signed $file"; signed=$((signed + 1)); done; '
    '[ "$signed" -gt 0 ] || { echo "no nvidia module for kernel $1" >&2; exit 1; }'
)


def _sign_the_module(distro: Distro, facts: PlanFacts) -> Built:
    kernel = _valid(facts.kernel, "kernel release")
    steps = (
        Step("Create a module signing key (an existing one is kept)", _sh(_MAKE_KEY)),
        Step(f"Sign the nvidia modules of kernel {kernel}", _sh(_SIGN_MODULES, kernel)),
    )
    notes = (
        f"Enroll the key yourself, at a terminal: `sudo mokutil --import {_MOK_CERT}` asks for "
        "a one-time password of your choice (it cannot run unattended).",
        "Then reboot with someone at the console: a blue 'MOK management' screen appears for a "
        "few seconds; press a key, choose 'Enroll MOK', 'Continue', 'Yes', type the one-time "
        "password, then 'Reboot'. If the screen is missed, the key is not enrolled: import it "
        "again.",
        "DKMS 3 signs its later builds with this key pair by default, so kernel updates keep "
        "loading. Where DKMS is configured with another key (older Ubuntu releases use "
        "/var/lib/shim-signed/mok/), point mok_signing_key and mok_certificate in "
        "/etc/dkms/framework.conf at this pair, or enroll that key as well.",
        "The other way out is turning Secure Boot off in the firmware setup.",
    )
    return steps, notes


_HEADERS = {
    Family.DEBIAN: lambda kernel: _words("apt-get", "install", "-y", f"linux-headers-{kernel}"),
    Family.RHEL: lambda kernel: _words(
        "dnf", "install", "-y", f"kernel-devel-{kernel}", f"kernel-headers-{kernel}"
    ),
}


def _headers_step(distro: Distro, facts: PlanFacts) -> Step:
    kernel = _valid(facts.kernel, "kernel release")
    install = _HEADERS.get(distro.family)
    if install is None:
        raise _by_hand(distro, f"install the headers of kernel {kernel} with its package tool.")
    return Step(f"Install the headers of kernel {kernel}", install(kernel), timeout=900.0)


def _install_headers(distro: Distro, facts: PlanFacts) -> Built:
    notes = (
        "On Debian and Ubuntu, installing the headers also runs DKMS for that kernel; the "
        "dkms-not-built plan builds the module if it did not.",
    )
    return (_headers_step(distro, facts),), notes


def _build_with_dkms(distro: Distro, facts: PlanFacts) -> Built:
    module = _valid(facts.dkms_module, "DKMS module name")
    version = _valid(facts.dkms_version, "DKMS module version")
    kernel = _valid(facts.kernel, "kernel release")
    where = ("-m", module, "-v", version, "-k", kernel)
    steps = (
        Step(
            f"Build {module} {version} for kernel {kernel}",
            _words("dkms", "build", *where),
            timeout=1800.0,
        ),
        Step(f"Install it for kernel {kernel}", _words("dkms", "install", *where)),
        Step("Load the NVIDIA kernel module", "modprobe nvidia"),
    )
    notes = (
        f"If the build fails, /var/lib/dkms/{module}/{version}/build/make.log says why: missing "
        "headers (see kernel-headers-missing), or a kernel too new for this driver branch "
        "(boot the previous kernel, or install a newer driver).",
    )
    return steps, notes


def _hold_command(distro: Distro, packages: tuple[str, ...]) -> tuple[Step, ...]:
    if distro.family is Family.DEBIAN:
        return (Step("Hold the driver packages", _words("apt-mark", "hold", *packages)),)
    if distro.family is Family.RHEL:
        return (
            Step(
                "Install dnf's versionlock plugin",
                _words("dnf", "install", "-y", "dnf-command(versionlock)"),
            ),
            Step("Lock the driver packages", _words("dnf", "versionlock", "add", *packages)),
        )
    raise _by_hand(distro, "reboot, then hold the NVIDIA packages with its package tool.")


def _reboot_and_hold(distro: Distro, facts: PlanFacts) -> Built:
    if not facts.driver_packages:
        raise _NoSteps(
            "No installed package at the driver's version was found to hold: reboot, then hold "
            "the NVIDIA packages by hand (`dpkg -l '*nvidia*'` or `rpm -qa '*nvidia*'`)."
        )
    packages = tuple(_valid(p, "package name") for p in facts.driver_packages)
    notes = (
        "Reboot: it loads the kernel module of the installed driver, which matches the library. "
        "Reloading the module without a reboot needs every GPU user stopped first (jobs, "
        "nvidia-persistenced, nvidia-fabricmanager, monitoring agents, a display server): "
        "`systemctl stop nvidia-persistenced`, then `modprobe -r nvidia_uvm nvidia_drm "
        "nvidia_modeset nvidia` and `modprobe nvidia`; one forgotten user makes it fail halfway, "
        "so the reboot is the default.",
        "The hold stops unattended upgrades from replacing the driver under a running module "
        "again. Lift it for a planned upgrade: `apt-mark unhold ...` or `dnf versionlock delete "
        "...`.",
    )
    return _hold_command(distro, packages), notes


_ENABLE_FABRIC_MANAGER = Step(
    "Start Fabric Manager, and at every boot", "systemctl enable --now nvidia-fabricmanager"
)


def _fabric_manager_package(distro: Distro, facts: PlanFacts) -> Step:
    """Fabric Manager's packages are named per branch, nvidia-fabricmanager-<branch>, on both
    families (NVIDIA/apt-packaging-fabric-manager, NVIDIA/yum-packaging-fabric-manager)."""
    version = _valid(facts.loaded_version or facts.packaged_version, "driver version")
    package = f"nvidia-fabricmanager-{version.split('.')[0]}"
    if distro.family is Family.DEBIAN:
        return Step(
            f"Install {package}", _words("apt-get", "install", "-y", package), timeout=900.0
        )
    if distro.family is Family.RHEL:
        return Step(
            f"Install {package} {version}",
            _words("dnf", "install", "-y", f"{package}-{version}"),
            timeout=900.0,
        )
    raise _by_hand(
        distro, f"install {package} at exactly version {version}, then enable the service."
    )


def _start_fabric_manager(distro: Distro, facts: PlanFacts) -> Built:
    notes = (
        "Fabric Manager must be exactly the driver's version, or it refuses to start: "
        "`journalctl -u nvidia-fabricmanager` says so. On Debian/Ubuntu, `apt-cache policy "
        "nvidia-fabricmanager-<branch>` shows the versions offered; install the one matching "
        "the driver with `apt-get install nvidia-fabricmanager-<branch>=<version>`.",
    )
    if facts.fabric_manager_installed:
        return (_ENABLE_FABRIC_MANAGER,), notes
    return (_fabric_manager_package(distro, facts), _ENABLE_FABRIC_MANAGER), notes


def _start_persistenced(distro: Distro, facts: PlanFacts) -> Built:
    steps = (
        Step(
            "Start nvidia-persistenced, and at every boot",
            "systemctl enable --now nvidia-persistenced",
        ),
    )
    notes = (
        "If the unit does not exist, the daemon comes with the driver's utilities "
        "(nvidia-compute-utils-<branch> on Ubuntu, nvidia-persistenced from NVIDIA's "
        "repository).",
    )
    return steps, notes


def _find_the_gpu(distro: Distro, facts: PlanFacts) -> Built:
    notes = (
        "No command here brings a GPU the bus does not show: no driver is installed or loaded "
        "for it.",
        f"{NO_GPU_REMEDY} Then run the repair again.",
    )
    return (), notes


def _reboot_for_lost_gpu(distro: Distro, facts: PlanFacts) -> Built:
    notes = (
        "A GPU that fell off the bus (XID 79) does not come back with a GPU reset; NVIDIA's "
        "XID catalog says reboot the node. Drain its jobs first.",
        "If it happens again, it is hardware: reseat the GPU and its riser, check its power "
        "cables, and watch its temperature and power under load.",
    )
    return (), notes


# Resets only an idle GPU: a PID line from the compute-apps query means a job still runs there.
_RESET_WHEN_IDLE = (
    'if nvidia-smi --query-compute-apps=pid --format=csv,noheader -i "$1" | grep -q "^[0-9]"; '
    'then echo "GPU $1 runs processes: stop them, or reboot instead" >&2; exit 1; fi; '
    'nvidia-smi -r -i "$1"'
)


def _reset_remapping_gpus(distro: Distro, facts: PlanFacts) -> Built:
    if not facts.remap_gpus:
        raise _NoSteps("No GPU with a pending or failed remap is known: read the row-remap check.")
    gpus = [_valid(bus, "GPU bus id", PCI_BUS_ID) for bus in facts.remap_gpus]
    steps = tuple(
        Step(f"Reset GPU {bus} if no process uses it", _sh(_RESET_WHEN_IDLE, bus), timeout=120.0)
        for bus in gpus
    )
    notes = (
        "If a reset is refused (processes on the GPU, or an NVSwitch system that resets its "
        "GPUs only together), reboot the node instead: the remap happens at any GPU reset.",
        "A remap failure that stays after the reset means the GPU has no spare rows left: "
        "drain it and contact the vendor (RMA).",
    )
    return steps, notes


_SERVER_PACKAGES_NOTE = (
    "The guide installs driver 470 from the graphics-drivers PPA on Ubuntu 20.04. Today 470 is "
    "a legacy branch that does not support Hopper (H100, H200) or newer GPUs, the PPA packages "
    "drivers for desktops, and Ubuntu 20.04 is past its standard support. Servers take the "
    "distribution's nvidia-driver-<branch>-server packages (or NVIDIA's CUDA repository); from "
    "Blackwell on only the open kernel modules work: the -open flavours."
)


def _install_on_ubuntu(distro: Distro, facts: PlanFacts) -> Built:
    listing = Step(
        "List the server drivers Ubuntu offers for these GPUs",
        "ubuntu-drivers list --gpgpu",
        root=False,
        timeout=120.0,
    )
    branch = facts.branch and f"nvidia-driver-{facts.branch}-server"
    package = facts.recommended or branch
    if package is None:
        note = (
            "No server driver is known for these GPUs: pick the newest "
            "nvidia-driver-<branch>-server the listing shows (-server-open on Blackwell) and "
            "install it with `apt-get install -y nvidia-driver-<branch>-server`."
        )
        return (listing,), (note,)
    package = _valid(package, "driver package")
    install = Step(
        f"Install {package}", _words("apt-get", "install", "-y", package), timeout=1800.0
    )
    return (listing, _headers_step(distro, facts), install), ()


def _install_on_debian(distro: Distro, facts: PlanFacts) -> Built:
    # wiki.debian.org/NvidiaGraphicsDrivers: nvidia-driver with firmware-misc-nonfree, from the
    # contrib, non-free and non-free-firmware components; nvidia-smi is its own package there.
    install = Step(
        "Install Debian's NVIDIA driver",
        _words("apt-get", "install", "-y", "nvidia-driver", "firmware-misc-nonfree", "nvidia-smi"),
        timeout=1800.0,
    )
    notes = (
        "Debian's driver comes from its contrib, non-free and non-free-firmware components: "
        "enable them in /etc/apt/sources.list and `apt-get update` if the install cannot find "
        "the package. For a newer branch than Debian packages, use NVIDIA's CUDA repository.",
    )
    return (_headers_step(distro, facts), install), notes


def _install_on_rhel(distro: Distro, facts: PlanFacts) -> Built:
    notes = (
        "The driver itself comes from NVIDIA's CUDA repository, which this plan does not add: "
        "trusting a third-party repository is your decision. Add it with `dnf config-manager "
        "--add-repo https://developer.download.nvidia.com/compute/cuda/repos/rhel<major>/"
        "<arch>/cuda-rhel<major>.repo`, install the driver as NVIDIA's driver installation "
        "guide says for this release (a DKMS build, the open flavour from Blackwell on; EPEL "
        "provides dkms), then reboot.",
    )
    return (_headers_step(distro, facts),), notes


def _install_driver(distro: Distro, facts: PlanFacts) -> Built:
    if distro.id == "ubuntu":
        steps, notes = _install_on_ubuntu(distro, facts)
    elif distro.family is Family.DEBIAN:
        steps, notes = _install_on_debian(distro, facts)
    elif distro.family is Family.RHEL:
        steps, notes = _install_on_rhel(distro, facts)
    else:
        raise _by_hand(
            distro,
            "install the NVIDIA driver from its packages (or NVIDIA's .run installer), then "
            f"reboot. {_SERVER_PACKAGES_NOTE}",
        )
    fabric = (
        ("An NVSwitch system also needs nvidia-fabricmanager-<branch> at the driver's version.",)
        if facts.nvswitch
        else ()
    )
    return steps, (*notes, *fabric, _SERVER_PACKAGES_NOTE)


@dataclass(frozen=True, slots=True)
class _Recipe:
    title: str
    outcome: str
    build: Callable[[Distro, PlanFacts], Built]
    reboot: bool = False


_INSTALL = _Recipe(
    "Install the NVIDIA server driver",
    "After the reboot, driver-loaded and nvidia-smi pass: nvidia-smi lists every GPU.",
    _install_driver,
    reboot=True,
)
_RECIPES: dict[str, _Recipe] = {
    "no-nvidia-gpu": _Recipe(
        "Find the GPU: nothing to install or load without one",
        "The driver-loaded check no longer says there is no NVIDIA GPU on this machine.",
        _find_the_gpu,
    ),
    "driver-not-loaded": _Recipe(
        "Load the NVIDIA driver",
        "driver-loaded and nvidia-smi pass: /proc/driver/nvidia/version names the driver and "
        "nvidia-smi lists the GPUs.",
        _load_the_driver,
    ),
    "no-driver-installed": _INSTALL,
    "nouveau-loaded": _Recipe(
        "Blacklist nouveau and rebuild the initramfs",
        "After the reboot, the nouveau check passes (nouveau is not in /proc/modules) and the "
        "NVIDIA driver can load.",
        _blacklist_nouveau,
        reboot=True,
    ),
    "secure-boot-unsigned": _Recipe(
        "Sign the NVIDIA modules for Secure Boot",
        "After the key is enrolled and the host rebooted, the secure-boot check names the "
        "module's signer and driver-loaded passes.",
        _sign_the_module,
        reboot=True,
    ),
    "kernel-headers-missing": _Recipe(
        "Install the running kernel's headers",
        "The kernel-headers check passes: /lib/modules/<kernel>/build exists.",
        _install_headers,
    ),
    "dkms-not-built": _Recipe(
        "Build the driver with DKMS for the running kernel",
        "The dkms check shows the module installed for the running kernel, and driver-loaded "
        "passes.",
        _build_with_dkms,
    ),
    "library-mismatch": _Recipe(
        "Reboot onto the installed driver, and hold its packages",
        "After the reboot, nvidia-smi answers and nvml-driver-match passes: the NVML library "
        "and the kernel module have the same version.",
        _reboot_and_hold,
        reboot=True,
    ),
    "fabric-manager-down": _Recipe(
        "Install and start Fabric Manager",
        "The fabric-manager check passes: nvidia-fabricmanager is active and every GPU's "
        "fabric state is Completed.",
        _start_fabric_manager,
    ),
    "persistence-off": _Recipe(
        "Run nvidia-persistenced",
        "The persistence-mode check passes on every GPU, and nvidia-persistenced is active.",
        _start_persistenced,
    ),
    "gpu-fallen-off-bus": _Recipe(
        "Reboot to bring the lost GPU back",
        "After the reboot, gpu-count passes and xid-log shows no XID 79 in this boot.",
        _reboot_for_lost_gpu,
        reboot=True,
    ),
    "row-remap-pending": _Recipe(
        "Reset the GPUs waiting for a row remap",
        "The row-remap check shows no remap pending or failed.",
        _reset_remapping_gpus,
    ),
}


def _plan(cause_id: str, recipe: _Recipe, distro: Distro, facts: PlanFacts) -> Plan:
    try:
        steps, notes = recipe.build(distro, facts)
    except _NoSteps as refused:
        steps, notes = (), refused.notes
    return Plan(cause_id, recipe.title, steps, recipe.outcome, recipe.reboot, notes)


def plan_for(cause: Cause, distro: Distro, facts: PlanFacts) -> Plan | None:
    """The plan that fixes ``cause`` here; None for a cause this module has no plan for. A plan
    that cannot be given as safe commands has no steps, and notes saying why and what to do."""
    recipe = _RECIPES.get(cause.id)
    return None if recipe is None else _plan(cause.id, recipe, distro, facts)


def install_plan(distro: Distro, facts: PlanFacts) -> Plan:
    """Install a driver where none is: the no-driver-installed cause's plan."""
    return _plan("no-driver-installed", _INSTALL, distro, facts)
