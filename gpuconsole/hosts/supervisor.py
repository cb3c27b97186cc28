"""The fleet supervisor: one asyncio task per SSH host that connects, runs the agent, keeps it
running, and survives what hosts and links do.

Per host: connect (at most ``max_connecting`` attempts at once, so a rack coming back does not
storm the bastion), start the agent over the connection, read its lines. An agent that exits or
falls silent is restarted on the same connection; a lost connection makes the host `down` with
the reason and is retried with exponential backoff and jitter. A changed or revoked host key
and a refused login are not retried: each needs a person, and the console tries again when
restarted. An unknown host key is retried with the same backoff, so the console connects once
someone has added the key. A host that lets the console log in but whose agent cannot read GPUs
(no driver, no nvidia-smi) is `no-driver`, with the agent's words, until a reading comes.
One whose agent's lines cannot be read (another protocol version, garbage in its place) is
`agent-error` with the first such line's reason, once no tick's line (a reading, or the agent's
word why there is none) could be read for the host's connect timeout since that line. Nothing is
restarted for it: the agent runs on and its lines are read, so a passing garbage line mends itself
with the next reading, while a wrong version, which no restart would mend, stays `agent-error`.

The supervisor keeps, per host, the newest reading not yet taken: `take` hands it to the fleet
store once, so that a tick without a new reading counts as a miss there (stale after 3).
`take` may be called from another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import asyncssh

from gpuconsole.core.clock import Clock, wall_clock
from gpuconsole.core.model import HostSnapshot, HostState
from gpuconsole.core.untrusted import visible
from gpuconsole.hosts.inventory import HostEntry
from gpuconsole.hosts.ssh import MAX_REASON_CHARS, ConnectFailure, SshSettings, connect
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.agent import checked_interval
from gpuconsole.telemetry.wire import (
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

# States that no retry can mend: a person must act (then restart the console).
NEEDS_A_PERSON = frozenset(
    {HostState.AUTH_FAILED, HostState.HOST_KEY_MISMATCH, HostState.HOST_KEY_REVOKED}
)
REPLY_TIMEOUT_S = 5.0
LENT_CHANNELS = 4
"""Commands that actions may run at once on a watched host's connection: with a kill channel
for each and the agent's own, within OpenSSH's default MaxSessions of 10."""
AGENT_START_TIMEOUT_S = 60.0
_STDERR_TAIL = 4096


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: ``initial × factor^attempt``, capped, ± ``jitter``."""

    initial: float = 1.0
    maximum: float = 60.0
    factor: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        base = min(self.maximum, self.initial * self.factor ** min(attempt, 64))
        return base * (1.0 - self.jitter + 2.0 * self.jitter * draw())


@dataclass
class HostLink:
    """One host's stream as the supervisor sees it. Mutated on the supervisor's loop only."""

    entry: HostEntry
    state: HostState = HostState.CONNECTING
    reason: str | None = None
    pending: HostSnapshot | None = None
    """The newest reading not yet taken."""
    latest: HostSnapshot | None = None
    last_error: str | None = None
    """The agent's reason for the last tick without a reading, until the next reading."""
    hello: Hello | None = None
    malformed: int = 0
    unreadable: str | None = None
    """The reason of the first line that could not be read since a tick's line last could."""
    agent_starts: int = 0
    connects: int = 0
    notices: list[str] = field(default_factory=list)
    """What connecting changed on this side (a host key added), one line each."""
    connection: asyncssh.SSHClientConnection | None = None
    process: asyncssh.SSHClientProcess[bytes] | None = None
    replies: dict[int, asyncio.Future[Reply]] = field(default_factory=dict)
    channels: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(LENT_CHANNELS))
    """What actions may open on ``connection`` at once (see `Supervisor.lend`)."""

    @property
    def name(self) -> str:
        return self.entry.name


@dataclass(frozen=True, slots=True)
class Lent:
    """A watched host's connection lent to an action, and the channels the action may open on
    it at once. Both belong to ``loop``, the supervisor's: they are used there only."""

    connection: asyncssh.SSHClientConnection
    channels: asyncio.Semaphore
    loop: asyncio.AbstractEventLoop


class Supervisor:
    """Watches a set of SSH hosts until `stop`; see the module's docstring."""

    def __init__(
        self,
        entries: Sequence[HostEntry],
        settings: SshSettings | None = None,
        *,
        interval: float = 1.0,
        agent_mode: str = "auto",
        agent_gpus: int = 8,
        script: bytes | None = None,
        backoff: Backoff | None = None,
        max_connecting: int = 16,
        silence_ticks: int = 10,
        clock: Clock = wall_clock,
        on_reading: Callable[[str, AgentTick], None] | None = None,
    ) -> None:
        self._links = {entry.name: HostLink(entry) for entry in entries}
        self._settings = settings or SshSettings()
        # refused here, not in each host's task (where every host would show as down)
        self._interval = checked_interval(interval)
        self._mode = agent_mode
        self._gpus = agent_gpus
        self._script = agent_script() if script is None else script
        self._backoff = backoff or Backoff()
        self._max_connecting = max_connecting
        self._silence_ticks = silence_ticks
        self._clock = clock
        self._on_reading = on_reading
        self._lock = threading.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._request_ids = itertools.count(1)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self._links)

    def link(self, host: str) -> HostLink:
        return self._links[host]

    # --- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start one task per host on the running loop."""
        connecting = asyncio.Semaphore(self._max_connecting)
        self._tasks = []
        for link in self._links.values():
            task = asyncio.create_task(self._watch(link, connecting), name=f"watch {link.name}")
            task.add_done_callback(functools.partial(self._ended, link))
            self._tasks.append(task)

    def _ended(self, link: HostLink, task: asyncio.Task[None]) -> None:
        """A watch that an unforeseen error ended must not leave its host "connecting" forever
        with no word: the host is down, and the error is its reason."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        self._set(
            link,
            HostState.DOWN,
            visible(
                f"{link.name}: stopped watching: {type(error).__name__}: {error}", MAX_REASON_CHARS
            ),
        )

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop every host in a fixed order: ask agents to stop, close the connections (their
        agents then see their stdin close), cancel the tasks and await them (``timeout``)."""
        for link in self._links.values():
            if link.process is not None:
                with contextlib.suppress(Exception):
                    link.process.stdin.write(encode_command({"cmd": "stop"}))
            if link.connection is not None:
                link.connection.close()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
        self._tasks = []

    async def settled(self, timeout: float) -> None:
        """Wait until every host has its first reading or a definite answer (any state but
        `connecting`: a refused connection, a refused key, an agent that reads no GPU), or
        ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(
                link.latest is not None or link.state is not HostState.CONNECTING
                for link in self._links.values()
            ):
                return
            await asyncio.sleep(0.05)

    # --- what the fleet store takes ------------------------------------------------------------

    def take(self, host: str) -> HostSnapshot:
        """The newest reading not taken yet; `SourceError` (with the state when known) if none."""
        link = self._links[host]
        with self._lock:
            if link.state is not HostState.LIVE:
                raise SourceError(link.reason or f"{host}: {link.state.value}", state=link.state)
            snapshot, link.pending = link.pending, None
        if snapshot is None:
            raise SourceError(link.last_error or f"{host}: no new reading from the agent")
        return snapshot

    # --- commands ---------------------------------------------------------------------------

    async def request(self, host: str, command: dict[str, object]) -> Reply:
        """Send a command that the agent answers; a `Reply` with ok False if it cannot be sent."""
        link = self._links[host]
        process = link.process
        if process is None or link.hello is None:
            return Reply(0, False, f"{host}: no agent is running there now")
        request_id = next(self._request_ids)
        answer: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        link.replies[request_id] = answer
        try:
            process.stdin.write(encode_command({**command, "id": request_id}))
            return await asyncio.wait_for(answer, REPLY_TIMEOUT_S)
        except (asyncio.TimeoutError, TimeoutError):
            return Reply(
                request_id, False, f"{host}: the agent did not answer within {REPLY_TIMEOUT_S:g} s"
            )
        except (asyncssh.Error, OSError, BrokenPipeError) as error:
            return Reply(request_id, False, f"{host}: the command could not be sent ({error})")
        finally:
            link.replies.pop(request_id, None)

    async def lend(self, host: str) -> Lent | None:
        """The host's connection for an action's commands, while it has one (the agent need
        not be running on it); None while it has none."""
        link = self._links[host]
        connection = link.connection
        if connection is None or connection.is_closed():
            return None
        return Lent(connection, link.channels, asyncio.get_running_loop())

    # --- one host -----------------------------------------------------------------------------

    def _set(self, link: HostLink, state: HostState, reason: str | None) -> None:
        with self._lock:
            link.state, link.reason = state, reason
            if state is not HostState.LIVE:
                link.pending = None

    async def _watch(self, link: HostLink, connecting: asyncio.Semaphore) -> None:
        attempt = 0
        while True:
            try:
                async with connecting:
                    connection = await connect(link.entry, self._settings, notices=link.notices)
            except ConnectFailure as failure:
                if failure.state in NEEDS_A_PERSON:
                    self._set(link, failure.state, failure.reason)
                    return  # retrying would only repeat the refusal (and trip fail2ban)
                attempt = await self._pause(link, failure.reason, attempt, failure.state)
                continue
            attempt = 0
            link.connects += 1
            link.unreadable = None
            if link.state is not HostState.LIVE:
                self._set(link, HostState.CONNECTING, f"{link.name}: connected, starting the agent")
            link.connection = connection
            try:
                async with connection:
                    reason = await self._run_agents(link, connection)
            finally:
                link.connection = None
            attempt = await self._pause(link, f"{link.name}: {reason}", attempt)

    async def _pause(
        self, link: HostLink, reason: str, attempt: int, state: HostState = HostState.DOWN
    ) -> int:
        """Put the host in ``state`` and wait out the backoff; the next attempt."""
        self._set(link, state, reason)
        await asyncio.sleep(self._backoff.delay(attempt))
        return attempt + 1

    async def _run_agents(self, link: HostLink, connection: asyncssh.SSHClientConnection) -> str:
        """Run the agent until the connection ends, restarting it when it exits; why it ended."""
        failures = 0
        while True:
            try:
                exit_reason, produced = await self._run_agent(link, connection)
            except (asyncssh.Error, OSError) as error:
                return f"connection lost ({_reason(error)})"
            if connection.is_closed():
                return f"connection lost ({exit_reason})"
            failures = 0 if produced else failures + 1
            with self._lock:
                link.last_error = f"{link.name}: agent {exit_reason}; restarting it"
                if link.state is not HostState.LIVE and link.unreadable is not None:
                    link.state, link.reason = HostState.AGENT_ERROR, link.unreadable
                elif link.state is not HostState.LIVE:  # it never read a GPU on this connection
                    link.state = HostState.NO_DRIVER
                    link.reason = f"{link.name}: logged in, but the agent {exit_reason}"
            await asyncio.sleep(self._backoff.delay(failures) if failures else 0.0)

    async def _run_agent(
        self, link: HostLink, connection: asyncssh.SSHClientConnection
    ) -> tuple[str, bool]:
        """One run of the agent: why it ended, and whether it gave any reading."""
        command = agent_command(len(self._script), self._interval, self._mode, self._gpus)
        process = await connection.create_process(command, encoding=None)
        link.agent_starts += 1
        process.stdin.write(self._script)
        stream = AgentStream(link.name, self._clock)
        link.process = process
        produced = False
        unread: asyncio.TimerHandle | None = None
        # A host's first line can be slow (a busy host, a heavy login shell); past that, a
        # silent agent is stuck and is restarted.
        silence = AGENT_START_TIMEOUT_S
        try:
            while True:
                try:
                    line = await asyncio.wait_for(process.stdout.readline(), silence)
                except (asyncio.TimeoutError, TimeoutError):
                    return f"silent for {silence:g} s", produced
                if not line:
                    break
                silence = max(self._silence_ticks * self._interval, 10.0)
                malformed = stream.malformed
                event = stream.feed(line.decode("utf-8", "replace"))
                link.malformed = stream.malformed
                if stream.malformed > malformed and unread is None:
                    unread = self._unreadable(link, stream.last_malformed)
                if isinstance(event, AgentTick | AgentError) and unread is not None:
                    unread.cancel()
                    unread = None
                produced = self._handle(link, event) or produced
        finally:
            if unread is not None:
                unread.cancel()
            link.process = None
            link.hello = None
            for answer in link.replies.values():
                if not answer.done():
                    answer.set_result(Reply(0, False, f"{link.name}: the agent exited"))
            process.close()
        return await _exit_reason(process), produced

    def _unreadable(self, link: HostLink, why: str | None) -> asyncio.TimerHandle:
        """A line of the agent could not be read: unless a tick's line can be read within the
        connect timeout (two ticks, where a tick is longer than half of it), the host is
        `agent-error` with the first such line's reason."""
        if link.unreadable is None:
            link.unreadable = visible(
                f"{link.name}: the agent's first unreadable line: {why}", MAX_REASON_CHARS
            )
        wait = max(link.entry.connect_timeout, 2 * self._interval)
        return asyncio.get_running_loop().call_later(
            wait, self._set, link, HostState.AGENT_ERROR, link.unreadable
        )

    def _handle(self, link: HostLink, event: Event | None) -> bool:
        """Apply one event; True for a reading."""
        if isinstance(event, AgentTick | AgentError):
            link.unreadable = None
        if isinstance(event, AgentTick):
            with self._lock:
                link.pending = link.latest = event.snapshot
                link.last_error = None
                link.state, link.reason = HostState.LIVE, None
            if self._on_reading is not None:
                self._on_reading(link.name, event)
            return True
        if isinstance(event, Hello):
            link.hello = event
        elif isinstance(event, AgentError):
            with self._lock:
                link.last_error = f"{link.name}: {event.message}"
                if link.state is not HostState.LIVE:  # logged in, and told why no GPU reads
                    link.state = HostState.NO_DRIVER
                    link.reason = f"{link.name}: logged in, but no GPU reading: {event.message}"
        elif isinstance(event, Reply):
            answer = link.replies.get(event.request_id)
            if answer is not None and not answer.done():
                answer.set_result(event)
        return False


async def _exit_reason(process: asyncssh.SSHClientProcess[bytes]) -> str:
    """'exited with status 1: <its last stderr line>' or 'killed by signal KILL'."""
    stderr = b""
    with contextlib.suppress(asyncio.TimeoutError, TimeoutError, asyncssh.Error, OSError):
        stderr = await asyncio.wait_for(process.stderr.read(_STDERR_TAIL), 1.0)
        await asyncio.wait_for(process.wait_closed(), 1.0)
    last = next(
        (ln.strip() for ln in reversed(stderr.decode("utf-8", "replace").splitlines()) if ln),
        "",
    )
    if process.exit_signal is not None:
        how = f"killed by signal {process.exit_signal[0]}"
    elif process.exit_status is not None:
        how = f"exited with status {process.exit_status}"
    else:
        how = "stopped"
    return f"{how}: {visible(last, 160)}" if last else how


def _reason(error: BaseException) -> str:
    text = getattr(error, "reason", None) or str(error) or type(error).__name__
    return str(text)
