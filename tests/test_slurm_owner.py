"""A real Slurm job's GPU process named by its job, end to end: read on this machine (the NVML
and nvidia-smi sources), read over a real sshd by the agent, printed by `gpuconsole snapshot
--json`, and shown in the host screen's process list.

The job runs on the test's single-node cluster (linuxproc tracking: no Slurm cgroup, so the job
is found from the process's ``SLURM_JOB_ID``); a stand-in nvidia-smi lists its process on GPU 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from slurm import Slurm
from sshd import Sshd, run_gpuconsole, sshd_available
from standin import write_standin_smi
from static_source import StaticSource
from test_app import cell_text
from test_slurm_jobs import WAIT_S, job_process

from gpuconsole.core.model import GpuProcess, GpuState, HostSnapshot
from gpuconsole.telemetry.agent import Owners, SlurmJobs
from gpuconsole.telemetry.jobs import LocalOwners
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.host import HostScreen

JOB_NAME = "llama-ft"
JOB_COMMAND = ["sleep", "300"]


@pytest.fixture
def job_pid(slurm: Slurm) -> Iterator[tuple[int, psutil.Process]]:
    job = slurm.submit(JOB_NAME, " ".join(JOB_COMMAND))
    process = job_process(job, JOB_COMMAND)
    yield job, process
    slurm.run("scancel", str(job), check=False)


def on_gpu_0(pid: int) -> HostSnapshot:
    gpu = GpuState(index=0, name="NVIDIA H200", utilization_pct=90.0)
    process = GpuProcess(pid, 0, 40_000.0, "root", " ".join(JOB_COMMAND))
    return HostSnapshot("here", 1000.0, (gpu,), processes=(process,))


def test_a_local_reading_names_the_job_of_a_process(
    slurm: Slurm, job_pid: tuple[int, psutil.Process]
) -> None:
    job, process = job_pid
    jobs = LocalOwners(Owners(env=slurm.env))
    deadline = time.monotonic() + WAIT_S
    while True:
        (named,) = jobs.attach(on_gpu_0(process.pid)).processes
        assert named.job is not None and named.job.job_id == job
        if named.job.name is not None or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (named.job.name, named.job.user, named.job.partition) == (JOB_NAME, "root", "debug")
    assert named.owner == f"job {job} {JOB_NAME}"


def test_a_process_outside_any_job_has_none(slurm: Slurm) -> None:
    (process,) = LocalOwners(Owners(env=slurm.env)).attach(on_gpu_0(os.getpid())).processes
    assert (process.job, process.pod, process.container_name) == (None, None, None)


async def test_the_process_list_shows_the_jobs_id_and_name(
    slurm: Slurm, job_pid: tuple[int, psutil.Process]
) -> None:
    job, process = job_pid
    jobs = LocalOwners(Owners(slurm=SlurmJobs(env=slurm.env, first_wait=WAIT_S)))
    snapshot = jobs.attach(on_gpu_0(process.pid))
    app = GpuConsoleApp(StaticSource(snapshot), auto_poll=False, background_start=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HostScreen("here"))
        await pilot.pause()
        key = f"0/{process.pid}"
        assert cell_text(app.screen, "processes", key, "owner") == f"job {job} {JOB_NAME}"
        assert cell_text(app.screen, "processes", key, "user") == "root"


@pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")
def test_snapshot_over_ssh_names_the_job(
    slurm: Slurm, job_pid: tuple[int, psutil.Process], tmp_path: Path
) -> None:
    """The README's `gpuconsole snapshot --json --host` against a host whose agent finds the
    job: its session has the cluster's SLURM_CONF and its nvidia-smi lists the job's process."""
    job, process = job_pid
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "job.pid"
    pid_file.write_text(str(process.pid))
    write_standin_smi(bin_dir, gpus=1, hostile_pid_file=pid_file)
    path = f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    server = Sshd(tmp_path / "sshd", env={"PATH": path, "SLURM_CONF": str(slurm.conf)}).start()
    try:
        server.ssh_config(["gpu-test"])
        result = run_gpuconsole(
            server.home, "snapshot", "--json", "--hosts", "gpu-test", "--host", "gpu-test"
        )
    finally:
        server.kill()
    assert result.returncode == 0, result.stderr
    (entry,) = [p for p in json.loads(result.stdout)["processes"] if p["pid"] == process.pid]
    assert entry["job"]["job_id"] == job
    assert (entry["job"]["name"], entry["job"]["user"]) == (JOB_NAME, "root")
