"""One way to act on a host: open a shell on a target, run and stream commands with timeouts,
close it, and put every command that changes the host into the audit log.

A target's shell is this machine's `/bin/sh` (``entry`` None) or the host's over SSH. A host the
console already watches (`WatchedTarget`) lends its watch's connection, so that an action does
not open a second one; asyncssh binds a connection to the event loop that opened it, the
supervisor's, so each command runs there (`_LentShell`) and its lines and result come back to
the action's loop. A host the console does not watch, or one whose watch has no connection now,
gets a connection of the action's own, closed when the action ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.shell import LineSink, LocalShell, Shell, SshShell
from gpuconsole.core import audit
from gpuconsole.hosts.source import WatchedTarget
from gpuconsole.hosts.ssh import SshSettings, connect
from gpuconsole.hosts.targets import Target

if TYPE_CHECKING:
    from gpuconsole.hosts.supervisor import Lent

_STOP_WAIT_S = 15.0
"""How long a stopped command on a lent connection may take to be killed on the host (an
`SshShell` stop: its start, then TERM, a second's grace, KILL, a second more and the check that
it is gone), and how much longer than its
own timeout a command may take before the supervisor's loop counts as gone."""
_GONE = "SSH: the console stopped watching the host"


class HostShell:
    """A shell on one host for one action: `run` and `stream` read; `change` runs a command
    that changes the host, and logs it."""

    def __init__(self, host: str, action: str, shell: Shell) -> None:
        self.host = host
        self.action = action
        """What its changes are logged as (`repair-step`, `launch`, `memory-trial`...)."""
        self._shell = shell

    async def run(self, command: str, timeout: float) -> CommandOutput:
        return await self._shell.run(command, timeout)

    async def stream(self, command: str, timeout: float, on_line: LineSink) -> CommandOutput:
        return await self._shell.stream(command, timeout, on_line)

    async def change(
        self,
        command: str,
        timeout: float,
        *,
        on_line: LineSink | None = None,
        logged: str | None = None,
        **details: object,
    ) -> CommandOutput:
        """Run ``command`` (streamed to ``on_line`` when given), then log it: the action, the
        host, what ran (``logged`` says it shorter where the command is long), ``details`` and
        the exit code (None: it timed out, or was stopped, and then ``stopped`` is true)."""
        entry = {"host": self.host, "command": logged or command, **details}
        try:
            if on_line is None:
                output = await self._shell.run(command, timeout)
            else:
                output = await self._shell.stream(command, timeout, on_line)
        except asyncio.CancelledError:
            audit.record(self.action, **entry, exit_code=None, stopped=True)
            raise
        audit.record(self.action, **entry, exit_code=output.exit_code)
        return output


@contextlib.asynccontextmanager
async def open_shell(
    target: Target, action: str, settings: SshSettings | None = None
) -> AsyncIterator[HostShell]:
    """The target's shell for ``action`` until the block ends. Raises
    `gpuconsole.hosts.ssh.ConnectFailure` (its ``reason`` one line naming the host) when the
    host cannot be reached."""
    if target.entry is None:
        yield HostShell(target.name, action, LocalShell())
        return
    if isinstance(target, WatchedTarget):
        lent = await target.watch.lend(target.name)
        if lent is not None:
            yield HostShell(target.name, action, _LentShell(lent, target.name))
            return
    connection = await connect(target.entry, settings or SshSettings())
    async with connection:
        yield HostShell(target.name, action, SshShell(connection, target.name))


class _LentShell:
    """An `SshShell` on a watched host's connection: each command runs on the supervisor's
    loop, within the channels lent with it; lines and the result are handed back to the
    caller's loop, in order. A stopped command is killed on the host before the stop returns,
    as with a connection of the action's own."""

    def __init__(self, lent: Lent, host: str) -> None:
        self._lent = lent
        self._shell = SshShell(lent.connection, host)

    async def run(self, command: str, timeout: float) -> CommandOutput:
        return await self._there(command, timeout, lambda: self._shell.run(command, timeout))

    async def stream(self, command: str, timeout: float, on_line: LineSink) -> CommandOutput:
        here = asyncio.get_running_loop()

        def back(line: str) -> None:
            with contextlib.suppress(RuntimeError):  # the action's loop has closed
                here.call_soon_threadsafe(on_line, line)

        return await self._there(
            command, timeout, lambda: self._shell.stream(command, timeout, back)
        )

    async def _there(
        self, command: str, timeout: float, start: Callable[[], Awaitable[CommandOutput]]
    ) -> CommandOutput:
        here = asyncio.get_running_loop()
        ended: asyncio.Future[None] = here.create_future()
        stopping = threading.Event()

        async def run_there() -> CommandOutput:
            try:
                async with self._lent.channels:
                    return await start()
            except asyncio.CancelledError:
                if stopping.is_set():
                    raise
                return CommandOutput(command, None, "", _GONE)  # the source closed under it
            finally:
                with contextlib.suppress(RuntimeError):
                    here.call_soon_threadsafe(_end, ended)

        if not self._lent.loop.is_running():
            return CommandOutput(command, None, "", _GONE)
        running = asyncio.run_coroutine_threadsafe(run_there(), self._lent.loop)
        answer = asyncio.wrap_future(running)
        try:
            # asyncio.wait, not wait_for: Python 3.11's wait_for can lose a cancellation
            done, _ = await asyncio.wait({answer}, timeout=timeout + _STOP_WAIT_S)
        except asyncio.CancelledError:
            stopping.set()  # before the cancel, so that the far side re-raises it
            running.cancel()
            await asyncio.wait({ended}, timeout=_STOP_WAIT_S)
            raise
        if not done:  # the supervisor's loop stopped before it could answer
            running.cancel()
            return CommandOutput(command, None, "", _GONE)
        return answer.result()


def _end(ended: asyncio.Future[None]) -> None:
    if not ended.done():
        ended.set_result(None)
