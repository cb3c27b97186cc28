"""Issue 35: a host whose agent's lines cannot be read is `agent-error`, with the first line's
reason, within the connect timeout of that line; a value of the wrong type costs only itself.

The real supervisor against a real OpenSSH sshd on 127.0.0.1. In the agent's place runs the real
agent (sim mode), sent to the host as the real one is, with what it writes changed: its protocol
version, a field's type, or every line garbage.
"""

from __future__ import annotations

import textwrap
import time

import pytest
from sshd import Sshd, sshd_available, wait_for

from gpuconsole.core.model import HostState, Severity
from gpuconsole.fleet.poller import collect, ingest
from gpuconsole.fleet.store import FleetStore
from gpuconsole.hosts.inventory import HostDefaults
from gpuconsole.hosts.source import SshSource
from gpuconsole.hosts.supervisor import Backoff, HostLink, Supervisor
from gpuconsole.rules.health import evaluate, host_state_finding
from gpuconsole.telemetry.wire import agent_script

pytestmark = pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")

CONNECT_TIMEOUT = 2.0
TICK = 0.2
SLACK = 1.5
"""What the bound allows beyond the connect timeout: the test's polling and a busy machine."""
HOST = "gpu-test"


def standin(change: str) -> bytes:
    """The real agent's source run with ``change`` applied to its namespace, ``agent``, first."""
    return (
        "import os, sys\n"
        'agent = {"__name__": "gpuconsole_agent"}\n'
        f'exec(compile({agent_script()!r}, "gpuconsole-agent", "exec"), agent)\n'
        f"{textwrap.dedent(change)}\n"
        'code = agent["main"](sys.argv[1:])\n'
        "sys.stderr.flush()\n"
        "os._exit(code)\n"
    ).encode()


WRONG_VERSION = 'agent["PROTOCOL_VERSION"] = 7'
WRONG_TYPES = """
    import json
    send = agent["LineWriter"].send
    def _send(self, kind, **fields):
        fields = json.loads(json.dumps(fields))
        for gpu in fields.get("gpus") or ():
            gpu["temperature_c"] = "hot"
        for process in fields.get("processes") or ():
            process["used_memory_mib"] = "lots"
        send(self, kind, **fields)
    agent["LineWriter"].send = _send
"""
ONLY_GARBAGE = """
    def _send(self, kind, **fields):
        os.write(self._fd, b"Welcome to node7! {not json\\n")
    agent["LineWriter"].send = _send
"""
GARBAGE_FOR_A_WHILE = f"""
    import time
    send, began = agent["LineWriter"].send, time.monotonic()
    def _send(self, kind, **fields):
        if kind == "reading" and time.monotonic() - began < {CONNECT_TIMEOUT + 2.0}:
            os.write(self._fd, b"garbage {{not json\\n")
        else:
            send(self, kind, **fields)
    agent["LineWriter"].send = _send
"""
ONE_LINE_AND_EXIT = """
    os.write(1, b'{"v": 7, "type": "hello", "mode": "sim"}\\n')
    os._exit(0)
"""


def source_for(server: Sshd, change: str) -> SshSource:
    defaults = HostDefaults(
        user=server.home.owner(), port=server.port, connect_timeout=CONNECT_TIMEOUT
    )
    host = defaults.entry(HOST, "127.0.0.1")
    supervisor = Supervisor(
        [host],
        server.settings(keepalive_interval=1.0, keepalive_count_max=2),
        interval=TICK,
        agent_mode="sim",
        agent_gpus=2,
        script=standin(change),
        backoff=Backoff(initial=0.2, maximum=1.0),
    )
    return SshSource(supervisor)


def agent_error_after_first_bad_line(link: HostLink, timeout: float = 20.0) -> float:
    """Seconds from the first line the console could not read to the host's `agent-error`."""
    first_bad = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if first_bad is None and link.malformed:
            first_bad = time.monotonic()
        if link.state.value == "agent-error":
            assert first_bad is not None, "agent-error before any line went unread"
            return time.monotonic() - first_bad
        time.sleep(0.02)
    raise AssertionError(f"no agent-error after {timeout} s: {link.state.value}, {link.reason}")


def assert_one_line_naming_the_host(reason: str | None, *words: str) -> None:
    assert reason is not None and reason.startswith(f"{HOST}: "), reason
    assert "\n" not in reason and len(reason) <= 1024, reason
    for word in words:
        assert word in reason, (word, reason)


def test_a_wrong_protocol_version_is_agent_error_within_the_connect_timeout(sshd: Sshd) -> None:
    source = source_for(sshd, WRONG_VERSION)
    link = source.supervisor.link(HOST)
    store = FleetStore(source.hosts)
    try:
        waited = agent_error_after_first_bad_line(link)
        assert waited <= CONNECT_TIMEOUT + SLACK, waited
        assert_one_line_naming_the_host(link.reason, "protocol version 7", "not 2")
        ingest(store, collect(source))
        assert store.status(HOST).state.value == "agent-error"
        (finding,) = [f for f in store.findings(HOST) if f.host == HOST and f.gpu is None]
        assert (finding.code, finding.severity) == ("host-agent-error", Severity.CRITICAL)
        assert "protocol version 7" in finding.message
        # Not retried: a wrong version does not mend by starting the same agent again.
        time.sleep(1.0)
        assert (link.agent_starts, link.connects) == (1, 1)
        assert link.state.value == "agent-error"
    finally:
        source.close()


def test_a_field_of_the_wrong_type_is_na_and_the_host_live(sshd: Sshd) -> None:
    source = source_for(sshd, WRONG_TYPES)
    link = source.supervisor.link(HOST)
    try:
        source.settle(15)
        wait_for(lambda: link.pending is not None, 10, "a reading")
        assert link.state is HostState.LIVE, (link.state, link.reason)
        snapshot = source.read(HOST)
        assert [g.index for g in snapshot.gpus] == [0, 1]
        assert all(g.temperature_c is None for g in snapshot.gpus)
        assert all(g.name and g.memory_total_mib and g.power_w for g in snapshot.gpus)
        assert snapshot.processes, "the processes were dropped with the bad value"
        assert all(p.used_memory_mib is None for p in snapshot.processes)
        assert all(p.pid and p.command and p.container_name for p in snapshot.processes)
        notes = " ".join(snapshot.bad_value_notes)
        assert "temperature_c is 'hot'" in notes and "used_memory_mib is 'lots'" in notes, notes
        assert snapshot.bad_values == len(snapshot.gpus) + len(snapshot.processes)
        codes = {f.code: f.severity for f in evaluate(snapshot)}
        assert codes["bad-value-from-host"] is Severity.INFO
        assert link.malformed == 0
    finally:
        source.close()


def test_only_garbage_lines_are_agent_error_with_the_first_line(sshd: Sshd) -> None:
    source = source_for(sshd, ONLY_GARBAGE)
    link = source.supervisor.link(HOST)
    try:
        waited = agent_error_after_first_bad_line(link)
        assert waited <= CONNECT_TIMEOUT + SLACK, waited
        assert_one_line_naming_the_host(link.reason, "Welcome to node7!", "neither JSON nor")
        finding = host_state_finding(HOST, link.state, link.reason)
        assert finding is not None and finding.code == "host-agent-error"
    finally:
        source.close()


def test_garbage_for_a_while_is_agent_error_then_live_on_the_same_agent(sshd: Sshd) -> None:
    """The choice: unreadable lines restart nothing. The agent runs on and its lines are read;
    the host is live again with the first reading that can be read."""
    source = source_for(sshd, GARBAGE_FOR_A_WHILE)
    link = source.supervisor.link(HOST)
    try:
        agent_error_after_first_bad_line(link)
        assert_one_line_naming_the_host(link.reason, "garbage {not json")
        wait_for(lambda: link.state is HostState.LIVE, 15, "the host live again")
        assert link.reason is None
        assert (link.agent_starts, link.connects) == (1, 1)
    finally:
        source.close()


def test_an_agent_that_exits_after_an_unreadable_line_is_agent_error(sshd: Sshd) -> None:
    """Not `no-driver`: the agent said nothing about GPUs the console could read."""
    source = source_for(sshd, ONE_LINE_AND_EXIT)
    link = source.supervisor.link(HOST)
    try:
        source.settle(15)
        assert link.state.value == "agent-error", (link.state, link.reason)
        assert_one_line_naming_the_host(link.reason, "protocol version 7")
    finally:
        source.close()
