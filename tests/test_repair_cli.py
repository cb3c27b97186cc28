"""`gpuconsole repair` end to end on this machine (which has no NVIDIA driver, and no GPU: its
bus is shown to the probes with one GPU where a test needs a driver to plan for): the diagnosis,
the dry run, and a confirmed run whose system tools are stand-ins that record their arguments."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

from cli_runner import gpuconsole
from test_repair_execute import calls, sysfs_with_one_gpu, write_tools

from gpuconsole.actions.verify.probes import SYSFS_VARIABLE

# The tools that change a host. The read-only ones the diagnosis asks (dkms, mokutil,
# systemctl) are left as this machine has them: absent, so the diagnosis reads a bare host.
STUBBED = ("apt-get", "modprobe", "update-initramfs")


def repair(
    *args: str, path: str | None = None, sysfs: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`gpuconsole repair` here; ``sysfs``: the bus the probes read (default: this machine's)."""
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    if sysfs is not None:
        env[SYSFS_VARIABLE] = str(sysfs)
    return gpuconsole("repair", *args, env=env)


def test_a_dry_run_diagnoses_plans_and_runs_nothing(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    tools = write_tools(tmp_path / "bin", log, STUBBED)
    sysfs = sysfs_with_one_gpu(tmp_path / "sys")
    done = repair("--dry-run", "--json", path=f"{tools}:/usr/bin:/bin", sysfs=sysfs)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["causes"][:2] == ["driver-not-loaded", "no-driver-installed"]
    assert [w["cause"] for w in report["walk"]][:4] == [
        "no-nvidia-gpu",
        "driver-not-loaded",
        "no-driver-installed",
        "nouveau-loaded",
    ]
    (plan,) = report["plans"]  # loading a driver that is not installed is not planned
    assert plan["cause"] == "no-driver-installed" and plan["reboot"] is True
    assert report["runs"][0]["dry_run"] is True and report["runs"][0]["steps"] == []
    assert calls(log) == []


def test_without_a_terminal_or_yes_nothing_runs(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    tools = write_tools(tmp_path / "bin", log, STUBBED)
    done = repair(path=f"{tools}:/usr/bin:/bin", sysfs=sysfs_with_one_gpu(tmp_path / "sys"))
    assert done.returncode == 1
    assert "no terminal to ask; pass --yes" in done.stderr
    assert "not confirmed: nothing was run" in done.stdout
    assert calls(log) == []


def test_a_confirmed_repair_runs_the_plan_audits_it_and_verifies_again(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    tools = write_tools(tmp_path / "bin", log, STUBBED)
    path = f"{tools}:/usr/bin:/bin"
    sysfs = sysfs_with_one_gpu(tmp_path / "sys")
    dry = repair("--dry-run", "--json", path=path, sysfs=sysfs)
    planned = json.loads(dry.stdout)["plans"][0]["commands"]
    assert {shlex.split(command)[0] for command in planned} <= set(STUBBED)  # no real tool runs
    done = repair("--yes", "--json", path=path, sysfs=sysfs)
    report = json.loads(done.stdout)
    assert calls(log) == planned
    (run,) = report["runs"]
    assert run["completed"] and [s["exit_code"] for s in run["steps"]] == [0] * len(planned)
    # the stand-ins installed nothing: verified again, the driver is still missing
    assert report["after"]["status"] == "fail"
    assert done.returncode == 2
    state = Path(os.environ["XDG_STATE_HOME"]) / "gpuconsole" / "audit.jsonl"
    logged = [json.loads(line) for line in state.read_text().splitlines()]
    assert [e["command"] for e in logged] == planned


def test_on_a_machine_without_an_nvidia_gpu_repair_plans_no_driver(tmp_path: Path) -> None:
    """This machine as it is: no GPU on its bus. No driver install is planned or run; the one
    cause says so, and where to look."""
    log = tmp_path / "calls.log"
    tools = write_tools(tmp_path / "bin", log, STUBBED)
    done = repair("--yes", "--json", path=f"{tools}:/usr/bin:/bin")
    report = json.loads(done.stdout)
    assert report["walk"][0]["cause"] == "no-nvidia-gpu" and report["walk"][0]["found"] is True
    assert report["causes"] == ["no-nvidia-gpu"]
    (plan,) = report["plans"]
    assert plan["cause"] == "no-nvidia-gpu" and plan["commands"] == []
    assert any("lspci -d 10de:" in note for note in plan["notes"])
    assert calls(log) == []
    text = repair("--dry-run", path=f"{tools}:/usr/bin:/bin").stdout
    assert "No NVIDIA GPU on this machine" in text and "apt-get" not in text
