"""Does Secure Boot accept the driver: is it off, or is the nvidia module signed (or loaded, so
accepted)? The fix is shared/reference/gpu-facts.md's ("Driver failure modes", from the NVIDIA
driver README's "Signing the NVIDIA Kernel Module")."""

from __future__ import annotations

from gpuconsole.actions.verify import probes
from gpuconsole.actions.verify.judging import lines_with
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

SECURE_BOOT = Probe(
    "secure-boot", "command -v mokutil >/dev/null 2>&1 || exit 127; mokutil --sb-state"
)
MODULE_SIGNER = Probe(
    "module-signer",
    f"{probes.WITH_SBIN}command -v modinfo >/dev/null 2>&1 || exit 127; modinfo -F signer nvidia",
)


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
    said = lines_with(state, "secureboot", "secure boot", "efi variables")
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
    if probes.module_driver(evidence) is not None:
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


CHECKS: tuple[Check, ...] = (
    Check(
        "secure-boot",
        "Secure Boot accepts the driver",
        (SECURE_BOOT, MODULE_SIGNER, probes.DRIVER_VERSION),
        _judge_secure_boot,
    ),
)
