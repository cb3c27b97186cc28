"""Multi-node launches: where the nodes meet (each node's address, a free port on the head), one
result of several nodes, and a real two-node torchrun over the test sshd on this machine's CPU."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from sshd import user_env
from test_launch import CPU_RUN, LAUNCH_S

from gpuconsole.actions.launch.commands import RDZV_PORT, LaunchError, LaunchSpec, node_command
from gpuconsole.actions.launch.nodes import parse_probe, probe_command
from gpuconsole.actions.launch.run import run_on_nodes
from gpuconsole.actions.launch.session import ACTION
from gpuconsole.actions.session import HostShell
from gpuconsole.actions.shell import LocalShell

SPEC = LaunchSpec("resnet50", "tuned", steps=3)


def probe(env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["sh", "-c", probe_command(shlex.quote(sys.executable))],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return done.stdout


def test_a_node_is_reached_at_its_ssh_server_address_else_its_fqdn() -> None:
    plain = {k: v for k, v in os.environ.items() if k != "SSH_CONNECTION"}
    assert parse_probe("here", probe(plain)).address == socket.getfqdn()
    over_ssh = {**plain, "SSH_CONNECTION": "10.0.0.9 50022 10.0.0.5 22"}
    assert parse_probe("here", probe(over_ssh)).address == "10.0.0.5"


def test_the_rendezvous_port_is_29400_unless_something_holds_it() -> None:
    with socket.socket() as holder:
        try:
            holder.bind(("", RDZV_PORT))
        except OSError:
            pytest.skip(f"port {RDZV_PORT} is taken on this machine already")
        assert parse_probe("here", probe()).free_port != RDZV_PORT
    assert parse_probe("here", probe()).free_port == RDZV_PORT


def test_a_probe_that_printed_something_else_names_the_host() -> None:
    with pytest.raises(LaunchError, match="gpu-b: cannot tell its address"):
        parse_probe("gpu-b", "Traceback (most recent call last):\n")


def test_node_commands_meet_at_an_address_and_say_their_own() -> None:
    command = node_command(
        SPEC, ["gpu-a", "gpu-b"], 8, "10.0.0.5", "job-1", port=29411, local_addr="10.0.0.6"
    )
    assert "--rdzv-endpoint 10.0.0.5:29411" in command
    assert "--local-addr 10.0.0.6" in command
    v6 = node_command(SPEC, ["gpu-a", "gpu-b"], 8, "fd00::5", "job-1", local_addr="fd00::6")
    assert "--rdzv-endpoint [fd00::5]:29400" in v6 and "--local-addr fd00::6" in v6
    with pytest.raises(LaunchError, match="host 'gpu-a;reboot'"):
        node_command(SPEC, ["gpu-a", "gpu-b"], 8, "10.0.0.5", "job-1", local_addr="gpu-a;reboot")
    with pytest.raises(LaunchError, match="rendezvous port 0"):
        node_command(SPEC, ["gpu-a", "gpu-b"], 8, "10.0.0.5", "job-1", port=0)


# --- one result of several nodes (shell commands standing in for torchrun) -------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def events(*lines: dict[str, object]) -> str:
    return "; ".join(f"echo {shlex.quote(json.dumps(line))}" for line in lines)


SUMMARY = {
    "event": "summary",
    "recipe": "resnet50",
    "preset": "tuned",
    "samples_per_s": 10.0,
    "world_size": 2,
}


async def test_rank_0_may_be_on_any_node_and_its_summary_is_the_runs(home: Path) -> None:
    seen: list[str] = []
    commands = {
        "gpu-a": "echo torchrun agent log line",
        "gpu-b": events({"event": "step", "step": 1}, SUMMARY),
    }
    shells = {host: HostShell(host, ACTION, LocalShell()) for host in ("gpu-a", "gpu-b")}
    result = await run_on_nodes(shells, SPEC, commands, lambda e: seen.append(e["event"]))
    assert result.ok and result.host == "gpu-a"
    assert result.summary == SUMMARY and len(result.steps) == 1
    assert seen == ["step", "summary"]
    assert (home / ".cache" / "gpuconsole" / "recipes" / "resnet50.py").is_file()


async def test_a_failed_node_stops_the_others_and_is_named(home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "still-waiting"
    commands = {
        "gpu-a": f"sleep 60; touch {marker}",  # waiting for gpu-b in the rendezvous
        "gpu-b": "echo 'RendezvousConnectionError: the store is not reachable'; exit 1",
    }
    shells = {host: HostShell(host, ACTION, LocalShell()) for host in ("gpu-a", "gpu-b")}
    started = time.monotonic()
    result = await run_on_nodes(shells, SPEC, commands)
    assert time.monotonic() - started < 30
    assert not result.ok and result.host == "gpu-a" and result.exit_code == 1
    assert result.error == "gpu-b: RendezvousConnectionError: the store is not reachable"
    await asyncio.sleep(0.5)
    assert not marker.exists()


# --- two nodes over SSH ---------------------------------------------------------------------------


@pytest.fixture
def two_nodes(sshd, tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Two inventory hosts, `gpu-a` and `gpu-b`: SSH aliases (no DNS name) of the test sshd."""
    pytest.importorskip("torch")
    sshd.ssh_config(["gpu-a", "gpu-b"])
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(f'[defaults]\npython = "{sys.executable}"\n[hosts.gpu-a]\n[hosts.gpu-b]\n')
    env = user_env(sshd.home)
    return env, inventory


def test_two_nodes_over_ssh_train_as_one_world_and_keep_one_result(two_nodes) -> None:
    env, inventory = two_nodes
    args = ("launch", "resnet50", "--nodes", "gpu-a,gpu-b", "--gpus", "1", "--preset", "baseline")
    done = gpuconsole(
        *args, "--inventory", str(inventory), "--json", *CPU_RUN, env=env, timeout=LAUNCH_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["engine"] == "torchrun-nodes" and report["host"] == "gpu-a"
    # One process per node, one world of two: both nodes' ranks took part in every step.
    assert report["summary"]["world_size"] == 2
    assert len(report["steps"]) >= 3
    head, other = report["commands"]["gpu-a"], report["commands"]["gpu-b"]
    assert "--rdzv-endpoint 127.0.0.1:" in head and "is_host=true" in head
    assert "--rdzv-endpoint 127.0.0.1:" in other and "is_host=false" in other
    history = json.loads(gpuconsole("bench", "history", "--json", env=env).stdout)
    assert [(run["host"], run["world_size"], run["status"]) for run in history] == [
        ("gpu-a", 2, "ok")
    ]
