"""`gpuconsole snapshot`'s text: whose work each process is, its load, and the host's node."""

from __future__ import annotations

from conftest import NOW

from gpuconsole.cli.output import snapshot_text
from gpuconsole.core.model import (
    GpuProcess,
    GpuState,
    HostSnapshot,
    KubePod,
    ProcessLoad,
    SchedulerNode,
    SlurmJob,
)

JOB = SlurmJob(41327, "llama-ft", "alice", "gpu", None, None, "RUNNING")
POD = KubePod("5f1c2e9a-7b3d-4c8e-9a61-2d4f8b0c7e13", "infer", "llama-13b-7d9f5", "server")


def text_of(*processes: GpuProcess, node: SchedulerNode | None = None) -> list[str]:
    snapshot = HostSnapshot("gpu-07", NOW, (GpuState(0),), processes, node=node)
    return snapshot_text(snapshot).splitlines()[2:]


def test_each_process_says_its_load_and_whose_it_is() -> None:
    lines = text_of(
        GpuProcess(4101, 0, 40960.0, "alice", "python3 train.py", job=JOB, load=ProcessLoad(87.0)),
        GpuProcess(5202, 0, 2048.0, "root", "python3 serve.py", pod=POD, load=ProcessLoad(None)),
        GpuProcess(6303, 0, None, None, None),
    )
    assert lines == [
        "  pid 4101 on GPU 0: 40 GiB alice, SM 87%, job 41327 (alice, llama-ft): python3 train.py",
        "  pid 5202 on GPU 0: 2.0 GiB root, SM N/A, pod infer/llama-13b-7d9f5 (server): "
        "python3 serve.py",
        "  pid 6303 on GPU 0: N/A N/A",
    ]


def test_the_host_s_node_is_said_with_its_drain_reason() -> None:
    drained = SchedulerNode("slurm", "gpu-07", "IDLE+DRAIN", "bad GPU 3")
    assert text_of(node=drained) == ["  slurm node gpu-07: drained (reason: bad GPU 3)"]
    assert text_of(node=SchedulerNode("slurm", "gpu-07", "MIXED")) == ["  slurm node gpu-07: mixed"]
    assert text_of() == []
