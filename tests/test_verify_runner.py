"""The verification runner against real shells: this machine's, and a host's over the test sshd."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sshd import Sshd, free_port, sshd_available

from gpuconsole.actions.shell import LocalShell
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.actions.verify.output import exit_code, reports_text
from gpuconsole.actions.verify.runner import verify_targets, verify_with
from gpuconsole.hosts.inventory import HostDefaults
from gpuconsole.hosts.targets import Context, Target


def echo_check(check_id: str, probe: Probe) -> Check:
    """A check that passes when its probe printed something and exited 0."""

    def judge(evidence: Evidence, _context: Context) -> Verdict:
        output = evidence[probe.name]
        if output.ok:
            return Verdict(Status.PASS, output.stdout.strip())
        return Verdict(Status.FAIL, f"exit {output.exit_code}", output.lines(), "fix it")

    return Check(check_id, check_id, (probe,), judge)


async def test_a_probe_past_its_timeout_is_cut_short() -> None:
    began = time.monotonic()
    output = await LocalShell().run("sleep 30", timeout=0.3)
    assert output.timed_out
    assert time.monotonic() - began < 5


async def test_a_missing_program_reads_as_missing() -> None:
    output = await LocalShell().run("no-such-program-gpuconsole --version", timeout=5)
    assert output.missing
    assert not output.ok


async def test_probes_run_in_the_c_locale_and_report_exit_codes() -> None:
    output = await LocalShell().run('echo "$LC_ALL"; exit 3', timeout=5)
    assert output.exit_code == 3
    assert output.stdout.strip() == "C"


async def test_a_shared_probe_runs_once_and_heavy_probes_run_after_light_ones(
    tmp_path: Path,
) -> None:
    log = tmp_path / "order"
    shared = Probe("shared", f"echo shared >> {log}; echo one")
    heavy = Probe("heavy", f"echo heavy >> {log}; echo two", heavy=True)
    light = Probe("light", f"sleep 0.2; echo light >> {log}; echo three")
    checks = [
        echo_check("first", shared),
        echo_check("second", shared),
        echo_check("big", heavy),
        echo_check("slow", light),
    ]
    report = await verify_with(LocalShell(), checks, Context("here"))
    assert [c.status for c in report.checks] == [Status.PASS] * 4
    assert log.read_text().split() == ["shared", "light", "heavy"]


async def test_a_judge_that_raises_fails_its_check_and_no_other() -> None:
    def broken(_evidence: Evidence, _context: Context) -> Verdict:
        raise KeyError("missing field")

    probe = Probe("p", "echo fine")
    checks = [Check("broken", "broken", (probe,), broken), echo_check("fine", probe)]
    report = await verify_with(LocalShell(), checks, Context("here"))
    broken_result, fine_result = report.checks
    assert broken_result.status is Status.FAIL
    assert "KeyError" in broken_result.summary
    assert fine_result.status is Status.PASS
    assert exit_code([report]) == 2


async def test_failures_carry_evidence_and_fix_in_text_and_json() -> None:
    checks = [echo_check("bad", Probe("bad", "echo 'it broke' >&2; exit 4"))]
    report = await verify_with(LocalShell(), checks, Context("here"))
    text = reports_text([report])
    assert "fail  bad  exit 4" in text
    assert "| it broke" in text and "fix: fix it" in text
    data = report.as_dict()
    assert data["checks"][0]["evidence"] == {  # type: ignore[index]
        "commands": ["echo 'it broke' >&2; exit 4"],
        "lines": ["it broke"],
    }


@pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")
async def test_hosts_verify_concurrently_over_ssh_and_an_unreachable_one_is_reported(
    sshd: Sshd,
) -> None:
    defaults = HostDefaults(user=_user(), port=sshd.port, connect_timeout=5.0)
    reachable = defaults.entry("gpu-test", "127.0.0.1")
    closed = HostDefaults(user=_user(), port=free_port(), connect_timeout=5.0).entry(
        "gpu-off", "127.0.0.1"
    )
    settings = sshd.settings()
    checks = [echo_check("whoami", Probe("whoami", "id -un"))]
    targets = [
        Target("gpu-test", reachable, Context("gpu-test")),
        Target("gpu-off", closed, Context("gpu-off")),
    ]
    arrived: list[str] = []
    reports = await verify_targets(
        targets, checks, settings, on_report=lambda r: arrived.append(r.host)
    )
    assert [r.host for r in reports] == ["gpu-test", "gpu-off"]
    assert sorted(arrived) == ["gpu-off", "gpu-test"]
    assert reports[0].checks[0].status is Status.PASS
    assert reports[0].checks[0].summary == _user()
    assert reports[1].error is not None and "connection refused" in reports[1].error
    assert reports[1].status is Status.FAIL


def _user() -> str:
    import os
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
