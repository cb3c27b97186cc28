"""The agent run for real: started with the exact remote command under bash, its script written
to its stdin, its lines decoded by `AgentStream`. nvidia-smi is the stand-in (tests/standin.py);
NVML is absent here, which is what ``auto`` has to cope with."""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import itertools
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuconsole.telemetry import agent as agent_module
from gpuconsole.telemetry.wire import (
    AGENT_MARKER,
    AgentError,
    AgentStream,
    AgentTick,
    Event,
    Hello,
    Reply,
    agent_command,
    agent_script,
    encode_command,
)
from tests.nvml_standin import INSUFFICIENT_SIZE as INSUFFICIENT_SIZE  # test_process_load's
from tests.nvml_standin import StandinLibrary
from tests.standin import MISSING_PID, write_standin_smi

SCRIPT = agent_script()
WAIT_S = 5.0


class RunningAgent:
    """One agent process, its stdout read by a thread into timestamped events."""

    def __init__(self, command: str, path: str, python: str | None = None) -> None:
        env = {"PATH": path, "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}
        self.process = subprocess.Popen(
            ["/bin/bash", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        # Written by a thread of its own, as the console's asyncssh buffers it: the script is
        # larger than a pipe holds, and where bash finds no python3 nothing ever reads it.
        self._writer = threading.Thread(target=self._write_script, daemon=True)
        self._writer.start()
        self.stream = AgentStream("test-host")
        self._lines: queue.Queue[tuple[float, bytes]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _write_script(self) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):  # ended (the test is over) before it read it all
            self.process.stdin.write(SCRIPT)
            self.process.stdin.flush()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self._lines.put((time.monotonic(), raw))
        self._lines.put((time.monotonic(), b""))

    def next(self, timeout: float = WAIT_S) -> tuple[float, Event | None]:
        """The next line's event (None for a CSV row of a tick not complete yet), with when the
        line arrived; a malformed line fails the test."""
        try:
            at, raw = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line from the agent within {timeout} s") from None
        if not raw:
            raise AssertionError(f"the agent exited: {self.stderr()}")
        event = self.stream.feed(raw.decode())
        assert self.stream.malformed == 0, self.stream.last_malformed
        return at, event

    def next_of(self, kind: type, timeout: float = WAIT_S) -> tuple[float, Event]:
        deadline = time.monotonic() + timeout
        while True:
            at, event = self.next(max(0.0, deadline - time.monotonic()))
            if isinstance(event, kind):
                return at, event

    def send(self, command: dict[str, object]) -> None:
        self._writer.join()  # the script first, whole
        assert self.process.stdin is not None
        self.process.stdin.write(encode_command(command))
        self.process.stdin.flush()

    def close_stdin(self) -> None:
        self._writer.join()
        assert self.process.stdin is not None
        self.process.stdin.close()

    def stderr(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return "(still running)"
        return self.process.stderr.read().decode(errors="replace")

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=WAIT_S)


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """python3 (this interpreter) and the stand-in nvidia-smi, first on PATH."""
    directory = tmp_path / "bin"
    directory.mkdir()
    (directory / "python3").symlink_to(sys.executable)
    return directory


@pytest.fixture
def start(bin_dir: Path) -> Iterator[Callable[..., RunningAgent]]:
    agents: list[RunningAgent] = []

    def start_agent(
        interval: float, mode: str, gpus: int = 8, timeout: float = 5.0, path: str | None = None
    ) -> RunningAgent:
        command = agent_command(len(SCRIPT), interval, mode, gpus, timeout=timeout)
        agent = RunningAgent(command, path or f"{bin_dir}:/usr/bin:/bin")
        agents.append(agent)
        return agent

    yield start_agent
    for agent in agents:
        agent.end()


@pytest.fixture
def hang_flag(tmp_path: Path) -> Iterator[Path]:
    """While this file exists the stand-in hangs; it goes at the end, so none hangs on."""
    flag = tmp_path / "hang"
    yield flag
    flag.unlink(missing_ok=True)


def processes_running(needle: str) -> list[int]:
    """Pids whose command line contains ``needle``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle.encode() in cmdline and b"\0" in cmdline:
                pids.append(int(entry.name))
    return pids


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


# --- modes ---------------------------------------------------------------------------------------


def test_sim_mode_readings_decode_into_snapshots_of_eight_gpus(start) -> None:
    agent = start(0.1, "sim")
    _, hello = agent.next()
    assert isinstance(hello, Hello)
    assert (hello.mode, hello.topology, hello.driver_version) == ("sim", None, None)
    assert hello.agent_pid == agent.process.pid  # bash exec'd python3
    for _ in range(3):
        _, reading = agent.next()
        assert isinstance(reading, AgentTick)
        snapshot = reading.snapshot
        assert (snapshot.host, snapshot.source, len(snapshot.gpus)) == ("test-host", "agent-sim", 8)
        assert [gpu.index for gpu in snapshot.gpus] == list(range(8))
        assert {gpu.name for gpu in snapshot.gpus} == {"NVIDIA H100 80GB HBM3"}
        assert all(gpu.pstate == "P0" and gpu.fan_pct is None for gpu in snapshot.gpus)
        assert len(snapshot.processes) == 2
        assert all(p.container and p.container.startswith("docker:") for p in snapshot.processes)
        assert reading.sent_at is not None and abs(reading.sent_at - time.time()) < 5
    assert agent.stream.malformed == 0


def test_smi_mode_decodes_gpus_and_processes(start, bin_dir: Path) -> None:
    write_standin_smi(bin_dir, gpus=8)
    agent = start(0.2, "smi")
    _, hello = agent.next()
    assert isinstance(hello, Hello)
    assert (hello.mode, hello.driver_version, hello.cuda_version) == ("smi", "580.159.04", "13.0")
    assert hello.topology is not None and hello.topology.gpu_count == 8
    assert hello.topology.link(0, 7) == "NV18" and hello.topology.numa_affinity[7] == 1
    _, reading = agent.next_of(AgentTick)
    snapshot = reading.snapshot
    assert (snapshot.source, snapshot.driver_version) == ("agent-smi", "580.159.04")
    assert [gpu.index for gpu in snapshot.gpus] == list(range(8))
    gpu = snapshot.gpus[3]
    assert (gpu.name, gpu.memory_total_mib, gpu.power_limit_w) == ("NVIDIA H200", 143771.0, 700.0)
    assert gpu.pcie is not None and gpu.pcie.max_width == 16 and gpu.fan_pct is None
    parent, missing = snapshot.processes
    # The stand-in names its parent, the agent, as a GPU process: /proc tells who that is.
    assert (parent.pid, parent.gpu, parent.used_memory_mib) == (hello.agent_pid, 0, 1002.0)
    assert parent.user == getpass.getuser()
    assert parent.command is not None and AGENT_MARKER in parent.command
    assert (missing.pid, missing.gpu, missing.user, missing.command) == (
        MISSING_PID,
        1,
        None,
        "train",
    )


def nvml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(nvml_loads(), reason="this machine has NVML: auto would rightly use it")
def test_auto_without_nvml_falls_back_to_smi(start, bin_dir: Path) -> None:
    write_standin_smi(bin_dir, gpus=2)
    agent = start(0.2, "auto")
    _, hello = agent.next()
    assert isinstance(hello, Hello) and hello.mode == "smi"
    _, reading = agent.next_of(AgentTick)
    assert len(reading.snapshot.gpus) == 2


@pytest.mark.skipif(nvml_loads(), reason="this machine has NVML")
def test_nvml_mode_without_nvml_exits_saying_why(start) -> None:
    agent = start(0.2, "nvml")
    assert agent.process.wait(timeout=WAIT_S) == 1
    assert "libnvidia-ml.so.1 cannot be loaded" in agent.stderr()


# --- nvml, against a stand-in library (tests/test_agent_nvml.py has the rest) --------------------


class FakeNvmlLibrary(StandinLibrary):
    """Two GPUs: GPU 1 has fallen off the bus, and GPU 0 answers only its name, P-state, power
    and clock-event reasons (every other call is not supported) and runs ``processes``, (pid,
    used bytes) pairs."""

    def __init__(self, processes: list[tuple[int, int]]) -> None:
        running = [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in processes]
        super().__init__(
            [
                {
                    "nvmlDeviceGetName": "NVIDIA H200",
                    "nvmlDeviceGetPerformanceState": 0,
                    "nvmlDeviceGetPowerUsage": 123_450,
                    "nvmlDeviceGetCurrentClocksEventReasons": 0x41,
                    "nvmlDeviceGetComputeRunningProcesses": running,
                },
                {},
            ]
        )
        self.faults[1] = "lost"


def test_nvml_reads_each_field_alone_and_keeps_going_past_a_lost_gpu() -> None:
    library = FakeNvmlLibrary([(os.getpid(), 512 * 1024 * 1024), (MISSING_PID, 2**64 - 1)])
    gpus, processes = agent_module.Nvml(library).read()
    first, lost = gpus
    assert (first["name"], first["pstate"], first["power_w"]) == ("NVIDIA H200", 0, 123.45)
    assert first["throttle_mask"] == 0x41 and first["lost"] is False
    assert first["fan_pct"] is None and first["temperature_c"] is None
    assert first["ecc"] is None  # ECC mode not readable: no counts asked for
    assert lost == dict.fromkeys(agent_module.GPU_KEYS) | {
        "index": 1,
        "lost": True,
        "mig_instances": [],
    }
    # Asked the size, then asked again with room.
    assert library.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2
    mine, gone = processes
    assert (mine["pid"], mine["gpu"], mine["used_memory_mib"]) == (os.getpid(), 0, 512.0)
    assert (mine["kind"], mine["mig_instance"], mine["user"]) == (
        "compute",
        None,
        getpass.getuser(),
    )
    assert mine["command"] == " ".join(
        Path("/proc/self/cmdline").read_text().rstrip("\0").split("\0")
    )
    assert (gone["used_memory_mib"], gone["user"], gone["command"], gone["cgroup"]) == (None,) * 4


# --- a hung nvidia-smi ---------------------------------------------------------------------------


def test_hung_nvidia_smi_gives_an_error_each_tick_and_one_call_at_a_time(
    start, bin_dir: Path, hang_flag: Path
) -> None:
    flag = hang_flag
    standin = write_standin_smi(bin_dir, gpus=2, hang_flag=flag)
    agent = start(0.2, "smi", timeout=0.6)
    agent.next_of(AgentTick)
    flag.touch()
    errors: list[tuple[float, str]] = []
    most_standins = 0
    while len(errors) < 8:
        at, event = agent.next()
        most_standins = max(most_standins, len(processes_running(str(standin))))
        if isinstance(event, AgentError):
            errors.append((at, event.message))
    messages = [message for _, message in errors]
    assert all(message.startswith("nvidia-smi --query-gpu") for message in messages), messages
    assert any("has not answered for" in message for message in messages)
    assert any("gave no answer within 0.6 s and was killed" in message for message in messages)
    ticks = [at for at, message in errors if "has not answered" in message]
    assert 0.1 < statistics.median(gaps(ticks)) < 0.3
    assert most_standins == 1
    flag.unlink()
    agent.next_of(AgentTick)


# --- commands ------------------------------------------------------------------------------------


def test_interval_command_changes_the_pace(start) -> None:
    agent = start(0.6, "sim", gpus=1)
    agent.next_of(AgentTick)
    agent.send({"cmd": "interval", "seconds": 0.1, "id": 1})
    _, reply = agent.next_of(Reply)
    assert reply == Reply(1, True, "interval set to 0.1 s")
    times = [agent.next_of(AgentTick)[0] for _ in range(6)]
    assert 0.05 < statistics.median(gaps(times)) < 0.2
    agent.send({"cmd": "interval", "seconds": 0.01, "id": 2})
    _, refused = agent.next_of(Reply)
    assert refused == Reply(2, False, "interval 0.01 s is outside 0.1 ... 3600 s")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(["sleep", "60"])
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()


def started(pid: int) -> float | None:
    """The process's start as a reading gives it, which a signal command carries back."""
    value = agent_module.process_details(pid)["started"]
    return value if isinstance(value, float) else None


def test_signal_reaches_the_process_that_runs_the_command(start, sleeper) -> None:
    agent = start(0.2, "sim", gpus=1)
    agent.next_of(Hello)
    command = {"cmd": "signal", "id": 5, "pid": sleeper.pid, "signal": "TERM"}
    agent.send({**command, "command": "sleep 60", "started": started(sleeper.pid)})
    _, reply = agent.next_of(Reply)
    assert reply == Reply(5, True, f"sent TERM to pid {sleeper.pid}")
    assert sleeper.wait(timeout=WAIT_S) == -signal.SIGTERM


def test_signal_to_a_pid_that_runs_something_else_sends_nothing(start, sleeper) -> None:
    agent = start(0.2, "sim", gpus=1)
    agent.next_of(Hello)
    command = {"cmd": "signal", "id": 6, "pid": sleeper.pid, "signal": "KILL"}
    agent.send({**command, "command": "python3 train.py", "started": started(sleeper.pid)})
    _, reply = agent.next_of(Reply)
    assert reply == Reply(
        6, False, f"pid {sleeper.pid} is now 'sleep 60', not the GPU process: nothing sent"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(timeout=0.2)


def test_signal_to_a_process_that_has_exited(start) -> None:
    agent = start(0.2, "sim", gpus=1)
    agent.next_of(Hello)
    agent.send({"cmd": "signal", "id": 7, "pid": MISSING_PID, "signal": "TERM", "command": "x"})
    _, reply = agent.next_of(Reply)
    assert reply == Reply(7, False, f"pid {MISSING_PID} has already exited")


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ({"cmd": "signal", "pid": "1", "signal": "TERM", "command": "x"}, "needs pid"),
        ({"cmd": "signal", "pid": 0, "signal": "TERM", "command": "x"}, "needs pid"),
        ({"cmd": "signal", "pid": 5, "signal": "HUP", "command": "x"}, "needs signal"),
        ({"cmd": "reboot"}, "unknown command 'reboot'"),
        ({"cmd": "interval", "v": 1, "seconds": 1}, "protocol version 1, not 2"),
    ],
)
def test_malformed_commands_with_an_id_are_refused(start, command, message) -> None:
    agent = start(0.2, "sim", gpus=1)
    agent.next_of(Hello)
    agent.send({**command, "id": 9})
    _, reply = agent.next_of(Reply)
    assert reply.request_id == 9 and not reply.ok and message in reply.message


def test_malformed_commands_without_an_id_are_ignored(start) -> None:
    agent = start(0.2, "sim", gpus=1)
    agent.next_of(Hello)
    assert agent.process.stdin is not None
    agent.process.stdin.write(b"not json\n[1]\n" + encode_command({"cmd": "reboot"}))
    agent.send({"cmd": "signal", "pid": MISSING_PID, "signal": "KILL", "command": "init"})
    agent.send({"cmd": "interval", "seconds": 0.2, "id": 10})
    _, reply = agent.next_of(Reply)  # the first reply is to the first command with an id
    assert reply.request_id == 10 and reply.ok


# --- leaving -------------------------------------------------------------------------------------


def test_closing_stdin_ends_the_agent_and_its_nvidia_smi(
    start, bin_dir: Path, hang_flag: Path
) -> None:
    flag = hang_flag
    standin = write_standin_smi(bin_dir, gpus=2, hang_flag=flag)
    agent = start(0.2, "smi")
    agent.next_of(AgentTick)
    flag.touch()
    agent.next_of(AgentError)  # a call is in flight, hanging
    assert processes_running(str(standin))
    began = time.monotonic()
    agent.close_stdin()
    assert agent.process.wait(timeout=WAIT_S) == 0
    assert time.monotonic() - began < 2.0
    assert processes_running(str(standin)) == []


def test_stop_ends_the_agent(start) -> None:
    agent = start(0.2, "sim", gpus=1)
    agent.next_of(AgentTick)
    began = time.monotonic()
    agent.send({"cmd": "stop"})
    assert agent.process.wait(timeout=WAIT_S) == 0
    assert time.monotonic() - began < 1.0


def test_a_console_that_stops_reading_ends_the_agent(bin_dir: Path) -> None:
    command = agent_command(len(SCRIPT), 0.1, "sim", 1)
    process = subprocess.Popen(
        ["/bin/bash", "-c", command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(SCRIPT)
    process.stdin.flush()
    assert json.loads(process.stdout.readline())["type"] == "hello"
    process.stdout.close()  # stdin stays open: only the broken pipe tells the agent
    try:
        assert process.wait(timeout=2.0) == 0
    finally:
        process.kill()
        process.wait()
        process.stdin.close()


# --- where there is no python3 -------------------------------------------------------------------


def test_without_python3_nvidia_smi_streams_csv_that_decodes(start, tmp_path: Path) -> None:
    only_smi = tmp_path / "only-nvidia-smi"
    only_smi.mkdir()
    write_standin_smi(only_smi, gpus=2)
    agent = start(0.1, "auto", path=str(only_smi))  # bash finds no python3 there
    for _ in range(2):
        _, reading = agent.next_of(AgentTick)
        assert reading.sent_at is None
        assert reading.snapshot.source == "smi-stream"
        assert [gpu.index for gpu in reading.snapshot.gpus] == [0, 1]
        assert reading.snapshot.gpus[1].memory_total_mib == 143771.0
    assert agent.stream.mode == "smi-stream" and agent.stream.malformed == 0


# --- the oldest Python the agent keeps to --------------------------------------------------------


def oldest_python() -> str | None:
    """The interpreter behind ``python3.8`` on PATH (behind a pyenv shim, say), if it runs."""
    found = shutil.which("python3.8")
    if found is None:
        return None
    probe = subprocess.run(
        [found, "-c", "import sys; print(sys.executable)"], capture_output=True, timeout=WAIT_S
    )
    return probe.stdout.decode().strip() or None if probe.returncode == 0 else None


@pytest.mark.skipif(oldest_python() is None, reason="no working python3.8 on PATH")
def test_the_agent_runs_on_python_3_8(start, bin_dir: Path) -> None:
    python = oldest_python()
    assert python is not None
    (bin_dir / "python3").unlink()
    (bin_dir / "python3").symlink_to(python)
    write_standin_smi(bin_dir, gpus=2)
    agent = start(0.2, "auto")
    _, hello = agent.next()
    assert isinstance(hello, Hello) and hello.mode == "smi"
    _, reading = agent.next_of(AgentTick)
    assert len(reading.snapshot.gpus) == 2 and len(reading.snapshot.processes) == 2
