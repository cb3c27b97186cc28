"""What the live console keeps over time besides the store: when each finding and firing alert
began (for the triage view's "newest first"), and, when it records, the recording."""

from __future__ import annotations

import threading
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
        self._behind_told = False
        self._unrecorded: set[str] = set()
        """Hosts that changed in rounds the recorder could not take: the next round that it
        takes states their findings, so no episode change is lost with a round."""

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
        stop: threading.Event | None = None,
    ) -> str | None:
        """Take one round; returns, once each, why recording stopped if it did, and that it
        fell behind. With ``stop``, waits for a recorder that is behind (see `Recorder.take`)."""
        changed = set(changed) | self._unrecorded
        tick = tick_of(store, readings, changed, alerts)
        for host, seen, findings, xids in tick.findings_by_host():
            self.onsets.update_host(host, seen, findings, xids)
        self.onsets.update_alerts(tick.time, tick.alerts)
        if self.recorder is None:
            return None
        if self.recorder.take(tick, stop):
            self._unrecorded.clear()
        else:
            self._unrecorded = changed
        if self.recorder.error is not None:
            if self._error_told:
                return None
            self._error_told = True
            return self.recorder.error
        stopping = stop is not None and stop.is_set()  # a round cut short is not news
        if self._unrecorded and not self._behind_told and not stopping:
            self._behind_told = True
            return f"{self.recorder.path}: the recording falls behind: some rounds not recorded"
        return None
