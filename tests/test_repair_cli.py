"""`gpuconsole repair` end to end on this machine (which has no NVIDIA driver): the diagnosis,
the dry run, and a confirmed run whose system tools are stand-ins that record their arguments."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

from cli_runner import gpuconsole
from test_repair_execute import calls, write_tools

# The tools that change a host. The read-only ones the diagnosis asks (dkms, mokutil,
# systemctl) are left as this machine has them: absent, so the diagnosis reads a bare host.
STUBBED = ("apt-get", "modprobe", "update-initramfs")


def repair(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return gpuconsole("repair", *args, env=env)


def test_a_dry_run_diagnoses_plans_and_runs_nothing(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    tools = write_tools(tmp_path / "bin", log, STUBBED)
    done = repair("--dry-run", "--json", path=f"{tools}:/usr/bin:/bin")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["causes"][:2] == ["driver-not-loaded", "no-driver-installed"]
    assert [w["cause"] for w in report["walk"]][:3] == [
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
    done = repair(path=f"{tools}:/usr/bin:/bin")
    assert done.returncode == 1
    assert "no terminal to ask; pass --yes" in done.stderr
    assert "not confirmed: nothing was run" in done.stdout
    assert calls(log) == []


def test_a_confirmed_repair_runs_the_plan_audits_it_and_verifies_again(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    tools = write_tools(tmp_path / "bin", log, STUBBED)
    path = f"{tools}:/usr/bin:/bin"
    planned = json.loads(repair("--dry-run", "--json", path=path).stdout)["plans"][0]["commands"]
    assert {shlex.split(command)[0] for command in planned} <= set(STUBBED)  # no real tool runs
    done = repair("--yes", "--json", path=path)
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
