"""Where probes run: this machine's shell, or a host's over SSH. Every call has a timeout, and a
child that will not die (an nvidia-smi stuck in the driver) is left behind, never waited on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Protocol

import asyncssh

from gpuconsole.actions.verify.model import Output

# Probes run in the C locale so that tools print the words the judges read.
_PREFIX = "LC_ALL=C; export LC_ALL; "
_MAX_OUTPUT = 1 << 20
_REAP_WAIT_S = 1.0


class Shell(Protocol):
    """Runs one shell command line and returns what it printed."""

    async def run(self, command: str, timeout: float) -> Output: ...


class LocalShell:
    """This machine's `/bin/sh`."""

    async def run(self, command: str, timeout: float) -> Output:
        process = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            _PREFIX + command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # the shell and what it started
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(process.wait(), _REAP_WAIT_S)
            return Output(command, None, "", f"no answer within {timeout:g} s")
        return Output(command, process.returncode, _text(stdout), _text(stderr))


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


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data[:_MAX_OUTPUT]
    return data[:_MAX_OUTPUT].decode("utf-8", "replace")
