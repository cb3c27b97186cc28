"""Is nouveau, the open-source driver, loaded and holding the GPU? The fix is
shared/reference/gpu-facts.md's ("Driver failure modes")."""

from __future__ import annotations

from gpuconsole.actions.verify import probes
from gpuconsole.actions.verify.model import Check, Evidence, Status, Verdict
from gpuconsole.hosts.targets import Context


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


CHECKS: tuple[Check, ...] = (
    Check("nouveau", "nouveau not loaded", (probes.KERNEL_MODULES,), _judge_nouveau),
)
