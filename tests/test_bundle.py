"""The incident bundle, checked file by file: made over a real sshd (stand-in nvidia-smi and
kernel log on the far side), for a simulated host (no shell: said, not failed), from the command
line, and never over an existing file."""

from __future__ import annotations

import dataclasses
import json
import os
import tarfile
import threading
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from conftest import EPOCH, NOW
from notices import notices
from sshd import Sshd, sshd_available, user_env
from static_source import StaticSource

from gpuconsole.actions.bundle.archive import BundleError
from gpuconsole.actions.bundle.contents import BundleInputs, summary
from gpuconsole.actions.bundle.gather import light_checks
from gpuconsole.actions.bundle.inputs import history_inputs, live_inputs
from gpuconsole.actions.bundle.make import make_bundle
from gpuconsole.cli.main import main
from gpuconsole.core import audit, paths
from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import HostSnapshot, Severity
from gpuconsole.fleet.alerts.defaults import DEFAULT_RULES
from gpuconsole.fleet.alerts.engine import AlertEngine
from gpuconsole.fleet.headless import record_fleet
from gpuconsole.fleet.poller import collect
from gpuconsole.fleet.record.episodes import ALERT, FINDING, Episode
from gpuconsole.fleet.record.reader import Recording
from gpuconsole.fleet.record.recorder import Recorder
from gpuconsole.fleet.record.when import clock
from gpuconsole.fleet.session import FleetSession
from gpuconsole.hosts.inventory import HostDefaults
from gpuconsole.hosts.ssh import SshSettings
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.telemetry.sim import SimRack, SimSource, demo_rack
from gpuconsole.ui.widgets.notices import laid_out

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
def audit_log(audit_log: Path) -> Path:
    """The test's audit log (tests/conftest.py), holding two actions for a bundle to copy."""
    audit.record("signal-process", host="gpu-test", pid=4242, signal="SIGTERM", sent=True)
    audit.record("repair-step", host="gpu-other", command="modprobe nvidia", exit_code=0)
    return audit_log


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
    assert "00:02:00 UTC, open: **CRITICAL** GPU 3 `xid`" in summary
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
    words = ("bundle", "gpu-test", "--hosts", "gpu-test", "-o", str(tmp_path), "--json")
    done = gpuconsole(*words, env=env, timeout=180)
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
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.press("enter")
        host = app.screen.host
        await pilot.press("B")
        await app.workers.wait_for_complete()
        await pilot.pause()
        history = list(app.fleet.store.history(host))
        shown = await notices(pilot)
    (path,) = (tmp_path / "bundles").glob("*.tar.gz")
    # as the notice lays it out: the path on lines of its own, never broken inside a name
    written = laid_out(f"bundle written: {path}")
    assert any(n.text.startswith(written) and n.severity == "information" for n in shown), shown
    files = members(path)
    times = [json.loads(line)["time"] for line in files["readings.jsonl"].splitlines()]
    assert times == [s.time for s in history]
    assert "a simulated host has no shell" in files["summary.md"]
    assert f"# Incident bundle: {host} at " in files["summary.md"]
    # the console keeps 120 readings and does not record: the bundle says so
    first, at = clock(history[0].time), clock(history[-1].time)
    assert (
        f"- readings from {clock(history[-1].time - 600)} until {first} UTC: the bundle holds the "
        "last 2 min of the 10 min before its moment (the console keeps a host's last 120 "
        "readings, and does not record)"
    ) in files["summary.md"]
    assert f"- 120 readings from {first} to {at} UTC" in files["summary.md"]


# --- the timeline as of the moment ----------------------------------------------------------------


def episode(code: str, since: float, until: float | None, kind: str = FINDING) -> Episode:
    return Episode(
        kind,
        f"a100-01/2/{code}",
        "a100-01",
        2,
        code,
        Severity.WARNING,
        f"{code} on GPU 2",
        "",
        since,
        until,
    )


def test_the_timeline_says_what_was_open_and_what_had_ended_at_the_moment() -> None:
    """Ended before the moment, open at it, begun after it (a recording's window runs past it):
    before, one begun after the moment read "still open" as well."""
    at = NOW
    inputs = BundleInputs(
        host="a100-01",
        at=at,
        origin="the test",
        episodes=(
            episode("ended-before", at - 300, at - 120),
            episode("open", at - 200, None),
            episode("ended-after", at - 100, at + 60, ALERT),
            episode("ended-at-the-moment", at - 50, at),
            episode("began-after", at + 30, None),
        ),
    )
    timeline = summary(inputs, [], None, [], at).split("## Timeline")[1].split("## Host")[0]
    lines = [line.split(": **")[0] for line in timeline.strip().splitlines()]
    assert lines == [
        f"- {clock(at - 300)} UTC, ended at {clock(at - 120)}",
        f"- {clock(at - 200)} UTC, open",
        f"- {clock(at - 100)} UTC, open",  # its end, after the moment, is in findings.json
        f"- {clock(at - 50)} UTC, ended at {clock(at)}",
        f"- {clock(at + 30)} UTC, began after the moment",
    ]


def temperature(t: float, celsius: float) -> HostSnapshot:
    from test_record import full_snapshot

    first = full_snapshot(t)
    hot = dataclasses.replace(first.gpus[0], temperature_c=celsius, throttle_reasons=None)
    return full_snapshot(t, gpus=(hot, *first.gpus[1:]))


def test_a_live_bundle_says_a_finding_gone_within_its_grace_ended(audit_log: Path) -> None:
    """A finding that went away less than the grace (30 s) ago is still an open episode in the
    console (it continues if the finding comes back), but as of the bundle's moment it ended:
    before, the bundle said "still open"."""
    from test_record import START

    fleet = FleetSession(["n1"], DEFAULT_RULES)
    source = StaticSource(temperature(START, 88.0))

    def take(t: float, celsius: float) -> None:
        source.snapshot = temperature(t, celsius)
        fleet.take(collect(source))

    for second in range(10):
        take(START + second, 88.0 if second < 6 else 61.0)
    at = START + 9
    assert any(e.code == "temp-high" and e.until is None for e in fleet.onsets.open_episodes())
    store = fleet.store
    inputs = live_inputs(
        "n1",
        "the test",
        tuple(store.history("n1")),
        store.findings("n1"),
        fleet.alerts.active(),
        fleet.onsets.episodes_now(),
        at=at,
        kept=store.history_length,
    )
    text = summary(inputs, [], None, inputs.notes, at)
    assert (
        f"- {clock(START)} UTC, ended at {clock(START + 6)}: **WARNING** GPU 0 `temp-high`" in text
    )
    assert "`temp-high`" not in text.split("## Timeline")[0]  # not a problem at the moment
    assert f"- {clock(START)} UTC, open: **CRITICAL** GPU 1 `gpu-lost`" in text
    # the console has read it for ten seconds: the bundle says it holds no more
    assert (
        "the bundle holds the last 9 s of the 10 min before its moment (the console has no "
        "earlier reading of it, and does not record)"
    ) in text
    take(START + 10, 88.0)  # back within the grace: the same episode goes on
    (temp,) = [e for e in fleet.onsets.episodes_now() if e.code == "temp-high"]
    assert (temp.since, temp.until) == (START, None)


# --- a live bundle's ten minutes -----------------------------------------------------------------


async def test_a_live_bundle_holds_the_last_ten_minutes_of_a_longer_history(
    make_app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, audit_log: Path
) -> None:
    monkeypatch.setenv("GPUCONSOLE_BUNDLE_DIR", str(tmp_path / "bundles"))
    app = make_app(history_seconds=700)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("enter")
        host = app.screen.host
        await pilot.press("B")
        await app.workers.wait_for_complete()
        await pilot.pause()
        history = list(app.fleet.store.history(host))
    assert len(history) == 700
    (path,) = (tmp_path / "bundles").glob("*.tar.gz")
    files = members(path)
    times = [json.loads(line)["time"] for line in files["readings.jsonl"].splitlines()]
    at = history[-1].time
    assert times == [s.time for s in history if s.time >= at - 600]
    assert times[0] == at - 600
    assert "the bundle holds the last" not in files["summary.md"]


def test_a_live_bundle_of_a_recording_console_takes_the_rest_from_the_recording(
    tmp_path: Path, audit_log: Path
) -> None:
    """The console's store holds its last 120 readings; the recording it writes, the rest."""
    rack = demo_rack(hosts=1, seed=7, epoch=EPOCH)
    (host,) = rack.hosts
    clock_ = ManualClock(EPOCH + 60)
    path = tmp_path / "console.sqlite"
    recorder = Recorder(path, label="test")
    stop = threading.Event()

    def tick(rounds: int) -> None:
        clock_.advance(1.0)
        if rounds >= 700:
            stop.set()

    try:
        assert (
            record_fleet(SimSource(rack, clock_), recorder, interval=0.0, stop=stop, on_round=tick)
            is None
        )
    finally:
        recorder.close()
    recording = Recording(path)
    try:
        assert recording.end is not None
        at = recording.end
        store_history = recording.snapshots(host, at - 119, at)  # what the console kept
        open_now = recording.open_episodes(at)
    finally:
        recording.close()
    assert len(store_history) == 120
    inputs = live_inputs(host, "the test", store_history, (), (), open_now, at=at, recording=path)
    times = [s.time for s in inputs.readings]
    assert times[0] == at - 600 and times[-1] == at and len(times) == 601
    assert not [n for n in inputs.notes if n.startswith("readings from")]


# --- --at from the command line ------------------------------------------------------------------


@pytest.fixture
def incident(tmp_path: Path, rack: SimRack, audit_log: Path) -> tuple[Path, float]:
    """40 s of the demo rack from 00:10:00, XID 79 on l40s-01's GPU 1 from 00:10:30."""
    from test_record import record_incident

    recording = tmp_path / "incident.sqlite"
    fault_time, _ = record_incident(recording, rack, seconds=40, fault_at=30)
    return recording, fault_time


def test_bundle_at_a_time_the_recording_does_not_hold_is_refused_and_writes_nothing(
    incident: tuple[Path, float], tmp_path: Path
) -> None:
    """Before, 07:00 was taken as 07:00 after the recording's end, and a bundle was written."""
    recording, _ = incident
    out = tmp_path / "out"
    out.mkdir()
    done = gpuconsole(
        "bundle", "l40s-01", "--record", str(recording), "--at", "07:00", "-o", str(out)
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"gpuconsole: --at 07:00: not in {recording}, which holds 2026-01-01 00:10:00 to "
        "00:10:39 UTC\n"
    )
    assert list(out.iterdir()) == []


def test_bundle_at_a_time_of_day_is_about_that_moment_in_the_recording(
    incident: tuple[Path, float], tmp_path: Path
) -> None:
    from test_record import START

    recording, fault_time = incident
    target = tmp_path / "b.tar.gz"
    done = gpuconsole(
        "bundle", "l40s-01", "--record", str(recording), "--at", "00:10:35", "-o", str(target)
    )
    assert done.returncode == 0, done.stderr
    files = members(target)
    assert json.loads(files["findings.json"])["at"] == START + 35
    summary_md = files["summary.md"]
    assert summary_md.startswith("# Incident bundle: l40s-01 at 2026-01-01 00:10:35 UTC")
    assert f"- {clock(fault_time)} UTC, open: **CRITICAL** GPU 1 `gpu-lost`" in summary_md
    note = (
        "readings from 00:00:35 until 00:10:00 UTC: the bundle holds the last 35 s of the 10 min "
        f"before its moment (the recording {recording} holds none earlier)"
    )
    assert f"- {note}" in summary_md and f"  not collected: {note}" in done.stdout


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (
            ["h100-01", "--demo"],
            "gpuconsole: --at: the demo rack is made up afresh each run, so it has no past to go "
            "back to; record it (gpuconsole record --demo --record FILE) and give --record FILE, "
            "or leave out --at for a bundle of now",
        ),
        (
            ["local"],
            "gpuconsole: --at: no recording holds {name} (there is no {default}), so there is no "
            "past to go back to; give --record FILE, or leave out --at for a bundle of now",
        ),
    ],
    ids=["demo", "live"],
)
def test_bundle_at_without_a_recording_is_refused_not_ignored(
    words: list[str], message: str, tmp_path: Path
) -> None:
    """Before, --demo --at wrote a bundle of now, as if --at had not been given."""
    import socket

    done = gpuconsole("bundle", *words, "--at", "00:10", "-o", str(tmp_path))
    assert done.returncode == 2
    default = paths.RECORDING.path()
    assert done.stderr == message.format(name=socket.gethostname(), default=default) + "\n"
    assert list(tmp_path.glob("*.tar.gz")) == []
