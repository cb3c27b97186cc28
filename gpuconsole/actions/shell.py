"""Where probes run: this machine's shell, or a host's over SSH. Every call has a timeout, and a
child that will not die (an nvidia-smi stuck in the driver) is left behind, never waited on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import asyncssh

from gpuconsole.actions.output import CommandOutput

# Probes run in the C locale so that tools print the words the judges read.
_PREFIX = "LC_ALL=C; export LC_ALL; "
_MAX_OUTPUT = 1 << 20
_REAP_WAIT_S = 1.0
_GROUP_MARK = "gpuconsole-process-group "
_GONE_MARK = "gpuconsole-process-group-gone"
_GRACE_S = 1
_STOP_WAIT_S = 5.0  # for a command stopped while it starts: its start, then its group


LineSink = Callable[[str], None]


class Shell(Protocol):
    """Runs one shell command line and returns what it printed."""

    async def run(self, command: str, timeout: float) -> CommandOutput: ...

    async def stream(self, command: str, timeout: float, on_line: LineSink) -> CommandOutput:
        """Run it with stderr merged into stdout, handing each line over as it comes."""
        ...


async def _read_lines(
    read_line: Callable[[], Awaitable[bytes | str]], deadline: float, on_line: LineSink
) -> list[str]:
    """Lines until the end or ``deadline`` (monotonic); raises TimeoutError at the deadline."""
    lines: list[str] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        raw = await asyncio.wait_for(read_line(), left)
        if not raw:
            return lines
        line = _text(raw).rstrip("\n")
        lines.append(line)
        on_line(line)


class LocalShell:
    """This machine's `/bin/sh`."""

    async def run(self, command: str, timeout: float) -> CommandOutput:
        process = await _spawn(command, asyncio.subprocess.PIPE)
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            await _kill_group(process)
            return CommandOutput(command, None, "", f"no answer within {timeout:g} s")
        return CommandOutput(command, process.returncode, _text(stdout), _text(stderr))

    async def stream(self, command: str, timeout: float, on_line: LineSink) -> CommandOutput:
        process = await _spawn(command, asyncio.subprocess.STDOUT)
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        try:
            lines = await _read_lines(process.stdout.readline, deadline, on_line)
            await asyncio.wait_for(process.wait(), max(0.1, deadline - time.monotonic()))
        except (asyncio.TimeoutError, TimeoutError):
            await _kill_group(process)
            return CommandOutput(command, None, "", f"no answer within {timeout:g} s")
        except asyncio.CancelledError:  # stopped by the user: nothing of it may run on
            await _kill_group(process)
            raise
        return CommandOutput(command, process.returncode, "\n".join(lines))


@dataclass(frozen=True, slots=True)
class _Started:
    """A command running on a host: its process, its process group there (None if the shell
    did not say it in time), and what the login shell printed before saying it."""

    process: asyncssh.SSHClientProcess[bytes]
    group: str | None
    preamble: tuple[str, ...]


class SshShell:
    """A host's shell over an open asyncssh connection (one channel per command).

    Closing the channel does not end a command without a terminal: sshd started it in a
    session of its own, which lives on (OpenSSH does not honour a signal request for it). So
    every command is started by `_start`, whose shell first prints its process id, which is
    that session's process group; a command that times out or is stopped has the group
    killed over a second channel, in words any POSIX login shell takes (dash included), and
    is checked to be gone (`_stop`).

    ``host`` names the host in what is said of it (the address it was reached at where not
    given)."""

    def __init__(self, connection: asyncssh.SSHClientConnection, host: str | None = None) -> None:
        self._connection = connection
        self._host = host or str((connection.get_extra_info("peername") or ("the host",))[0])

    async def run(self, command: str, timeout: float) -> CommandOutput:
        deadline = time.monotonic() + timeout
        started = await self._start(command, asyncssh.PIPE, deadline)
        if isinstance(started, str):
            return CommandOutput(command, None, "", started)
        process = started.process
        try:
            stdout, stderr = await asyncio.wait_for(
                asyncio.gather(_read_capped(process.stdout), _read_capped(process.stderr)),
                _left(deadline),
            )
            await asyncio.wait_for(process.wait_closed(), _left(deadline))
        except (asyncio.TimeoutError, TimeoutError):
            return _given_up(command, timeout, await self._stop(started))
        except asyncio.CancelledError:
            await self._stop(started)
            raise
        except (asyncssh.Error, OSError) as error:
            return CommandOutput(command, None, "", f"SSH: {getattr(error, 'reason', error)}")
        code = process.exit_status if process.exit_status is not None else 255
        printed = "".join(f"{line}\n" for line in started.preamble) + _text(stdout)
        return CommandOutput(command, code, printed, _text(stderr))

    async def stream(self, command: str, timeout: float, on_line: LineSink) -> CommandOutput:
        """As `LocalShell.stream`; a stopped or timed-out command is killed on the host."""
        deadline = time.monotonic() + timeout
        started = await self._start(command, asyncssh.STDOUT, deadline)
        if isinstance(started, str):
            return CommandOutput(command, None, "", started)
        process = started.process
        for line in started.preamble:
            on_line(line)
        try:
            lines = await _read_lines(process.stdout.readline, deadline, on_line)
            await asyncio.wait_for(process.wait_closed(), _left(deadline))
        except (asyncio.TimeoutError, TimeoutError):
            return _given_up(command, timeout, await self._stop(started))
        except asyncio.CancelledError:
            await self._stop(started)
            raise
        except (asyncssh.Error, OSError) as error:
            return CommandOutput(command, None, "", f"SSH: {getattr(error, 'reason', error)}")
        code = process.exit_status if process.exit_status is not None else 255
        return CommandOutput(command, code, "\n".join([*started.preamble, *lines]))

    async def _start(self, command: str, stderr: int, deadline: float) -> _Started | str:
        """The command started with no stdin, once its shell has said its process group (or
        the deadline passed); or why it could not start."""
        opening = asyncio.ensure_future(
            self._connection.create_process(
                f"{_PREFIX}echo {_GROUP_MARK}$$; {command}", stderr=stderr, encoding=None
            )
        )
        try:
            process = await asyncio.shield(opening)
            process.stdin.write_eof()
            started = await _told(process, deadline)
        except asyncio.CancelledError:
            await self._stop_opened(opening)
            raise
        except (asyncssh.Error, OSError) as error:
            return f"SSH: {getattr(error, 'reason', error)}"
        if _cancel_pending():  # stopped just as the group line came: the command runs; kill it
            await self._stop(started)
            raise asyncio.CancelledError
        return started

    async def _stop_opened(self, opening: asyncio.Future[asyncssh.SSHClientProcess[bytes]]) -> None:
        """Stopped while starting: the command may run on the host already (sshd starts it
        before its answer arrives here), so let the start end, learn the group and kill it."""
        with contextlib.suppress(asyncssh.Error, OSError, asyncio.TimeoutError, TimeoutError):
            process = await asyncio.wait_for(opening, _STOP_WAIT_S)
            await self._stop(await _told(process, time.monotonic() + _STOP_WAIT_S))

    async def _stop(self, started: _Started) -> str | None:
        """TERM the command's process group on the host, KILL what is left a moment later,
        and check that the group is gone; None when it is, else one line naming the host.

        ``kill -s SIG -- -GROUP`` is the form POSIX gives and dash takes (dash reads
        ``kill -TERM -- -GROUP``'s ``--`` as a pid: "Illegal number"). The group is gone only
        when signal 0 finds no such process: a process the user may not signal, or a kill the
        shell refuses, reads as still there."""
        started.process.close()
        group = started.group
        if group is None:
            return f"{self._host}: the command's shell did not say its process group: it may run on"
        script = (
            f"{_PREFIX}kill -s TERM -- -{group} 2>/dev/null && sleep {_GRACE_S}; "
            f"kill -s KILL -- -{group} 2>/dev/null && sleep {_GRACE_S}; "
            f'why=$(kill -s 0 -- -{group} 2>&1) || case "$why" in '
            f"*[Nn]'o such process'*) echo {_GONE_MARK};; esac"
        )
        try:
            checked = await asyncio.wait_for(
                self._connection.run(script, check=False), 2 * _GRACE_S + 5.0
            )
        except (asyncssh.Error, OSError, asyncio.TimeoutError, TimeoutError):
            return f"{self._host}: could not check that process group {group} ended"
        if _GONE_MARK in _text(checked.stdout).split():
            return None
        return (
            f"{self._host}: processes of group {group} still run after KILL (stuck in the "
            "kernel, or another user's): `ps -e -o pid,pgid,stat,args` there lists them"
        )


def _given_up(command: str, timeout: float, stop: str | None) -> CommandOutput:
    """A command that timed out, with what its stop found where it was not gone."""
    why = f"no answer within {timeout:g} s"
    return CommandOutput(command, None, "", why if stop is None else f"{why}; {stop}")


async def _told(process: asyncssh.SSHClientProcess[bytes], deadline: float) -> _Started:
    """The process with the group its shell says first (None if it says none by
    ``deadline``), and the lines printed before that."""
    preamble: list[str] = []
    try:
        while raw := await asyncio.wait_for(process.stdout.readline(), _left(deadline)):
            line = _text(raw).rstrip("\n")
            if line.startswith(_GROUP_MARK):
                group = line.removeprefix(_GROUP_MARK)
                return _Started(process, group if group.isdigit() else None, tuple(preamble))
            preamble.append(line)  # a login shell's rc file that prints
    except (asyncio.TimeoutError, TimeoutError, asyncssh.Error, OSError):
        pass  # the command's own reading meets the same end, and says it
    return _Started(process, None, tuple(preamble))


def _cancel_pending() -> bool:
    """Whether this task was cancelled although its last await returned: Python 3.11's
    `asyncio.wait_for` returns the result of an awaitable that finished just as the task was
    cancelled, and the cancellation is lost unless it is looked for."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return bool(cancelling is not None and cancelling())


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


async def _read_capped(reader: asyncssh.SSHReader[bytes]) -> bytes:
    """What a stream gives until its end, keeping the first `_MAX_OUTPUT` bytes: the rest is
    read and dropped, so that the command can finish and a flood cannot fill memory."""
    kept = bytearray()
    while chunk := await reader.read(1 << 16):
        kept += chunk[: _MAX_OUTPUT - len(kept)]
    return bytes(kept)


async def _spawn(command: str, stderr: int) -> asyncio.subprocess.Process:
    """`/bin/sh -c` in a session of its own (so a timeout can kill all it started), no stdin."""
    return await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        _PREFIX + command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
    )


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    """Kill the shell and everything it started; wait a moment for it, never longer."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
        await asyncio.wait_for(process.wait(), _REAP_WAIT_S)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data[:_MAX_OUTPUT]
    return data[:_MAX_OUTPUT].decode("utf-8", "replace")
