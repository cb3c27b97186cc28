"""Polling rounds as the console and the headless recorder both keep them: a store primed with
the hosts' recent past and the alerts that past leaves active, then each round's readings into
the store and the alert engine evaluated at the readings' time (not the wall clock)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuconsole.alerts.engine import AlertEngine, findings_from
from gpuconsole.alerts.rules import AlertRule
from gpuconsole.poller import Reading, ingest, prime
from gpuconsole.store import FleetStore
from gpuconsole.telemetry import Source


def primed(
    source: Source, seconds: int, rules: Sequence[AlertRule]
) -> tuple[FleetStore, AlertEngine]:
    """A store holding the last ``seconds`` the source can replay, and the alerts active at its
    end (duration rules need the recent past)."""
    store = FleetStore(source.hosts, history_length=seconds)
    prime(store, source, seconds)
    alerts = AlertEngine(rules, findings=findings_from(store))
    alerts.replay(s for host in store.hosts for s in store.history(host))
    return store, alerts


def take_round(store: FleetStore, alerts: AlertEngine, readings: list[Reading]) -> set[str]:
    """One round's readings into the store and the alerts; the hosts whose state changed."""
    changed = ingest(store, readings)
    snapshots = [r.snapshot for r in readings if r.snapshot is not None]
    if snapshots:
        alerts.evaluate(snapshots, max(s.time for s in snapshots))
    return changed
