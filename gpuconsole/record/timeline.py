"""What the live console keeps over time besides the store: when each finding and firing alert
began (for the triage view's "newest first"), and, when it records, the recording."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpuconsole.alerts.engine import Alert
from gpuconsole.poller import Reading
from gpuconsole.record.episodes import OnsetTracker
from gpuconsole.record.recorder import Recorder, tick_of
from gpuconsole.store import FleetStore


class Timeline:
    """Fed once per polling round, after the store and the alerts took the readings."""

    def __init__(self, recorder: Recorder | None = None) -> None:
        self.onsets = OnsetTracker()
        self.recorder = recorder
        self._error_told = False

    @property
    def recording(self) -> Path | None:
        """The file being recorded into, if any."""
        return None if self.recorder is None else self.recorder.path

    def note(
        self,
        store: FleetStore,
        readings: Iterable[Reading],
        changed: Iterable[str],
        alerts: Iterable[Alert],
    ) -> str | None:
        """Take one round; returns, once, why recording stopped if it did."""
        tick = tick_of(store, readings, changed, alerts)
        for host, seen, findings, xids in tick.findings_by_host():
            self.onsets.update_host(host, seen, findings, xids)
        self.onsets.update_alerts(tick.time, tick.alerts)
        if self.recorder is None:
            return None
        self.recorder.take(tick)
        if self.recorder.error is not None and not self._error_told:
            self._error_told = True
            return self.recorder.error
        return None
