"""Signalling GPU processes: real processes, real signals, the confirmation flow in the UI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from static_source import StaticSource

from gpuconsole.actions.processes import LocalSignals, describe, signal_process
from gpuconsole.core.model import GpuProcess, GpuState, HostSnapshot
from gpuconsole.telemetry.agent import process_details
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.confirm import ConfirmScreen
from gpuconsole.ui.screens.host import HostScreen

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]

HERE = LocalSignals({"here"})


@pytest.fixture
def sleeper():
    process = subprocess.Popen(SLEEPER)
    yield process
    process.kill()
    process.wait()


def gpu_process(pid: int, command: str) -> GpuProcess:
    """The row as the console reads it: its start from /proc, as a reading takes it."""
    started = process_details(pid)["started"]
    return GpuProcess(
        pid=pid,
        gpu=0,
        used_memory_mib=2048.0,
        user="alice",
        command=command,
        started=started if isinstance(started, float) else None,
    )


def test_terminate_sends_term_and_logs_it(sleeper, audit_log) -> None:
    result = signal_process(
        HERE, "here", gpu_process(sleeper.pid, " ".join(SLEEPER)), signal.SIGTERM
    )
    assert result.sent
    assert sleeper.wait(timeout=5) == -signal.SIGTERM
    entry = json.loads(audit_log.read_text().splitlines()[-1])
    assert entry["action"] == "signal-process"
    assert (entry["pid"], entry["signal"], entry["sent"]) == (sleeper.pid, "SIGTERM", True)


def test_a_reused_pid_is_not_signalled(sleeper, audit_log) -> None:
    result = signal_process(
        LocalSignals({"here"}), "here", gpu_process(sleeper.pid, "python train.py"), signal.SIGKILL
    )
    assert not result.sent
    assert "not the GPU process" in result.message
    assert sleeper.poll() is None  # still running


def test_an_exited_process_is_reported_as_gone(audit_log) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    result = signal_process(
        LocalSignals({"here"}), "here", gpu_process(done.pid, "python -c pass"), signal.SIGTERM
    )
    assert not result.sent
    assert "already exited" in result.message


def test_describe_names_pid_user_gpu_memory_and_command() -> None:
    text = describe(gpu_process(42, "python train.py"))
    assert text == "pid 42 (alice) on GPU 0 holding 2.0 GiB: python train.py"


async def test_confirmed_terminate_from_the_host_screen(sleeper, audit_log) -> None:
    gpu = GpuState(index=0, name="NVIDIA H200", utilization_pct=50.0)
    process = gpu_process(sleeper.pid, " ".join(SLEEPER))
    source = StaticSource(HostSnapshot("here", 1000.0, (gpu,), processes=(process,)))
    app = GpuConsoleApp(
        source, auto_poll=False, background_start=False, signals=LocalSignals({"here"})
    )
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HostScreen("here"))
        await pilot.pause()
        await pilot.press("k")  # the GPU list has focus: no process chosen yet
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("tab", "k")
        assert isinstance(app.screen, ConfirmScreen)
        assert str(sleeper.pid) in app.screen.detail
        await pilot.press("n")
        assert sleeper.poll() is None
        await pilot.press("k", "y")
        assert sleeper.wait(timeout=5) == -signal.SIGTERM


async def test_processes_of_a_remote_host_are_not_signalled(make_app, audit_log) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HostScreen("h100-02"))
        await pilot.pause()
        await pilot.press("tab", "k")
        assert not isinstance(app.screen, ConfirmScreen)
        assert not audit_log.exists()
