"""`gpuconsole drain` and `resume` against a real single-node Slurm cluster (`tests/slurm.py`):
the scheduler's own `sinfo -R` is the judge. This machine is the host (``localhost``); its Slurm
node is found from its host name, as on a real node."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from hostile import UNSAFE
from hypothesis import given
from hypothesis import strategies as st
from slurm import Slurm
from sshd import Sshd, run_gpuconsole

from gpuconsole.actions.service import (
    KUBERNETES,
    MAX_REASON,
    SLURM,
    ServiceError,
    ServicePlan,
    _said,
    _state,
    checked_reason,
)


def on_slurm(slurm: Slurm, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuconsole ARGS` where the test's Slurm cluster answers."""
    return gpuconsole(*args, env=slurm.env)


def reasons(slurm: Slurm) -> list[str]:
    """``sinfo -R``'s reasons for the node, as Slurm keeps them."""
    out = slurm.run("sinfo", "-R", "-h", "-n", slurm.node, "-o", "%E").stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def audit_entries() -> list[dict[str, object]]:
    path = Path(os.environ["XDG_STATE_HOME"]) / "gpuconsole" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_drain_takes_the_node_out_and_resume_brings_it_back(slurm: Slurm) -> None:
    reason = "GPU 3 uncorrectable ECC; ticket OPS-1234 (o'neil)"
    drained = on_slurm(slurm, "drain", "localhost", "--reason", reason, "--yes")
    assert drained.returncode == 0, drained.stderr
    command = f"scontrol update nodename={slurm.node} state=drain reason="
    assert f"(slurm node {slurm.node}): $ {command}" in drained.stdout
    assert f"{slurm.node} is now drained, reason: {reason}" in drained.stdout
    assert slurm.state() == "drained"
    assert reasons(slurm) == [reason]
    resumed = on_slurm(slurm, "resume", "localhost", "--yes", "--json")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert (result["ok"], result["plan"]["scheduler"]) == (True, SLURM)
    assert result["state"] in ("idle", "idle (not responding)")  # sinfo may say idle* a moment
    assert slurm.state().rstrip("*") == "idle"
    assert reasons(slurm) == []
    logged = [(e["action"], e["node"], e["exit_code"]) for e in audit_entries()]
    assert logged == [("drain", slurm.node, 0), ("resume", slurm.node, 0)]
    assert audit_entries()[0]["reason"] == reason


def test_drain_and_resume_over_ssh(slurm: Slurm, tmp_path: Path) -> None:
    """An inventory host reached through a real sshd whose sessions reach the cluster: the
    same commands, run over the console's SSH connection."""
    server = Sshd(
        tmp_path / "sshd", env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(slurm.conf)}
    ).start()
    try:
        server.ssh_config(["gpu-slurm"])
        hosts = ("--hosts", "gpu-slurm")
        drained = run_gpuconsole(server.home, "drain", "gpu-slurm", *hosts, "--reason", "PSU")
        assert drained.returncode == 1 and "pass --yes" in drained.stderr  # no terminal
        drained = run_gpuconsole(
            server.home, "drain", "gpu-slurm", *hosts, "--reason", "PSU", "--yes"
        )
        assert drained.returncode == 0, drained.stderr
        assert f"gpu-slurm: {slurm.node} is now drained, reason: PSU" in drained.stdout
        assert reasons(slurm) == ["PSU"]
        resumed = run_gpuconsole(server.home, "resume", "gpu-slurm", *hosts, "--yes")
        assert resumed.returncode == 0, resumed.stderr
        assert reasons(slurm) == []
    finally:
        server.kill()


def test_a_node_with_a_running_job_drains_and_the_job_goes_on(slurm: Slurm) -> None:
    job = slurm.submit("llama-ft", "sleep 120")
    result = on_slurm(slurm, "drain", "localhost", "--reason", "fan failure", "--yes")
    assert result.returncode == 0, result.stderr
    assert "is now draining, reason: fan failure" in result.stdout
    assert slurm.run("squeue", "-h", "-j", str(job), "-o", "%T").stdout.strip() == "RUNNING"
    assert slurm.state() == "draining"


def test_nothing_runs_without_a_yes_when_there_is_no_terminal(slurm: Slurm) -> None:
    result = on_slurm(slurm, "drain", "localhost", "--reason", "fan failure")
    assert result.returncode == 1
    assert "not run: no terminal to ask; pass --yes" in result.stderr
    assert slurm.state().rstrip("*") == "idle" and audit_entries() == []


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("   ", "say why the node is taken out"),
        ("first line\nsecond", "without control characters"),
        ("x" * (MAX_REASON + 1), f"more than {MAX_REASON}"),
    ],
)
def test_a_bad_reason_is_refused_before_anything_runs(slurm: Slurm, reason: str, said: str) -> None:
    result = on_slurm(slurm, "drain", "localhost", "--reason", reason, "--yes")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpuconsole: --reason: ") and said in line
    assert slurm.state().rstrip("*") == "idle" and audit_entries() == []


def test_an_unknown_node_is_scontrols_error_and_logged(slurm: Slurm) -> None:
    args = ("drain", "localhost", "--node", "nosuchnode", "--reason", "x", "--yes")
    result = on_slurm(slurm, *args)
    assert result.returncode == 2
    assert "scontrol update nodename=nosuchnode" in result.stdout
    assert [e["exit_code"] for e in audit_entries()] != [0]
    assert slurm.state().rstrip("*") == "idle"


@given(st.text(max_size=MAX_REASON))
def test_a_reason_is_kept_as_given_or_refused(reason: str) -> None:
    try:
        kept = checked_reason(reason)
    except ServiceError:
        assert not reason.strip() or not reason.strip().isprintable()
        return
    assert kept == reason.strip() and kept.isprintable()


def test_the_state_as_each_scheduler_says_it() -> None:
    slurm = ServicePlan("h", "drain", SLURM, "n1", "", "", "r")
    kube = ServicePlan("h", "drain", KUBERNETES, "n1", "", "", "r")
    assert _state(slurm, "drained|GPU 3 ECC\n") == "drained, reason: GPU 3 ECC"
    assert _state(slurm, "idle|none\n") == "idle"
    assert _state(slurm, "idle*|none") == "idle (not responding)"
    assert _state(kube, "true") == "cordoned (unschedulable)"
    assert _state(kube, "") == "schedulable"


def test_what_the_scheduler_says_reaches_no_terminal_as_escapes() -> None:
    """A reason another admin set with scontrol (or kubectl's stderr) may hold anything."""
    slurm = ServicePlan("h", "drain", SLURM, "n1", "", "", "r")
    state = _state(slurm, "drained|\x1b]0;owned\x07 GPU 3\x1b[2J\n")
    assert state.startswith("drained, reason: ") and "GPU 3" in state
    assert not UNSAFE.search(state)
    said = _said("error:\n\x1b]52;c;SE9TVElMRQ==\x07 denied" + "x" * 500)
    assert not UNSAFE.search(said) and len(said) <= 200
