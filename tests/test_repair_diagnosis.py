"""The diagnosis walk on recorded outputs: the real H200 recording (healthy), and one broken host
per cause, each built from that recording by replacing the outputs that change.

Every replaced output is written from a documented format, not recorded: the messages and forms
in shared/reference/gpu-facts.md ("Driver failure modes", "XID errors", "nvidia-smi exit codes"),
os-release(5) and each distribution's /etc/os-release, `dkms status` and `systemctl is-active`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_verify_h200 import NEWER_THAN_THE_RECORDING

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.repair.diagnosis import (
    CAUSE_ORDER,
    DIAGNOSIS_CHECKS,
    diagnose,
    parse_distro,
    probes,
)
from gpuconsole.actions.repair.model import Diagnosis, Family
from gpuconsole.hosts.targets import Context

RECORDED = Path(__file__).parent / "fixtures" / "verify" / "h200-probes.json"
KERNEL = "5.15.0-91-generic"

# Documented format (os-release(5); the file Ubuntu 24.04 ships): the recorded host is an
# Ubuntu 24.04 VM, whose recording predates these repair probes.
UBUNTU_24_04 = (
    'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\n'
    "ID_LIKE=debian\n"
)


def out(stdout: str = "", exit_code: int | None = 0, stderr: str = "") -> CommandOutput:
    return CommandOutput("(replaced)", exit_code, stdout, stderr)


def healthy() -> dict[str, CommandOutput]:
    """The H200 recording, plus the repair probes as that host would answer them: no systemctl
    and no modinfo there (the recording shows both missing), dpkg without NVIDIA packages (its
    driver comes with the VM image), no ubuntu-drivers, a clean kernel log."""
    evidence = {
        name: CommandOutput(**fields) for name, fields in json.loads(RECORDED.read_text()).items()
    }
    evidence.update(
        {
            "os-release": out(UBUNTU_24_04),
            "persistenced": out(exit_code=127),
            "module-file": out(exit_code=127),
            "driver-packages": out(""),
            "ubuntu-drivers": out(exit_code=127),
            "module-load-log": out(""),
        }
    )
    return evidence


CANNOT_COMMUNICATE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running.\n"
)
SMI_PROBES = (
    "smi",
    "smi-query",
    "smi-details",
    "remapped-rows",
    "nvlink-status",
    "ecc-counts",
)


def driver_down(**replaced: CommandOutput) -> dict[str, CommandOutput]:
    """An installed 535 driver that is not loaded: nvidia-smi exits 9, no
    /proc/driver/nvidia/version, no nvidia in /proc/modules, a DKMS build for this kernel."""
    evidence = healthy()
    for name in SMI_PROBES:
        evidence[name] = out(CANNOT_COMMUNICATE, 9)
    evidence.update(
        {
            "driver-version": out(
                "", 1, "cat: /proc/driver/nvidia/version: No such file or directory\n"
            ),
            "modules": out("ext4 1015808 1 - Live 0xffffffffc0a00000\n"),
            "uname": out(f"{KERNEL}\n"),
            "kernel-tree": out(f"present /lib/modules/{KERNEL}/build\n"),
            "dkms": out(f"nvidia/535.129.03, {KERNEL}, x86_64: installed\n"),
            "module-file": out("535.129.03\n"),
            "driver-packages": out(
                "nvidia-driver-535 535.129.03-0ubuntu1\nnvidia-dkms-535 535.129.03-0ubuntu1\n"
            ),
            "secure-boot": out("SecureBoot disabled\n"),
            "module-signer": out("\n"),
            "nvswitches": out(""),
            "fabric-manager-service": out("inactive\n", 3),
        }
    )
    evidence.update(replaced)
    return evidence


def walked(diagnosis: Diagnosis) -> dict[str, bool | None]:
    return {w.cause_id: w.found for w in diagnosis.walk}


def causes(diagnosis: Diagnosis) -> list[str]:
    return [c.id for c in diagnosis.causes]


def run(evidence: dict[str, CommandOutput], expected_gpus: int | None = 1) -> Diagnosis:
    return diagnose(evidence, Context("gpu1", expected_gpus=expected_gpus))


# -- the probes ------------------------------------------------------------------------------


def test_probes_are_the_checks_probes_and_the_repair_ones_each_once() -> None:
    names = [p.name for p in probes()]
    assert len(names) == len(set(names))
    assert set(names) - NEWER_THAN_THE_RECORDING <= set(healthy())
    assert {"os-release", "persistenced", "module-file", "driver-packages"} <= set(names)


def test_the_checks_are_the_verify_checks_themselves() -> None:
    from gpuconsole.actions.verify.checks import CHECKS

    assert all(any(check is c for c in CHECKS) for check in DIAGNOSIS_CHECKS)


# -- the healthy H200 ------------------------------------------------------------------------


def test_the_healthy_h200_has_no_cause_and_nothing_found() -> None:
    diagnosis = run(healthy())
    assert diagnosis.healthy
    assert [w.cause_id for w in diagnosis.walk] == list(CAUSE_ORDER)
    assert all(w.found is not True for w in diagnosis.walk)
    assert all(w.evidence for w in diagnosis.walk)
    assert diagnosis.distro.family is Family.DEBIAN
    assert diagnosis.distro.kernel == "6.18.44-fc-v973-gpu"
    assert {r.id for r in diagnosis.results} == {c.id for c in DIAGNOSIS_CHECKS}


def test_the_walk_follows_the_documented_order() -> None:
    assert CAUSE_ORDER == (
        "no-nvidia-gpu",
        "driver-not-loaded",
        "no-driver-installed",
        "nouveau-loaded",
        "secure-boot-unsigned",
        "kernel-headers-missing",
        "dkms-not-built",
        "library-mismatch",
        "fabric-manager-down",
        "persistence-off",
        "gpu-fallen-off-bus",
        "row-remap-pending",
    )


# -- each cause ------------------------------------------------------------------------------


def test_a_machine_whose_bus_shows_no_nvidia_gpu_gets_no_driver_plan() -> None:
    """No driver installed or loaded, and the bus shows only an NVIDIA audio function: the one
    cause is the missing GPU, and its plan runs nothing (it was a driver install)."""
    from gpuconsole.actions.repair.plans import PlanFacts
    from gpuconsole.actions.repair.session import plans_for

    evidence = driver_down(
        **{
            "nvidia-pci": out("0x040300\n"),
            "module-file": out("", 1, "modinfo: ERROR: Module nvidia not found.\n"),
            "driver-packages": out(""),
            "dkms": out(""),
            "smi": out("", None),
        }
    )
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["no-nvidia-gpu"]
    assert walked(diagnosis)["driver-not-loaded"] is True  # still answered, as a consequence
    (plan,) = plans_for(diagnosis, PlanFacts())
    assert plan.cause_id == "no-nvidia-gpu" and plan.steps == () and not plan.reboot
    assert any("lspci -d 10de:" in note for note in plan.notes)
    with_gpu = run({**evidence, "nvidia-pci": out("0x030200\n0x068000\n")})
    assert "no-nvidia-gpu" not in causes(with_gpu)
    assert walked(with_gpu)["no-nvidia-gpu"] is False
    assert walked(run({**evidence, "nvidia-pci": out("", 1)}))["no-nvidia-gpu"] is None


def test_a_driver_that_is_installed_but_not_loaded() -> None:
    diagnosis = run(driver_down())
    assert causes(diagnosis) == ["driver-not-loaded"]
    found = walked(diagnosis)
    assert found["no-driver-installed"] is False
    # read through the driver, which does not answer: cannot tell
    assert found["persistence-off"] is None
    assert found["fabric-manager-down"] is None
    assert found["row-remap-pending"] is None
    first = diagnosis.causes[0]
    assert any("couldn't communicate" in line for line in first.evidence)
    assert "modprobe nvidia" in first.explanation


def test_no_driver_installed_at_all() -> None:
    missing = out("", 127, "sh: 1: nvidia-smi: not found\n")
    evidence = driver_down(
        **{name: missing for name in SMI_PROBES},
        **{
            "module-file": out("", 1, "modinfo: ERROR: Module nvidia not found.\n"),
            "dkms": out(exit_code=127),
            "driver-packages": out(""),
            "modules": out("nouveau 2433024 1 - Live 0xffffffffc0800000\n"),
        },
    )
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["driver-not-loaded", "no-driver-installed", "nouveau-loaded"]


def test_a_container_toolkit_alone_is_not_a_driver() -> None:
    evidence = driver_down(
        **{name: out("", 127) for name in SMI_PROBES},
        **{
            "module-file": out("", 1, "modinfo: ERROR: Module nvidia not found.\n"),
            "dkms": out(""),
            "driver-packages": out("nvidia-container-toolkit 1.14.3-1\n"),
        },
    )
    assert walked(run(evidence))["no-driver-installed"] is True


def test_no_driver_installed_cannot_be_told_without_modinfo_or_a_package_tool() -> None:
    evidence = driver_down(
        **{name: out("", 127) for name in SMI_PROBES},
        **{
            "module-file": out(exit_code=127),
            "dkms": out(exit_code=127),
            "driver-packages": out(exit_code=127),
        },
    )
    assert walked(run(evidence))["no-driver-installed"] is None


def test_nouveau_holds_the_gpu() -> None:
    evidence = driver_down(modules=out("nouveau 2433024 1 - Live 0xffffffffc0800000\n"))
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["driver-not-loaded", "nouveau-loaded"]
    assert any(line.startswith("nouveau ") for line in diagnosis.causes[1].evidence)


def test_secure_boot_rejects_the_unsigned_module() -> None:
    evidence = driver_down(
        **{
            "secure-boot": out("SecureBoot enabled\n"),
            "module-signer": out("\n"),
            "module-load-log": out(
                "Dec 02 10:00:01 gpu1 systemd-modules-load[412]: Failed to insert module "
                "'nvidia': Key was rejected by service\n"
            ),
        }
    )
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["driver-not-loaded", "secure-boot-unsigned"]
    lines = diagnosis.causes[1].evidence
    assert any("Key was rejected by service" in line for line in lines)
    assert any("SecureBoot enabled" in line for line in lines)


def test_the_rejection_in_the_log_is_enough_without_mokutil() -> None:
    evidence = driver_down(
        **{
            "secure-boot": out(exit_code=127),
            "module-load-log": out(
                "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\n"
            ),
        }
    )
    assert walked(run(evidence))["secure-boot-unsigned"] is True


def test_missing_headers_after_a_kernel_update() -> None:
    evidence = driver_down(
        **{
            "kernel-tree": out(f"missing /lib/modules/{KERNEL}/build\n"),
            "dkms": out("nvidia/535.129.03, 5.15.0-89-generic, x86_64: installed\n"),
        }
    )
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["driver-not-loaded", "kernel-headers-missing", "dkms-not-built"]


def test_dkms_registered_the_driver_but_never_built_it() -> None:
    evidence = driver_down(dkms=out("nvidia/535.129.03: added\n"))
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["driver-not-loaded", "dkms-not-built"]
    assert any("nvidia/535.129.03: added" in line for line in diagnosis.causes[1].evidence)


def test_missing_headers_are_no_cause_while_the_driver_works() -> None:
    evidence = healthy()
    evidence["kernel-tree"] = out("missing /lib/modules/6.18.44-fc-v973-gpu/build\n")
    diagnosis = run(evidence)
    assert diagnosis.healthy
    step = next(w for w in diagnosis.walk if w.cause_id == "kernel-headers-missing")
    assert step.found is False
    assert any("not a cause now" in line for line in step.evidence)


MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.154\n"
)


def mismatch() -> dict[str, CommandOutput]:
    """Packages upgraded to 535.154.05 under a loaded 535.129.03 module. nvidia-smi exits with
    NVML's error code, 18 (NVML_ERROR_LIB_RM_VERSION_MISMATCH in nvml.h)."""
    evidence = healthy()
    for name in SMI_PROBES:
        evidence[name] = out(MISMATCH, 18)
    evidence.update(
        {
            "driver-version": out(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 "
                "18:56:32 UTC 2023\n"
                "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n"
            ),
            "module-file": out("535.154.05\n"),
            "driver-packages": out(
                "libnvidia-compute-535-server 535.154.05-0ubuntu0.22.04.1\n"
                "nvidia-driver-535-server 535.154.05-0ubuntu0.22.04.1\n"
                "nvidia-container-toolkit 1.14.3-1\n"
            ),
        }
    )
    return evidence


def test_driver_library_version_mismatch() -> None:
    diagnosis = run(mismatch())
    assert causes(diagnosis) == ["library-mismatch"]
    found = walked(diagnosis)
    assert found["driver-not-loaded"] is False
    assert any("535.154" in line for line in diagnosis.causes[0].evidence)


def test_an_hgx_system_with_fabric_manager_inactive() -> None:
    evidence = healthy()
    evidence["nvswitches"] = out(
        "0000:05:00.0\n0000:06:00.0\n0000:07:00.0\n0000:08:00.0\n"
        "nvidia-nvswitch0\nnvidia-nvswitch1\nnvidia-nvswitch2\nnvidia-nvswitch3\n"
    )
    evidence["fabric-manager-service"] = out("inactive\n", 3)
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["fabric-manager-down"]


def test_persistence_mode_off_and_the_daemon_inactive() -> None:
    evidence = healthy()
    query = evidence["smi-query"]
    evidence["smi-query"] = out(query.stdout.replace(", Enabled, Enabled,", ", Disabled, Enabled,"))
    evidence["persistenced"] = out("inactive\n", 3)
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["persistence-off"]
    assert "systemctl is-active nvidia-persistenced: inactive" in diagnosis.causes[0].evidence


def test_the_daemon_inactive_alone_is_found() -> None:
    evidence = healthy()
    evidence["persistenced"] = out("failed\n", 3)
    assert causes(run(evidence)) == ["persistence-off"]


XID_79 = (
    "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=2741, name=python, "
    "GPU has fallen off the bus.\n"
)


def test_xid_79_in_the_kernel_log() -> None:
    evidence = healthy()
    evidence["kernel-xids"] = out("source: dmesg\n" + XID_79)
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["gpu-fallen-off-bus"]
    assert any("Xid (PCI:0000:3b:00): 79" in line for line in diagnosis.causes[0].evidence)


def test_a_gpu_nvidia_smi_calls_lost_with_fewer_gpus_than_expected() -> None:
    evidence = healthy()
    query = evidence["smi-query"]
    evidence["smi-query"] = out(
        query.stdout,
        0,
        "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n",
    )
    diagnosis = run(evidence, expected_gpus=2)
    assert causes(diagnosis) == ["gpu-fallen-off-bus"]
    assert any("1 of 2 expected GPUs visible" in line for line in diagnosis.causes[0].evidence)


def test_fewer_gpus_without_a_sign_of_why_cannot_be_told() -> None:
    diagnosis = run(healthy(), expected_gpus=2)
    assert walked(diagnosis)["gpu-fallen-off-bus"] is None
    assert diagnosis.healthy


def test_a_pending_row_remap() -> None:
    evidence = healthy()
    evidence["remapped-rows"] = out("00000000:00:06.0, 0, 1, Yes, No\n")
    diagnosis = run(evidence)
    assert causes(diagnosis) == ["row-remap-pending"]
    assert "GPU 00000000:00:06.0: remap pending" in diagnosis.causes[0].evidence


def test_every_cause_is_explained_in_plain_words() -> None:
    evidence = driver_down(modules=out("nouveau 2433024 1 - Live 0xffffffffc0800000\n"))
    for cause in run(evidence).causes:
        assert cause.title and len(cause.explanation) > 100


# -- the distribution ------------------------------------------------------------------------

# Documented formats: each distribution's /etc/os-release as it ships.
OS_RELEASES = {
    "ubuntu-22.04": (
        'PRETTY_NAME="Ubuntu 22.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\n'
        'VERSION="22.04.3 LTS (Jammy Jellyfish)"\nVERSION_CODENAME=jammy\nID=ubuntu\n'
        "ID_LIKE=debian\nUBUNTU_CODENAME=jammy\n"
    ),
    "ubuntu-20.04": (
        'NAME="Ubuntu"\nVERSION="20.04.6 LTS (Focal Fossa)"\nID=ubuntu\nID_LIKE=debian\n'
        'PRETTY_NAME="Ubuntu 20.04.6 LTS"\nVERSION_ID="20.04"\n'
    ),
    "debian-12": (
        'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
        'VERSION_ID="12"\nVERSION="12 (bookworm)"\nVERSION_CODENAME=bookworm\nID=debian\n'
    ),
    "rocky-9": (
        'NAME="Rocky Linux"\nVERSION="9.3 (Blue Onyx)"\nID="rocky"\n'
        'ID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\nPLATFORM_ID="platform:el9"\n'
    ),
    "rhel-8": (
        'NAME="Red Hat Enterprise Linux"\nVERSION="8.9 (Ootpa)"\nID="rhel"\n'
        'ID_LIKE="fedora"\nVERSION_ID="8.9"\nPLATFORM_ID="platform:el8"\n'
    ),
    "arch": 'NAME="Arch Linux"\nPRETTY_NAME="Arch Linux"\nID=arch\nBUILD_ID=rolling\n',
}


@pytest.mark.parametrize(
    ("name", "family", "distro_id", "version"),
    [
        ("ubuntu-22.04", Family.DEBIAN, "ubuntu", "22.04"),
        ("ubuntu-20.04", Family.DEBIAN, "ubuntu", "20.04"),
        ("debian-12", Family.DEBIAN, "debian", "12"),
        ("rocky-9", Family.RHEL, "rocky", "9.3"),
        ("rhel-8", Family.RHEL, "rhel", "8.9"),
        ("arch", Family.UNKNOWN, "arch", None),
    ],
)
def test_parse_distro(name: str, family: Family, distro_id: str, version: str | None) -> None:
    distro = parse_distro(out(OS_RELEASES[name]), out(f"{KERNEL}\n"))
    assert (distro.family, distro.id, distro.version_id, distro.kernel) == (
        family,
        distro_id,
        version,
        KERNEL,
    )


def test_parse_distro_without_os_release_or_uname() -> None:
    distro = parse_distro(out("", 1, "cat: /etc/os-release: No such file or directory\n"))
    assert (distro.family, distro.id, distro.kernel) == (Family.UNKNOWN, None, None)


def test_the_diagnosis_names_the_distribution() -> None:
    evidence = driver_down()
    evidence["os-release"] = out(OS_RELEASES["rocky-9"])
    distro = run(evidence).distro
    assert (distro.family, distro.id, distro.kernel) == (Family.RHEL, "rocky", KERNEL)
