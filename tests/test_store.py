"""FleetStore: history, stream state (live → stale → down), findings and series."""

from __future__ import annotations

from conftest import EPOCH, NOW
from hypothesis import given
from hypothesis import strategies as st

from gpuconsole.core.model import GpuState, HostSnapshot, HostState, Severity
from gpuconsole.fleet.store import FleetStore
from gpuconsole.telemetry.sim import SimRack

HOST = "node1"


def snap(time: float, *utils: float | None, host: str = HOST) -> HostSnapshot:
    """A hand-built snapshot: one GPU per utilization given (None: a lost GPU)."""
    gpus = tuple(
        GpuState(index=i, lost=True)
        if util is None
        else GpuState(index=i, utilization_pct=util, temperature_c=40.0 + i)
        for i, util in enumerate(utils or (50.0,))
    )
    return HostSnapshot(host=host, time=time, gpus=gpus)


def fail(store: FleetStore, times: int, host: str = HOST, reason: str = "timeout") -> list[bool]:
    return [store.record_failure(host, reason) for _ in range(times)]


# --- record ---------------------------------------------------------------------------------------


def test_new_store_hosts_are_connecting_without_history() -> None:
    store = FleetStore(["b", "a"])
    assert store.hosts == ("b", "a")
    assert store.status("a").state is HostState.CONNECTING
    assert store.latest("a") is None
    assert list(store.history("a")) == []
    assert store.findings("a") == ()
    assert store.severity("a") is None


def test_record_appends_and_makes_host_live() -> None:
    store = FleetStore([HOST])
    first, second = snap(100.0), snap(101.0)
    assert store.record(first) is True
    status = store.status(HOST)
    assert status.state is HostState.LIVE
    assert status.reason is None
    assert status.last_seen == 100.0
    assert store.record(second) is True
    assert list(store.history(HOST)) == [first, second]
    assert store.latest(HOST) is second
    assert store.status(HOST).last_seen == 101.0


def test_reading_no_newer_than_latest_is_refused() -> None:
    store = FleetStore([HOST])
    store.record(snap(100.0, 10.0))
    assert store.record(snap(100.0, 99.0)) is False  # same time
    assert store.record(snap(99.0, 99.0)) is False  # older
    assert len(store.history(HOST)) == 1
    assert store.latest(HOST).gpus[0].utilization_pct == 10.0
    assert store.status(HOST).last_seen == 100.0


def test_history_is_bounded_by_history_length() -> None:
    store = FleetStore([HOST], history_length=3)
    for t in range(10):
        store.record(snap(float(t)))
    assert [s.time for s in store.history(HOST)] == [7.0, 8.0, 9.0]


# --- record_failure -------------------------------------------------------------------------------


def test_one_or_two_misses_change_nothing() -> None:
    store = FleetStore([HOST])
    store.record(snap(100.0))
    assert fail(store, 2) == [False, False]
    assert store.status(HOST).state is HostState.LIVE
    assert [f.code for f in store.findings(HOST)] == []


def test_three_misses_with_history_make_host_stale_with_reason() -> None:
    store = FleetStore([HOST])
    store.record(snap(100.0))
    assert fail(store, 3, reason="ssh: connection timed out") == [False, False, True]
    status = store.status(HOST)
    assert status.state is HostState.STALE
    assert status.reason == "ssh: connection timed out"
    assert status.last_seen == 100.0  # when it was last read, not when it failed
    stale = [f for f in store.findings(HOST) if f.code == "host-stale"]
    assert len(stale) == 1
    assert stale[0].severity is Severity.WARNING
    assert "ssh: connection timed out" in stale[0].message
    assert store.severity(HOST) is Severity.WARNING


def test_repeated_miss_with_same_reason_is_no_change_but_new_reason_is() -> None:
    store = FleetStore([HOST])
    store.record(snap(100.0))
    fail(store, 3, reason="timeout")
    assert store.record_failure(HOST, "timeout") is False
    assert store.record_failure(HOST, "connection refused") is True
    assert store.status(HOST).reason == "connection refused"


def test_ten_misses_make_host_down() -> None:
    store = FleetStore([HOST])
    store.record(snap(100.0))
    results = fail(store, 10, reason="no route to host")
    assert results == [False, False, True, False, False, False, False, False, False, True]
    status = store.status(HOST)
    assert status.state is HostState.DOWN
    assert status.reason == "no route to host"
    codes = [f.code for f in store.findings(HOST)]
    assert "host-down" in codes
    assert "host-stale" not in codes
    assert store.severity(HOST) is Severity.CRITICAL


def test_never_seen_host_goes_from_connecting_straight_to_down() -> None:
    store = FleetStore([HOST])
    states = []
    results = []
    for _ in range(10):
        results.append(store.record_failure(HOST, "refused"))
        states.append(store.status(HOST).state)
    assert results == [False] * 9 + [True]
    assert states == [HostState.CONNECTING] * 9 + [HostState.DOWN]
    assert HostState.STALE not in states
    assert [f.code for f in store.findings(HOST)] == ["host-down"]
    assert store.status(HOST).last_seen is None


def test_thresholds_are_configurable() -> None:
    store = FleetStore([HOST], stale_after=1, down_after=2)
    store.record(snap(100.0))
    assert store.record_failure(HOST, "x") is True
    assert store.status(HOST).state is HostState.STALE
    assert store.record_failure(HOST, "x") is True
    assert store.status(HOST).state is HostState.DOWN


def test_recovery_after_failures_makes_host_live_again() -> None:
    store = FleetStore([HOST])
    store.record(snap(100.0))
    fail(store, 10)
    assert store.status(HOST).state is HostState.DOWN
    assert store.record(snap(200.0)) is True
    status = store.status(HOST)
    assert status.state is HostState.LIVE
    assert status.reason is None
    assert status.last_seen == 200.0
    codes = [f.code for f in store.findings(HOST)]
    assert "host-down" not in codes
    assert "host-stale" not in codes
    # The miss count restarted: two more misses are still no news.
    assert fail(store, 2) == [False, False]
    assert store.status(HOST).state is HostState.LIVE


def test_a_repeated_reading_does_not_revive_a_stale_host() -> None:
    store = FleetStore([HOST])
    reading = snap(100.0)
    store.record(reading)
    fail(store, 3)
    assert store.status(HOST).state is HostState.STALE
    # A source that answers with the reading it already gave has shown nothing new.
    assert store.record(reading) is False
    assert store.status(HOST).state is HostState.STALE
    assert store.record(snap(101.0)) is True
    assert store.status(HOST).state is HostState.LIVE
    assert len(store.history(HOST)) == 2


def test_older_reading_never_moves_last_seen_back() -> None:
    store = FleetStore([HOST])
    store.record(snap(100.0))
    fail(store, 3)
    store.record(snap(50.0))  # out of order: older than the latest reading
    assert store.latest(HOST).time == 100.0
    assert store.status(HOST).last_seen == 100.0


# --- findings -------------------------------------------------------------------------------------


def test_findings_are_health_findings_worst_first(rack: SimRack) -> None:
    store = FleetStore(rack.hosts)
    store.record(rack.read("h100-01", NOW))  # GPU 3 fell off the bus at EPOCH + 120
    findings = store.findings("h100-01")
    severities = [f.severity for f in findings]
    assert severities == sorted(severities, reverse=True)
    assert findings[0].severity is Severity.CRITICAL
    assert {"gpu-lost", "xid"} <= {f.code for f in findings}
    assert store.gpu_findings("h100-01", 3)
    assert all(f.gpu == 3 for f in store.gpu_findings("h100-01", 3))
    assert store.severity("h100-01") is Severity.CRITICAL


def test_stale_finding_joins_health_findings_in_order(rack: SimRack) -> None:
    store = FleetStore(rack.hosts)
    store.record(rack.read("h100-01", NOW))
    health_codes = {f.code for f in store.findings("h100-01")}
    fail(store, 3, host="h100-01", reason="timeout")
    findings = store.findings("h100-01")
    codes = [f.code for f in findings]
    assert "host-stale" in codes
    assert health_codes <= set(codes)  # the last reading's findings are kept
    severities = [f.severity for f in findings]
    assert severities == sorted(severities, reverse=True)
    # A warning: after the critical GPU findings, before the info ones.
    stale_at = codes.index("host-stale")
    assert all(f.severity is Severity.CRITICAL for f in findings[:stale_at])
    assert all(f.severity <= Severity.WARNING for f in findings[stale_at:])


def test_down_finding_on_healthy_host_is_its_only_finding(rack: SimRack) -> None:
    store = FleetStore(rack.hosts)
    store.record(rack.read("a100-02", NOW))
    assert store.findings("a100-02") == ()
    fail(store, 10, host="a100-02", reason="no route to host")
    (finding,) = store.findings("a100-02")
    assert finding.code == "host-down"
    assert finding.severity is Severity.CRITICAL
    assert finding.host == "a100-02"
    assert "no route to host" in finding.message


# --- series ---------------------------------------------------------------------------------------


def test_series_is_oldest_first_and_skips_missing_values() -> None:
    store = FleetStore([HOST])
    store.record(snap(1.0, 10.0, 70.0))
    store.record(snap(2.0, 20.0, None))
    store.record(snap(3.0, 30.0, 90.0))
    store.record(HostSnapshot(HOST, 4.0, gpus=(GpuState(index=0, utilization_pct=40.0),)))
    assert store.series(HOST, 0, "utilization_pct") == [10.0, 20.0, 30.0, 40.0]
    assert store.series(HOST, 1, "utilization_pct") == [70.0, 90.0]  # lost at 2, absent at 4
    assert store.series(HOST, 1, "temperature_c") == [41.0, 41.0]
    assert store.series(HOST, 7, "utilization_pct") == []
    assert store.series(HOST, 0, "no_such_field") == []


@given(
    utils=st.lists(st.one_of(st.none(), st.floats(0, 100)), max_size=40),
    last=st.integers(0, 50),
    keep=st.integers(1, 30),
)
def test_series_last_is_the_tail_of_the_whole_series(
    utils: list[float | None], last: int, keep: int
) -> None:
    """For any history (GPU 1 lost in some readings) and any count, the newest ``last`` values
    are the end of the whole series: the trend line draws what it drew when it read it all."""
    store = FleetStore([HOST], history_length=keep)
    for t, util in enumerate(utils):
        store.record(snap(float(t + 1), 10.0, util))
    whole = store.series(HOST, 1, "utilization_pct")
    assert len(whole) <= keep
    assert store.series(HOST, 1, "utilization_pct", last) == (whole[-last:] if last else [])


def test_series_skips_a_gpu_lost_in_the_sim(rack: SimRack) -> None:
    store = FleetStore(rack.hosts)
    times = [EPOCH + t for t in range(116, 124)]  # GPU 3 of h100-01 falls off the bus at 120
    readings = [rack.read("h100-01", t) for t in times]
    for reading in readings:
        store.record(reading)
    lost = store.series("h100-01", 3, "temperature_c")
    assert lost == [r.gpu(3).temperature_c for r in readings[:4]]
    assert len(lost) == 4
    assert all(r.gpu(3).lost for r in readings[4:])
    healthy = store.series("h100-01", 0, "power_w")
    assert healthy == [r.gpu(0).power_w for r in readings]
    assert len(healthy) == len(times)
