"""The one way actions reach a host (`gpuconsole.actions.session`): this machine's shell, a
connection of the action's own, or the connection of a host the console watches; and the audit
log entry of every command that changes a host."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sshd import Sshd, free_port, gone, running, sshd_available
from test_ssh_fleet import entry, settings, source_for

from gpuconsole.actions import session
from gpuconsole.actions.session import open_shell
from gpuconsole.hosts.source import WatchedTarget
from gpuconsole.hosts.ssh import ConnectFailure
from gpuconsole.hosts.targets import Context, Target

HERE = Target("here", None, Context("here"))
needs_sshd = pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")


def entries(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def no_second_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*_args: object, **_options: object) -> None:
        raise AssertionError("the action opened a connection of its own")

    monkeypatch.setattr(session, "connect", refuse)


async def test_a_change_is_logged_with_its_exit_code_and_a_read_is_not(audit_log: Path) -> None:
    async with open_shell(HERE, "launch") as shell:
        read = await shell.run("echo read", 10.0)
        lines: list[str] = []
        changed = await shell.change(
            "echo one; echo two; exit 3", 10.0, on_line=lines.append, step="run", recipe="bert"
        )
        quiet = await shell.change("true", 10.0, logged="write nothing", step="install")
    assert read.stdout == "read\n" and lines == ["one", "two"] and changed.exit_code == 3
    assert quiet.ok
    first, second = entries(audit_log)
    assert {k: first[k] for k in ("action", "host", "command", "exit_code", "step", "recipe")} == {
        "action": "launch",
        "host": "here",
        "command": "echo one; echo two; exit 3",
        "exit_code": 3,
        "step": "run",
        "recipe": "bert",
    }
    assert first["user"] and "stopped" not in first
    assert (second["command"], second["exit_code"]) == ("write nothing", 0)


async def test_a_stopped_change_is_logged_as_stopped(audit_log: Path) -> None:
    async with open_shell(HERE, "repair-step") as shell:
        task = asyncio.ensure_future(shell.change("sleep 311", 30.0, on_line=lambda _line: None))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    (entry_,) = entries(audit_log)
    assert entry_["command"] == "sleep 311"
    assert entry_["exit_code"] is None and entry_["stopped"] is True
    assert await gone("sleep 311")


@needs_sshd
async def test_an_inventory_host_gets_a_connection_or_one_line_why_not(sshd: Sshd) -> None:
    target = Target("gpu-test", entry(sshd), Context("gpu-test"))
    async with open_shell(target, "verify", settings(sshd)) as shell:
        output = await shell.run("echo over ssh", 10.0)
    assert output.stdout.endswith("over ssh\n")
    closed = Target("gpu-gone", entry(sshd, "gpu-gone", port=free_port()), Context("gpu-gone"))
    with pytest.raises(ConnectFailure) as failure:
        async with open_shell(closed, "verify", settings(sshd)):
            pass
    assert failure.value.reason.startswith("gpu-gone: ") and "\n" not in failure.value.reason


@needs_sshd
async def test_a_watched_host_lends_its_connection(
    sshd: Sshd, audit_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = source_for(sshd)
    try:
        source.settle(15)
        target = source.target_for("gpu-test")
        assert isinstance(target, WatchedTarget)
        no_second_connection(monkeypatch)
        lines: list[str] = []
        async with open_shell(target, "launch") as shell:
            light = await asyncio.gather(*(shell.run(f"echo {n}", 10.0) for n in range(6)))
            streamed = await shell.change(
                "for n in 1 2 3; do echo line $n; done", 10.0, on_line=lines.append
            )
        assert [o.stdout.strip().splitlines()[-1] for o in light] == [str(n) for n in range(6)]
        assert streamed.ok and lines[-3:] == ["line 1", "line 2", "line 3"]
        assert source.supervisor.link("gpu-test").connects == 1
        (logged,) = entries(audit_log)
        assert (logged["host"], logged["exit_code"]) == ("gpu-test", 0)
    finally:
        source.close()


@needs_sshd
async def test_a_command_stopped_on_a_lent_connection_is_killed_on_the_host(
    sshd: Sshd, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = source_for(sshd)
    try:
        source.settle(15)
        no_second_connection(monkeypatch)
        async with open_shell(source.target_for("gpu-test"), "launch") as shell:
            task = asyncio.ensure_future(shell.stream("sleep 312", 60.0, lambda _line: None))
            for _ in range(100):
                if running("sleep 312"):
                    break
                await asyncio.sleep(0.1)
            assert running("sleep 312")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await gone("sleep 312", within=2.0)
            assert (await shell.run("echo still here", 10.0)).ok
    finally:
        source.close()


@needs_sshd
async def test_a_host_whose_watch_has_ended_gets_a_connection_of_its_own(sshd: Sshd) -> None:
    source = source_for(sshd)
    source.settle(15)
    target = source.target_for("gpu-test")
    source.close()
    async with open_shell(target, "verify", settings(sshd)) as shell:
        output = await shell.run("echo own", 10.0)
    assert output.stdout.endswith("own\n")
