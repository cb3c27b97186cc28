"""The polling round's one home: a fleet session owns the store, the alert engine, the onsets
(when each finding and firing alert began) and, when the fleet is recorded, the recorder; when
alerts go to Alertmanager, it hands each round's alerts to the sender. The console, the headless
recorder, the exporter and replay each drive one.

A session is primed with the hosts' recent past, as far as the source can replay it: the store
takes it, the alert engine replays it, and the onsets take it too, reading by reading, with the
findings the alert engine sees in each. So a finding, its alert and its episode begin at one
instant everywhere (the triage view, the alerts screen, a bundle), not the alert in the past
and the finding when the console started. Then each round's readings go into the store, the
alert engine evaluated at the readings' time (not the wall clock), the onsets and the recording.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from gpuconsole.fleet.alerts.engine import AlertEngine, findings_from
from gpuconsole.fleet.alerts.rules import AlertRule
from gpuconsole.fleet.poller import HostReading, ingest, prime
from gpuconsole.fleet.record.episodes import FINDING, OnsetTracker
from gpuconsole.fleet.record.recorder import Recorder, tick_of
from gpuconsole.fleet.store import HISTORY_READINGS, FleetStore
from gpuconsole.telemetry import Source

if TYPE_CHECKING:
    from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSender


class Round(NamedTuple):
    """What taking one round's readings did."""

    changed: set[str]
    """The hosts whose state changed; every host in a session's first round (nothing of them
    had been stated before)."""
    problem: str | None = None
    """Once each: why recording stopped, or that it falls behind."""


class FleetSession:
    """Store, alerts, onsets, recording and delivery to Alertmanager, fed together once per
    polling round (`take`).

    Not thread-safe: one thread feeds and reads a session at a time (a session built on a
    worker thread is handed over whole, as the console's start and replay's jumps do).
    """

    def __init__(
        self,
        hosts: Iterable[str],
        rules: Sequence[AlertRule],
        *,
        history_seconds: int = HISTORY_READINGS,
        recorder: Recorder | None = None,
        alertmanager: AlertmanagerSender | None = None,
    ) -> None:
        self.store = FleetStore(hosts, history_length=history_seconds)
        self._findings = findings_from(self.store)
        self.alerts = AlertEngine(rules, findings=self._findings)
        """Evaluated on each round's readings, at the readings' time."""
        self.onsets = OnsetTracker()
        """The episodes open now: when each finding and firing alert began."""
        self.recorder = recorder
        self.alertmanager = alertmanager
        """Where firing alerts go, if anywhere: it takes the alerts of each round that evaluates
        them. Its owner (the command that made it) closes it; sessions may share one."""
        self._stated = False
        """Whether a round has stated every host's findings (the first one does)."""
        self._error_told = False
        self._behind_told = False
        self._unrecorded: set[str] = set()
        """Hosts that changed in rounds the recorder could not take: the next round that it
        takes states their findings, so no episode change is lost with a round."""
        self._began_told = False
        """Whether the recorder took the episodes open before its first tick (`Tick.began`)."""

    @property
    def recording(self) -> Path | None:
        """The file being recorded into, if any."""
        return None if self.recorder is None else self.recorder.path

    def prime(self, source: Source, seconds: int) -> None:
        """The last ``seconds`` the source can replay: into the store, the alerts they leave
        active, and the episodes open at their end, each begun at the reading where it first
        showed (within the onsets' grace, as if the console had been watching).

        The onsets take each past reading with the findings the alert engine replays it with
        (the store's for the newest, the health rules' for the others), so a finding and the
        alert that fires on it begin at the same reading.
        """
        prime(self.store, source, seconds)
        self.alerts.replay(s for host in self.store.hosts for s in self.store.history(host))
        for host in self.store.hosts:
            for snapshot in self.store.history(host):
                self.onsets.update_host(
                    host, snapshot.time, self._findings(snapshot), snapshot.xid_events
                )
        if self.alerts.now is not None:
            self.onsets.update_alerts(self.alerts.now, self.alerts.active())

    def take(self, readings: Sequence[HostReading], stop: threading.Event | None = None) -> Round:
        """One round's readings into the store, the alerts (at the newest reading's time) and
        Alertmanager's sender, the onsets and the recording. A round without a reading does not
        evaluate the alerts, and tells the sender nothing: its alerts then time out in
        Alertmanager if no reading comes for their validity (`AlertmanagerSender.validity`).

        With ``stop`` (the headless recorder), waits for a recorder that is behind (see
        `Recorder.take`); a round taken once ``stop`` is set was cut short and goes no further
        than the store and the alerts.
        """
        changed = ingest(self.store, readings)
        snapshots = [r.snapshot for r in readings if r.snapshot is not None]
        if snapshots:
            self.alerts.evaluate(snapshots, max(s.time for s in snapshots))
            if self.alertmanager is not None:
                self.alertmanager.update(self.alerts.active(), self._gpu_uuid)
        if not self._stated:
            changed |= set(self.store.hosts)
        if stop is not None and stop.is_set():
            return Round(changed)
        self._stated = True
        return Round(changed, self._note(readings, changed | self._unrecorded, stop))

    def _gpu_uuid(self, host: str, gpu: int) -> str | None:
        """The UUID of a host's GPU in its latest reading, where known."""
        snapshot = self.store.latest(host)
        found = None if snapshot is None else snapshot.gpu(gpu)
        return None if found is None else found.uuid

    def _note(
        self, readings: Sequence[HostReading], changed: set[str], stop: threading.Event | None
    ) -> str | None:
        """The round into the onsets and the recorder; returns, once each, why recording
        stopped if it did, and that it fell behind."""
        tick = tick_of(self.store, readings, changed, self.alerts.active())
        for host, seen, findings, xids in tick.findings_by_host():
            self.onsets.update_host(host, seen, findings, xids)
        self.onsets.update_alerts(tick.time, tick.alerts)
        if self.recorder is None:
            return None
        if not self._began_told:
            began = tuple(e for e in self.onsets.open_episodes() if e.kind == FINDING)
            tick = replace(tick, began=began)
        if self.recorder.take(tick, stop):
            self._unrecorded.clear()
            self._began_told = True
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
