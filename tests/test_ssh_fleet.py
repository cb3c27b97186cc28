"""The SSH fleet against a real OpenSSH sshd on 127.0.0.1: readings, faults and recovery.

The far side's GPUs are simulated two ways: the agent's own `sim` mode, and the agent's `smi`
mode reading a stand-in `nvidia-smi` that sshd puts first on the session's PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sshd import Sshd, free_port, keygen, sshd_available, wait_for

from gpuconsole.actions.processes import signal_process
from gpuconsole.core.model import GpuProcess, HostState
from gpuconsole.fleet.poller import collect, ingest
from gpuconsole.fleet.store import FleetStore
from gpuconsole.hosts.inventory import HostDefaults, HostEntry
from gpuconsole.hosts.source import SshSource
from gpuconsole.hosts.ssh import SshSettings
from gpuconsole.hosts.supervisor import Backoff, Supervisor
from gpuconsole.telemetry.agent import process_details
from gpuconsole.telemetry.wire import AGENT_MARKER, agent_script

pytestmark = pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")

FAST = Backoff(initial=0.2, maximum=1.0)
TICK = 0.2


def entry(server: Sshd, name: str = "gpu-test", **changes: object) -> HostEntry:
    defaults = HostDefaults(user=_user(), port=server.port, connect_timeout=5.0)
    host = defaults.entry(name, "127.0.0.1")
    return HostEntry(**{**_fields(host), **changes})  # type: ignore[arg-type]


def settings(server: Sshd, **changes: object) -> SshSettings:
    return server.settings(**{"keepalive_interval": 1.0, "keepalive_count_max": 2, **changes})


def source_for(server: Sshd, mode: str = "sim", **options: object) -> SshSource:
    host_settings = options.pop("settings", None) or settings(server)
    hosts = options.pop("hosts", None) or [entry(server)]
    supervisor = Supervisor(
        hosts,  # type: ignore[arg-type]
        host_settings,  # type: ignore[arg-type]
        interval=TICK,
        agent_mode=mode,
        backoff=FAST,
        **options,  # type: ignore[arg-type]
    )
    return SshSource(supervisor)


def agent_pids() -> list[int]:
    pids = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if AGENT_MARKER in cmdline and "python3" in " ".join(cmdline[:1]):
            pids.append(process.pid)
    return pids


# --- readings ----------------------------------------------------------------------------------


def test_the_agent_streams_simulated_readings_over_sshd(sshd: Sshd) -> None:
    source = source_for(sshd)
    try:
        source.settle(15)
        link = source.supervisor.link("gpu-test")
        assert link.state is HostState.LIVE, link.reason
        snapshot = source.read("gpu-test")
        assert snapshot.host == "gpu-test"
        assert len(snapshot.gpus) == 8
        assert link.hello is not None and link.hello.mode == "sim"
        with pytest.raises(Exception, match="no new reading"):
            source.read("gpu-test")  # the same reading is handed out once
        wait_for(lambda: link.pending is not None, what="the next reading")
    finally:
        source.close()


def test_the_agent_reads_nvidia_smi_on_the_host(sshd: Sshd) -> None:
    source = source_for(sshd, mode="auto")  # no NVML library here: the agent uses nvidia-smi
    try:
        source.settle(15)
        snapshot = source.read("gpu-test")
        assert snapshot.source == "agent-smi"
        assert len(snapshot.gpus) == 8
        assert all(g.memory_total_mib for g in snapshot.gpus)
    finally:
        source.close()


# --- faults -----------------------------------------------------------------------------------


def test_sshd_killed_makes_the_host_down_then_live_when_it_is_back(sshd: Sshd) -> None:
    source = source_for(sshd)
    link = source.supervisor.link("gpu-test")
    try:
        source.settle(15)
        assert link.state is HostState.LIVE
        sshd.kill()
        wait_for(lambda: link.state is HostState.DOWN, what="the host to go down")
        assert "gpu-test" in (link.reason or "")
        with pytest.raises(Exception) as raised:
            source.read("gpu-test")
        assert getattr(raised.value, "state", None) is HostState.DOWN
        sshd.start()
        wait_for(lambda: link.state is HostState.LIVE, what="the host to come back")
        assert link.connects == 2
    finally:
        source.close()


def test_a_killed_agent_is_restarted_on_the_same_connection(sshd: Sshd) -> None:
    source = source_for(sshd)
    link = source.supervisor.link("gpu-test")
    try:
        source.settle(15)
        wait_for(lambda: link.hello is not None, what="the agent's hello")
        assert link.hello is not None
        first = link.hello.agent_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_for(
            lambda: link.hello is not None and link.hello.agent_pid != first,
            what="a new agent",
        )
        wait_for(lambda: link.pending is not None, what="readings from the new agent")
        assert link.agent_starts == 2
        assert link.connects == 1
        assert link.state is HostState.LIVE
    finally:
        source.close()


def test_a_hung_nvidia_smi_makes_the_host_stale_within_three_ticks(
    sshd: Sshd, standin: tuple[Path, Path]
) -> None:
    source = source_for(sshd, mode="smi")
    store = FleetStore(source.hosts)
    try:
        source.settle(15)
        ingest(store, collect(source))
        assert store.status("gpu-test").state is HostState.LIVE
        standin[1].touch()  # every nvidia-smi from now on hangs, as on a GPU off the bus
        ticks = 0
        while store.status("gpu-test").state is not HostState.STALE:
            time.sleep(TICK)
            ingest(store, collect(source))
            ticks += 1
            assert ticks <= 3 + 6, "not stale after the hang (3 ticks + the in-flight ones)"
        assert "nvidia-smi" in (store.status("gpu-test").reason or "")
    finally:
        standin[1].unlink(missing_ok=True)
        source.close()


def test_a_changed_host_key_is_refused_loudly_and_not_retried(sshd: Sshd, tmp_path: Path) -> None:
    sshd.trust(keygen(tmp_path / "other_host_key", "other"))
    source = source_for(sshd)
    link = source.supervisor.link("gpu-test")
    try:
        source.settle(15)
        assert link.state is HostState.HOST_KEY_MISMATCH
        assert "REFUSED" in (link.reason or "")
        assert str(sshd.known_hosts) in (link.reason or "")
        time.sleep(1.0)  # backoff would have retried by now
        assert link.connects == 0
        assert link.state is HostState.HOST_KEY_MISMATCH
    finally:
        source.close()


def test_an_unknown_host_key_is_refused_until_someone_adds_it(sshd: Sshd) -> None:
    sshd.known_hosts.write_text("")
    source = source_for(sshd)
    link = source.supervisor.link("gpu-test")
    try:
        source.settle(15)
        assert link.state is HostState.HOST_KEY_UNKNOWN
        assert "host key unknown" in (link.reason or "")
        assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {sshd.known_hosts}" in (link.reason or "")
        assert link.connects == 0
        sshd.trust(sshd.host_key)  # what the reason says to do, done
        wait_for(lambda: link.state is HostState.LIVE, 15, "the host once its key is known")
    finally:
        source.close()


def test_a_wrong_key_is_an_auth_failure(sshd: Sshd, tmp_path: Path) -> None:
    stranger = keygen(tmp_path / "stranger")
    source = source_for(
        sshd,
        settings=settings(
            sshd,
            options=(
                f"UserKnownHostsFile={sshd.known_hosts}",
                f"IdentityFile={stranger}",
                "IdentitiesOnly=yes",
                "IdentityAgent=none",
            ),
        ),
    )
    link = source.supervisor.link("gpu-test")
    try:
        source.settle(15)
        assert link.state is HostState.AUTH_FAILED
        assert "authentication refused" in (link.reason or "")
    finally:
        source.close()


def test_nothing_listening_is_down_with_the_reason(sshd: Sshd) -> None:
    closed = entry(sshd, name="nobody", port=free_port())
    source = source_for(sshd, hosts=[closed])
    link = source.supervisor.link("nobody")
    try:
        source.settle(15)
        assert link.state is HostState.DOWN
        assert "refused" in (link.reason or "").lower()
    finally:
        source.close()


def test_garbage_on_the_agents_stdout_is_counted_and_the_host_stays_live(sshd: Sshd) -> None:
    noisy = (
        b"import sys, threading, time\n"
        b"def _noise():\n"
        b"    while True:\n"
        b"        sys.stdout.write('garbage {not json\\n'); sys.stdout.flush(); time.sleep(0.1)\n"
        b"threading.Thread(target=_noise, daemon=True).start()\n"
        b"exec(compile(%r, 'gpuconsole-agent', 'exec'))\n" % agent_script()
    )
    source = source_for(sshd, script=noisy)
    link = source.supervisor.link("gpu-test")
    try:
        source.settle(15)
        wait_for(lambda: link.malformed >= 5, what="garbage lines to be counted")
        link.pending = None
        wait_for(lambda: link.pending is not None, what="readings among the garbage")
        assert link.state is HostState.LIVE
        assert link.agent_starts == 1
    finally:
        source.close()


def test_no_agent_is_left_on_the_host_after_the_console_quits(sshd: Sshd) -> None:
    before = set(agent_pids())
    source = source_for(sshd)
    source.settle(15)
    link = source.supervisor.link("gpu-test")
    wait_for(lambda: link.hello is not None, what="the agent's hello")
    assert link.hello is not None
    assert link.hello.agent_pid in set(agent_pids()) - before
    source.close()
    wait_for(lambda: not set(agent_pids()) - before, timeout=5, what="the agent to exit")


# --- remote process actions ---------------------------------------------------------------------


def test_a_remote_process_is_signalled_through_its_agent(sshd: Sshd, audit_log: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "300"])
    source = source_for(sshd)
    try:
        source.settle(15)
        wait_for(lambda: source.supervisor.link("gpu-test").hello is not None, what="hello")
        started = process_details(sleeper.pid)["started"]
        assert isinstance(started, float)
        process = GpuProcess(sleeper.pid, 0, 1024.0, command="sleep 300", started=started)
        wrong = GpuProcess(sleeper.pid, 0, 1024.0, command="python other", started=started)
        refused = signal_process(source, "gpu-test", wrong, signal.SIGTERM)
        assert not refused.sent
        assert sleeper.poll() is None
        result = signal_process(source, "gpu-test", process, signal.SIGTERM)
        assert result.sent, result.message
        assert sleeper.wait(timeout=5) == -signal.SIGTERM
    finally:
        sleeper.kill()
        source.close()
    records = [json.loads(line) for line in audit_log.read_text().splitlines()]
    assert [r["sent"] for r in records] == [False, True]
    assert all(r["host"] == "gpu-test" for r in records)


# --- helpers ----------------------------------------------------------------------------------


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _fields(host: HostEntry) -> dict[str, object]:
    return {name: getattr(host, name) for name in HostEntry.__slots__}  # type: ignore[attr-defined]


# --- a host that lets the console in but has no GPU to read -----------------------------------


@pytest.fixture
def driverless(tmp_path: Path) -> Iterator[Sshd]:
    """An sshd whose sessions have python3 but neither NVML nor nvidia-smi."""
    path = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    if shutil.which("nvidia-smi", path=path) is not None:
        pytest.skip("this machine has nvidia-smi")
    server = Sshd(tmp_path / "sshd-bare", env={"PATH": path}).start()
    yield server
    server.kill()


def test_a_host_without_a_driver_is_no_driver_with_the_agents_words(driverless: Sshd) -> None:
    """Logged in, no reading: a definite answer (the main today sat in `connecting` with
    "connected, starting the agent" until hosts check gave up)."""
    source = source_for(driverless, mode="auto")
    link = source.supervisor.link("gpu-test")
    try:
        started = time.monotonic()
        source.settle(30)
        assert time.monotonic() - started < 25, "settle waited as if no answer came"
        assert link.state is HostState.NO_DRIVER, (link.state, link.reason)
        assert link.reason is not None and link.reason.startswith("gpu-test: logged in, but")
        assert "nvidia-smi" in link.reason, link.reason
    finally:
        source.close()
