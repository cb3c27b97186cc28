"""One polling round: read every host of a source, then hand the readings to the store.

Kept apart from the UI so that the headless commands and the tests poll the same way the
console does. `collect` blocks (it calls the source) and runs on a worker thread; `ingest`
is cheap and runs where the store lives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuconsole.core.model import HostSnapshot, HostState
from gpuconsole.fleet.store import FleetStore
from gpuconsole.telemetry import Source, SourceError


@dataclass(frozen=True, slots=True)
class HostReading:
    """The outcome of reading one host: a snapshot, or the one-line reason there is none."""

    host: str
    snapshot: HostSnapshot | None = None
    error: str | None = None
    state: HostState | None = None
    """The host's state when the source knows it (see `SourceError.state`)."""


def collect(source: Source, hosts: Iterable[str] | None = None) -> list[HostReading]:
    """Read each host once; one host's failure never stops the others."""
    readings = []
    for host in source.hosts if hosts is None else hosts:
        try:
            readings.append(HostReading(host, snapshot=source.read(host)))
        except SourceError as error:
            readings.append(HostReading(host, error=str(error), state=error.state))
        except Exception as error:  # a source's bug must not blind the console to other hosts
            readings.append(HostReading(host, error=f"{host}: {type(error).__name__}: {error}"))
    return readings


def ingest(store: FleetStore, readings: Iterable[HostReading]) -> set[str]:
    """Record the readings; returns the hosts whose view changed."""
    changed = set()
    for reading in readings:
        if reading.snapshot is not None:
            updated = store.record(reading.snapshot)
        else:
            updated = store.record_failure(
                reading.host, reading.error or "no reading", reading.state
            )
        if updated:
            changed.add(reading.host)
    return changed


def prime(store: FleetStore, source: Source, seconds: int) -> None:
    """Fill the store's history from a source that can replay its past (the simulation)."""
    for host in source.hosts:
        store.record_past(host, source.backfill(host, seconds))
