"""A command streamed over SSH is ended on the host when it is stopped or times out: closing the
channel alone leaves a command without a terminal running there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncssh
import pytest
from sshd import Sshd, gone, running, sshd_available

from gpuconsole.actions.shell import SshShell

pytestmark = pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")


@pytest.fixture
async def shell(tmp_path: Path):  # type: ignore[no-untyped-def]
    server = Sshd(tmp_path / "sshd").start()
    try:
        async with asyncssh.connect(
            "127.0.0.1",
            port=server.port,
            known_hosts=str(server.known_hosts),
            client_keys=[str(server.client_key)],
            agent_path=None,
            config=[],
        ) as connection:
            yield SshShell(connection)
    finally:
        server.kill()


async def test_a_stopped_stream_kills_its_commands_on_the_host(shell: SshShell) -> None:
    lines: list[str] = []
    # a child in the background and one in the foreground, as torchrun has its workers
    command = "echo started; sleep 307 & sleep 308; echo never"
    task = asyncio.create_task(shell.stream(command, 60.0, lines.append))
    for _ in range(50):
        if running("sleep 308") and lines:
            break
        await asyncio.sleep(0.2)
    assert running("sleep 307") and running("sleep 308")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone("sleep 307") and await gone("sleep 308")
    assert lines == ["started"]  # the process-group line is the shell's, not the command's


async def test_a_timed_out_stream_kills_its_command_on_the_host(shell: SshShell) -> None:
    output = await shell.stream("sleep 309", 1.0, lambda _line: None)
    assert output.exit_code is None and "no answer within 1 s" in output.stderr
    assert await gone("sleep 309")


async def test_a_finished_stream_reads_as_before(shell: SshShell) -> None:
    lines: list[str] = []
    output = await shell.stream("echo one; echo two >&2; exit 3", 10.0, lines.append)
    assert output.exit_code == 3
    assert lines == ["one", "two"] and output.stdout == "one\ntwo"
