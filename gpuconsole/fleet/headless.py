"""Recording without the UI (`gpuconsole record`): the console's polling loop, headless.

Each round reads every host into a fleet session, as the console does: the store, the alert
engine (and Alertmanager's sender, if alerts go there), the onsets, and the recorder. Rounds are
chained (the next starts one interval after the last one started, never overlapping), until
``stop`` is set or ``duration`` has passed.

``stop`` ends the loop at the next host read, not at the end of a round or of reading the hosts'
recent past (a large simulated rack takes minutes for either): a signal's handler sets it and
the recorder is closed well within a second. The round cut short is not recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from gpuconsole.core.model import HostSnapshot
from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSender
from gpuconsole.fleet.alerts.defaults import DEFAULT_RULES
from gpuconsole.fleet.alerts.rules import AlertRule
from gpuconsole.fleet.poller import collect
from gpuconsole.fleet.record.recorder import Recorder
from gpuconsole.fleet.session import FleetSession
from gpuconsole.fleet.store import HISTORY_READINGS
from gpuconsole.telemetry import Source


def record_fleet(
    source: Source,
    recorder: Recorder,
    rules: Sequence[AlertRule] = DEFAULT_RULES,
    *,
    interval: float = 1.0,
    stop: threading.Event | None = None,
    duration: float | None = None,
    on_round: Callable[[int], None] | None = None,
    alertmanager: AlertmanagerSender | None = None,
) -> str | None:
    """Record until stopped; returns why recording failed (one line), or None. Firing alerts
    go to ``alertmanager`` too, where given (the caller closes it)."""
    stop = stop or threading.Event()
    watched = _Stoppable(source, stop)
    try:
        fleet = FleetSession(
            watched.hosts,
            rules,
            history_seconds=HISTORY_READINGS,
            recorder=recorder,
            alertmanager=alertmanager,
        )
        fleet.prime(watched, HISTORY_READINGS)
        began = time.monotonic()
        rounds = 0
        while not stop.is_set():
            started = time.monotonic()
            taken = fleet.take(collect(watched), stop)
            if stop.is_set():
                break
            if taken.problem is not None:
                return taken.problem
            rounds += 1
            if on_round is not None:
                on_round(rounds)
            if duration is not None and time.monotonic() - began >= duration:
                break
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
    except _Stopped:
        pass
    return recorder.error


class _Stopped(BaseException):
    """``stop`` was set while hosts were being read. A BaseException, as KeyboardInterrupt is:
    `collect` turns a source's ordinary exceptions into a failed reading of one host."""


class _Stoppable:
    """The source, answering until ``stop`` is set, then raising `_Stopped` at the next read."""

    def __init__(self, source: Source, stop: threading.Event) -> None:
        self._source = source
        self._stop = stop

    @property
    def hosts(self) -> tuple[str, ...]:
        return self._source.hosts

    def read(self, host: str) -> HostSnapshot:
        if self._stop.is_set():
            raise _Stopped
        return self._source.read(host)

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        if self._stop.is_set():
            raise _Stopped
        return self._source.backfill(host, seconds)
