"""The recorder: the fleet's readings, host states, findings, alerts and actions into a recording.

`Recorder.take` is cheap and safe to call from the UI thread: it queues the tick. A writer
thread encodes and inserts, and commits at most once a second, and at the latest one second after
a tick arrived, even when no further tick comes. Ticks do not pile up behind a writer that falls
behind (a fleet too large for the disk): the headless recorder hands a tick over only once the
writer has written the ones before (so `close` has at most one left to write), and the console's
ticks past `MAX_QUEUED_TICKS` waiting go unrecorded (it says so). SQLite in WAL mode with
``synchronous=NORMAL`` keeps every commit through a killed process, so a console killed without
a clean shutdown loses at most its last second. In between ticks the writer thins and expires old
data (`retention`).

Only one recorder writes a file at a time: it holds an exclusive lock on it (``flock``), and a
second one is refused with a line that says so. Actions come from the audit log: the writer
copies the entries appended to it (by this console or any other gpuconsole on the machine).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuconsole.core import paths
from gpuconsole.core.model import Finding, HostSnapshot, XidEvent
from gpuconsole.fleet.alerts.engine import Alert
from gpuconsole.fleet.poller import HostReading
from gpuconsole.fleet.record import schema
from gpuconsole.fleet.record.codec import KEYFRAME_EVERY_S, Decoder, HostEncoder, to_ms
from gpuconsole.fleet.record.episodes import Changes, Episode, OnsetTracker
from gpuconsole.fleet.record.retention import Maintenance, Retention
from gpuconsole.fleet.record.schema import RecordingError
from gpuconsole.fleet.record.when import is_time
from gpuconsole.fleet.store import FleetStore, HostStatus

COMMIT_EVERY_S = 1.0
SESSION_END_S = 0.001
"""Episodes still open when a session ends end this long after its last reading: at that
reading they were still there."""
MAINTAIN_EVERY_S = 30.0
"""Retention runs in rounds at most this often (wall time), between ticks."""
MAX_QUEUED_TICKS = 16
"""Ticks taken from the console and not yet written, at most. Their readings are the store's
latest (its history is longer), so what they hold besides is small."""
AUDIT_READ_BYTES = 1 << 22
"""The audit log is read this much at a time: a long one is caught up with over rounds."""
ROOM_POLL_S = 0.1
"""A caller waiting for the writer looks at its ``stop`` event this often."""


@dataclass(frozen=True, slots=True)
class Tick:
    """What one polling round changed: new readings, every host's state and findings, alerts."""

    time: float
    snapshots: tuple[HostSnapshot, ...] = ()
    statuses: Mapping[str, HostStatus] = field(default_factory=dict)
    findings: Mapping[str, tuple[Finding, ...]] = field(default_factory=dict)
    alerts: tuple[Alert, ...] = ()
    """Only firing ones are recorded."""
    began: tuple[Episode, ...] = ()
    """Findings' episodes open before this tick, since before the recorder saw them (the history
    a fleet session was primed with): recorded with their own ``since``."""

    def findings_by_host(
        self,
    ) -> Iterator[tuple[str, float, tuple[Finding, ...], tuple[XidEvent, ...]]]:
        """Each host's findings with when this tick saw the host (its new reading's time, else
        the tick's) and the XIDs its reading holds (which date the XID findings)."""
        readings = {s.host: s for s in self.snapshots}
        for host, findings in self.findings.items():
            snapshot = readings.get(host)
            if snapshot is None:
                yield host, self.time, findings, ()
            else:
                yield host, snapshot.time, findings, snapshot.xid_events


def tick_of(
    store: FleetStore,
    readings: Iterable[HostReading],
    changed: Iterable[str],
    alerts: Iterable[Alert] = (),
    now: float | None = None,
) -> Tick:
    """The tick after ``readings`` were ingested into ``store`` (``changed``: what ingest said).

    Its time is the newest reading's, else ``now``, else the wall clock.
    """
    changed = set(changed)
    snapshots = tuple(r.snapshot for r in readings if r.snapshot is not None and r.host in changed)
    when = max((s.time for s in snapshots), default=now if now is not None else time.time())
    return Tick(
        time=when,
        snapshots=snapshots,
        statuses={host: store.status(host) for host in store.hosts},
        findings={host: store.findings(host) for host in changed},
        alerts=tuple(alerts),
    )


class RecordingWriter:
    """Writes ticks into an open recording in one transaction per `commit` (no thread of its own).

    The `Recorder` drives it from its thread; benchmarks and tests may drive it directly.
    """

    def __init__(
        self,
        connection: sqlite3.Connection,
        meta: Mapping[str, str],
        *,
        label: str = "",
        keyframe_every_s: float = KEYFRAME_EVERY_S,
        audit_log: Path | None = None,
    ) -> None:
        self._db = connection
        self._keyframe_every_s = keyframe_every_s
        self.decoder = Decoder(json.loads(meta["schema"]))
        self._hosts: dict[str, int] = dict(connection.execute("SELECT name, id FROM hosts"))
        self._encoders: dict[str, HostEncoder] = {}
        self._last_t: dict[str, int] = {}
        for name, ident in self._hosts.items():
            (last,) = connection.execute(
                "SELECT MAX(t) FROM readings WHERE host = ?", (ident,)
            ).fetchone()
            if last is not None:
                self._last_t[name] = last
        self._states: dict[str, str] = {}
        self._tracker = OnsetTracker()
        self._episodes: dict[str, int] = {}
        self.last_time: float | None = None
        self._label = label
        self._session: int | None = None
        """The sessions row, made with the first tick: a session spans readings' time."""
        self._begin()
        self._end_dangling_episodes()
        self._audit = _AuditTail(audit_log or paths.AUDIT_LOG.path(), self._actions_watermark())
        self._db.execute("COMMIT")

    def _begin(self) -> None:
        if not self._db.in_transaction:
            self._db.execute("BEGIN IMMEDIATE")

    def _end_dangling_episodes(self) -> None:
        """Episodes a killed recorder left open end where its recording ended."""
        (last,) = self._db.execute("SELECT MAX(last) FROM sessions").fetchone()
        if last is not None:
            self._db.execute(
                "UPDATE episodes SET until = ? WHERE until IS NULL", (last + SESSION_END_S,)
            )

    def _actions_watermark(self) -> float:
        """Actions are copied from the audit log from the newest one recorded, or from now."""
        (newest,) = self._db.execute("SELECT MAX(t) FROM actions").fetchone()
        return time.time() if newest is None else newest

    def write(self, tick: Tick) -> None:
        """Add one tick to the open transaction (opening one if none is)."""
        self._begin()
        if self._session is None:
            started = min((s.time for s in tick.snapshots), default=tick.time)
            self._session = self._db.execute(
                "INSERT INTO sessions (started, label, pid) VALUES (?, ?, ?)",
                (started, self._label, os.getpid()),
            ).lastrowid
        rows = []
        for snapshot in tick.snapshots:
            t = to_ms(snapshot.time)
            if t <= self._last_t.get(snapshot.host, -1):
                continue  # a reading already recorded (by this session or an earlier one)
            self._last_t[snapshot.host] = t
            encoder = self._encoders.get(snapshot.host)
            if encoder is None:
                encoder = self._encoders[snapshot.host] = HostEncoder(self._keyframe_every_s)
            row = encoder.encode(snapshot)
            rows.append((self._host_id(snapshot.host), row.t, row.key, row.data))
        self._db.executemany("INSERT INTO readings (host, t, key, data) VALUES (?, ?, ?, ?)", rows)
        for host, status in tick.statuses.items():
            if self._states.get(host) != status.state.value:
                self._states[host] = status.state.value
                self._db.execute(
                    "INSERT OR REPLACE INTO states (host, t, state, reason) VALUES (?, ?, ?, ?)",
                    (self._host_id(host), to_ms(tick.time), status.state.value, status.reason),
                )
        self._record(self._tracker.resume(tick.began))
        for host, seen, findings, xids in tick.findings_by_host():
            self._record(self._tracker.update_host(host, seen, findings, xids))
        self._record(self._tracker.update_alerts(tick.time, tick.alerts))
        self.last_time = tick.time if self.last_time is None else max(self.last_time, tick.time)

    def commit(self) -> None:
        """Commit what was written since the last commit, with the actions logged meanwhile.

        Between commits no transaction is open: retention work may run then.
        """
        self._begin()
        for entry in self._audit.new_entries():
            host, action = (entry.get(k) for k in ("host", "action"))
            self._db.execute(
                "INSERT INTO actions (t, host, action, entry) VALUES (?, ?, ?, ?)",
                (
                    entry["time"],
                    host if isinstance(host, str) else None,
                    action if isinstance(action, str) else None,
                    json.dumps(entry),
                ),
            )
        if self._session is not None and self.last_time is not None:
            self._db.execute(
                "UPDATE sessions SET last = ? WHERE id = ?", (self.last_time, self._session)
            )
        self._db.execute("COMMIT")

    def close(self) -> None:
        """The session ends: its open episodes end with it, then the last commit."""
        self._begin()
        for ident, until in self._tracker.flush():
            row = self._episodes.pop(ident, None)
            if row is not None:
                self._db.execute("UPDATE episodes SET until = ? WHERE id = ?", (until, row))
        if self.last_time is not None:
            end = self.last_time
            self._db.execute(
                "UPDATE episodes SET until = ? WHERE until IS NULL", (end + SESSION_END_S,)
            )
            self._db.execute("UPDATE sessions SET ended = ? WHERE id = ?", (end, self._session))
        self.commit()

    def _host_id(self, host: str) -> int:
        ident = self._hosts.get(host)
        if ident is None:
            ident = self._db.execute("INSERT INTO hosts (name) VALUES (?)", (host,)).lastrowid
            assert ident is not None
            self._hosts[host] = ident
        return ident

    def _record(self, changes: Changes) -> None:
        if not changes:
            return
        for episode in changes.opened:
            self._episodes[episode.ident] = self._insert(episode)
        for episode in changes.worsened:
            self._db.execute(
                "UPDATE episodes SET severity = ?, message = ?, remediation = ? WHERE id = ?",
                (
                    int(episode.severity),
                    episode.message,
                    episode.remediation,
                    self._episodes[episode.ident],
                ),
            )
        for ident, until in changes.closed:
            row = self._episodes.pop(ident, None)
            if row is not None:
                self._db.execute("UPDATE episodes SET until = ? WHERE id = ?", (until, row))

    def _insert(self, episode: Episode) -> int:
        row = self._db.execute(
            "INSERT INTO episodes (kind, ident, host, gpu, code, severity, message, remediation, "
            "since, labels) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                episode.kind,
                episode.ident,
                episode.host,
                episode.gpu,
                episode.code,
                int(episode.severity),
                episode.message,
                episode.remediation,
                episode.since,
                json.dumps([list(pair) for pair in episode.labels]),
            ),
        ).lastrowid
        assert row is not None
        return row


class _AuditTail:
    """The audit log's entries newer than a watermark, read as the log grows."""

    def __init__(self, path: Path, watermark: float) -> None:
        self._path = path
        self._watermark = watermark
        self._offset = 0

    def new_entries(self) -> list[dict[str, Any]]:
        try:
            with self._path.open("rb") as log:
                if os.fstat(log.fileno()).st_size < self._offset:
                    self._offset = 0  # rotated or truncated: read it anew
                log.seek(self._offset)
                data = log.read(AUDIT_READ_BYTES)
        except OSError:
            return []
        complete = data.rfind(b"\n") + 1  # a line still being written waits for the next round
        if not complete and len(data) == AUDIT_READ_BYTES:
            complete = len(data)  # a line that long is no entry: passed over
        self._offset += complete
        entries = []
        for line in data[:complete].splitlines():
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):
                continue
            stamp = entry.get("time") if isinstance(entry, dict) else None
            if is_time(stamp) and stamp > self._watermark:
                entries.append(entry)
        if entries:
            self._watermark = max(e["time"] for e in entries)
        return entries


_STOP = object()


class Recorder:
    """Records ticks into ``path`` from a thread of its own; see the module's docstring."""

    def __init__(
        self,
        path: Path,
        *,
        label: str = "",
        retention: Retention | None = None,
        keyframe_every_s: float = KEYFRAME_EVERY_S,
        commit_every_s: float = COMMIT_EVERY_S,
        maintain_every_s: float = MAINTAIN_EVERY_S,
        audit_log: Path | None = None,
    ) -> None:
        self.path = path
        schema.create(path, label)
        self._lock = _lock(path)
        try:
            connection, meta = schema.open_for_writing(path)
        except RecordingError:
            self._lock.close()
            raise
        try:
            self._writer = RecordingWriter(
                connection,
                meta,
                label=label,
                keyframe_every_s=keyframe_every_s,
                audit_log=audit_log,
            )
        except sqlite3.Error as error:
            connection.close()
            self._lock.close()
            raise RecordingError(f"{path}: cannot write: {error}") from None
        self._connection = connection
        self._maintenance = Maintenance(connection, self._writer.decoder, retention or Retention())
        self._commit_every_s = commit_every_s
        self._maintain_every_s = maintain_every_s
        self._queue: queue.SimpleQueue[Tick | object] = queue.SimpleQueue()
        self._room = threading.Condition()
        self._waiting = 0
        """Ticks taken and not yet written (guarded by ``_room``)."""
        self.error: str | None = None
        """Why recording stopped early (a full disk), one line; None while it works."""
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()

    def take(self, tick: Tick, stop: threading.Event | None = None) -> bool:
        """Queue a tick for the writer; False when it was not (recording stopped, or the writer
        is `MAX_QUEUED_TICKS` behind, or ``stop`` was set while waiting).

        Without ``stop`` it returns at once (the UI thread); with it, it first waits until the
        writer has written every tick taken before, or ``stop`` is set (the headless recorder).
        """
        with self._room:
            while stop is not None and self._waiting and self.error is None:
                if stop.is_set():
                    return False
                self._room.wait(ROOM_POLL_S)  # a signal's handler sets ``stop``: look again soon
            if self.error is not None or self._waiting >= MAX_QUEUED_TICKS:
                return False
            self._waiting += 1
        self._queue.put(tick)
        return True

    @property
    def recorded_until(self) -> float | None:
        """The newest tick's time written so far (None before the first)."""
        return self._writer.last_time

    def close(self) -> None:
        """Write what is queued, end the session and release the file."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._connection.close()
        self._lock.close()

    def _run(self) -> None:
        writer = self._writer
        dirty = False
        deadline = time.monotonic() + self._commit_every_s
        last_maintenance = 0.0
        try:
            while True:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    item = None
                if item is _STOP:
                    writer.close()
                    return
                if isinstance(item, Tick):
                    writer.write(item)
                    dirty = True
                    with self._room:
                        self._waiting -= 1
                        self._room.notify()
                if time.monotonic() < deadline:
                    continue
                if dirty:
                    writer.commit()
                    dirty = False
                deadline = time.monotonic() + self._commit_every_s
                now = writer.last_time
                since = time.monotonic() - last_maintenance
                if now is not None and since >= self._maintain_every_s:
                    last_maintenance = self._maintain(now, deadline)
        except Exception as error:  # a full disk, or a bug: stop with a reason, never hang `take`
            known = isinstance(error, (sqlite3.Error, OSError))
            why = str(error) if known else f"{type(error).__name__}: {error}"
            self.error = f"{self.path}: recording stopped: {why}"
            with contextlib.suppress(sqlite3.Error):
                self._connection.rollback()

    def _maintain(self, now: float, deadline: float) -> float:
        """Units of retention work until the next commit is due; when the round finished, the
        time it did (so the next round waits), else 0 (continue after the next commit)."""
        while time.monotonic() < deadline and self._queue.empty():
            if not self._maintenance.step(now):
                return time.monotonic()
        return 0.0


def _lock(path: Path) -> Any:
    """An exclusive lock on the recording (held while the returned file stays open)."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - held open: it holds the lock
    except OSError as error:
        raise RecordingError(f"{path}: cannot write: {error.strerror or error}") from None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise RecordingError(f"{path}: another gpuconsole is recording into it") from None
    return handle
