"""Can the driver be built for the running kernel: are its headers there, and has DKMS built and
installed the nvidia module for it? The fixes are shared/reference/gpu-facts.md's ("Driver
failure modes")."""

from __future__ import annotations

from dataclasses import dataclass

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.verify import probes
from gpuconsole.actions.verify.judging import no_answer
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

KERNEL_TREE = Probe(
    "kernel-tree",
    'tree="/lib/modules/$(uname -r)"; '
    'if [ -e "$tree/build" ]; then echo "present $tree/build"; '
    'elif [ -d "$tree" ]; then echo "missing $tree/build"; '
    'else echo "absent $tree"; fi',
)
"""One line: "present|missing <tree>/build", or "absent <tree>" when the kernel's module tree
itself is not there (a VM or container whose kernel and modules come from outside)."""
DKMS = Probe("dkms", f"{probes.WITH_SBIN}command -v dkms >/dev/null 2>&1 || exit 127; dkms status")

# -- kernel-headers ------------------------------------------------------------------------------


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


# -- dkms ----------------------------------------------------------------------------------------


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
        return no_answer(DKMS, Status.WARN, "Run `sudo dkms status` by hand.")
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


CHECKS: tuple[Check, ...] = (
    Check(
        "kernel-headers",
        "Headers for the running kernel",
        (KERNEL_TREE, DKMS),
        _judge_kernel_headers,
    ),
    Check("dkms", "DKMS built the driver for this kernel", (DKMS, probes.UNAME), _judge_dkms),
)
