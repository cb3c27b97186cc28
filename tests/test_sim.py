"""The simulated hosts: determinism, hardware-true topologies, workload dynamics and faults."""

from __future__ import annotations

import re

import pytest

from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import GpuState, HostSnapshot, XidEvent
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.sim import (
    DEFAULT_EPOCH,
    FAULTS,
    PROFILES,
    ActiveFault,
    HostUnreachable,
    SimRack,
    SimSource,
    demo_rack,
)

E = DEFAULT_EPOCH
HOSTS = {"h100-01": "h100-sxm-8", "a100-01": "a100-pcie-8", "l40s-01": "l40s-4"}


def make_rack(seed: int = 3) -> SimRack:
    return SimRack(HOSTS, seed=seed)


def gpu(rack: SimRack, host: str, index: int, t: float) -> GpuState:
    state = rack.read(host, t).gpu(index)
    assert state is not None
    return state


def busy_gpu(rack: SimRack, host: str, t: float) -> int:
    """A GPU running a job (not in an eval dip) at ``t``."""
    busy = [g.index for g in rack.read(host, t).gpus if (g.utilization_pct or 0) >= 80]
    assert busy, f"no busy GPU on {host} at {t}"
    return busy[0]


def readings(rack: SimRack, host: str, start: int, stop: int) -> list[HostSnapshot]:
    return [rack.read(host, E + s) for s in range(start, stop)]


@pytest.fixture(scope="module")
def h100_history() -> list[HostSnapshot]:
    """25 minutes of a healthy H100 host, one reading a second (read once: it is shared)."""
    return readings(make_rack(), "h100-01", 0, 1500)


# --- determinism ---------------------------------------------------------------------------------


def test_same_seed_epoch_and_time_give_equal_snapshots() -> None:
    a, b = make_rack(), make_rack()
    for host in HOSTS:
        assert a.read(host, E + 900.5) == b.read(host, E + 900.5)


def test_a_different_seed_gives_different_readings() -> None:
    def powers(rack: SimRack) -> list[float | None]:
        return [g.power_w for host in HOSTS for g in rack.read(host, E + 900).gpus]

    assert powers(make_rack(3)) != powers(make_rack(4))


def test_reading_forward_or_back_equals_a_fresh_read() -> None:
    stepped, fresh = make_rack(), make_rack()
    stepped.read("h100-01", E + 590)
    assert stepped.read("h100-01", E + 600) == fresh.read("h100-01", E + 600)
    assert stepped.read("h100-01", E + 300) == make_rack().read("h100-01", E + 300)


def test_a_reading_shows_the_step_of_its_time() -> None:
    rack = make_rack()
    early, late = rack.read("a100-01", E + 42.1), rack.read("a100-01", E + 42.9)
    assert (early.time, late.time) == (E + 42.1, E + 42.9)
    assert early.gpus == late.gpus


def test_reading_before_the_epoch_is_refused() -> None:
    with pytest.raises(ValueError, match="before"):
        make_rack().read("h100-01", E - 1)


# --- what a reading holds ------------------------------------------------------------------------


def test_snapshot_conventions() -> None:
    rack = make_rack()
    snap = rack.read("h100-01", E + 60)
    assert (snap.host, snap.source) == ("h100-01", "sim")
    assert snap.driver_version == "570.133.20" and snap.cuda_version == "12.8"
    assert snap.topology == PROFILES["h100-sxm-8"].topology
    assert [g.index for g in snap.gpus] == list(range(8))
    assert {g.name for g in snap.gpus} == {"NVIDIA H100 80GB HBM3"}
    uuid = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    assert all(uuid.match(g.uuid or "") for g in snap.gpus)
    assert len({g.uuid for g in snap.gpus}) == 8
    assert len({g.pci_bus_id for g in snap.gpus}) == 8
    for g in snap.gpus:
        assert (g.persistence_mode, g.compute_mode, g.mig_mode) == (True, "Default", False)
        assert g.memory_total_mib == 81559 and g.power_limit_w == 700
        assert g.recovery_action == "none" and g.ecc is not None and g.remap is not None
        assert g.ecc.volatile_uncorrected == 0 and g.remap.pending is False


def test_uuids_are_stable_across_time_and_racks() -> None:
    first = [g.uuid for g in make_rack().read("l40s-01", E).gpus]
    assert first == [g.uuid for g in make_rack().read("l40s-01", E + 777).gpus]


def test_missing_fields_are_none_not_zero() -> None:
    rack = make_rack()
    for host in HOSTS:
        assert all(g.fan_pct is None for g in rack.read(host, E + 10).gpus)
    # L40S has GDDR6, not HBM: no row remapping to report.
    assert all(g.remap is None for g in rack.read("l40s-01", E + 10).gpus)


def test_bus_ids_sit_on_the_socket_of_their_numa_node() -> None:
    for key in ("h100-sxm-8", "a100-pcie-8"):
        profile = PROFILES[key]
        for bus_id, numa in zip(profile.pci_bus_ids, profile.topology.numa_affinity, strict=True):
            bus = int(bus_id.split(":")[1], 16)
            assert (bus >= 0x80) == (numa == 1), (key, bus_id)


def test_idle_and_busy_gpus_look_the_part(h100_history: list[HostSnapshot]) -> None:
    seen_idle = seen_busy = False
    for snap in h100_history[::10]:
        for g in snap.gpus:
            assert g.pcie is not None and g.pcie.width == g.pcie.max_width == 16
            procs = snap.processes_on(g.index)
            if g.utilization_pct == 0:
                seen_idle = True
                assert (g.pstate, g.pcie.gen, g.throttle_reasons) == ("P8", 1, ("gpu-idle",))
                assert procs == () and g.memory_used_mib == 0
                assert g.power_w is not None and 55 <= g.power_w <= 90
            elif (g.utilization_pct or 0) >= 85:
                seen_busy = True
                assert (g.pstate, g.pcie.gen) == ("P0", 5)
                assert len(procs) == 1 and (procs[0].used_memory_mib or 0) > 1000
                assert g.power_w is not None and g.power_w > 400
                assert g.memory_used_mib == procs[0].used_memory_mib + 9
    assert seen_idle and seen_busy


def test_power_capped_gpus_say_so_and_clock_down(h100_history: list[HostSnapshot]) -> None:
    capped = [
        g
        for snap in h100_history[::5]
        for g in snap.gpus
        if "sw-power-cap" in (g.throttle_reasons or ())
    ]
    assert capped
    for g in capped:
        assert g.power_w is not None and g.power_w >= 0.98 * 700
        assert g.sm_clock_mhz is not None and g.sm_clock_mhz < 1980


def test_a_multi_gpu_job_has_one_process_per_gpu() -> None:
    snap = make_rack().read("h100-01", E + 300)
    by_command: dict[str, list[int]] = {}
    for p in snap.processes:
        by_command.setdefault(p.command or "", []).append(p.pid)
    gangs = [pids for command, pids in by_command.items() if command.startswith("python3 -u ")]
    assert gangs and all(len(pids) > 1 and len(set(pids)) == len(pids) for pids in gangs)
    assert all(p.user for p in snap.processes)


def test_job_memory_ramps_up_when_a_job_starts(h100_history: list[HostSnapshot]) -> None:
    for i in range(1, len(h100_history) - 5):
        for g in h100_history[i].gpus:
            if h100_history[i - 1].gpus[g.index].memory_used_mib == 0 and g.memory_used_mib:
                later = h100_history[i + 5].gpus[g.index].memory_used_mib or 0
                assert 0 < g.memory_used_mib < later
                return
    pytest.fail("no job started on h100-01 in 25 minutes")


def test_temperature_lags_power(h100_history: list[HostSnapshot]) -> None:
    history = h100_history
    for i in range(1, len(history) - 30):
        for g in history[i].gpus:
            before = history[i - 1].gpus[g.index]
            if (before.power_w or 0) < 100 and (g.power_w or 0) > 500:
                temps = [history[i + k].gpus[g.index].temperature_c or 0 for k in range(30)]
                rise = temps[-1] - (before.temperature_c or 0)
                assert rise >= 15  # it does get much hotter...
                assert temps[0] - (before.temperature_c or 0) <= 3  # ...but not at once
                assert temps[5] < temps[15] < temps[29]
                return
    pytest.fail("no load step on h100-01 in 25 minutes")


# --- topologies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(PROFILES))
def test_topology_shape(key: str) -> None:
    profile = PROFILES[key]
    topo = profile.topology
    n = profile.gpu_count
    assert topo.gpu_count == n == len(profile.pci_bus_ids)
    assert len(topo.cpu_affinity) == len(topo.numa_affinity) == n
    for a in range(n):
        assert len(topo.matrix[a]) == n and topo.link(a, a) == "X"
        for b in range(n):
            assert topo.link(a, b) == topo.link(b, a)


def test_h100_gpus_all_meet_on_nvswitch() -> None:
    topo = PROFILES["h100-sxm-8"].topology
    assert {topo.link(a, b) for a in range(8) for b in range(8) if a != b} == {"NV18"}
    assert topo.numa_affinity == (0, 0, 0, 0, 1, 1, 1, 1)
    assert topo.cpu_affinity[0] == "0-55,112-167" and topo.cpu_affinity[7] == "56-111,168-223"


def test_a100_pairs_are_bridged_and_the_rest_is_pcie() -> None:
    topo = PROFILES["a100-pcie-8"].topology
    for a, b in ((0, 1), (2, 3), (4, 5), (6, 7)):
        assert topo.link(a, b) == "NV12"
    assert (topo.link(0, 2), topo.link(0, 3), topo.link(0, 4)) == ("PIX", "NODE", "SYS")
    links = {topo.link(a, b) for a in range(8) for b in range(8) if a != b}
    assert links == {"NV12", "PIX", "NODE", "SYS"}
    assert all(topo.link(a, b) == "SYS" for a in range(4) for b in range(4, 8))
    assert topo.best_sets(2, limit=1)[0][1] == "NV12"


def test_l40s_has_no_nvlink() -> None:
    topo = PROFILES["l40s-4"].topology
    assert (topo.link(0, 1), topo.link(2, 3), topo.link(1, 2)) == ("PIX", "PIX", "NODE")
    assert not any(cell.startswith("NV") for row in topo.matrix for cell in row)


# --- faults --------------------------------------------------------------------------------------


def test_thermal_throttle_runs_hot_and_slow() -> None:
    rack = make_rack()
    index = busy_gpu(rack, "a100-01", E + 400)
    rack.set_fault("a100-01", "thermal-throttle", index)
    g = gpu(rack, "a100-01", index, E + 400)
    assert g.temperature_c is not None and g.slowdown_temperature_c is not None
    assert g.slowdown_temperature_c < g.temperature_c <= 92
    assert {"hw-thermal", "sw-thermal"} <= set(g.throttle_reasons or ())
    assert g.sm_clock_mhz is not None and g.sm_clock_max_mhz is not None
    assert g.sm_clock_mhz < 0.8 * g.sm_clock_max_mhz
    assert ActiveFault("thermal-throttle", index, E) in rack.faults("a100-01")


def test_clearing_a_fault_restores_the_healthy_reading() -> None:
    rack, healthy = make_rack(), make_rack()
    rack.set_fault("a100-01", "thermal-throttle", 1)
    rack.read("a100-01", E + 400)
    rack.clear_fault("a100-01", "thermal-throttle", 1)
    assert rack.faults("a100-01") == ()
    assert rack.read("a100-01", E + 400) == healthy.read("a100-01", E + 400)


def test_xid_79_loses_the_gpu_from_since_on() -> None:
    rack = make_rack()
    index = busy_gpu(rack, "h100-01", E + 200)
    since = E + 200
    rack.set_fault("h100-01", "xid-79", index, since=since)
    before = rack.read("h100-01", since - 1)
    assert not before.gpus[index].lost and before.processes_on(index)
    assert before.xid_events == ()
    event = XidEvent(79, index, since, "GPU has fallen off the bus.")
    for t in (since, since + 1, since + 600):
        snap = rack.read("h100-01", t)
        lost = snap.gpus[index]
        assert lost.lost and lost.name == before.gpus[index].name
        assert lost.uuid == before.gpus[index].uuid
        assert lost.pci_bus_id == before.gpus[index].pci_bus_id
        assert lost.utilization_pct is None and lost.temperature_c is None
        assert lost.power_w is None and lost.memory_used_mib is None and lost.pcie is None
        assert lost.memory_fraction is None
        assert snap.processes_on(index) == ()
        assert event in snap.xid_events


def test_xid_79_crashes_the_job_that_spanned_the_lost_gpu() -> None:
    rack = make_rack()
    snap = rack.read("h100-01", E + 200)
    index = busy_gpu(rack, "h100-01", E + 200)
    command = snap.processes_on(index)[0].command
    peers = [p.gpu for p in snap.processes if p.command == command and p.gpu != index]
    rack.set_fault("h100-01", "xid-79", index, since=E + 200)
    after = rack.read("h100-01", E + 205)
    assert all(not after.processes_on(peer) for peer in peers)


def test_ecc_uncorrectable_needs_a_reset() -> None:
    rack = make_rack()
    rack.set_fault("a100-01", "ecc-uncorrectable", 5, since=E + 100)
    assert gpu(rack, "a100-01", 5, E + 99).recovery_action == "none"
    snap = rack.read("a100-01", E + 130)
    g = snap.gpus[5]
    assert g.ecc is not None and g.remap is not None
    assert g.ecc.volatile_uncorrected >= 1 and g.ecc.aggregate_uncorrected >= 1
    assert g.remap.uncorrectable >= 1 and g.remap.pending is True
    assert g.recovery_action == "reset"
    assert {e.xid for e in snap.xid_events if e.gpu == 5 and e.time == E + 100} >= {48}
    assert all(other.recovery_action == "none" for other in snap.gpus if other.index != 5)


def test_pcie_degraded_trains_below_max_even_under_load() -> None:
    rack = make_rack()
    index = busy_gpu(rack, "h100-01", E + 300)
    rack.set_fault("h100-01", "pcie-degraded", index)
    g = gpu(rack, "h100-01", index, E + 300)
    assert g.pcie is not None and g.pcie.degraded_width
    assert (g.pcie.width, g.pcie.max_width) == (8, 16)
    healthy = [o.pcie for o in rack.read("h100-01", E + 300).gpus if o.index != index]
    assert not any(p is not None and p.degraded_width for p in healthy)


def test_host_unresponsive_raises_a_source_error_naming_the_host() -> None:
    rack = make_rack()
    rack.set_fault("l40s-01", "host-unresponsive", since=E + 50)
    rack.read("l40s-01", E + 49)
    with pytest.raises(HostUnreachable, match=r"^l40s-01: no answer within 2 s$"):
        rack.read("l40s-01", E + 50)
    assert issubclass(HostUnreachable, SourceError)
    rack.read("h100-01", E + 50)  # other hosts still answer


def test_memory_leak_grows_until_oom_then_restarts() -> None:
    rack = make_rack()
    rack.set_fault("h100-01", "memory-leak", 2, since=E + 100)
    history = readings(rack, "h100-01", 100, 400)
    used = [s.gpus[2].memory_used_mib or 0.0 for s in history]
    pids = [tuple(p.pid for p in s.processes_on(2)) for s in history]
    assert all(len(p) <= 1 for p in pids)
    assert used[30] - used[0] >= 30 * 512  # at least 0.5 GiB/s
    drop = next(i for i in range(1, len(used)) if used[i] < used[i - 1])
    assert used[drop - 1] <= 81559 and used[drop - 1] > 0.9 * 81559
    assert pids[drop] == ()  # killed out of memory
    restart = next(i for i in range(drop, len(pids)) if pids[i])
    assert pids[restart] != pids[0]
    assert used[restart + 10] > used[restart]  # leaking again


def test_stuck_process_holds_memory_on_an_idle_gpu() -> None:
    rack = make_rack()
    rack.set_fault("l40s-01", "stuck-process", 3)
    for t in (E + 10, E + 500, E + 1000):
        snap = rack.read("l40s-01", t)
        g = snap.gpus[3]
        (proc,) = snap.processes_on(3)
        assert (g.utilization_pct, g.pstate) == (0.0, "P8")
        assert proc.user == "carol" and "kernel" in (proc.command or "")
        assert proc.used_memory_mib is not None and proc.used_memory_mib >= 0.5 * 46068
        assert g.memory_fraction is not None and g.memory_fraction >= 0.5


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: SimRack({"x": "tpu-v5"}), "tpu-v5"),
        (lambda: make_rack().set_fault("h100-01", "gpu-on-fire", 0), "gpu-on-fire"),
        (lambda: make_rack().set_fault("l40s-01", "xid-79", 4), "4"),
        (lambda: make_rack().set_fault("h100-01", "xid-79"), "xid-79"),
        (lambda: make_rack().set_fault("h100-99", "xid-79", 0), "h100-99"),
        (lambda: make_rack().set_fault("h100-01", "host-unresponsive", 1), "host-unresponsive"),
        (lambda: make_rack().clear_fault("h100-01", "gpu-on-fire", 0), "gpu-on-fire"),
        (lambda: make_rack().read("nope", E), "nope"),
    ],
)
def test_unknown_names_raise_value_error_naming_them(call, name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(name)) as info:
        call()
    assert "\n" not in str(info.value)


def test_fault_catalog() -> None:
    assert set(FAULTS) == {
        "thermal-throttle",
        "xid-79",
        "ecc-uncorrectable",
        "pcie-degraded",
        "host-unresponsive",
        "memory-leak",
        "stuck-process",
    }
    assert all(text and "\n" not in text for text in FAULTS.values())


# --- source and demo -----------------------------------------------------------------------------


def test_source_reads_at_its_clock_and_backfills_the_last_seconds() -> None:
    rack = make_rack()
    clock = ManualClock(E + 100.5)
    source = SimSource(rack, clock)
    assert source.hosts == tuple(HOSTS) and source.rack is rack
    assert source.read("a100-01") == make_rack().read("a100-01", E + 100.5)
    history = source.backfill("a100-01", 60)
    assert [s.time for s in history] == [E + 41.5 + i for i in range(60)]
    assert history[-1] == source.read("a100-01")
    assert source.backfill("a100-01", 500)[0].time == E + 0.5  # never before the epoch


def test_backfill_skips_readings_while_the_host_was_down() -> None:
    rack = make_rack()
    rack.set_fault("h100-01", "host-unresponsive", since=E + 90)
    source = SimSource(rack, ManualClock(E + 100))
    assert [s.time for s in source.backfill("h100-01", 20)] == [E + 81 + i for i in range(9)]


def test_demo_rack_default() -> None:
    rack = demo_rack()
    assert rack.hosts == ("h100-01", "h100-02", "h100-03", "a100-01", "a100-02", "l40s-01")
    assert rack.faults("a100-01") and rack.faults("h100-01")
    lost_at = rack.faults("h100-01")[0].since
    assert lost_at > rack.epoch  # the history shows it happen
    assert not rack.read("h100-01", lost_at - 1).gpus[3].lost
    assert rack.read("h100-01", lost_at).gpus[3].lost


def test_demo_rack_of_64_hosts() -> None:
    rack = demo_rack(64)
    assert len(rack.hosts) == len(set(rack.hosts)) == 64
    faulty = [h for h in rack.hosts if rack.faults(h)]
    assert len(faulty) >= 5
    assert {rack.profile(h).name for h in rack.hosts} == set(PROFILES)
    assert demo_rack(64).read("l40s-02", E + 30) == rack.read("l40s-02", E + 30)
