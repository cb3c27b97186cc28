"""Host summaries, fleet ordering and filtering."""

from __future__ import annotations

import pytest
from conftest import EPOCH, NOW

from gpuconsole.core.model import GpuState, HostSnapshot, HostState, Severity
from gpuconsole.fleet.host_order import SORT_KEYS, host_matches, sort_hosts
from gpuconsole.fleet.store import FleetStore
from gpuconsole.rules.summary import short_model, summarize
from gpuconsole.telemetry.sim import SimRack, demo_rack

H100 = "NVIDIA H100 80GB HBM3"


def gpu(index: int, **fields: object) -> GpuState:
    return GpuState(index=index, name=H100, **fields)  # type: ignore[arg-type]


def snap(*gpus: GpuState, host: str = "n1") -> HostSnapshot:
    return HostSnapshot(host=host, time=1.0, gpus=gpus)


# --- summarize ------------------------------------------------------------------------------------


def test_summarize_aggregates_and_skips_a_lost_gpu() -> None:
    summary = summarize(
        snap(
            gpu(
                0,
                utilization_pct=50.0,
                memory_used_mib=1000.0,
                memory_total_mib=2000.0,
                temperature_c=60.0,
                power_w=100.0,
                power_limit_w=300.0,
            ),
            GpuState(index=1, name=H100, lost=True),
            gpu(
                2,
                utilization_pct=90.0,
                memory_used_mib=1500.0,
                memory_total_mib=2000.0,
                temperature_c=81.0,
                power_w=250.0,
                power_limit_w=300.0,
            ),
            gpu(
                3,
                utilization_pct=10.0,
                memory_used_mib=500.0,
                memory_total_mib=2000.0,
                temperature_c=70.0,
                power_w=150.0,
                power_limit_w=300.0,
            ),
        )
    )
    assert summary.gpu_count == 4
    assert summary.lost_gpus == 1
    assert summary.model == "H100 80GB HBM3"
    assert summary.utilization_mean == pytest.approx(50.0)  # (50 + 90 + 10) / 3, not / 4
    assert summary.utilization_max == 90.0
    assert summary.memory_used_mib == 3000.0
    assert summary.memory_total_mib == 6000.0
    assert summary.hottest_c == 81.0
    assert summary.hottest_gpu == 2
    assert summary.power_w == 500.0
    assert summary.power_limit_w == 900.0


def test_summarize_all_missing_gives_none_never_zero() -> None:
    summary = summarize(snap(*(GpuState(index=i, name=H100, lost=True) for i in range(3))))
    assert summary.gpu_count == 3
    assert summary.lost_gpus == 3
    assert summary.model == "H100 80GB HBM3"
    for field in (
        "utilization_mean",
        "utilization_max",
        "memory_used_mib",
        "memory_total_mib",
        "hottest_c",
        "hottest_gpu",
        "power_w",
        "power_limit_w",
    ):
        assert getattr(summary, field) is None, field


def test_summarize_a_real_zero_stays_zero() -> None:
    summary = summarize(snap(gpu(0, utilization_pct=0.0, power_w=0.0, memory_used_mib=0.0)))
    assert summary.utilization_mean == 0.0
    assert summary.utilization_max == 0.0
    assert summary.power_w == 0.0
    assert summary.memory_used_mib == 0.0
    assert summary.memory_total_mib is None  # not reported, so not 0


def test_summarize_empty_and_nameless_hosts() -> None:
    empty = summarize(snap())
    assert empty.gpu_count == 0
    assert empty.lost_gpus == 0
    assert empty.model is None
    assert empty.utilization_mean is None
    assert summarize(snap(GpuState(index=0, utilization_pct=5.0))).model is None


def test_summarize_model_is_the_most_common() -> None:
    summary = summarize(
        snap(
            GpuState(index=0, name="NVIDIA L40S"),
            GpuState(index=1, name="NVIDIA A100 80GB PCIe"),
            GpuState(index=2, name="NVIDIA L40S"),
        )
    )
    assert summary.model == "L40S"


def test_summarize_sim_host_with_a_lost_gpu(rack: SimRack) -> None:
    reading = rack.read("h100-01", NOW)  # GPU 3 fell off the bus
    summary = summarize(reading)
    alive = [g for g in reading.gpus if not g.lost]
    assert summary.gpu_count == 8
    assert summary.lost_gpus == 1
    assert len(alive) == 7
    assert summary.utilization_mean == pytest.approx(
        sum(g.utilization_pct for g in alive) / len(alive)
    )
    assert summary.memory_total_mib == 7 * 81559.0
    hottest = max(alive, key=lambda g: g.temperature_c)
    assert summary.hottest_c == hottest.temperature_c
    assert reading.gpu(summary.hottest_gpu).temperature_c == summary.hottest_c


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
        ("NVIDIA L40S", "L40S"),
        ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-16GB"),
        ("NVIDIA", "NVIDIA"),
        (None, None),
    ],
)
def test_short_model(name: str | None, short: str | None) -> None:
    assert short_model(name) == short


# --- sort_hosts -----------------------------------------------------------------------------------

GHOST = "ghost"  # never read
DARK = "dark-box"  # read, but every GPU lost: no metric at all
DOWN = "l40s-01"  # read once, then ten misses


@pytest.fixture(scope="module")
def readings() -> tuple[HostSnapshot, ...]:
    """The demo rack at NOW, read once per module (snapshots are immutable)."""
    rack = demo_rack(hosts=6, seed=7, epoch=EPOCH)
    return tuple(rack.read(host, NOW) for host in rack.hosts)


@pytest.fixture
def store(readings: tuple[HostSnapshot, ...]) -> FleetStore:
    store = FleetStore((*(r.host for r in readings), GHOST, DARK))
    for reading in readings:
        store.record(reading)
    store.record(snap(GpuState(index=0, lost=True), GpuState(index=1, lost=True), host=DARK))
    for _ in range(10):
        store.record_failure(DOWN, "no route to host")
    return store


def test_fixture_states(store: FleetStore) -> None:
    assert store.status(DOWN).state is HostState.DOWN
    assert store.status(GHOST).state is HostState.CONNECTING
    assert store.severity("h100-01") is Severity.CRITICAL
    assert store.severity("a100-01") is Severity.CRITICAL
    assert store.severity("a100-02") is None


@pytest.mark.parametrize("by", SORT_KEYS)
def test_every_sort_key_orders_every_host_once(store: FleetStore, by: str) -> None:
    hosts = list(reversed(store.hosts))
    ordered = sort_hosts(store, hosts, by)
    assert sorted(ordered) == sorted(hosts)


def test_worst_first_puts_down_host_first_and_healthy_last(store: FleetStore) -> None:
    ordered = sort_hosts(store, store.hosts, "worst")
    assert ordered[0] == DOWN
    assert set(ordered[1:4]) == {"h100-01", "a100-01", DARK}  # the critical live hosts
    assert ordered.index("h100-01") < ordered.index("a100-02")
    assert ordered.index("a100-01") < ordered.index("h100-02")
    ranks = [rank(store, h) for h in ordered]
    assert ranks == sorted(ranks, reverse=True)


def rank(store: FleetStore, host: str) -> int:
    severity = store.severity(host)
    return -1 if severity is None or severity < Severity.WARNING else int(severity)


def test_worst_first_ignores_info_findings_that_come_and_go(store: FleetStore) -> None:
    """A host whose worst is an info finding (a GPU at its power limit) sorts with the healthy
    ones, by name: otherwise a busy fleet's rows change places every tick."""
    calm = [
        h for h in store.hosts if store.status(h).state is HostState.LIVE and rank(store, h) < 0
    ]
    assert any(store.severity(h) is Severity.INFO for h in calm)
    assert any(store.severity(h) is None for h in calm)
    ordered = sort_hosts(store, store.hosts, "worst")
    assert [h for h in ordered if h in calm] == sorted(calm)


def test_worst_first_critical_before_healthy_regardless_of_name() -> None:
    store = FleetStore(["aaa-healthy", "zzz-critical"])
    store.record(snap(gpu(0, utilization_pct=50.0), host="aaa-healthy"))
    store.record(snap(GpuState(index=0, name=H100, lost=True), host="zzz-critical"))
    assert store.severity("zzz-critical") is Severity.CRITICAL
    assert sort_hosts(store, store.hosts, "worst") == ["zzz-critical", "aaa-healthy"]


def test_sort_by_name(store: FleetStore) -> None:
    assert sort_hosts(store, reversed(store.hosts), "name") == sorted(store.hosts)


@pytest.mark.parametrize(
    ("by", "field"),
    [
        ("utilization", "utilization_mean"),
        ("temperature", "hottest_c"),
        ("power", "power_w"),
        ("memory", "memory_used_mib"),
    ],
)
def test_metric_keys_highest_first_hosts_without_reading_last(
    store: FleetStore, by: str, field: str
) -> None:
    ordered = sort_hosts(store, reversed(store.hosts), by)
    assert ordered[-2:] == [DARK, GHOST]  # no value, ties broken by name
    values = [getattr(summarize(store.latest(h)), field) for h in ordered[:-2]]
    assert None not in values
    assert values == sorted(values, reverse=True)
    assert len(set(values)) > 1  # the order is not vacuous


def test_metric_sort_on_hand_built_hosts() -> None:
    store = FleetStore(["cool", "hot", "warm", "unread"])
    store.record(snap(gpu(0, temperature_c=40.0), host="cool"))
    store.record(snap(gpu(0, temperature_c=88.0), host="hot"))
    store.record(snap(gpu(0, temperature_c=65.0), gpu(1, temperature_c=30.0), host="warm"))
    assert sort_hosts(store, store.hosts, "temperature") == ["hot", "warm", "cool", "unread"]


def test_metric_sort_puts_an_idle_host_before_one_without_reading() -> None:
    store = FleetStore(["aaa-unread", "zzz-idle"])
    store.record(snap(gpu(0, utilization_pct=0.0, power_w=0.0), host="zzz-idle"))
    assert sort_hosts(store, store.hosts, "utilization") == ["zzz-idle", "aaa-unread"]
    assert sort_hosts(store, store.hosts, "power") == ["zzz-idle", "aaa-unread"]


# --- host_matches ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "text", "expected"),
    [
        ("h100-01", "h100", True),
        ("h100-01", "H100-01", True),
        ("a100-01", "h100", False),
        (DOWN, "DOWN", True),
        (DOWN, "down", True),
        ("a100-02", "Live", True),
        ("a100-02", "down", False),
        (GHOST, "connecting", True),
        ("a100-01", "a100 80gb pcie", True),  # GPU model
        ("h100-02", "hbm3", True),
        ("l40s-01", "l40s", True),
        ("a100-01", "THERMAL-THROTTLE", True),  # finding code
        ("a100-02", "thermal-throttle", False),
        ("h100-01", "GPU-LOST", True),
        (DOWN, "host-down", True),
        ("h100-02", "host-down", False),
        ("h100-01", "no-such-thing", False),
        (GHOST, "", True),
    ],
)
def test_host_matches(store: FleetStore, host: str, text: str, expected: bool) -> None:
    assert host_matches(store, host, text) is expected
