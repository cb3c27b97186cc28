"""`NvmlSource` on a real NVIDIA GPU; skipped where NVML cannot be used (CI has no GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gpuconsole.model import PCIE_LINK_RANK, nvlink_count
from gpuconsole.telemetry.nvml import NvmlSource, nvml_unavailable_reason

REASON = nvml_unavailable_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(REASON is not None, reason=f"no usable NVIDIA GPU: {REASON}"),
]

HOLD_GIB = """
import sys, torch
if not torch.cuda.is_available():
    print("no-cuda", flush=True)
    sys.exit(0)
block = torch.empty(2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def source() -> Iterator[NvmlSource]:
    nvml = NvmlSource()
    yield nvml
    nvml.close()


def test_a_reading_has_every_gpu_with_its_basics(source: NvmlSource) -> None:
    snapshot = source.read(source.hosts[0])
    assert snapshot.source == "nvml"
    assert snapshot.driver_version and snapshot.cuda_version
    assert snapshot.gpus
    for gpu in snapshot.gpus:
        assert not gpu.lost
        assert gpu.name and gpu.uuid and gpu.uuid.startswith("GPU-")
        assert gpu.pci_bus_id
        assert gpu.memory_total_mib and gpu.memory_total_mib > 0
        assert gpu.temperature_c is not None
        assert gpu.power_limit_w is not None
        assert gpu.pstate and gpu.pstate.startswith("P")


def test_a_real_reading_has_no_bad_values(source: NvmlSource) -> None:
    for _ in range(5):
        snapshot = source.read(source.hosts[0])
        assert snapshot.bad_values == 0, snapshot.bad_value_notes


def test_topology_is_square_with_self_on_the_diagonal(source: NvmlSource) -> None:
    snapshot = source.read(source.hosts[0])
    topology = snapshot.topology
    assert topology is not None
    count = len(snapshot.gpus)
    assert len(topology.matrix) == count
    known = set(PCIE_LINK_RANK) | {"X"}
    for a, row in enumerate(topology.matrix):
        assert len(row) == count
        assert row[a] == "X"
        assert all(cell in known or nvlink_count(cell) for cell in row), row
    assert len(topology.cpu_affinity) == len(topology.numa_affinity) == count


def test_reading_twice(source: NvmlSource) -> None:
    first = source.read(source.hosts[0])
    second = source.read(source.hosts[0])
    assert second.time >= first.time
    assert [g.uuid for g in second.gpus] == [g.uuid for g in first.gpus]
    assert second.topology == first.topology


def test_a_process_holding_memory_shows_with_its_pid(source: NvmlSource) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_GIB],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        status = holder.stdout.readline().strip()
        if status != "ready":
            pytest.skip(f"torch cannot use CUDA here ({status or 'no answer'})")
        snapshot = source.read(source.hosts[0])
        mine = [p for p in snapshot.processes if p.pid == holder.pid]
        assert mine, f"pid {holder.pid} not among {[p.pid for p in snapshot.processes]}"
        assert mine[0].used_memory_mib is not None and mine[0].used_memory_mib >= 1000
        assert mine[0].command and "python" in mine[0].command
        assert mine[0].user
        # The boundary's ranges refuse the impossible only: a real GPU under load passes whole.
        assert snapshot.bad_values == 0, snapshot.bad_value_notes
    finally:
        holder.kill()
        holder.wait(timeout=30)
