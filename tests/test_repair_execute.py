"""Carrying out repair plans against a real shell, local and over the test sshd.

The system tools a plan calls (apt-get, dkms, modprobe, update-initramfs, systemctl, mokutil,
sudo, id) are stand-ins on PATH that record their arguments: no test changes a real package.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path

import asyncssh
import pytest
from sshd import Sshd, sshd_available

from gpuconsole.actions.repair.execute import command_line, execute
from gpuconsole.actions.repair.model import Plan, Step
from gpuconsole.actions.repair.session import ACTION
from gpuconsole.actions.session import HostShell
from gpuconsole.actions.shell import LocalShell, Shell, SshShell
from gpuconsole.core import paths

TOOLS = ("apt-get", "dkms", "modprobe", "update-initramfs", "systemctl", "mokutil")

PLAN = Plan(
    "dkms-not-built",
    "Build the driver for the running kernel",
    (
        Step("install headers", "apt-get install -y linux-headers-6.8.0-45-generic"),
        Step("build the module", "dkms install -m nvidia -v 550.127.05 -k 6.8.0-45-generic"),
        Step("load it", "modprobe nvidia"),
    ),
    outcome="nvidia-smi answers.",
)


def write_tools(directory: Path, log: Path, tools: Sequence[str] = TOOLS) -> Path:
    """Stand-ins that log `tool args...`; `fail-TOOL` in the directory makes TOOL fail."""
    directory.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        script = directory / tool
        script.write_text(
            "#!/bin/sh\n"
            f'echo "{tool} $*" >> {shlex.quote(str(log))}\n'
            f'echo "{tool}: working on $*"\n'
            f"if [ -e {shlex.quote(str(directory))}/fail-{tool} ]; then\n"
            f'  echo "{tool}: E: something broke" >&2; exit 100\n'
            "fi\n"
        )
        script.chmod(0o755)
    return directory


def sysfs_with_one_gpu(root: Path) -> Path:
    """A sysfs tree whose PCI bus holds one NVIDIA GPU (and its audio function) beside another
    vendor's device: this machine, seen by the probes (``GPUCONSOLE_SYSFS``), as a GPU host whose
    driver is missing, rather than a machine without a GPU, where repair plans nothing."""
    devices = root / "bus" / "pci" / "devices"
    for address, vendor, pci_class in (
        ("0000:00:01.0", "0x8086", "0x060000"),
        ("0000:17:00.0", "0x10de", "0x030200"),
        ("0000:17:00.1", "0x10de", "0x040300"),
    ):
        (devices / address).mkdir(parents=True)
        (devices / address / "vendor").write_text(f"{vendor}\n")
        (devices / address / "class").write_text(f"{pci_class}\n")
    return root


def act_as_user(directory: Path, sudo_needs_password: bool) -> None:
    """`id -u` says 1000, and `sudo -n` either runs the command or wants a password."""
    (directory / "id").write_text("#!/bin/sh\necho 1000\n")
    body = (
        'echo "sudo: a password is required" >&2; exit 1\n'
        if sudo_needs_password
        else '[ "$1" = "-n" ] && shift; exec "$@"\n'
    )
    (directory / "sudo").write_text("#!/bin/sh\n" + body)
    for name in ("id", "sudo"):
        (directory / name).chmod(0o755)


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    log = tmp_path / "calls.log"
    directory = write_tools(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{directory}:/usr/bin:/bin")
    return directory, log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def audit_entries() -> list[dict[str, object]]:

    path = paths.AUDIT_LOG.path()
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def on(host: str, shell: Shell | None = None) -> HostShell:
    """``host``'s shell for a repair: this machine's unless ``shell`` is given."""
    return HostShell(host, ACTION, shell or LocalShell())


async def yes(_plan: Plan, _commands: Sequence[str]) -> bool:
    return True


async def no(_plan: Plan, _commands: Sequence[str]) -> bool:
    return False


async def test_a_dry_run_shows_every_command_and_runs_none(tools) -> None:
    _, log = tools
    run = await execute(on("here"), PLAN, confirm=yes, dry_run=True)
    assert run.dry_run and not run.completed
    assert run.commands == tuple(step.command for step in PLAN.steps)
    assert calls(log) == []
    assert audit_entries() == []


async def test_a_refused_confirmation_runs_nothing(tools) -> None:
    _, log = tools
    shown: list[Sequence[str]] = []

    async def refuse(plan: Plan, commands: Sequence[str]) -> bool:
        shown.append(commands)
        return False

    run = await execute(on("here"), PLAN, confirm=refuse)
    assert not run.confirmed and run.runs == ()
    assert shown == [run.commands]
    assert calls(log) == []


async def test_a_confirmed_plan_runs_its_steps_in_order_streams_and_audits(tools) -> None:
    _, log = tools
    lines: list[str] = []
    run = await execute(on("here"), PLAN, confirm=yes, on_line=lines.append)
    assert run.completed, run.message
    assert calls(log) == [
        "apt-get install -y linux-headers-6.8.0-45-generic",
        "dkms install -m nvidia -v 550.127.05 -k 6.8.0-45-generic",
        "modprobe nvidia",
    ]
    assert lines[0] == "$ apt-get install -y linux-headers-6.8.0-45-generic"
    assert "apt-get: working on install -y linux-headers-6.8.0-45-generic" in lines
    entries = audit_entries()
    assert [e["command"] for e in entries] == list(run.commands)
    assert all(e["exit_code"] == 0 and e["host"] == "here" for e in entries)
    assert all(e["action"] == "repair-step" and e["user"] for e in entries)


async def test_the_first_failed_step_stops_the_plan_and_says_where(tools) -> None:
    directory, log = tools
    (directory / "fail-dkms").touch()
    run = await execute(on("here"), PLAN, confirm=yes)
    assert not run.completed
    assert [r.exit_code for r in run.runs] == [0, 100]
    assert calls(log) == [
        "apt-get install -y linux-headers-6.8.0-45-generic",
        "dkms install -m nvidia -v 550.127.05 -k 6.8.0-45-generic",
    ]
    assert "stopped at step 2 of 3 (build the module): exit code 100" in run.message
    assert "Done before it: 1. install headers. Not run: 1 step(s)." in run.message
    assert "dkms: E: something broke" in run.runs[1].tail
    assert [e["exit_code"] for e in audit_entries()] == [0, 100]


async def test_without_root_steps_go_through_sudo_n(tools) -> None:
    directory, log = tools
    act_as_user(directory, sudo_needs_password=False)
    run = await execute(on("here"), PLAN, confirm=yes)
    assert run.completed, run.message
    assert run.commands[2] == "sudo -n sh -c 'modprobe nvidia'"
    assert calls(log)[2] == "modprobe nvidia"


async def test_sudo_wanting_a_password_stops_with_a_clear_reason(tools) -> None:
    directory, log = tools
    act_as_user(directory, sudo_needs_password=True)
    run = await execute(on("gpu-07"), PLAN, confirm=yes)
    assert not run.completed
    assert len(run.runs) == 1
    assert "sudo needs a password on gpu-07" in run.message
    assert calls(log) == []


async def test_a_step_past_its_timeout_is_stopped(tools) -> None:
    slow = Plan("x", "slow", (Step("wait", "sleep 30", root=False, timeout=0.5),), outcome="")
    run = await execute(on("here"), slow, confirm=yes)
    assert run.runs[0].exit_code is None
    assert "no answer within 0.5 s" in run.message


def test_a_step_is_quoted_whole_for_sudo() -> None:
    step = Step("blacklist", "printf 'blacklist nouveau\\n' > /etc/modprobe.d/x.conf")
    line = command_line(step, as_root=False)
    assert shlex.split(line) == ["sudo", "-n", "sh", "-c", step.command]
    assert command_line(step, as_root=True) == step.command
    assert command_line(Step("read", "nvidia-smi", root=False), as_root=False) == "nvidia-smi"


@pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")
async def test_a_plan_runs_over_ssh_on_the_host(tmp_path: Path) -> None:
    log = tmp_path / "remote-calls.log"
    directory = write_tools(tmp_path / "remote-bin", log)
    server = Sshd(tmp_path / "sshd", env={"PATH": f"{directory}:/usr/bin:/bin"}).start()
    try:
        async with asyncssh.connect(
            "127.0.0.1",
            port=server.port,
            known_hosts=str(server.known_hosts),
            client_keys=[str(server.client_key)],
            agent_path=None,
            config=[],
        ) as connection:
            lines: list[str] = []
            shell = on("gpu-test", SshShell(connection))
            run = await execute(shell, PLAN, confirm=yes, on_line=lines.append)
            refused = await execute(shell, PLAN, confirm=no)
    finally:
        server.kill()
    assert run.completed, run.message
    assert calls(log) == [
        "apt-get install -y linux-headers-6.8.0-45-generic",
        "dkms install -m nvidia -v 550.127.05 -k 6.8.0-45-generic",
        "modprobe nvidia",
    ]
    assert "modprobe: working on nvidia" in lines
    assert refused.runs == ()
    assert [e["host"] for e in audit_entries()] == ["gpu-test"] * 3
