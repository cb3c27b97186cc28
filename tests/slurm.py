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

from sshd import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
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
        self.run("scancel", "--user=root", check=False)
        for pid_file in reversed(self._pids):
            try:
                os.kill(int(pid_file.read_text().split()[0]), 15)
            except (OSError, ValueError):
                continue


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
