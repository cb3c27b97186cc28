"""The Slurm job of each GPU process of this machine, for the sources that read it in-process
(NVML, nvidia-smi): the agent's own finding (`gpuconsole.telemetry.agent.slurm_job_id` from the
cgroup path or the environment, `SlurmJobs` asking squeue in a thread of its own), so that a host
read locally and one read through its agent name a process's job alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpuconsole.model import HostSnapshot, SlurmJob
from gpuconsole.telemetry.agent import SlurmJobs, cgroup_text, slurm_job_id


def job_from_row(job_id: int, row: Mapping[str, object] | None) -> SlurmJob:
    """A job as squeue's row describes it, or its id alone where squeue has not said."""
    known = row or {}
    texts = (known.get(f.name) for f in dataclasses.fields(SlurmJob)[1:])
    return SlurmJob(job_id, *(text if isinstance(text, str) else None for text in texts))


class LocalJobs:
    """Names the Slurm job of each process of a snapshot of this machine."""

    def __init__(self, lookup: SlurmJobs | None = None) -> None:
        self._lookup = lookup or SlurmJobs()

    def attach(self, snapshot: HostSnapshot) -> HostSnapshot:
        """``snapshot`` with each process's job, where it runs in one; unchanged otherwise."""
        ids = {p.pid: slurm_job_id(p.pid, cgroup_text(p.pid)) for p in snapshot.processes}
        if not any(ids.values()):
            return snapshot
        rows = self._lookup.lookup({job for job in ids.values() if job is not None})
        processes = tuple(
            p
            if (job := ids[p.pid]) is None
            else dataclasses.replace(p, job=job_from_row(job, rows.get(job)))
            for p in snapshot.processes
        )
        return dataclasses.replace(snapshot, processes=processes)
