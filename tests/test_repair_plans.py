"""Plans per cause and distribution family: the exact commands, the refusal of hostile values,
and the facts read from a diagnosed host."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gpuconsole.actions.repair.diagnosis import CAUSE_ORDER, diagnose
from gpuconsole.actions.repair.model import Cause, Distro, Family, Plan
from gpuconsole.actions.repair.plans import (
    PlanFacts,
    facts_from,
    install_plan,
    plan_for,
    recommended_server_driver,
)
from gpuconsole.hosts.targets import Context
from tests.test_repair_diagnosis import OS_RELEASES, mismatch, out

KERNEL = "5.15.0-91-generic"
RHEL_KERNEL = "5.14.0-362.8.1.el9_3.x86_64"
GPU = "00000000:3B:00.0"

FACTS = PlanFacts(
    loaded_version="535.129.03",
    packaged_version="535.154.05",
    branch="535",
    kernel=KERNEL,
    dkms_module="nvidia-srv",
    dkms_version="535.154.05",
    nvswitch=True,
    recommended="nvidia-driver-535-server",
    driver_packages=("libnvidia-compute-535-server", "nvidia-driver-535-server"),
    remap_gpus=(GPU,),
)
UBUNTU = Distro(Family.DEBIAN, "ubuntu", "22.04", KERNEL)
DEBIAN = Distro(Family.DEBIAN, "debian", "12", KERNEL)
ROCKY = Distro(Family.RHEL, "rocky", "9.3", RHEL_KERNEL)
ARCH = Distro(Family.UNKNOWN, "arch", None, KERNEL)
DISTROS = (UBUNTU, DEBIAN, ROCKY, ARCH)


def facts_for(distro: Distro) -> PlanFacts:
    return replace(FACTS, kernel=distro.kernel)


def plan(cause_id: str, distro: Distro, facts: PlanFacts | None = None) -> Plan:
    found = plan_for(Cause(cause_id, cause_id, ""), distro, facts or facts_for(distro))
    assert found is not None
    return found


def commands(found: Plan) -> list[str]:
    return [step.command for step in found.steps]


BLACKLIST = (
    'sh -c \'printf "blacklist nouveau\\noptions nouveau modeset=0\\n" '
    "> /etc/modprobe.d/blacklist-nouveau.conf'"
)
RESET = (
    'sh -c \'if nvidia-smi --query-compute-apps=pid --format=csv,noheader -i "$1" '
    '| grep -q "^[0-9]"; then echo "GPU $1 runs processes: stop them, or reboot instead" >&2; '
    'exit 1; fi; nvidia-smi -r -i "$1"\' sh ' + GPU
)
MAKE_KEY = (
    "sh -c 'test -s /var/lib/dkms/mok.key || { mkdir -p /var/lib/dkms && openssl req -new "
    '-x509 -nodes -newkey rsa:2048 -days 36500 -subj "/CN=DKMS module signing key/" '
    "-keyout /var/lib/dkms/mok.key -outform DER -out /var/lib/dkms/mok.pub; }'"
)


def dkms(kernel: str) -> list[str]:
    where = f"-m nvidia-srv -v 535.154.05 -k {kernel}"
    return [f"dkms build {where}", f"dkms install {where}", "modprobe nvidia"]


# (cause, distro) -> the exact commands; [] where the plan has no steps.
EXPECTED: dict[tuple[str, Distro], list[str]] = {
    ("driver-not-loaded", UBUNTU): ["modprobe nvidia", "nvidia-smi"],
    ("driver-not-loaded", ROCKY): ["modprobe nvidia", "nvidia-smi"],
    ("driver-not-loaded", ARCH): ["modprobe nvidia", "nvidia-smi"],
    ("no-driver-installed", UBUNTU): [
        "ubuntu-drivers list --gpgpu",
        f"apt-get install -y linux-headers-{KERNEL}",
        "apt-get install -y nvidia-driver-535-server",
    ],
    ("no-driver-installed", DEBIAN): [
        f"apt-get install -y linux-headers-{KERNEL}",
        "apt-get install -y nvidia-driver firmware-misc-nonfree nvidia-smi",
    ],
    ("no-driver-installed", ROCKY): [
        f"dnf install -y kernel-devel-{RHEL_KERNEL} kernel-headers-{RHEL_KERNEL}"
    ],
    ("no-driver-installed", ARCH): [],
    ("nouveau-loaded", UBUNTU): [BLACKLIST, "update-initramfs -u"],
    ("nouveau-loaded", DEBIAN): [BLACKLIST, "update-initramfs -u"],
    ("nouveau-loaded", ROCKY): [BLACKLIST, "dracut --force"],
    ("nouveau-loaded", ARCH): [],
    ("kernel-headers-missing", UBUNTU): [f"apt-get install -y linux-headers-{KERNEL}"],
    ("kernel-headers-missing", ROCKY): [
        f"dnf install -y kernel-devel-{RHEL_KERNEL} kernel-headers-{RHEL_KERNEL}"
    ],
    ("kernel-headers-missing", ARCH): [],
    ("dkms-not-built", UBUNTU): dkms(KERNEL),
    ("dkms-not-built", ROCKY): dkms(RHEL_KERNEL),
    ("dkms-not-built", ARCH): dkms(KERNEL),
    ("library-mismatch", UBUNTU): [
        "apt-mark hold libnvidia-compute-535-server nvidia-driver-535-server"
    ],
    ("library-mismatch", ROCKY): [
        "dnf install -y 'dnf-command(versionlock)'",
        "dnf versionlock add libnvidia-compute-535-server nvidia-driver-535-server",
    ],
    ("library-mismatch", ARCH): [],
    ("fabric-manager-down", UBUNTU): [
        "apt-get install -y nvidia-fabricmanager-535",
        "systemctl enable --now nvidia-fabricmanager",
    ],
    ("fabric-manager-down", ROCKY): [
        "dnf install -y nvidia-fabricmanager-535-535.129.03",
        "systemctl enable --now nvidia-fabricmanager",
    ],
    ("fabric-manager-down", ARCH): [],
    ("persistence-off", UBUNTU): ["systemctl enable --now nvidia-persistenced"],
    ("persistence-off", ROCKY): ["systemctl enable --now nvidia-persistenced"],
    ("persistence-off", ARCH): ["systemctl enable --now nvidia-persistenced"],
    ("gpu-fallen-off-bus", UBUNTU): [],
    ("gpu-fallen-off-bus", ROCKY): [],
    ("row-remap-pending", UBUNTU): [RESET],
    ("row-remap-pending", ROCKY): [RESET],
    ("row-remap-pending", ARCH): [RESET],
}


@pytest.mark.parametrize(("cause_id", "distro"), list(EXPECTED), ids=lambda v: getattr(v, "id", v))
def test_the_exact_commands(cause_id: str, distro: Distro) -> None:
    assert commands(plan(cause_id, distro)) == EXPECTED[(cause_id, distro)]


@pytest.mark.parametrize("distro", [UBUNTU, ROCKY, ARCH], ids=lambda d: d.id)
def test_secure_boot_signs_unattended_and_leaves_the_enrollment_to_the_admin(
    distro: Distro,
) -> None:
    found = plan("secure-boot-unsigned", distro)
    make_key, sign = commands(found)
    assert make_key == MAKE_KEY
    assert shlex.split(sign)[:2] == ["sh", "-c"]
    assert shlex.split(sign)[-2:] == ["sh", distro.kernel]
    assert "/lib/modules/$1/build/scripts/sign-file" in sign
    assert found.reboot
    assert not any("mokutil" in c for c in commands(found))
    notes = " ".join(found.notes)
    assert "mokutil --import /var/lib/dkms/mok.pub" in notes
    assert "Enroll MOK" in notes and "password" in notes


def test_the_fabric_manager_already_installed_is_only_started() -> None:
    facts = replace(FACTS, fabric_manager_installed=True)
    for distro in (UBUNTU, ROCKY, ARCH):
        assert commands(plan("fabric-manager-down", distro, facts)) == [
            "systemctl enable --now nvidia-fabricmanager"
        ]


def test_read_only_steps_do_not_ask_for_root() -> None:
    assert [s.root for s in plan("driver-not-loaded", UBUNTU).steps] == [True, False]
    assert [s.root for s in install_plan(UBUNTU, FACTS).steps] == [False, True, True]


def test_reboots_are_flagged() -> None:
    rebooting = {c for c in CAUSE_ORDER if plan(c, UBUNTU).reboot}
    assert rebooting == {
        "no-driver-installed",
        "nouveau-loaded",
        "secure-boot-unsigned",
        "library-mismatch",
        "gpu-fallen-off-bus",
    }


def test_every_plan_says_what_verification_shows_afterwards() -> None:
    for distro in DISTROS:
        for cause_id in CAUSE_ORDER:
            assert plan(cause_id, distro).outcome


def test_an_unknown_family_gets_notes_saying_what_to_do_by_hand() -> None:
    found = plan("nouveau-loaded", ARCH)
    assert not found.steps
    assert "arch" in found.notes[0] and "mkinitcpio" in found.notes[0]


def test_a_cause_without_a_plan() -> None:
    assert plan_for(Cause("something-new", "", ""), UBUNTU, FACTS) is None


# -- the install plan ------------------------------------------------------------------------


def test_the_ubuntu_install_names_the_server_package_and_explains_the_guide() -> None:
    found = install_plan(Distro(Family.DEBIAN, "ubuntu", "22.04", KERNEL), FACTS)
    assert "apt-get install -y nvidia-driver-535-server" in commands(found)
    assert found.reboot
    notes = " ".join(found.notes)
    assert "470" in notes and "PPA" in notes and "Blackwell" in notes
    assert "nvidia-fabricmanager" in notes  # an NVSwitch system


def test_the_ubuntu_install_without_a_recommendation_uses_the_branch() -> None:
    facts = replace(FACTS, recommended=None, branch="570")
    assert (
        commands(install_plan(UBUNTU, facts))[-1] == "apt-get install -y nvidia-driver-570-server"
    )


def test_the_ubuntu_install_knowing_nothing_lists_and_explains() -> None:
    found = install_plan(UBUNTU, replace(FACTS, recommended=None, branch=None))
    assert commands(found) == ["ubuntu-drivers list --gpgpu"]
    assert "nvidia-driver-<branch>-server" in found.notes[0]


def test_the_rhel_install_leaves_the_third_party_repository_to_the_admin() -> None:
    notes = " ".join(install_plan(ROCKY, FACTS).notes)
    assert "developer.download.nvidia.com" in notes


UBUNTU_DRIVERS_DEVICES = """\
== /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0 ==
modalias : pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00
vendor   : NVIDIA Corporation
model    : GH100 [H200 SXM 141GB]
driver   : nvidia-driver-535-server - distro non-free
driver   : nvidia-driver-570-server-open - distro non-free
driver   : nvidia-driver-570-open - distro non-free recommended
driver   : nvidia-driver-570-server - distro non-free
driver   : xserver-xorg-video-nouveau - distro free builtin
"""


def offering(*drivers: str) -> str:
    return "".join(f"driver   : {d}\n" for d in drivers)


def test_the_recommended_server_driver() -> None:
    # Documented format: `ubuntu-drivers devices` lists "driver : <package> - <origin> [flags]".
    assert recommended_server_driver(UBUNTU_DRIVERS_DEVICES) == "nvidia-driver-570-server-open"
    closed = offering(
        "nvidia-driver-570-server-open - distro non-free",
        "nvidia-driver-570 - distro non-free recommended",
        "nvidia-driver-570-server - distro non-free",
    )
    assert recommended_server_driver(closed) == "nvidia-driver-570-server"
    server = offering(
        "nvidia-driver-535-server - distro non-free recommended",
        "nvidia-driver-570-server - distro non-free",
    )
    assert recommended_server_driver(server) == "nvidia-driver-535-server"
    newest = offering(
        "nvidia-driver-535-server - distro non-free",
        "nvidia-driver-580 - distro non-free recommended",
        "nvidia-driver-570-server - distro non-free",
    )
    assert recommended_server_driver(newest) == "nvidia-driver-570-server"
    assert recommended_server_driver(offering("nvidia-driver-550 - distro non-free")) is None


# -- validation ------------------------------------------------------------------------------

HOSTILE = "5.15.0; rm -rf /"


def all_plans(distro: Distro, facts: PlanFacts) -> list[Plan]:
    return [plan(cause_id, distro, facts) for cause_id in CAUSE_ORDER]


@pytest.mark.parametrize("distro", DISTROS, ids=lambda d: d.id)
def test_a_hostile_kernel_release_never_reaches_a_command(distro: Distro) -> None:
    facts = replace(FACTS, kernel=HOSTILE)
    for found in all_plans(replace(distro, kernel=HOSTILE), facts):
        assert not any("rm -rf" in c for c in commands(found)), found.cause_id
    headers = plan("kernel-headers-missing", distro, facts)
    assert not headers.steps
    if distro.family is not Family.UNKNOWN:
        assert repr(HOSTILE) in headers.notes[0]


@pytest.mark.parametrize(
    ("field", "value", "cause_id", "distros"),
    [
        ("driver_packages", ("nvidia-driver", "x$(reboot)"), "library-mismatch", (UBUNTU, ROCKY)),
        ("recommended", "nvidia-driver-535-server && reboot", "no-driver-installed", (UBUNTU,)),
        ("dkms_module", "nvidia`id`", "dkms-not-built", DISTROS),
        ("dkms_version", "535 -k all", "dkms-not-built", DISTROS),
        ("loaded_version", "535.129.03|sh", "fabric-manager-down", (UBUNTU, ROCKY)),
        ("remap_gpus", ("00000000:3B:00.0; reboot",), "row-remap-pending", DISTROS),
        ("kernel", "-rf", "dkms-not-built", DISTROS),
    ],
)
def test_hostile_values_are_refused_and_named(
    field: str, value: object, cause_id: str, distros: tuple[Distro, ...]
) -> None:
    facts = replace(FACTS, **{field: value})
    for distro in distros:
        found = plan(cause_id, distro, facts)
        assert found.steps == ()
        shown = value[-1] if isinstance(value, tuple) else value
        assert repr(shown) in found.notes[0]


def test_an_unknown_value_gives_no_steps_and_says_so() -> None:
    found = plan("dkms-not-built", UBUNTU, replace(FACTS, dkms_version=None))
    assert found.steps == ()
    assert "DKMS module version is not known" in found.notes[0]


def test_every_command_round_trips_through_shlex() -> None:
    """Each step's command is the shell-quoted join of its words, exactly: split and joined
    again, it is the same line (and no step is an empty line)."""
    commands = [
        step.command
        for distro in DISTROS
        for found in all_plans(distro, facts_for(distro))
        for step in found.steps
    ]
    assert commands
    for command in commands:
        words = shlex.split(command)
        assert words, command
        assert shlex.join(words) == command


def test_every_sh_script_parses(tmp_path: Path) -> None:
    for distro in DISTROS:
        for found in all_plans(distro, facts_for(distro)):
            for step in found.steps:
                words = shlex.split(step.command)
                if words[:2] == ["sh", "-c"]:
                    subprocess.run(["sh", "-n", "-c", words[2]], check=True)


def fake_smi(tmp_path: Path, apps: str) -> dict[str, str]:
    """A stand-in nvidia-smi on PATH: prints ``apps`` for the process query, logs a reset."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --query-compute-apps*) printf "{apps}" ;; '
        f'-r) echo "reset $3" >> {tmp_path}/log ;; esac\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_the_reset_runs_only_on_an_idle_gpu(tmp_path: Path) -> None:
    (command,) = commands(plan("row-remap-pending", UBUNTU))
    idle = subprocess.run(shlex.split(command), env=fake_smi(tmp_path, ""), check=False)
    assert idle.returncode == 0
    assert (tmp_path / "log").read_text() == f"reset {GPU}\n"
    (tmp_path / "log").unlink()
    busy = subprocess.run(
        shlex.split(command),
        env=fake_smi(tmp_path, "2741\\n"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert busy.returncode == 1 and "runs processes" in busy.stderr
    assert not (tmp_path / "log").exists()


# -- facts from a diagnosed host ---------------------------------------------------------------


def test_facts_and_plan_from_a_library_mismatch() -> None:
    evidence = mismatch()
    evidence["os-release"] = out(OS_RELEASES["ubuntu-22.04"])
    evidence["uname"] = out(f"{KERNEL}\n")
    diagnosis = diagnose(evidence, Context("gpu1", expected_gpus=1))
    facts = facts_from(evidence, diagnosis)
    assert facts.loaded_version == "535.129.03"
    assert facts.packaged_version == "535.154.05"
    assert facts.branch == "535"
    assert facts.kernel == KERNEL
    assert facts.driver_packages == ("libnvidia-compute-535-server", "nvidia-driver-535-server")
    assert not facts.nvswitch
    (cause,) = diagnosis.causes
    found = plan_for(cause, diagnosis.distro, facts)
    assert found is not None and found.reboot
    assert commands(found) == [
        "apt-mark hold libnvidia-compute-535-server nvidia-driver-535-server"
    ]


def test_facts_of_dkms_remap_and_fabric_manager() -> None:
    evidence = mismatch()
    evidence["uname"] = out(f"{KERNEL}\n")
    evidence["dkms"] = out(
        f"nvidia-srv/535.129.03, {KERNEL}, x86_64: installed\nnvidia-srv/535.154.05: added\n"
    )
    evidence["remapped-rows"] = out(f"{GPU}, 0, 1, Yes, No\n00000000:5D:00.0, 0, 0, No, No\n")
    evidence["ubuntu-drivers"] = out(UBUNTU_DRIVERS_DEVICES)
    evidence["driver-packages"] = out("nvidia-fabricmanager-535 535.129.03-1\n")
    facts = facts_from(evidence, diagnose(evidence, Context("gpu1")))
    assert (facts.dkms_module, facts.dkms_version) == ("nvidia-srv", "535.154.05")
    assert facts.remap_gpus == (GPU,)
    assert facts.recommended == "nvidia-driver-570-server-open"
    assert facts.fabric_manager_installed
