"""Simulated faults written as `nvidia-smi -q -x` dumps, read back and triaged.

Each fault is set on a host of the demo rack that has none of its own, the host is read well after
the fault began, the reading is written with `dump_xml` and parsed with `parse_xml` as a saved
dump would be, and the health rules must find the fault in what was parsed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from gpuconsole.core.model import GpuProcess, GpuState, HostSnapshot, RowRemap
from gpuconsole.rules import health
from gpuconsole.telemetry.sim import DEFAULT_EPOCH, FAULTS, SimRack, demo_rack
from gpuconsole.telemetry.smi import parse_xml
from gpuconsole.telemetry.smi_xml import dump_xml

HOST = "h100-02"  # no demo fault of its own
LATER = DEFAULT_EPOCH + 600.0
NOT_IN_XML = {"mig_instances"}
"""GpuState fields that `nvidia-smi -q -x` does not carry (MIG instances are not dumped)."""
DUMPLESS = {"host-unresponsive"}  # a host that does not answer leaves no dump


@pytest.fixture
def rack() -> SimRack:
    return demo_rack(hosts=6, seed=7)


def through_xml(snapshot: HostSnapshot) -> HostSnapshot:
    return parse_xml(dump_xml(snapshot), snapshot.host, snapshot.time)


def codes_on(snapshot: HostSnapshot, gpu: int, previous: Sequence[HostSnapshot] = ()) -> set[str]:
    findings = health.evaluate(snapshot, previous)
    return {f.code for f in findings if f.gpu == gpu}


def busy_gpu(rack: SimRack, t: float) -> int:
    """A GPU of HOST that is busy at ``t`` and a minute before (so a hot one has heated up)."""
    before, now = rack.read(HOST, t - 60.0), rack.read(HOST, t)
    return next(
        g.index
        for g in now.gpus
        if (g.utilization_pct or 0) > 50 and (before.gpus[g.index].utilization_pct or 0) > 50
    )


def test_every_dumpable_fault_is_covered() -> None:
    covered = {
        "xid-79",
        "ecc-uncorrectable",
        "thermal-throttle",
        "pcie-degraded",
        "memory-leak",
        "stuck-process",
    }
    assert set(FAULTS) - DUMPLESS == covered


def test_xid_79_dump_shows_the_lost_gpu(rack: SimRack) -> None:
    rack.set_fault(HOST, "xid-79", 3)
    parsed = through_xml(rack.read(HOST, LATER))
    assert parsed.gpus[3].lost
    assert parsed.processes_on(3) == ()
    assert "gpu-lost" in codes_on(parsed, 3)


def test_ecc_dump_shows_the_error_and_the_pending_remap(rack: SimRack) -> None:
    rack.set_fault(HOST, "ecc-uncorrectable", 6)
    parsed = through_xml(rack.read(HOST, LATER))
    assert {"ecc-uncorrectable", "row-remap-pending"} <= codes_on(parsed, 6)


def test_thermal_dump_shows_the_slowdown(rack: SimRack) -> None:
    gpu = busy_gpu(rack, LATER)
    rack.set_fault(HOST, "thermal-throttle", gpu)
    parsed = through_xml(rack.read(HOST, LATER))
    thermal = {"thermal-throttle", "thermal-slowdown"} & set(health.RULES)
    assert thermal, "health has no thermal rule under either name"
    assert thermal & codes_on(parsed, gpu)


def test_pcie_dump_shows_the_degraded_link(rack: SimRack) -> None:
    gpu = busy_gpu(rack, LATER)
    rack.set_fault(HOST, "pcie-degraded", gpu)
    parsed = through_xml(rack.read(HOST, LATER))
    link = parsed.gpus[gpu].pcie
    assert link is not None and (link.width, link.max_width) == (8, 16)  # half its width
    assert "pcie-degraded" in codes_on(parsed, gpu)


def test_memory_leak_dumps_grow_until_memory_is_nearly_full(rack: SimRack) -> None:
    rack.set_fault(HOST, "memory-leak", 4)
    readings = [through_xml(rack.read(HOST, LATER + s)) for s in range(0, 120, 5)]
    full = next(r for r in readings if (r.gpus[4].memory_fraction or 0) >= 0.8)
    earlier = readings[readings.index(full) - 1]
    assert (earlier.gpus[4].memory_used_mib or 0.0) < (full.gpus[4].memory_used_mib or 0.0)
    assert "mem-pressure" in codes_on(full, 4)


def test_stuck_process_dump_shows_an_idle_gpu_holding_memory(rack: SimRack) -> None:
    rack.set_fault(HOST, "stuck-process", 5)
    before = through_xml(rack.read(HOST, LATER - 90.0))
    parsed = through_xml(rack.read(HOST, LATER))
    gpu = parsed.gpus[5]
    (process,) = parsed.processes_on(5)
    assert gpu.utilization_pct == 0.0
    assert gpu.memory_total_mib and (process.used_memory_mib or 0.0) > 0.5 * gpu.memory_total_mib
    assert process.command and "ipykernel_launcher" in process.command
    # idle-memory-held needs history: two dumps 90 s apart give it.
    assert "idle-memory-held" in codes_on(parsed, 5, [before])


# --- round trip ----------------------------------------------------------------------------------


def assert_round_trip(snapshot: HostSnapshot) -> None:
    parsed = through_xml(snapshot)
    assert len(parsed.gpus) == len(snapshot.gpus)
    for original, read in zip(snapshot.gpus, parsed.gpus, strict=True):
        for field in dataclasses.fields(original):
            if field.name not in NOT_IN_XML:
                expected = getattr(original, field.name)
                got = getattr(read, field.name)
                assert got == expected, (
                    f"GPU {original.index} {field.name}: {got!r} != {expected!r}"
                )
    assert parsed.processes == tuple(map(without_user, snapshot.processes))
    assert (parsed.driver_version, parsed.cuda_version) == (
        snapshot.driver_version,
        snapshot.cuda_version,
    )


def without_user(process: GpuProcess) -> GpuProcess:
    """What nvidia-smi's XML keeps of a process: pid, type, name, memory; no owner, start, load."""
    return dataclasses.replace(
        process,
        user=None,
        container=None,
        job=None,
        pod=None,
        container_name=None,
        started=None,
        load=None,
    )


@pytest.mark.parametrize("host", demo_rack(hosts=6, seed=7).hosts)
def test_round_trip_of_every_demo_host(rack: SimRack, host: str) -> None:
    """Includes the demo's own faults: a100-01's hot GPU and h100-01's lost one."""
    assert_round_trip(rack.read(host, LATER))


def test_round_trip_of_faulty_readings(rack: SimRack) -> None:
    for fault, gpu in (("ecc-uncorrectable", 1), ("pcie-degraded", 2), ("stuck-process", 3)):
        rack.set_fault(HOST, fault, gpu)
    assert_round_trip(rack.read(HOST, LATER))


def test_round_trip_of_what_the_sim_never_varies() -> None:
    """None stays None; a fan, a graphics process, MIG ids, a remap failure, odd decimals."""
    bare = GpuState(index=0)
    rich = GpuState(
        index=1,
        name="NVIDIA L40S",
        fan_pct=38.0,
        temperature_c=71.5,
        slowdown_temperature_c=90.0,
        power_w=123.456,
        throttle_reasons=("hw-slowdown", "hw-power-brake"),
        remap=RowRemap(correctable=2, uncorrectable=600, pending=False, failure=True),
        recovery_action="drain-and-reset",
        mig_mode=True,
    )
    processes = (
        GpuProcess(pid=4242, gpu=1, used_memory_mib=None, command="Xorg", kind="graphics"),
        GpuProcess(pid=77, gpu=1, used_memory_mib=4864.0, command=None, mig_instance=2),
    )
    assert_round_trip(HostSnapshot("lab", 1.0, (bare, rich), processes))
