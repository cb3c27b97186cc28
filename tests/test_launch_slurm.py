"""Launching through Slurm: `srun` on a login node starts torchrun once per node. Run for real on
this machine's CPU against a stand-in srun (tests/slurm_standin.py: tasks, SLURM_* variables and
exit status as srun(1) documents them), over the test sshd as a login node is reached."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from slurm_standin import write_standin_slurm
from sshd import user_env
from test_launch import CPU_RUN, LAUNCH_S

from gpuconsole.actions.launch.commands import LaunchSpec, slurm_command

SPEC = LaunchSpec("resnet50", "baseline", steps=3)


def test_each_task_learns_the_head_and_whether_it_hosts_the_store(tmp_path: Path) -> None:
    """The task script of the srun line, run by the stand-in with python swapped for `echo`."""
    write_standin_slurm(tmp_path, nodes=("gpu07", "gpu08"))
    command = slurm_command(SPEC, 2, 8, "job-3", python="echo")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, env=env, check=True
    )
    lines = sorted(done.stdout.splitlines())
    assert len(lines) == 2
    for line, is_host in zip(lines, ("false", "true"), strict=True):
        words = shlex.split(line)
        assert words[words.index("--rdzv-endpoint") + 1] == "gpu07:29400"
        assert words[words.index("--rdzv-conf") + 1] == f"is_host={is_host}"
        assert words[words.index("--nnodes") + 1] == "2"


@pytest.fixture
def login_node(sshd, standin: tuple[Path, Path], tmp_path: Path) -> tuple[dict[str, str], Path]:
    """`login` on the test sshd, whose PATH there finds the stand-in srun and scontrol."""
    pytest.importorskip("torch")
    write_standin_slurm(standin[0], log=tmp_path / "tasks.jsonl")
    sshd.ssh_config(["login"])
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(f'[defaults]\npython = "{sys.executable}"\n[hosts.login]\n')
    env = user_env(sshd.home)
    return env, inventory


def test_srun_on_a_login_node_trains_on_two_nodes_and_keeps_one_result(
    login_node, tmp_path: Path
) -> None:
    env, inventory = login_node
    args = ("launch", "resnet50", "--host", "login", "--slurm", "2", "--gpus", "1")
    more = ("--preset", "baseline", "--inventory", str(inventory), "--json", *CPU_RUN)
    done = gpuconsole(*args, *more, env=env, timeout=LAUNCH_S)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["engine"] == "srun" and report["host"] == "login"
    assert report["summary"]["world_size"] == 2
    assert f"exec {sys.executable} -m torch.distributed.run" in report["commands"]["login"]
    tasks = [json.loads(line) for line in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    assert [(t["nodeid"], t["procid"], t["argv"][0]) for t in tasks] == [
        (0, 0, "bash"),
        (1, 1, "bash"),
    ]
    history = json.loads(gpuconsole("bench", "history", "--json", env=env).stdout)
    assert [(run["host"], run["world_size"], run["status"]) for run in history] == [
        ("login", 2, "ok")
    ]


SLURM_CLIENTS = frozenset(
    [
        "srun",
        "sbatch",
        "salloc",
        "scontrol",
        "sinfo",
        "squeue",
        "scancel",
        "sacct",
        "sacctmgr",
        "sattach",
        "sbcast",
        "sdiag",
        "sprio",
        "sreport",
        "scrontab",
        "sshare",
        "sstat",
        "strigger",
    ]
)


@pytest.fixture
def here(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """This machine as the launch host; ``bin`` is first on its PATH and has no srun yet."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    return {**os.environ, "PATH": path, "HOME": str(tmp_path / "home")}, bin_dir


def test_a_host_without_srun_is_said_not_to_be_a_slurm_login_node(here, tmp_path) -> None:
    env, bin_dir = here
    # this machine may have Slurm's clients (the drain tests' cluster): a PATH without them
    system = tmp_path / "usr-bin-without-slurm"
    system.mkdir()
    for tool in Path("/usr/bin").iterdir():
        if tool.name not in SLURM_CLIENTS:
            (system / tool.name).symlink_to(tool)
    env = {**env, "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{system}"}
    done = gpuconsole(
        "launch", "resnet50", "--slurm", "2", "--gpus", "1", env=env, timeout=LAUNCH_S
    )
    assert done.returncode == 2
    assert "failed (no-slurm): this host is not a Slurm login node" in done.stdout
    history = json.loads(gpuconsole("bench", "history", "--json", env=env).stdout)
    assert [run["status"] for run in history] == ["failed"]


def test_more_nodes_than_the_cluster_has_is_srun_s_own_error(here) -> None:
    env, bin_dir = here
    write_standin_slurm(bin_dir)
    done = gpuconsole(
        "launch", "resnet50", "--slurm", "3", "--gpus", "1", env=env, timeout=LAUNCH_S
    )
    assert done.returncode == 2
    assert "Requested node configuration is not available" in done.stdout


def test_slurm_without_gpus_per_node_is_refused_before_anything_runs(here) -> None:
    env, bin_dir = here
    log = write_standin_slurm(bin_dir)
    done = gpuconsole("launch", "resnet50", "--slurm", "2", env=env, timeout=LAUNCH_S)
    assert done.returncode != 0
    assert "--slurm needs --gpus" in done.stderr
    assert not log.exists()
