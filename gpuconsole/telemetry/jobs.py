"""Who each GPU process of this machine works for, and since when, for the sources that read it
in-process (NVML, nvidia-smi): the agent's own findings (`gpuconsole.telemetry.agent`:
`process_details` from /proc, `Owners` for the Slurm job, the Kubernetes pod, the Docker
container's name and the machine's Slurm node), so that a host read locally and one read through
its agent say the same."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpuconsole.core.model import GpuProcess, HostSnapshot, KubePod, SchedulerNode, SlurmJob
from gpuconsole.telemetry.agent import Owners, process_details


def job_from_row(job_id: int, row: Mapping[str, object] | None) -> SlurmJob:
    """A job as squeue's row describes it, or its id alone where squeue has not said."""
    known = row or {}
    texts = (known.get(f.name) for f in dataclasses.fields(SlurmJob)[1:])
    return SlurmJob(job_id, *(text if isinstance(text, str) else None for text in texts))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _texts(cls: type, found: Mapping[str, object]) -> dict[str, str | None]:
    """``found``'s texts for the fields of ``cls`` (a model class), None for the rest."""
    return {f.name: _text(found.get(f.name)) for f in dataclasses.fields(cls)}


def pod_from(found: object) -> KubePod | None:
    """A process's pod as the agent's `KubePods` found it."""
    return KubePod(**_texts(KubePod, found)) if isinstance(found, Mapping) else None


def node_from(found: object) -> SchedulerNode | None:
    """The machine's node as the agent's `SlurmNode` found it."""
    return SchedulerNode(**_texts(SchedulerNode, found)) if isinstance(found, Mapping) else None


class LocalOwners:
    """Attaches to each snapshot of this machine what the agent says of a host: each process's
    start, Slurm job, Kubernetes pod and container name, and the machine's Slurm node."""

    def __init__(self, owners: Owners | None = None) -> None:
        self._owners = owners or Owners()

    def attach(self, snapshot: HostSnapshot) -> HostSnapshot:
        """``snapshot`` with what this machine says of its processes and its node; where it
        says nothing of a process (one that has ended), the process keeps what it had."""
        details = [dict(process_details(p.pid), pid=p.pid) for p in snapshot.processes]
        owned = self._owners.reading(details)
        rows = {row["job_id"]: row for row in owned["jobs"]}
        processes = tuple(
            _owned(process, found, rows)
            for process, found in zip(snapshot.processes, details, strict=True)
        )
        return dataclasses.replace(snapshot, processes=processes, node=node_from(owned["node"]))


def _owned(process: GpuProcess, found: Mapping[str, object], rows: Mapping) -> GpuProcess:
    """``process`` with what the agent's functions found of it (``found``, a process entry as
    the agent sends it) and squeue's ``rows`` by job id."""
    job_id, started = found.get("slurm_job"), found.get("started")
    return dataclasses.replace(
        process,
        job=job_from_row(job_id, rows.get(job_id)) if isinstance(job_id, int) else process.job,
        pod=pod_from(found.get("pod")) or process.pod,
        container_name=_text(found.get("container_name")) or process.container_name,
        started=started if isinstance(started, float) else process.started,
    )
