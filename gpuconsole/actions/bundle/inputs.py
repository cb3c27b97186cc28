"""What a bundle is about, gathered from the live console or from a recording.

The window is the ten minutes before the moment and, from a recording, the two after it. The
live console keeps only a couple of minutes of readings; when it records, the recording gives
the rest. Actions come from the audit log (live) or the recording's copy of it (replay), for a
day before the moment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuconsole import paths
from gpuconsole.actions.bundle.contents import BundleInputs
from gpuconsole.alerts.engine import FIRING
from gpuconsole.model import Finding, HostSnapshot
from gpuconsole.record.episodes import ALERT, FINDING, Episode, OnsetTracker
from gpuconsole.record.reader import Recording
from gpuconsole.record.schema import RecordingError
from gpuconsole.store import FleetStore

WINDOW_BEFORE_S = 600.0
WINDOW_AFTER_S = 120.0
ACTIONS_LOOKBACK_S = 86400.0


def live_inputs(
    host: str,
    origin: str,
    history: Sequence[HostSnapshot],
    findings: Sequence[Finding],
    alerts: Iterable[Any],
    open_episodes: Iterable[Episode],
    *,
    at: float,
    recording: Path | None = None,
    notes: Sequence[str] = (),
) -> BundleInputs:
    """A bundle of the console's store now (blocking: it may read the recording and the audit
    log; run it off the UI thread, on copies of the store's data)."""
    notes = list(notes)
    readings = list(history)
    episodes = sorted((e for e in open_episodes if e.host == host), key=lambda e: e.since)
    if recording is not None and recording.is_file():
        try:
            opened = Recording(recording)
        except RecordingError as error:
            notes.append(f"earlier readings: {error}")
        else:
            try:
                if host in opened.hosts:
                    first = readings[0].time if readings else at + 1
                    earlier = opened.snapshots(host, at - WINDOW_BEFORE_S, first)
                    readings = [s for s in earlier if s.time < first] + readings
                    episodes = _merge(opened.episodes(at - WINDOW_BEFORE_S, at, host), episodes)
            except RecordingError as error:
                notes.append(f"earlier readings: {error}")
            finally:
                opened.close()
    return BundleInputs(
        host=host,
        at=at,
        origin=origin,
        readings=tuple(readings),
        findings=tuple(findings),
        alerts=tuple(a for a in alerts if a.host == host and a.state == FIRING),
        episodes=tuple(episodes),
        actions=tuple(_recent_actions(host)),
        notes=tuple(notes),
    )


def recorded_inputs(
    recording: Recording, host: str, at: float, notes: Sequence[str] = ()
) -> BundleInputs:
    """A bundle of a recording around ``at``: what the console saw then (blocking)."""
    open_now = [e for e in recording.open_episodes(at) if e.host == host]
    return BundleInputs(
        host=host,
        at=at,
        origin=f"the recording {recording.path}",
        readings=tuple(recording.snapshots(host, at - WINDOW_BEFORE_S, at + WINDOW_AFTER_S)),
        findings=tuple(e.as_finding() for e in open_now if e.kind == FINDING),
        alerts=tuple(e.as_alert() for e in open_now if e.kind == ALERT),
        episodes=tuple(recording.episodes(at - WINDOW_BEFORE_S, at + WINDOW_AFTER_S, host)),
        actions=tuple(recording.actions(at - ACTIONS_LOOKBACK_S, at + WINDOW_AFTER_S, host)),
        notes=tuple(notes),
    )


def _recent_actions(host: str) -> list[dict[str, Any]]:
    """The audit log's entries about ``host`` from the last day (the log is in wall time)."""
    now = time.time()
    return audit_entries(host, now - ACTIONS_LOOKBACK_S, now + 1)


def audit_entries(
    host: str, start: float, end: float, path: Path | None = None
) -> list[dict[str, Any]]:
    """The audit log's entries about ``host`` logged in [start, end], oldest first."""
    try:
        text = (path or paths.AUDIT_LOG.path()).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        stamp = entry.get("time") if isinstance(entry, dict) else None
        if entry.get("host") == host and isinstance(stamp, (int, float)) and start <= stamp <= end:
            entries.append(entry)
    return entries


def _merge(recorded: Iterable[Episode], live: Iterable[Episode]) -> list[Episode]:
    """The recorded episodes, and the live ones the recording does not hold yet."""
    merged = {(e.ident, e.since): e for e in recorded}
    for episode in live:
        merged.setdefault((episode.ident, episode.since), episode)
    return sorted(merged.values(), key=lambda e: e.since)


def history_inputs(
    host: str,
    origin: str,
    history: Sequence[HostSnapshot],
    alerts: Iterable[Any],
    notes: Sequence[str] = (),
) -> BundleInputs:
    """A bundle of readings that were never recorded (a simulated host's past, one fresh
    reading): the health rules run over them in order, as the console would have."""
    store = FleetStore([host], history_length=max(1, len(history)))
    tracker = OnsetTracker()
    episodes: dict[str, Episode] = {}
    ended: list[Episode] = []
    for snapshot in history:
        store.record(snapshot)
        findings = store.findings(host)
        changes = tracker.update_host(host, snapshot.time, findings, snapshot.xid_events)
        for episode in (*changes.opened, *changes.worsened):
            episodes[episode.ident] = episode
        for ident, until in changes.closed:
            ended.append(replace(episodes.pop(ident), until=until))
    for ident, until in tracker.flush():  # gone before the last reading, within their grace
        ended.append(replace(episodes.pop(ident), until=until))
    at = history[-1].time if history else time.time()
    return BundleInputs(
        host=host,
        at=at,
        origin=origin,
        readings=tuple(history),
        findings=store.findings(host),
        alerts=tuple(a for a in alerts if a.host == host and a.state == FIRING),
        episodes=tuple(sorted((*ended, *episodes.values()), key=lambda e: e.since)),
        actions=tuple(_recent_actions(host)),
        notes=tuple(notes),
    )
