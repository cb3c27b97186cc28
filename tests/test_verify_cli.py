"""`gpuconsole verify` as a user runs it: this machine, and hosts over the test sshd."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from sshd import Sshd, sshd_available, user_env

from gpuconsole.actions.verify.checks import CHECKS


def verify(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``gpuconsole verify ARGS``, as the user of ``home`` where one is given."""
    return gpuconsole("verify", *args, env=None if home is None else user_env(home), timeout=180)


def test_verify_this_machine_reports_every_check_and_fails_without_a_driver() -> None:
    done = verify("--json")
    assert done.returncode == 2, done.stderr
    (report,) = json.loads(done.stdout)
    assert [c["id"] for c in report["checks"]] == [c.id for c in CHECKS]
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert statuses["driver-loaded"] == "fail"
    assert set(statuses.values()) <= {"pass", "warn", "fail", "skip"}
    failed = next(c for c in report["checks"] if c["id"] == "driver-loaded")
    assert failed["remediation"] and failed["evidence"]["commands"]


def test_text_output_keeps_going_past_the_first_failure() -> None:
    done = verify()
    assert done.returncode == 2
    lines = done.stdout.splitlines()
    assert ": FAIL (" in lines[0]
    verdicts = [line.split()[0] for line in lines[1:] if line.startswith("  ") and line[2] != " "]
    assert len(verdicts) == len(CHECKS)
    assert set(verdicts) <= {"pass", "warn", "fail", "skip"}
    assert "fix:" in done.stdout


@pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")
def test_verify_a_group_of_the_inventory_over_ssh(sshd: Sshd, tmp_path: Path) -> None:
    sshd.ssh_config(["gpu-a", "gpu-b"])
    inventory = tmp_path / "hosts.toml"
    inventory.write_text('[groups.rack-a]\nhosts = ["gpu-a", "gpu-b"]\n')
    done = verify("rack-a", "--inventory", str(inventory), "--json", home=sshd.home)
    assert done.returncode in (1, 2), done.stderr
    reports = json.loads(done.stdout)
    assert [r["host"] for r in reports] == ["gpu-a", "gpu-b"]
    for report in reports:
        assert report["error"] is None
        statuses = {c["id"]: c["status"] for c in report["checks"]}
        assert statuses["nvidia-smi"] == "pass"  # the stand-in nvidia-smi on the host's PATH


def test_an_unknown_host_is_one_line() -> None:
    done = verify("gpu-nowhere", "--hosts", "gpu-a")
    assert done.returncode == 2
    assert done.stderr.strip() == "gpuconsole: no host 'gpu-nowhere' in --hosts"
