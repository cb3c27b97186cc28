"""A private single-node Slurm cluster on 127.0.0.1 for tests: Debian's real ``munged``,
``slurmctld`` and ``slurmd``, each on its own socket, ports and directories.

It runs as root (SlurmUser=root) with ``ProctrackType=proctrack/linuxproc`` and
``TaskPlugin=task/none``, which need no cgroups, so it runs in a container. Its one node is
named after this machine's short host name, as a real node is, so that the console finds it the
way it finds a real one. The clients (``sbatch``, ``scontrol``, ``sinfo``) reach it through
``SLURM_CONF``, which `env` sets.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
from leftovers import end, end_processes_of, processes_of, watch
from sshd import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
WAIT_S = 30.0
"""The longest a stop waits for the jobs to end, and for each daemon to exit."""
CLIENTS = ("sbatch", "scontrol", "sinfo", "squeue", "scancel")
_SBIN = ("/usr/sbin", "/usr/bin")


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (f"{d}/{name}" for d in _SBIN if Path(f"{d}/{name}").exists()), None
    )


def slurm_available() -> bool:
    """Whether the daemons and clients are installed and this process may run them (root)."""
    return os.geteuid() == 0 and all(_which(n) for n in (*DAEMONS, *CLIENTS, "mungekey"))


class Slurm:
    """One cluster of one node; `start`, then `stop`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # for the session check: its slurmstepd have neither the run's mark nor pytest above
        watch(directory)
        self.node = socket.gethostname().split(".")[0]
        self.conf = directory / "slurm.conf"
        self._pids: list[Path] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, check=check, timeout=30
        )

    def start(self) -> Slurm:
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)  # munged wants every directory above its socket searchable by all
        for sub in ("state", "spool"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        key = d / "munge.key"
        subprocess.run([_which("mungekey"), "-c", "-k", str(key)], check=True)  # type: ignore[list-item]
        key.chmod(0o600)
        socket_path = d / "munge.sock"
        self._daemon(
            "munged",
            f"--key-file={key}",
            f"--socket={socket_path}",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}",
        )
        self.conf.write_text(self._config(socket_path, free_port(), free_port()))
        self._daemon("slurmctld", "-i")
        self._daemon("slurmd", "-N", self.node)
        self._wait_for_idle()
        return self

    def _daemon(self, name: str, *args: str) -> None:
        subprocess.run([_which(name), *args], env=self.env, check=True, timeout=30)  # type: ignore[list-item]
        self._pids.append(self.directory / f"{name}.pid")

    def _config(self, munge_socket: Path, ctld_port: int, slurmd_port: int) -> str:
        d = self.directory
        settings: Mapping[str, object] = {
            "ClusterName": "gpuconsole-test",
            "SlurmctldHost": f"{self.node}(127.0.0.1)",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={munge_socket}",
            "CredType": "cred/munge",
            "SlurmctldPort": ctld_port,
            "SlurmdPort": slurmd_port,
            "StateSaveLocation": d / "state",
            "SlurmdSpoolDir": d / "spool",
            "SlurmctldPidFile": d / "slurmctld.pid",
            "SlurmdPidFile": d / "slurmd.pid",
            "SlurmctldLogFile": d / "slurmctld.log",
            "SlurmdLogFile": d / "slurmd.log",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "SelectType": "select/cons_tres",
            "ReturnToService": 2,
            "MpiDefault": "none",
        }
        lines = [f"{key}={value}" for key, value in settings.items()]
        lines.append(
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} "
            "RealMemory=1000 State=UNKNOWN"
        )
        lines.append(f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def state(self) -> str:
        """The node's state as sinfo prints it (idle, drained, draining, mixed...)."""
        return self.run("sinfo", "-h", "-n", self.node, "-o", "%T").stdout.strip()

    def _wait_for_idle(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.run("sinfo", "-h", "-n", self.node, "-o", "%T", check=False).stdout.strip() in (
                "idle",
                "mixed",
                "allocated",
            ):
                return
            time.sleep(0.3)
        logs = "".join(p.read_text()[-2000:] for p in self.directory.glob("slurm*.log"))
        raise RuntimeError(f"the test Slurm node did not come up:\n{logs}")

    def submit(self, name: str, command: str) -> int:
        """A batch job running ``command``; its id once it runs."""
        output = f"--output={self.directory}/job-%j.out"  # not slurm-N.out in the working dir
        out = self.run("sbatch", "--parsable", "-J", name, output, "--wrap", command).stdout
        job = int(out.strip().split(";")[0])
        deadline = time.monotonic() + 30
        while self.run("squeue", "-h", "-j", str(job), "-o", "%T").stdout.strip() != "RUNNING":
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job} did not start")
            time.sleep(0.2)
        return job

    def stop(self) -> None:
        """Cancel every job and wait until it has ended, stop the daemons (slurmd, slurmctld,
        munged), each waited for, then end whatever of this cluster still runs. A slurmstepd is
        not slurmd's to stop: one whose slurmctld is gone before its job ends is left to init
        and runs on for ever, with its job's processes."""
        try:
            self._cancel_jobs()
        finally:
            for pid_file in reversed(self._pids):
                self._stop_daemon(pid_file)
            # job steps, their slurmstepd (working in this directory) and any job process
            # (SLURM_CONF names this directory), all reparented to init by now
            end_processes_of(self.directory)

    def _cancel_jobs(self) -> None:
        if not self._daemon_process(self.directory / "slurmctld.pid"):
            return
        try:
            jobs = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False)
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                if not self.run("squeue", "-h", "-o", "%i", check=False).stdout.split() and not [
                    p for p in processes_of([self.directory]) if p.name() == "slurmstepd"
                ]:
                    return
                time.sleep(0.2)
        except (subprocess.SubprocessError, OSError, psutil.Error):
            return  # what is left is ended below, with the daemons gone

    def _daemon_process(self, pid_file: Path) -> psutil.Process | None:
        """The daemon whose pid ``pid_file`` holds, if it runs and is this cluster's (a pid
        reused by another process is not)."""
        try:
            process = psutil.Process(int(pid_file.read_text().split()[0]))
        except (OSError, ValueError, IndexError, psutil.Error):
            return None
        mine = {p.pid for p in processes_of([self.directory])}
        return process if process.pid in mine else None

    def _stop_daemon(self, pid_file: Path) -> None:
        process = self._daemon_process(pid_file)
        if process is not None:
            end([process], timeout=WAIT_S / 2)


def running() -> Iterator[Slurm]:
    """A started cluster, stopped and removed when the generator closes (a pytest fixture's
    body). Its directory is its own under /tmp: munged refuses a socket below a directory that
    others cannot search, as pytest's temporary directories are."""
    directory = Path(tempfile.mkdtemp(prefix="gpuconsole-slurm-"))
    cluster = Slurm(directory)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
