"""`gpuconsole hosts check`, `snapshot --host` and the console's fleet screen on real SSH hosts.

The commands run as a user runs them: a subprocess whose HOME holds `~/.ssh/config` (Host
aliases), the key and known_hosts, against the test sshd.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pilot_wait import until
from sshd import Sshd, free_port, run_gpuconsole, sshd_available

from gpuconsole.core.model import HostState
from gpuconsole.hosts.inventory import hosts_from_option
from gpuconsole.hosts.source import FleetSource, SshSource
from gpuconsole.hosts.supervisor import Backoff, Supervisor
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.fleet import FleetScreen

pytestmark = pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")


LINK_S = 15.0


@pytest.fixture
def home(sshd: Sshd) -> Path:
    """A home whose ~/.ssh/config names the test sshd `gpu-test` and a closed port `gpu-off`."""
    config = sshd.ssh_config(["gpu-test"])
    closed = free_port()
    with config.open("a") as more:
        more.write(f"Host gpu-off\n  HostName 127.0.0.1\n  Port {closed}\n  ConnectTimeout 3\n")
    return sshd.home


def test_hosts_check_reports_each_host_by_name_from_ssh_config(home: Path) -> None:
    done = run_gpuconsole(home, "hosts", "check", "--json", "--hosts", "gpu-test,gpu-off")
    assert done.returncode == 2, done.stderr
    results = {r["name"]: r for r in json.loads(done.stdout)}
    assert results["gpu-test"] == {
        "name": "gpu-test",
        "state": "live",
        "reason": None,
        "gpus": 8,
        "answered_by": "reading",
        "notices": [],
    }
    assert results["gpu-off"]["answered_by"] == "answer"
    assert results["gpu-off"]["state"] == "down"
    assert "connection refused" in results["gpu-off"]["reason"]
    assert results["gpu-off"]["gpus"] is None


def test_hosts_check_flags_a_gpu_count_that_differs_from_the_inventory(
    home: Path, tmp_path: Path
) -> None:
    inventory = tmp_path / "hosts.toml"
    inventory.write_text("[hosts.gpu-test]\ngpus = 4\n")
    done = run_gpuconsole(home, "hosts", "check", "--inventory", str(inventory))
    assert done.returncode == 1, done.stderr
    assert "8 GPUs found, the inventory expects 4" in done.stdout


def test_snapshot_of_a_remote_host(home: Path) -> None:
    done = run_gpuconsole(home, "snapshot", "--json", "--hosts", "gpu-test", "--host", "gpu-test")
    assert done.returncode in (0, 1, 2), done.stderr
    snapshot = json.loads(done.stdout)
    assert snapshot["host"] == "gpu-test"
    assert snapshot["source"] == "agent-smi"
    assert len(snapshot["gpus"]) == 8


def test_snapshot_of_an_unreachable_host_is_one_line(home: Path) -> None:
    done = run_gpuconsole(home, "snapshot", "--hosts", "gpu-off", "--host", "gpu-off")
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1
    assert "gpu-off" in done.stderr and "Traceback" not in done.stderr


def test_a_bad_inventory_names_file_and_line(home: Path, tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.toml"
    inventory.write_text("[hosts.gpu-test]\nport = 0\n")
    done = run_gpuconsole(home, "hosts", "check", "--inventory", str(inventory))
    assert done.returncode == 2
    assert done.stderr.startswith(f"gpuconsole: {inventory}:2:")
    assert done.stdout == ""


def test_hosts_check_without_an_inventory_says_how_to_give_one(home: Path) -> None:
    done = run_gpuconsole(home, "hosts", "check")
    assert done.returncode == 2
    assert "no inventory" in done.stderr


async def test_the_fleet_screen_shows_an_ssh_host_live_then_down(sshd: Sshd) -> None:
    host = hosts_from_option(f"127.0.0.1:{sshd.port}").hosts[0]
    settings = sshd.settings()
    supervisor = Supervisor(
        [host], settings, interval=0.2, agent_mode="sim", backoff=Backoff(0.2, 1.0)
    )
    source = FleetSource(None, SshSource(supervisor))
    app = GpuConsoleApp(source, label="test rack", refresh=0.2)
    name = host.name
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            assert isinstance(app.screen, FleetScreen)
            await until(
                pilot, lambda: app.fleet.store.status(name).state is HostState.LIVE, timeout=LINK_S
            )
            assert app.fleet.store.latest(name) is not None
            sshd.kill()
            await until(
                pilot, lambda: app.fleet.store.status(name).state is HostState.DOWN, timeout=LINK_S
            )
            # The stream's end is seen first; a reconnect tried before the poll may replace it.
            reason = app.fleet.store.status(name).reason or ""
            assert "connection lost" in reason or "connection refused" in reason, reason
            await pilot.press("s")  # the UI still answers while the host is down
            await pilot.pause()
    finally:
        source.close()


@pytest.mark.parametrize(("jump", "state"), [("gpu-test", "live"), ("gpu-off", "down")])
def test_a_host_behind_a_jump_host(
    home: Path, sshd: Sshd, tmp_path: Path, jump: str, state: str
) -> None:
    """Reached through the jump host: a jump host that is down makes the host down too."""
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        f'[hosts.gpu-behind]\naddress = "127.0.0.1"\nport = {sshd.port}\njump = "{jump}"\n'
    )
    done = run_gpuconsole(home, "hosts", "check", "--json", "--inventory", str(inventory))
    (result,) = json.loads(done.stdout)
    assert result["state"] == state, result
    assert done.returncode == (0 if state == "live" else 2)
