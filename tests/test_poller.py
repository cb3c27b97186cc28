"""One polling round: collect from a source, ingest into the store, prime from backfill."""

from __future__ import annotations

from conftest import EPOCH, NOW

from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import HostState
from gpuconsole.fleet.poller import HostReading, collect, ingest, prime
from gpuconsole.fleet.store import FleetStore
from gpuconsole.telemetry.sim import SimRack, SimSource

BAD = "a100-02"


def test_collect_keeps_going_when_one_host_raises(rack: SimRack, clock: ManualClock) -> None:
    rack.set_fault(BAD, "host-unresponsive", since=EPOCH)
    source = SimSource(rack, clock)
    readings = collect(source)
    assert [r.host for r in readings] == list(rack.hosts)
    by_host = {r.host: r for r in readings}
    bad = by_host.pop(BAD)
    assert bad.snapshot is None
    assert bad.error is not None
    assert BAD in bad.error
    assert "\n" not in bad.error
    for host, reading in by_host.items():
        assert reading.error is None
        assert reading.snapshot is not None
        assert reading.snapshot.host == host
        assert reading.snapshot.time == NOW
    # The host after the failing one was read too (a100-02 is not the last host).
    assert rack.hosts.index(BAD) < len(rack.hosts) - 1


def test_collect_reads_only_the_hosts_asked_for(rack: SimRack, clock: ManualClock) -> None:
    readings = collect(SimSource(rack, clock), ["l40s-01", "h100-02"])
    assert [r.host for r in readings] == ["l40s-01", "h100-02"]
    assert all(r.snapshot is not None for r in readings)


def test_ingest_returns_the_hosts_whose_view_changed(rack: SimRack, clock: ManualClock) -> None:
    rack.set_fault(BAD, "host-unresponsive", since=EPOCH)
    source = SimSource(rack, clock)
    store = FleetStore(source.hosts)
    good = set(rack.hosts) - {BAD}

    first = collect(source)
    assert ingest(store, first) == good  # one miss of a never-seen host is no news
    assert all(store.status(h).state is HostState.LIVE for h in good)
    assert store.status(BAD).state is HostState.CONNECTING

    assert ingest(store, first) == set()  # the same readings again: nothing newer

    clock.advance(1.0)
    assert ingest(store, collect(source)) == good
    assert all(store.latest(h).time == NOW + 1.0 for h in good)
    assert store.status(BAD).state is HostState.CONNECTING  # three misses, but no history

    for _ in range(6):  # misses 4..9: a host without history is never stale
        clock.advance(1.0)
        assert BAD not in ingest(store, collect(source))
    clock.advance(1.0)
    assert BAD in ingest(store, collect(source))  # the tenth miss: down
    status = store.status(BAD)
    assert status.state is HostState.DOWN
    assert BAD in (status.reason or "")


def test_ingest_uses_a_default_reason_when_the_error_is_empty() -> None:
    store = FleetStore(["n1"], stale_after=1, down_after=1)
    assert ingest(store, [HostReading("n1")]) == {"n1"}
    assert store.status("n1").state is HostState.DOWN
    assert store.status("n1").reason == "no reading"


def test_prime_fills_history_from_backfill(rack: SimRack, clock: ManualClock) -> None:
    source = SimSource(rack, clock)
    store = FleetStore(source.hosts)
    prime(store, source, 30)
    for host in rack.hosts:
        history = store.history(host)
        times = [s.time for s in history]
        assert times == [NOW - back for back in range(29, -1, -1)]
        assert store.status(host).state is HostState.LIVE
        assert store.latest(host) == rack.read(host, NOW)


def test_prime_is_bounded_by_history_length(rack: SimRack, clock: ManualClock) -> None:
    source = SimSource(rack, clock)
    store = FleetStore(source.hosts, history_length=5)
    prime(store, source, 20)
    assert [s.time for s in store.history("l40s-01")] == [NOW - b for b in range(4, -1, -1)]


def test_prime_leaves_out_the_time_a_host_was_unreachable(
    rack: SimRack, clock: ManualClock
) -> None:
    rack.set_fault(BAD, "host-unresponsive", since=NOW - 10)
    source = SimSource(rack, clock)
    store = FleetStore(source.hosts)
    prime(store, source, 30)
    times = [s.time for s in store.history(BAD)]
    assert times == [NOW - back for back in range(29, 10, -1)]
    assert len(store.history("h100-01")) == 30
