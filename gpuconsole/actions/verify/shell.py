"""Where probes run: this machine's shell, or a host's over SSH. Every call has a timeout, and a
child that will not die (an nvidia-smi stuck in the driver) is left behind, never waited on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import asyncssh

from gpuconsole.actions.verify.model import Output

# Probes run in the C locale so that tools print the words the judges read.
_PREFIX = "LC_ALL=C; export LC_ALL; "
_MAX_OUTPUT = 1 << 20
_REAP_WAIT_S = 1.0
_GROUP_MARK = "gpuconsole-process-group "
_GRACE_S = 1


LineSink = Callable[[str], None]


class Shell(Protocol):
    """Runs one shell command line and returns what it printed."""

    async def run(self, command: str, timeout: float) -> Output: ...

    async def stream(self, command: str, timeout: float, on_line: LineSink) -> Output:
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

    async def run(self, command: str, timeout: float) -> Output:
        process = await _spawn(command, asyncio.subprocess.PIPE)
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            await _kill_group(process)
            return Output(command, None, "", f"no answer within {timeout:g} s")
        return Output(command, process.returncode, _text(stdout), _text(stderr))

    async def stream(self, command: str, timeout: float, on_line: LineSink) -> Output:
        process = await _spawn(command, asyncio.subprocess.STDOUT)
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        try:
            lines = await _read_lines(process.stdout.readline, deadline, on_line)
            await asyncio.wait_for(process.wait(), max(0.1, deadline - time.monotonic()))
        except (asyncio.TimeoutError, TimeoutError):
            await _kill_group(process)
            return Output(command, None, "", f"no answer within {timeout:g} s")
        except asyncio.CancelledError:  # stopped by the user: nothing of it may run on
            await _kill_group(process)
            raise
        return Output(command, process.returncode, "\n".join(lines))


class SshShell:
    """A host's shell over an open asyncssh connection (one channel per command)."""

    def __init__(self, connection: asyncssh.SSHClientConnection) -> None:
        self._connection = connection

    async def run(self, command: str, timeout: float) -> Output:
        try:
            done = await asyncio.wait_for(
                self._connection.run(_PREFIX + command, check=False, encoding=None), timeout
            )
        except (asyncio.TimeoutError, TimeoutError):
            return Output(command, None, "", f"no answer within {timeout:g} s")
        except (asyncssh.Error, OSError) as error:
            return Output(command, None, "", f"SSH: {getattr(error, 'reason', error)}")
        code = done.exit_status if done.exit_status is not None else 255
        return Output(command, code, _text(done.stdout), _text(done.stderr))

    async def stream(self, command: str, timeout: float, on_line: LineSink) -> Output:
        """As `LocalShell.stream`; a stopped or timed-out command is killed on the host.

        Closing the channel does not end a command without a terminal: sshd started it in a
        session of its own, which lives on. The shell first prints its process id, which is
        that session's process group, and stopping kills the group over a second channel."""
        deadline = time.monotonic() + timeout
        try:
            process = await self._connection.create_process(
                f"{_PREFIX}echo {_GROUP_MARK}$$; {command}",
                stderr=asyncssh.STDOUT,
                encoding=None,
            )
        except (asyncssh.Error, OSError) as error:
            return Output(command, None, "", f"SSH: {getattr(error, 'reason', error)}")
        group: list[str] = []

        def line(text: str) -> None:
            if not group and text.startswith(_GROUP_MARK):
                group.append(text.removeprefix(_GROUP_MARK))
            else:
                on_line(text)

        try:
            lines = await _read_lines(process.stdout.readline, deadline, line)
            await asyncio.wait_for(process.wait_closed(), max(0.1, deadline - time.monotonic()))
        except (asyncio.TimeoutError, TimeoutError):
            await self._stop(process, group)
            return Output(command, None, "", f"no answer within {timeout:g} s")
        except asyncio.CancelledError:
            await self._stop(process, group)
            raise
        except (asyncssh.Error, OSError) as error:
            return Output(command, None, "", f"SSH: {getattr(error, 'reason', error)}")
        code = process.exit_status if process.exit_status is not None else 255
        output = [text for text in lines if not text.startswith(_GROUP_MARK)]
        return Output(command, code, "\n".join(output))

    async def _stop(self, process: asyncssh.SSHClientProcess, group: list[str]) -> None:
        """TERM the command's process group on the host, KILL what is left a moment later."""
        process.close()
        if not group or not group[0].isdigit():
            return
        pgid = group[0]
        with contextlib.suppress(asyncssh.Error, OSError, asyncio.TimeoutError, TimeoutError):
            await asyncio.wait_for(
                self._connection.run(
                    f"kill -TERM -- -{pgid} 2>/dev/null; sleep {_GRACE_S}; "
                    f"kill -KILL -- -{pgid} 2>/dev/null; true",
                    check=False,
                ),
                _GRACE_S + 5.0,
            )


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
