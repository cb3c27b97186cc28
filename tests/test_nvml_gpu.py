"""`NvmlSource` on a real NVIDIA GPU; skipped where NVML cannot be used (CI has no GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cli_runner import GPUCONSOLE, gpuconsole

from gpuconsole.core.model import PCIE_LINK_RANK, nvlink_count
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


def test_a_datacenter_gpu_gives_its_limits_and_its_pcie_traffic(source: NvmlSource) -> None:
    """A datacenter GPU (one with a serial number) gives its power range and default limit,
    application clocks, shutdown temperature and PCIe traffic; the H200 gives 200–700 W,
    default 700 W, 1980 and 3201 MHz, slowdown 89 °C and shutdown 95 °C."""
    gpus = [gpu for gpu in source.read(source.hosts[0]).gpus if gpu.serial]
    if not gpus:
        pytest.skip("no datacenter GPU here (none gives a serial number)")
    for gpu in gpus:
        low, high = gpu.power_limit_min_w, gpu.power_limit_max_w
        assert low is not None and high is not None and gpu.power_limit_default_w is not None
        assert low <= gpu.power_limit_default_w <= high
        assert gpu.power_limit_w is not None and low <= gpu.power_limit_w <= high
        sm, memory = gpu.sm_clock_application_mhz, gpu.memory_clock_application_mhz
        assert sm is not None and gpu.sm_clock_max_mhz is not None and sm <= gpu.sm_clock_max_mhz
        assert memory is not None and gpu.memory_clock_max_mhz is not None
        assert memory <= gpu.memory_clock_max_mhz
        shutdown, slowdown = gpu.shutdown_temperature_c, gpu.slowdown_temperature_c
        assert shutdown is not None and slowdown is not None and slowdown < shutdown
        assert gpu.pcie_tx_kib_s is not None and gpu.pcie_rx_kib_s is not None


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


HOSTILE_CUDA_JOB = (  # one short line, so the hostile arguments after it fit on the screen
    "import sys,torch;b=torch.empty(2**28,dtype=torch.uint8,device='cuda');"
    "torch.cuda.synchronize();print('ready',flush=True);sys.stdin.read()"
)


def test_a_hostile_cuda_job_reaches_no_terminal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real CUDA process on the GPU whose command line holds an OSC 52, a title, a screen
    clear and a forged line: the console's snapshot (text and JSON) and its screen show it as
    visible text, and the GPU's own reading has no bad value."""
    import json
    import os

    from hostile import (
        HOSTILE_ARGV,
        foreign_sequences,
        plain_output_faults,
        run_in_pty,
        unsafe_texts,
    )

    job = subprocess.Popen(
        [sys.executable, "-c", HOSTILE_CUDA_JOB, *HOSTILE_ARGV],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout is not None
        status = job.stdout.readline().strip()
        if status != "ready":
            pytest.skip(f"torch cannot use CUDA here ({status or 'no answer'})")
        env = {**os.environ, "LANG": "C.UTF-8", "TERM": "xterm-256color"}
        env.update({v: str(tmp_path / v.lower()) for v in ("XDG_STATE_HOME", "XDG_DATA_HOME")})
        text = gpuconsole("snapshot", env=env)
        assert plain_output_faults(text.stdout + text.stderr) == []
        (line,) = [line for line in text.stdout.splitlines() if f"pid {job.pid} " in line]
        assert "␛]52;c;" in line and "forged line" in line
        data = json.loads(gpuconsole("snapshot", "--json", env=env).stdout)
        assert unsafe_texts(data) == [] and data["bad_values"] == 0
        keys = [(6.0, b"\r"), (8.0, b"\t"), (10.0, b"q")]
        output, _ = run_in_pty(list(GPUCONSOLE), env, keys, size=(300, 40))
        assert foreign_sequences(output) == []
        assert "hostile-job ␛]52;c;SE9TVElMRQ==␛\\".encode() in output  # shown, as text
    finally:
        job.kill()
        job.wait(timeout=30)
