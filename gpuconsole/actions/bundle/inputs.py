"""What a bundle is about, gathered from the live console or from a recording.

The window is the ten minutes before the moment and, from a recording, the two after it. The
live console keeps only its last `HISTORY_READINGS` readings of a host (two minutes at a 1 s
refresh); when it records, the recording gives the rest. A bundle whose readings do not reach
back over the window says how much of it they cover, and why. Actions come from the audit log
(live) or the recording's copy of it (replay), for a day before the moment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuconsole.actions.bundle.contents import BundleInputs
from gpuconsole.core import paths
from gpuconsole.core.model import Finding, HostSnapshot
from gpuconsole.fleet.alerts.engine import FIRING
from gpuconsole.fleet.record.episodes import ALERT, FINDING, Episode, OnsetTracker
from gpuconsole.fleet.record.reader import Recording
from gpuconsole.fleet.record.schema import RecordingError
from gpuconsole.fleet.record.when import clock
from gpuconsole.fleet.store import HISTORY_READINGS, FleetStore

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
    kept: int = HISTORY_READINGS,
    recording: Path | None = None,
    notes: Sequence[str] = (),
) -> BundleInputs:
    """A bundle of the console's store now (blocking: it may read the recording and the audit
    log; run it off the UI thread, on copies of the store's data).

    ``history`` is the store's, which keeps ``kept`` readings of a host; ``open_episodes`` are
    the episodes as of ``at``, those that ended within their grace with their end. The readings
    are the window's: the recording's before the store's first, the store's own from the
    window's start.
    """
    notes = list(notes)
    start = at - WINDOW_BEFORE_S
    readings = [s for s in history if s.time >= start]
    episodes = sorted((e for e in open_episodes if e.host == host), key=lambda e: e.since)
    if len(history) >= kept:  # the store is full: it let older readings go
        why = f"the console keeps a host's last {kept} readings"
    else:
        why = "the console has no earlier reading of it"
    if recording is None or not recording.is_file():
        why += ", and does not record"
    else:
        why += f", and the recording {recording} gives none earlier"
        try:
            opened = Recording(recording)
        except RecordingError as error:
            notes.append(f"earlier readings: {error}")
        else:
            try:
                if host in opened.hosts:
                    first = readings[0].time if readings else at + 1
                    earlier = opened.snapshots(host, start, first)
                    readings = [s for s in earlier if s.time < first] + readings
                    episodes = _merge(opened.episodes(start, at, host), episodes)
            except RecordingError as error:
                notes.append(f"earlier readings: {error}")
            finally:
                opened.close()
    notes += _short_of_window(readings, at, why)
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
    readings = recording.snapshots(host, at - WINDOW_BEFORE_S, at + WINDOW_AFTER_S)
    before = [s for s in readings if s.time <= at]
    short = _short_of_window(before, at, f"the recording {recording.path} holds none earlier")
    return BundleInputs(
        host=host,
        at=at,
        origin=f"the recording {recording.path}",
        readings=tuple(readings),
        findings=tuple(e.as_finding() for e in open_now if e.kind == FINDING),
        alerts=tuple(e.as_alert() for e in open_now if e.kind == ALERT),
        episodes=tuple(recording.episodes(at - WINDOW_BEFORE_S, at + WINDOW_AFTER_S, host)),
        actions=tuple(recording.actions(at - ACTIONS_LOOKBACK_S, at + WINDOW_AFTER_S, host)),
        notes=(*notes, *short),
    )


def _short_of_window(readings: Sequence[HostSnapshot], at: float, why: str) -> list[str]:
    """A note when the readings up to ``at`` begin later than the window does (by more than the
    readings' own spacing): what the bundle holds of the ten minutes, and ``why`` not more."""
    if not readings:
        return []  # the summary says there is no reading of the host in the window
    first = readings[0].time
    spacing = (readings[-1].time - first) / (len(readings) - 1) if len(readings) > 1 else 0.0
    start = at - WINDOW_BEFORE_S
    if first - start <= max(spacing, 1.0):
        return []
    return [
        f"readings from {clock(start)} until {clock(first)} UTC: the bundle holds the last "
        f"{_minutes(at - first)} of the {_minutes(WINDOW_BEFORE_S)} before its moment ({why})"
    ]


def _minutes(seconds: float) -> str:
    """``45 s``, ``2 min``: how long, as a summary says it."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


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
    """The recorded episodes and the live ones; where both hold one, the live one, which knows
    more: the recorder writes an end only once the grace has passed, the live one has it now."""
    merged = {(e.ident, e.since): e for e in recorded}
    merged.update(((e.ident, e.since), e) for e in live)
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
