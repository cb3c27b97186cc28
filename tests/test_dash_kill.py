"""A command the console gives up on is ended on a host whose login shell is dash, and the end
is checked: what outlives the KILL is named in one line with its host.

The host is the test sshd on 127.0.0.1, logged into as a throwaway user whose login shell is
dash (made here as root, removed afterwards with everything it ran). A process that outlives
SIGKILL, as an nvidia-smi stuck in the driver does, is made with the cgroup v1 freezer: a frozen
task keeps a KILL pending until it is thawed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest
from sshd import Sshd, gone, running, sshd_available

from gpuconsole.actions.session import HostShell, open_shell
from gpuconsole.hosts.inventory import HostDefaults
from gpuconsole.hosts.targets import Context, Target

DASH = shutil.which("dash")
USERADD = shutil.which("useradd")
USERDEL = shutil.which("userdel")
FREEZER = Path("/sys/fs/cgroup/freezer")
HOST = "dash-host"

pytestmark = [
    pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="making a user with dash as its shell needs root"),
    pytest.mark.skipif(
        DASH is None or USERADD is None or USERDEL is None, reason="dash or useradd is missing"
    ),
]


def marker() -> str:
    """A `sleep` argument no other test runs (GNU sleep takes a fraction)."""
    return f"347.{os.getpid()}{time.monotonic_ns() % 10**6}"


@pytest.fixture
def dash_user() -> Iterator[str]:
    """A user with no password, no home of its own and dash as its login shell; afterwards it
    is gone, and so is every process it ran."""
    name = f"gpc35-{os.getpid()}"
    account = ["--system", "--no-create-home", "--no-user-group", "--home-dir", "/"]
    login = ["--shell", str(DASH), "--password", "*"]  # "*": no password, yet not locked
    subprocess.run([str(USERADD), *account, *login, name], check=True)
    try:
        yield name
    finally:
        left = [p for p in psutil.process_iter(["username"]) if p.info["username"] == name]
        for process in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(left, timeout=5)
        subprocess.run([str(USERDEL), name], check=True)


@pytest.fixture
async def dash_host(tmp_path: Path, dash_user: str) -> AsyncIterator[HostShell]:
    """The console's shell on the dash user's host, opened as an action opens one. sshd reads
    authorized keys as the user, who cannot enter the test's directory: its key is put where
    it can read it."""
    keys = Path(tempfile.mkdtemp(prefix="gpuconsole-dash-"))
    server = Sshd(tmp_path / "sshd")
    try:
        keys.chmod(0o755)
        (keys / "authorized_keys").write_text(Path(f"{server.client_key}.pub").read_text())
        (keys / "authorized_keys").chmod(0o644)
        server.configure(f"Match User {dash_user}\n  AuthorizedKeysFile {keys}/authorized_keys")
        server.start()
        entry = HostDefaults(user=dash_user, port=server.port, connect_timeout=5.0).entry(
            HOST, "127.0.0.1"
        )
        target = Target(HOST, entry, Context(HOST))
        async with open_shell(target, "verify", server.settings()) as shell:
            yield shell
    finally:
        server.kill()
        shutil.rmtree(keys)


async def test_the_login_shell_is_dash(dash_host: HostShell) -> None:
    output = await dash_host.run("readlink /proc/$$/exe", 10.0)
    assert output.stdout.strip() == os.path.realpath(str(DASH))


async def test_a_timed_out_command_is_ended_on_a_dash_host(dash_host: HostShell) -> None:
    mark = marker()
    output = await dash_host.run(f"sleep {mark}", 1.0)
    assert output.timed_out and output.stderr == "no answer within 1 s"
    assert await gone(mark, within=3.0)


async def test_a_timed_out_stream_and_its_children_are_ended_on_a_dash_host(
    dash_host: HostShell,
) -> None:
    """A hung tool run in the background of a stream (as journalctl with a pipe is)."""
    first, second = marker(), marker() + "1"
    output = await dash_host.stream(f"sleep {first} & sleep {second}", 1.0, lambda _line: None)
    assert output.timed_out and output.stderr == "no answer within 1 s"
    assert await gone(first, within=3.0) and await gone(second, within=3.0)


@pytest.fixture
def freezer() -> Iterator[Path]:
    """A cgroup v1 freezer group; afterwards thawed (a pending KILL then ends what is in it),
    emptied into the root group (what is left is ended with its user) and removed."""
    if not os.access(FREEZER, os.W_OK):
        pytest.skip("no writable cgroup v1 freezer")
    group = FREEZER / f"gpuconsole-test-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (FREEZER / "cgroup.procs").write_text(pid)
        group.rmdir()


async def test_a_command_that_outlives_kill_is_named_with_its_host(
    dash_host: HostShell, freezer: Path
) -> None:
    mark = marker()
    task = asyncio.ensure_future(dash_host.run(f"sleep {mark}", 3.0))
    for _ in range(40):
        if running(mark):
            break
        await asyncio.sleep(0.05)
    hung = running(mark)  # the login shell, which leads the group, and its sleep
    assert hung
    group = os.getpgid(hung[0].pid)
    for process in hung:
        (freezer / "cgroup.procs").write_text(str(process.pid))
    (freezer / "freezer.state").write_text("FROZEN")
    output = await task
    assert output.timed_out
    assert output.stderr == (
        f"no answer within 3 s; {HOST}: processes of group {group} still run after KILL "
        "(stuck in the kernel, or another user's): `ps -e -o pid,pgid,stat,args` there lists them"
    )
    assert running(mark)  # frozen, KILL pending: the line told the truth
