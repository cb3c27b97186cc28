"""`k` signals a process only while its pid and its start both match the row the admin
confirmed: a pid taken by a new process with the same command line is left alone, on this
machine and on an SSH host (through its agent).

The reuse is real, not simulated: once the confirmed process has exited, a new one with the
same command line is started at the same pid by writing the pid before it to
``/proc/sys/kernel/ns_last_pid`` (the kernel hands out the next free pid after it; CRIU restores
processes this way). That needs root; another process on the machine can take the pid first,
so it is retried. A confirmed start that differs from the live one without a new process (the
property test) checks the same rule for every other start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sshd import Sshd, wait_for

from gpuconsole.actions.processes import LocalSignals, signal_process
from gpuconsole.core.model import GpuProcess
from gpuconsole.hosts.inventory import HostDefaults
from gpuconsole.hosts.source import SshSource
from gpuconsole.hosts.supervisor import Backoff, Supervisor
from gpuconsole.telemetry import agent
from gpuconsole.telemetry.agent import command_line, process_details

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
HERE = LocalSignals({"here"})

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(NS_LAST_PID, os.W_OK),
    reason="reusing a pid on purpose needs root (ns_last_pid)",
)


@pytest.fixture
def sleep_line() -> list[str]:
    """A `sleep` command line no other test runs (GNU sleep takes a fraction)."""
    return ["sleep", f"335.{os.getpid()}{time.monotonic_ns() % 10**6}"]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a test starts, each killed and reaped at its end whatever happened."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def confirmed(pid: int) -> GpuProcess:
    """The row as the console reads it on this host (``process_details`` is what fills in a
    local or remote process's command line and start) and as the admin confirms it. A child
    just started has no command line until its exec has set it up, after Popen returns."""
    wait_for(lambda: command_line(pid), timeout=5, what=f"pid {pid}'s command line")
    details = process_details(pid)
    assert isinstance(details["started"], float)
    return GpuProcess(
        pid, 0, 1024.0, "root", command=str(details["command"]), started=details["started"]
    )


def reused(
    first: subprocess.Popen[bytes], argv: list[str], started: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """``first`` ended, and a new process running ``argv`` started at its pid."""
    first.kill()
    first.wait()
    time.sleep(0.05)  # a later clock tick than the first's start (SC_CLK_TCK is 100 here)
    for _ in range(200):
        NS_LAST_PID.write_text(str(first.pid - 1))
        process = subprocess.Popen(argv)
        started.append(process)
        if process.pid == first.pid:
            return process
        process.kill()
        process.wait()
    pytest.fail(f"could not start a process at pid {first.pid} again")


def signal_the_reused_pid(
    signals: object, host: str, argv: list[str], started: list[subprocess.Popen[bytes]]
) -> tuple[GpuProcess, subprocess.Popen[bytes], str]:
    first = subprocess.Popen(argv)
    started.append(first)
    row = confirmed(first.pid)  # what the admin saw and said yes to
    second = reused(first, argv, started)
    now = confirmed(second.pid)
    assert (now.pid, now.command) == (row.pid, row.command)  # the same pid and command line
    assert now.started != row.started  # but another process
    result = signal_process(signals, host, row, signal.SIGKILL)  # type: ignore[arg-type]
    assert not result.sent
    return now, second, result.message


def expected_line(now: GpuProcess) -> str:
    assert now.started is not None
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now.started))
    return f"pid {now.pid} is now another process (started at {stamp}), nothing sent"


@needs_root
def test_a_pid_reused_by_the_same_command_line_is_not_signalled_here(
    sleep_line: list[str], started: list[subprocess.Popen[bytes]], audit_log: Path
) -> None:
    now, second, message = signal_the_reused_pid(HERE, "here", sleep_line, started)
    assert message == expected_line(now)
    time.sleep(0.2)
    assert second.poll() is None  # the new process runs on
    entry = json.loads(audit_log.read_text().splitlines()[-1])
    assert (entry["sent"], entry["result"]) == (False, message)


def test_the_process_that_was_confirmed_is_still_signalled_here(
    sleep_line: list[str], started: list[subprocess.Popen[bytes]], audit_log: Path
) -> None:
    process = subprocess.Popen(sleep_line)
    started.append(process)
    result = signal_process(HERE, "here", confirmed(process.pid), signal.SIGTERM)
    assert result.sent, result.message
    assert process.wait(timeout=5) == -signal.SIGTERM


def test_a_row_read_without_a_start_is_not_signalled(
    sleep_line: list[str], started: list[subprocess.Popen[bytes]], audit_log: Path
) -> None:
    """A start that was not read cannot tell the process from one that took its pid."""
    process = subprocess.Popen(sleep_line)
    started.append(process)
    row = GpuProcess(process.pid, 0, 1024.0, command=" ".join(sleep_line))
    result = signal_process(HERE, "here", row, signal.SIGKILL)
    assert not result.sent
    assert result.message.startswith(f"pid {process.pid}: its start was not read")
    assert "\n" not in result.message and process.poll() is None


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shift=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).filter(lambda s: s != 0),
        st.sampled_from([0.01, -0.01, 1e-9, 1.0, 86400.0]),
    )
)
def test_any_other_start_sends_nothing(
    shift: float, sleep_line: list[str], started: list[subprocess.Popen[bytes]], audit_log: Path
) -> None:
    """KILL to a live process under any start but its own: it lives on, and one line says
    why."""
    if not started:
        started.append(subprocess.Popen(sleep_line))
    live = started[0]
    row = confirmed(live.pid)
    assert row.started is not None
    other = row.started + shift
    if other == row.started:  # a shift lost to rounding is no other start
        return
    result = signal_process(
        HERE,
        "here",
        GpuProcess(row.pid, 0, 1.0, command=row.command, started=other),
        signal.SIGKILL,
    )
    assert not result.sent
    assert result.message == expected_line(row)
    assert live.poll() is None


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    start=st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
        st.lists(st.integers(), max_size=2),
    )
)
def test_the_agents_signal_command_sends_nothing_for_any_other_start(
    start: object, sleep_line: list[str], started: list[subprocess.Popen[bytes]]
) -> None:
    """What the agent makes of a signal command's ``started``, whatever the console sends: only
    the live process's own start lets KILL through."""
    if not started:
        started.append(subprocess.Popen(sleep_line))
    live = started[0]
    row = confirmed(live.pid)
    if start == row.started:
        return
    command = {"cmd": "signal", "pid": live.pid, "signal": "KILL", "command": row.command}
    try:
        sent, _message = agent.send_signal(*agent.signal_of({**command, "started": start}))
    except agent.BadCommand:
        sent = False
    assert not sent
    assert live.poll() is None


# --- an SSH host: the agent judges on its side ---------------------------------------------


def ssh_source(server: Sshd) -> SshSource:
    import pwd

    user = pwd.getpwuid(os.getuid()).pw_name
    host = HostDefaults(user=user, port=server.port, connect_timeout=5.0).entry(
        "gpu-test", "127.0.0.1"
    )
    supervisor = Supervisor(
        [host],
        server.settings(keepalive_interval=1.0, keepalive_count_max=2),  # type: ignore[arg-type]
        interval=0.2,
        agent_mode="sim",
        backoff=Backoff(initial=0.2, maximum=1.0),
    )
    return SshSource(supervisor)


@pytest.fixture
def remote(sshd: Sshd) -> Iterator[SshSource]:
    source = ssh_source(sshd)
    try:
        source.settle(15)
        wait_for(lambda: source.supervisor.link("gpu-test").hello is not None, what="hello")
        yield source
    finally:
        source.close()


@needs_root
def test_a_pid_reused_by_the_same_command_line_is_not_signalled_on_an_ssh_host(
    remote: SshSource,
    sleep_line: list[str],
    started: list[subprocess.Popen[bytes]],
    audit_log: Path,
) -> None:
    now, second, message = signal_the_reused_pid(remote, "gpu-test", sleep_line, started)
    assert message == expected_line(now)
    time.sleep(0.2)
    assert second.poll() is None


def test_the_confirmed_process_is_still_signalled_on_an_ssh_host(
    remote: SshSource,
    sleep_line: list[str],
    started: list[subprocess.Popen[bytes]],
    audit_log: Path,
) -> None:
    process = subprocess.Popen(sleep_line)
    started.append(process)
    row = confirmed(process.pid)
    result = signal_process(remote, "gpu-test", row, signal.SIGTERM)
    assert result.sent, result.message
    assert process.wait(timeout=5) == -signal.SIGTERM
    again = subprocess.Popen(sleep_line)
    started.append(again)
    unread = GpuProcess(again.pid, 0, 1.0, command=row.command)  # a row without a start
    refused = signal_process(remote, "gpu-test", unread, signal.SIGKILL)
    assert not refused.sent
    assert refused.message.startswith(f"pid {again.pid}: its start was not read")
    assert again.poll() is None
