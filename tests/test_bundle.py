"""The incident bundle, checked file by file: made over a real sshd (stand-in nvidia-smi and
kernel log on the far side), for a simulated host (no shell: said, not failed), from the command
line, and never over an existing file."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import EPOCH, NOW
from sshd import Sshd, sshd_available, user_env

from gpuconsole import audit, paths
from gpuconsole.actions.bundle.archive import BundleError
from gpuconsole.actions.bundle.contents import BundleInputs
from gpuconsole.actions.bundle.gather import light_checks
from gpuconsole.actions.bundle.inputs import history_inputs
from gpuconsole.actions.bundle.make import make_bundle
from gpuconsole.alerts.engine import AlertEngine
from gpuconsole.cli import main
from gpuconsole.hosts.inventory import HostDefaults
from gpuconsole.hosts.ssh import SshSettings
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.model import HostSnapshot
from gpuconsole.telemetry.sim import SimRack

GPUCONSOLE = (sys.executable, "-m", "gpuconsole")
needs_sshd = pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")

KERNEL_LINES = (
    "2026-01-01T00:09:58+0000 gpu-test kernel: usb 1-1: new high-speed USB device",
    "2026-01-01T00:10:30+0000 gpu-test kernel: NVRM: Xid (PCI:0000:28:00): 79, pid=4242, "
    "name=python, GPU has fallen off the bus.",
    "2026-01-01T00:10:30+0000 gpu-test kernel: NVRM: GPU 0000:28:00.0: GPU has fallen off the bus.",
    "2026-01-01T00:10:31+0000 gpu-test kernel: eth0: link up",
)


def write_tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def standin_journal(directory: Path) -> None:
    """A `journalctl` that has kernel messages: NVRM lines among others."""
    lines = "\n".join(KERNEL_LINES)
    write_tool(
        directory,
        "journalctl",
        'case "$*" in\n'
        f'  *"-n 1"*) echo "{KERNEL_LINES[0]}" ;;\n'
        f"  *) cat <<'EOF'\n{lines}\nEOF\n  ;;\n"
        "esac\n",
    )


def gpu_test_readings(rack: SimRack, seconds: int = 30) -> list[HostSnapshot]:
    """The simulated h100-01 (XID 79 on GPU 3) as the host gpu-test."""
    return [
        dataclasses.replace(rack.read("h100-01", NOW - seconds + 1 + i), host="gpu-test")
        for i in range(seconds)
    ]


def ssh_target(sshd: Sshd) -> Target:
    import pwd

    user = pwd.getpwuid(os.getuid()).pw_name
    entry = HostDefaults(user=user, port=sshd.port, connect_timeout=5.0).entry(
        "gpu-test", "127.0.0.1"
    )
    return Target("gpu-test", entry, Context("gpu-test", 8))


def ssh_settings(sshd: Sshd) -> SshSettings:
    return sshd.settings()


def members(path: Path) -> dict[str, str]:
    """The bundle's files (under its one top folder) by name, as text."""
    with tarfile.open(path) as tar:
        names = tar.getnames()
        (root,) = {name.split("/")[0] for name in names}
        assert root.startswith("gpuconsole-bundle-")
        return {
            name.removeprefix(f"{root}/"): tar.extractfile(name).read().decode()  # type: ignore[union-attr]
            for name in names
        }


@pytest.fixture
def audit_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv(paths.AUDIT_LOG.variable, str(log))
    audit.record("signal-process", host="gpu-test", pid=4242, signal="SIGTERM", sent=True)
    audit.record("repair-step", host="gpu-other", command="modprobe nvidia", exit_code=0)
    return log


# --- over SSH -----------------------------------------------------------------------------------


@needs_sshd
async def test_a_bundle_over_ssh_holds_every_file_with_what_it_should(
    sshd: Sshd, standin: tuple[Path, Path], rack: SimRack, tmp_path: Path, audit_log: Path
) -> None:
    standin_journal(standin[0])
    readings = gpu_test_readings(rack)
    alerts = AlertEngine()
    alerts.replay(readings)
    inputs = history_inputs("gpu-test", "the test", readings, alerts.active())
    result = await make_bundle(
        inputs, ssh_target(sshd), tmp_path / "out", settings=ssh_settings(sshd)
    )
    assert result.notes == ()
    assert result.path.parent == tmp_path / "out"
    files = members(result.path)
    assert list(files) == [
        "summary.md",
        "readings.jsonl",
        "findings.json",
        "audit.jsonl",
        *(f"nvidia-smi/gpu-{i}.txt" for i in range(8)),
        "kernel-log.txt",
        "verification.json",
        "verification.txt",
    ]
    # readings: one JSON object per reading, in time order
    lines = [json.loads(line) for line in files["readings.jsonl"].splitlines()]
    assert [r["time"] for r in lines] == [s.time for s in readings]
    assert all(r["host"] == "gpu-test" and len(r["gpus"]) == 8 for r in lines)
    # findings and alerts at the moment, and the timeline
    findings = json.loads(files["findings.json"])
    assert findings["host"] == "gpu-test" and findings["at"] == readings[-1].time
    assert {("gpu-lost", 3), ("xid", 3)} <= {(f["code"], f["gpu"]) for f in findings["findings"]}
    assert any(a["rule"] == "gpu-xid" and a["gpu"] == 3 for a in findings["alerts"])
    xid = [e for e in findings["timeline"] if e["code"] == "xid"]
    assert [e["since"] for e in xid] == [EPOCH + 120.0]  # when the driver reported it
    # the audit log: this host's actions only
    actions = [json.loads(line) for line in files["audit.jsonl"].splitlines()]
    assert [(a["action"], a["host"]) for a in actions] == [("signal-process", "gpu-test")]
    # nvidia-smi -q of each GPU, as the host's nvidia-smi printed it
    for i in range(8):
        assert "Driver Version: 580.159.04" in files[f"nvidia-smi/gpu-{i}.txt"]
    # the kernel log: NVRM and Xid lines only
    log = files["kernel-log.txt"].splitlines()
    assert log == ["# source: journalctl -k -b", KERNEL_LINES[1], KERNEL_LINES[2]]
    # the verification: the checks that do not load the host, run there
    report = json.loads(files["verification.json"])
    assert report["host"] == "gpu-test"
    assert [c["id"] for c in report["checks"]] == [c.id for c in light_checks()]
    assert not {"p2p-bandwidth", "disk-read", "host-device-bandwidth"} & {
        c["id"] for c in report["checks"]
    }
    assert files["verification.txt"].startswith("gpu-test: ")
    # the summary: the worst first, what to do, the timeline, the files
    summary = files["summary.md"]
    assert summary.startswith("# Incident bundle: gpu-test at 2026-01-01 00:15:00 UTC")
    problems = summary.split("## Problems at that moment")[1].split("## Timeline")[0]
    first = next(line for line in problems.splitlines() if line.startswith("- "))
    assert first.startswith("- **CRITICAL**")
    assert "Next: reboot the node" in problems
    assert "00:02:00 UTC, still open: **CRITICAL** GPU 3 `xid`" in summary
    assert "8× H100 80GB HBM3 (1 lost), driver 570.133.20" in summary
    assert "- 1 action logged" in summary
    assert "## Not collected" not in summary
    for name in files:
        assert f"`{name}`" in summary


@needs_sshd
async def test_a_hung_nvidia_smi_and_an_unreadable_kernel_log_are_said_not_waited_for(
    sshd: Sshd, standin: tuple[Path, Path], rack: SimRack, tmp_path: Path, audit_log: Path
) -> None:
    directory, hang = standin
    write_tool(directory, "journalctl", "exit 0\n")  # a journal without kernel messages
    write_tool(
        directory,
        "dmesg",
        'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1\n',
    )
    hang.touch()
    readings = gpu_test_readings(rack, seconds=5)
    inputs = history_inputs("gpu-test", "the test", readings, ())
    result = await make_bundle(
        inputs,
        ssh_target(sshd),
        tmp_path,
        settings=ssh_settings(sshd),
        checks=(),
        smi_timeout=1.0,
    )
    files = members(result.path)
    assert files["nvidia-smi/gpu-0.txt"].startswith("not collected: no answer within 1 s")
    assert "Operation not permitted" in files["kernel-log.txt"]
    summary = files["summary.md"]
    assert "nvidia-smi -q of GPU 7: no answer within 1 s (a GPU that fell off the bus" in summary
    assert "kernel log: not readable by this user (dmesg: read kernel buffer failed" in summary
    assert len(result.notes) == 9


async def test_an_unreachable_host_still_gets_a_bundle(
    rack: SimRack, tmp_path: Path, audit_log: Path
) -> None:
    from sshd import free_port

    entry = HostDefaults(port=free_port(), connect_timeout=3.0).entry("gpu-test", "127.0.0.1")
    inputs = history_inputs("gpu-test", "the test", gpu_test_readings(rack, 3), ())
    result = await make_bundle(inputs, Target("gpu-test", entry), tmp_path)
    (note,) = result.notes
    assert note.startswith("nvidia-smi -q, kernel log, verification: gpu-test could not be reached")
    assert set(members(result.path)) == {
        "summary.md",
        "readings.jsonl",
        "findings.json",
        "audit.jsonl",
    }


# --- without a shell, and never over a file ------------------------------------------------------


async def test_a_simulated_host_gets_a_bundle_that_says_what_is_missing(
    rack: SimRack, tmp_path: Path, audit_log: Path
) -> None:
    note = "nvidia-smi -q, kernel log, verification: a simulated host has no shell to run them in"
    readings = [rack.read("a100-01", NOW - 9 + i) for i in range(10)]
    inputs = history_inputs("a100-01", "the demo rack", readings, (), (note,))
    result = await make_bundle(inputs, None, tmp_path)
    files = members(result.path)
    assert list(files) == ["summary.md", "readings.jsonl", "findings.json", "audit.jsonl"]
    assert f"## Not collected\n\n- {note}\n" in files["summary.md"]
    assert "thermal-throttle" in files["summary.md"]
    assert files["audit.jsonl"] == ""


async def test_an_existing_file_is_never_replaced(tmp_path: Path, audit_log: Path) -> None:
    target = tmp_path / "ticket-1234.tar.gz"
    target.write_bytes(b"the user's own file")
    inputs = BundleInputs(host="a100-01", at=NOW, origin="the test")
    with pytest.raises(BundleError, match=f"{target}: exists; a bundle never replaces a file"):
        await make_bundle(inputs, None, target)
    assert target.read_bytes() == b"the user's own file"
    first = await make_bundle(inputs, None, tmp_path)
    second = await make_bundle(inputs, None, tmp_path)  # same host, same second: a new name
    assert first.path != second.path and first.path.exists() and second.path.exists()
    assert second.path.name.endswith("-2.tar.gz")
    summary = members(first.path)["summary.md"]
    assert "Not known: there is no reading of this host for that moment." in summary
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [target.name, first.path.name, second.path.name, "audit.jsonl"]
    )


# --- the command line ---------------------------------------------------------------------------


def test_bundle_of_a_demo_host_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], audit_log: Path
) -> None:
    assert main(["bundle", "h100-01", "--demo", "-o", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    path = Path(result["path"])
    assert path.parent == tmp_path
    files = members(path)
    assert len(files["readings.jsonl"].splitlines()) == 600  # ten minutes at 1 Hz
    assert "a simulated host has no shell" in files["summary.md"]
    assert result["notes"] == [
        "nvidia-smi -q, kernel log, verification: a simulated host has no shell to run them in"
    ]


@pytest.mark.parametrize(
    ("words", "code", "message"),
    [
        (["gpu99", "--demo"], 2, "no host 'gpu99' in the demo rack"),
        (["gpu99"], 2, "unknown host 'gpu99': not 'local', not in the inventory"),
    ],
)
def test_bundle_refuses_an_unknown_host_in_one_line(
    capsys: pytest.CaptureFixture[str], words: list[str], code: int, message: str
) -> None:
    assert main(["bundle", *words]) == code
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_bundle_from_a_recording_at_a_time(
    tmp_path: Path, rack: SimRack, capsys: pytest.CaptureFixture[str], audit_log: Path
) -> None:
    from test_record import START, record_incident

    recording = tmp_path / "incident.sqlite"
    fault_time, _ = record_incident(recording, rack, seconds=40, fault_at=30)
    args = ["bundle", "l40s-01", "--record", str(recording), "--at", str(fault_time)]
    assert main([*args, "-o", str(tmp_path / "b.tar.gz")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"bundle written: {tmp_path / 'b.tar.gz'}")
    assert "l40s-01 is neither this machine nor an inventory host" in out
    files = members(tmp_path / "b.tar.gz")
    times = [json.loads(line)["time"] for line in files["readings.jsonl"].splitlines()]
    assert times == [START + i for i in range(40)]  # the window holds the whole recording
    findings = json.loads(files["findings.json"])
    assert {"gpu-lost", "xid"} <= {f["code"] for f in findings["findings"] if f["gpu"] == 1}
    # the same again: the file is there, so nothing is written and the file is kept
    before = (tmp_path / "b.tar.gz").read_bytes()
    assert main([*args, "-o", str(tmp_path / "b.tar.gz")]) == 3
    assert "exists; a bundle never replaces a file" in capsys.readouterr().err
    assert (tmp_path / "b.tar.gz").read_bytes() == before


@needs_sshd
def test_bundle_of_an_ssh_host_as_a_user_runs_it(
    sshd: Sshd, standin: tuple[Path, Path], tmp_path: Path, audit_log: Path
) -> None:
    standin_journal(standin[0])
    config = sshd.ssh_config(["gpu-test"])
    assert config.exists()
    env = user_env(sshd.home)
    done = subprocess.run(
        [*GPUCONSOLE, "bundle", "gpu-test", "--hosts", "gpu-test", "-o", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    files = members(Path(result["path"]))
    (reading,) = [json.loads(line) for line in files["readings.jsonl"].splitlines()]
    assert reading["host"] == "gpu-test" and reading["source"] == "agent-smi"
    assert "a reading taken now (no recording holds this host)" in files["summary.md"]
    assert KERNEL_LINES[1] in files["kernel-log.txt"]
    assert json.loads(files["verification.json"])["host"] == "gpu-test"


async def test_b_on_the_host_screen_writes_a_bundle_of_what_the_console_holds(
    make_app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, audit_log: Path
) -> None:
    monkeypatch.setenv("GPUCONSOLE_BUNDLE_DIR", str(tmp_path / "bundles"))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("enter")
        host = app.screen.host
        await pilot.press("B")
        await app.workers.wait_for_complete()
        await pilot.pause()
        history = list(app.fleet.store.history(host))
        notices = [n.message for n in app._notifications]
    (path,) = (tmp_path / "bundles").glob("*.tar.gz")
    assert any(m.startswith(f"bundle written: {path}") for m in notices)
    files = members(path)
    times = [json.loads(line)["time"] for line in files["readings.jsonl"].splitlines()]
    assert times == [s.time for s in history]
    assert "a simulated host has no shell" in files["summary.md"]
    assert f"# Incident bundle: {host} at " in files["summary.md"]
