"""Launching recipes: the engines' command lines, the GPUs chosen, progress parsing, and real runs
on this machine's CPU (a stand-in nvidia-smi says which GPUs there are) and over the test sshd."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from conftest import NOW
from sshd import user_env
from standin import write_standin_smi
from test_topology_screen import ranked

from gpuconsole.actions.launch.commands import (
    RECIPE_DIR,
    LaunchError,
    LaunchSpec,
    choose_gpus,
    install_command,
    node_command,
    single_host_command,
    slurm_command,
)
from gpuconsole.actions.launch.run import parse_event, start_failure
from gpuconsole.actions.launch.session import host_gpus, launch, plan_launch
from gpuconsole.actions.output import CommandOutput
from gpuconsole.core.model import Topology
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.telemetry.sim import PROFILES, SimRack
from gpuconsole.telemetry.smi.topo import parse_topo_m
from gpuconsole.ui.screens.topology import advice, left_out
from gpuconsole.ui.widgets.cells import Palette

SPEC = LaunchSpec("resnet50", "tuned", steps=50, extra=("--batch-size", "256"))
FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"


def pairs_topology() -> Topology:
    """Four GPUs: NVLink pairs {0,1} and {2,3}, PCIe across the pairs (written for the test)."""
    row = ("X", "NV12", "SYS", "SYS")
    return Topology(
        matrix=(
            row,
            ("NV12", "X", "SYS", "SYS"),
            ("SYS", "SYS", "X", "NV12"),
            ("SYS", "SYS", "NV12", "X"),
        ),
        numa_affinity=(0, 0, 1, 1),
    )


def test_one_gpu_runs_plain_python_and_several_run_torchrun() -> None:
    one = single_host_command(SPEC, (3,))
    assert one.startswith("CUDA_VISIBLE_DEVICES=3 PYTHONUNBUFFERED=1 exec python3 -u ")
    assert shlex.split(one)[-6:] == ["--preset", "tuned", "--steps", "50", "--batch-size", "256"]
    two = single_host_command(SPEC, (2, 3))
    assert "CUDA_VISIBLE_DEVICES=2,3" in two
    assert "torch.distributed.run --standalone --nproc-per-node 2" in two


def test_fewer_gpus_than_the_host_has_take_the_best_connected_set() -> None:
    assert choose_gpus(pairs_topology(), range(4), 2) == (0, 1)  # before {2,3}: lower indices
    assert choose_gpus(pairs_topology(), range(4), 4) == (0, 1, 2, 3)
    assert choose_gpus(None, range(4), 2) == (0, 1)
    with pytest.raises(LaunchError, match="--gpus 5: the host has 4 GPU"):
        choose_gpus(pairs_topology(), range(4), 5)


def test_the_h200_topology_fixture_reads_for_a_one_gpu_launch() -> None:
    topology = parse_topo_m((FIXTURES / "h200-topo-m.txt").read_text())
    assert choose_gpus(topology, range(topology.gpu_count), 1) == (0,)


@pytest.mark.parametrize(
    ("host", "wanted", "chosen"),
    [
        ("a100-01", 2, (0, 1)),
        ("a100-01", 4, (0, 1, 2, 3)),
        ("a100-01", 8, (0, 1, 2, 3, 4, 5, 6, 7)),
        ("l40s-01", 2, (0, 1)),
        ("l40s-01", 3, (0, 1, 2)),
        ("h100-01", 2, (0, 1)),
        ("h100-01", 4, (4, 5, 6, 7)),  # not 0-3: GPU 3 fell off the bus
        ("h100-01", 7, (0, 1, 2, 4, 5, 6, 7)),
    ],
)
def test_demo_hosts_launch_on_the_set_the_topology_screen_puts_first(
    rack: SimRack, host: str, wanted: int, chosen: tuple[int, ...]
) -> None:
    snapshot = rack.read(host, NOW)
    assert snapshot.topology is not None
    answering = [gpu.index for gpu in snapshot.gpus if not gpu.lost]
    assert choose_gpus(snapshot.topology, answering, wanted) == chosen
    shown = ranked(
        advice(snapshot.topology, Palette({}), left_out(snapshot, snapshot.topology)).plain
    )
    if wanted in shown:  # the screen ranks 2, 4, 8... and all of them
        (first, *_), _label = shown[wanted][0]
        assert first == chosen


def test_a_lost_gpu_is_not_counted_among_the_gpus_to_launch_on(rack: SimRack) -> None:
    snapshot = rack.read("h100-01", NOW)
    answering = [gpu.index for gpu in snapshot.gpus if not gpu.lost]
    with pytest.raises(LaunchError, match="--gpus 8: the host has 7 GPU\\(s\\) that answer"):
        choose_gpus(snapshot.topology, answering, 8)


def topo_m(topology: Topology) -> str:
    """``nvidia-smi topo -m`` as nvidia-smi prints it (tab-separated) for ``topology``."""
    names = [f"GPU{i}" for i in range(topology.gpu_count)]
    lines = ["\t" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for name, row, cpus, numa in zip(
        names, topology.matrix, topology.cpu_affinity, topology.numa_affinity, strict=True
    ):
        lines.append("\t".join([name, *row, cpus or "N/A", str(numa), "", "N/A"]))
    return "\n".join(lines) + "\n\nLegend:\n"


class LostGpuShell:
    """Answers the launch's nvidia-smi calls as an HGX H100 whose GPU 3 fell off the bus."""

    def __init__(self, exit_code: int, query: str) -> None:
        self.exit_code, self.query = exit_code, query

    async def run(self, command: str, timeout: float) -> CommandOutput:
        if command == "nvidia-smi topo -m":
            return CommandOutput(command, 0, topo_m(PROFILES["h100-sxm-8"].topology))
        return CommandOutput(command, self.exit_code, self.query)


H100_ROW = "{}, NVIDIA H100 80GB HBM3, 570.133.20"
H100_ROWS = [H100_ROW.format(i) for i in range(8)]
NO_HANDLE = "Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error"


@pytest.mark.parametrize(
    ("exit_code", "rows"),
    [
        (15, [*H100_ROWS[:3], NO_HANDLE, *H100_ROWS[4:]]),  # nvidia-smi's "a GPU fell off"
        (0, [*H100_ROWS[:3], "3, [GPU is lost], [GPU is lost]", *H100_ROWS[4:]]),
    ],
)
async def test_a_gpu_fallen_off_the_bus_is_left_out_of_the_launch(
    exit_code: int, rows: list[str]
) -> None:
    found = await host_gpus(LostGpuShell(exit_code, "\n".join(rows) + "\n"))
    assert found.indices == (0, 1, 2, 4, 5, 6, 7)
    assert (found.name, found.driver) == ("NVIDIA H100 80GB HBM3", "570.133.20")
    assert found.topology == PROFILES["h100-sxm-8"].topology
    plan = plan_launch(SPEC, ["h100-01"], found, 4, None, "job-1", {"h100-01": "python3"})
    assert plan.gpus == (4, 5, 6, 7)
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7 " in plan.commands["h100-01"]


async def test_nvidia_smi_that_answers_for_no_gpu_stops_the_launch() -> None:
    with pytest.raises(LaunchError, match="nvidia-smi does not answer: Unable to determine"):
        await host_gpus(LostGpuShell(15, NO_HANDLE + "\n"))


def test_multi_node_runs_use_c10d_rendezvous_at_the_first_node() -> None:
    command = node_command(SPEC, ["gpu-a", "gpu-b"], 8, "10.0.0.5", "job-1")
    assert "--nnodes 2 --nproc-per-node 8 --rdzv-backend c10d" in command
    assert "--rdzv-endpoint 10.0.0.5:29400 --rdzv-id job-1 --rdzv-conf is_host=false" in command
    head = node_command(SPEC, ["gpu-a", "gpu-b"], 8, "10.0.0.5", "job-1", is_head=True)
    assert "--rdzv-conf is_host=true" in head
    with pytest.raises(LaunchError, match="host 'gpu-a;reboot'"):
        node_command(SPEC, ["gpu-a;reboot"], 8, "gpu-a", "job-1")


def test_slurm_runs_srun_with_torchrun_per_node() -> None:
    command = slurm_command(SPEC, 4, 8, "job-2")
    words = shlex.split(command)
    assert words[:3] == ["PYTHONUNBUFFERED=1", "exec", "srun"]
    assert "--nodes=4" in words and "--gpus-per-node=8" in words
    task = words[-1]
    assert '--rdzv-endpoint "$head:29400"' in task and "--nnodes 4" in task


def test_the_recipe_files_are_written_with_here_documents(tmp_path: Path) -> None:
    command = install_command({"bert.py": "print('hello')\n", "_h.py": "X = 1\n"})
    home = tmp_path / "home"
    subprocess.run(["sh", "-c", command], env={"HOME": str(home)}, check=True)
    written = home / ".cache" / "gpuconsole" / "recipes"
    assert (written / "bert.py").read_text() == "print('hello')\n"
    assert (written / "_h.py").read_text() == "X = 1\n"
    with pytest.raises(LaunchError):
        install_command({"bert.py": "GPUCONSOLE_RECIPE_END\n"})
    with pytest.raises(LaunchError):
        install_command({"../evil.py": "x"})


def test_progress_lines_and_start_failures_are_read() -> None:
    assert parse_event('{"event": "step", "step": 3}') == {"event": "step", "step": 3}
    assert parse_event("W1202 compile warning {not json") is None
    assert parse_event('{"no": "event"}') is None
    kind, message = start_failure(["Traceback", "ModuleNotFoundError: No module named 'torch'"])
    assert (kind, message) == ("no-torch", "torch is not installed for this host's python3")
    assert start_failure(["something odd happened"]) == ("other", "something odd happened")


# --- real runs --------------------------------------------------------------------------------


LAUNCH_S = 600  # a recipe's real run on the CPU


@pytest.fixture
def cpu_host(tmp_path: Path) -> dict[str, str]:
    """This machine as a launch target: a stand-in nvidia-smi, the venv's python3 first."""
    pytest.importorskip("torch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_standin_smi(bin_dir, gpus=4)
    path = f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    return {**os.environ, "PATH": path, "HOME": str(tmp_path / "home")}


CPU_RUN = ("--", "--tiny", "--device", "cpu", "--steps", "3", "--warmup-steps", "1")


def test_a_launch_on_two_gpus_runs_torchrun_and_keeps_the_result(cpu_host) -> None:
    done = gpuconsole(
        "launch", "resnet50", "--gpus", "2", "--json", *CPU_RUN, env=cpu_host, timeout=LAUNCH_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["engine"] == "torchrun"
    assert report["summary"]["world_size"] == 2
    assert len(report["gpus"]) == 2
    history = json.loads(gpuconsole("bench", "history", "--json", env=cpu_host).stdout)
    assert [run["recipe"] for run in history] == ["resnet50"]
    assert history[0]["status"] == "ok"


def test_a_launch_that_fails_says_why_and_keeps_the_failure(cpu_host) -> None:
    done = gpuconsole("launch", "bert", "--gpus", "1", "--", "--device", "cuda", env=cpu_host)
    assert done.returncode == 2
    assert "failed (no-cuda)" in done.stdout
    assert "Traceback" not in done.stdout
    history = json.loads(gpuconsole("bench", "history", "--json", env=cpu_host).stdout)
    assert history[0]["status"] == "failed"


# --- over SSH -----------------------------------------------------------------------------------


@pytest.fixture
def ssh_home(sshd, tmp_path: Path) -> tuple[Path, Path]:
    """~/.ssh for host names on the test sshd, and an inventory naming the venv's python (the
    one with torch) as each host's interpreter."""
    pytest.importorskip("torch")
    sshd.ssh_config(["gpu-a", "gpu-b"])
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(f'[defaults]\npython = "{sys.executable}"\n[hosts.gpu-a]\n[hosts.gpu-b]\n')
    return sshd.home, inventory


def test_a_launch_over_ssh_runs_with_the_inventorys_python(ssh_home) -> None:
    home, inventory = ssh_home
    env = user_env(home)
    args = ("launch", "resnet50", "--host", "gpu-a", "--gpus", "1", "--inventory", str(inventory))
    done = gpuconsole(*args, "--json", *CPU_RUN, env=env, timeout=LAUNCH_S)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["host"] == "gpu-a" and report["engine"] == "python"
    assert sys.executable in report["commands"]["gpu-a"]


# --- the audit log --------------------------------------------------------------------------------

TINY_RUN = LaunchSpec(
    "resnet50", "baseline", 2, ("--tiny", "--device", "cpu", "--warmup-steps", "1")
)


def assert_logged(log: Path, host: str, run_command: str) -> None:
    """The launch's two entries: the recipe's files written, then the run."""
    install, run = [json.loads(line) for line in log.read_text().splitlines()]
    assert install["action"] == run["action"] == "launch"
    assert (install["host"], install["step"], install["recipe"]) == (host, "install", "resnet50")
    assert install["command"] == f"write resnet50.py, _recipe_harness.py to {RECIPE_DIR}"
    assert install["exit_code"] == 0 and install["user"]
    assert (run["host"], run["step"], run["recipe"]) == (host, "run", "resnet50")
    assert (run["command"], run["exit_code"]) == (run_command, 0)


@pytest.mark.usefixtures("cpu_torch_host")
async def test_a_launch_here_logs_the_recipe_it_wrote_and_the_run(audit_log: Path) -> None:
    plan, _gpus, result = await launch([Target("here", None, Context("here"))], TINY_RUN)
    assert result.ok, result.error
    assert_logged(audit_log, "here", plan.commands["here"])


async def test_a_launch_over_ssh_logs_what_it_did_on_the_host(sshd, audit_log: Path) -> None:
    pytest.importorskip("torch")
    from test_ssh_fleet import entry, settings

    host = entry(sshd, "gpu-a", python=sys.executable)
    plan, _gpus, result = await launch(
        [Target("gpu-a", host, Context("gpu-a"))], TINY_RUN, gpus=1, settings=settings(sshd)
    )
    assert result.ok, result.error
    assert_logged(audit_log, "gpu-a", plan.commands["gpu-a"])
