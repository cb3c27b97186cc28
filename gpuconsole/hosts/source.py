"""SSH hosts as a telemetry source, and the source that mixes them with the local host.

The supervisor is asyncio; the console's polling and the headless commands call sources from
threads. `SshSource` runs the supervisor on an event loop of its own, in a daemon thread, so
that neither a slow host nor the UI can hold the other up. An action on a watched host runs its
commands on the watch's connection (`SshSource.lend`), not on a second one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from gpuconsole.core.model import GpuProcess, HostSnapshot
from gpuconsole.hosts.signals import SignalResult, send_here
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.telemetry import Source, SourceError

if TYPE_CHECKING:  # asyncssh (and cryptography) load only where there are SSH hosts
    from gpuconsole.hosts.supervisor import Lent, Supervisor

_STOP_TIMEOUT_S = 10.0
_DRAIN_TIMEOUT_S = 2.0
_LEND_TIMEOUT_S = 5.0
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class WatchedTarget(Target):
    """An SSH host that ``watch`` watches: an action's commands run on its connection."""

    watch: SshSource = field(kw_only=True, compare=False, repr=False)


class SshSource:
    """Readings of SSH hosts, streamed by their agents; see `Supervisor`."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ssh-fleet", daemon=True)
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self.supervisor.start)
        self._loop.call_soon(self._started.set)
        self._loop.run_forever()
        # Whatever close() did not finish in time (connections still closing on a loaded
        # machine) is cancelled and given a moment, so that nothing is left half-done.
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.wait(pending, timeout=_DRAIN_TIMEOUT_S))

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.supervisor.hosts

    def read(self, host: str) -> HostSnapshot:
        return self.supervisor.take(host)

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        return []

    def settle(self, timeout: float) -> None:
        """Block until every host has a reading or has failed once (or ``timeout``)."""
        self._call(self.supervisor.settled(timeout), timeout + 1.0)

    def can_signal(self, host: str) -> bool:
        return host in self.supervisor.hosts

    def target_for(self, host: str) -> Target:
        entry = self.supervisor.link(host).entry
        return WatchedTarget(host, entry, Context(host, entry.expected_gpus), watch=self)

    async def lend(self, host: str) -> Lent | None:
        """From any event loop: the host's connection for an action (see `Supervisor.lend`);
        None while it has none, or once this source is closed."""
        if not self._loop.is_running():
            return None
        asked = asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self.supervisor.lend(host), self._loop)
        )
        # asyncio.wait, not wait_for: Python 3.11's wait_for can lose a cancellation
        done, _ = await asyncio.wait({asked}, timeout=_LEND_TIMEOUT_S)
        if not done:  # the loop stopped before it answered
            asked.cancel()
            return None
        return asked.result()

    def send_signal(self, host: str, process: GpuProcess, sig: signal.Signals) -> SignalResult:
        """Signal a process on the host through its agent, which applies the same pid-reuse
        guard as `send_here` does on this machine."""
        command = {
            "cmd": "signal",
            "pid": process.pid,
            "signal": sig.name.removeprefix("SIG"),
            "command": process.command or "",
            "started": process.started,
        }
        reply = self._call(self.supervisor.request(host, command), _STOP_TIMEOUT_S)
        return SignalResult(reply.ok, reply.message)

    def close(self) -> None:
        """Stop every agent and connection, then the loop and its thread."""
        if not self._loop.is_running():
            return
        try:
            # Past the timeout the connections are still closing; the daemon thread ends with
            # the process.
            with contextlib.suppress(TimeoutError, concurrent.futures.TimeoutError):
                self._call(self.supervisor.stop(), _STOP_TIMEOUT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_STOP_TIMEOUT_S + _DRAIN_TIMEOUT_S)

    def _call(self, coroutine: Coroutine[Any, Any, _T], timeout: float) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)


class FleetSource:
    """The local host (when it has GPUs) and SSH hosts as one source, hosts in that order."""

    def __init__(self, local: Source | None, remote: SshSource | None) -> None:
        self._local = local
        self._remote = remote
        local_hosts = local.hosts if local is not None else ()
        remote_hosts = remote.hosts if remote is not None else ()
        clash = set(local_hosts) & set(remote_hosts)
        if clash:
            name = sorted(clash)[0]
            raise SourceError(
                f"{name}: the local host has the name of an inventory host; rename it there"
            )
        self._owner: dict[str, Source] = {}
        for source, names in ((local, local_hosts), (remote, remote_hosts)):
            for name in names:
                self._owner[name] = source  # type: ignore[assignment]
        self._hosts: tuple[str, ...] = (*local_hosts, *remote_hosts)

    @property
    def hosts(self) -> tuple[str, ...]:
        return self._hosts

    def read(self, host: str) -> HostSnapshot:
        return self._owner[host].read(host)

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        return self._owner[host].backfill(host, seconds)

    def can_signal(self, host: str) -> bool:
        return host in self._owner

    def send_signal(self, host: str, process: GpuProcess, sig: signal.Signals) -> SignalResult:
        if self._remote is not None and self._owner[host] is self._remote:
            return self._remote.send_signal(host, process, sig)
        return send_here(process, sig)

    def target_for(self, host: str) -> Target:
        if self._remote is not None and self._owner[host] is self._remote:
            return self._remote.target_for(host)
        return Target(host, None, Context(host))

    def close(self) -> None:
        if self._remote is not None:
            self._remote.close()
