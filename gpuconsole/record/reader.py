"""Reading a recording: a host's reading at any time, ranges of readings, states, episodes.

A reading at ``t`` is the latest one recorded at or before ``t``: two row lookups (its row and
its keyframe's), whatever the recording's length. Decoded keyframes are cached, so stepping or
playing through a recording decodes each keyframe once. Safe to share between threads (one lock
around the connection). A recording still being written can be read: `refresh` sees new rows.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuconsole.model import HostSnapshot, HostState, Severity
from gpuconsole.record import schema
from gpuconsole.record.codec import Decoder, to_ms
from gpuconsole.record.episodes import Episode
from gpuconsole.record.schema import RecordingError

_KEYFRAME_CACHE = 1024


@dataclass(frozen=True, slots=True)
class Session:
    """One stretch of recording by one console; ``ended`` is None when it was killed."""

    started: float
    last: float | None
    ended: float | None
    label: str

    @property
    def until(self) -> float:
        return max(t for t in (self.started, self.last, self.ended) if t is not None)


class Recording:
    """An open recording, read-only. `RecordingError` (one line naming the file) when it is not
    one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db, meta = schema.open_for_reading(path)
        self.label = meta.get("label", "")
        self._lock = threading.Lock()
        self._keyframes: OrderedDict[tuple[int, int], HostSnapshot] = OrderedDict()
        try:
            self._decoder = Decoder(json.loads(meta["schema"]))
            self.refresh()
        except (sqlite3.Error, KeyError, ValueError) as error:
            self._db.close()
            raise RecordingError(f"{path}: damaged recording ({error})") from None

    def refresh(self) -> None:
        """Read the hosts, span and sessions again (the file may still be being written)."""
        with self._read() as db:
            self._ids = dict(db.execute("SELECT name, id FROM hosts ORDER BY id"))
            self.sessions = tuple(
                Session(*row)
                for row in db.execute(
                    "SELECT started, last, ended, label FROM sessions ORDER BY started"
                )
            )
            firsts, lasts = [], []
            for ident in self._ids.values():
                (first,) = db.execute(
                    "SELECT MIN(t) FROM readings WHERE host = ?", (ident,)
                ).fetchone()
                (last,) = db.execute(
                    "SELECT MAX(t) FROM readings WHERE host = ?", (ident,)
                ).fetchone()
                if first is not None:
                    firsts.append(first)
                    lasts.append(last)
        self.start = min(firsts) / 1000 if firsts else None
        """The first reading's time; None for a recording without readings."""
        self.end = max(lasts) / 1000 if lasts else None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self._ids)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._db
            except sqlite3.DatabaseError as error:
                raise RecordingError(f"{self.path}: cannot read: {error}") from None

    def _host(self, host: str) -> int:
        try:
            return self._ids[host]
        except KeyError:
            raise RecordingError(f"{self.path}: no host {host!r} in this recording") from None

    # --- readings ------------------------------------------------------------------------------

    def snapshot_at(self, host: str, t: float) -> HostSnapshot | None:
        """The host's latest reading at or before ``t``; None when there is none."""
        ident = self._host(host)
        with self._read() as db:
            row = db.execute(
                "SELECT t, key, data FROM readings WHERE host = ? AND t <= ? "
                "ORDER BY t DESC LIMIT 1",
                (ident, to_ms(t)),
            ).fetchone()
            return None if row is None else self._decode(db, host, ident, *row)

    def snapshots(self, host: str, start: float, end: float) -> list[HostSnapshot]:
        """The host's readings with ``start <= time <= end``, oldest first."""
        ident = self._host(host)
        with self._read() as db:
            rows = db.execute(
                "SELECT t, key, data FROM readings WHERE host = ? AND t >= ? AND t <= ? ORDER BY t",
                (ident, to_ms(start), to_ms(end)),
            ).fetchall()
            return [self._decode(db, host, ident, *row) for row in rows]

    def _decode(
        self, db: sqlite3.Connection, host: str, ident: int, t: int, key: int, data: bytes
    ) -> HostSnapshot:
        cached = self._keyframes.get((ident, key))
        if cached is None:
            if t != key:
                found = db.execute(
                    "SELECT data FROM readings WHERE host = ? AND t = ?", (ident, key)
                ).fetchone()
                if found is None:
                    raise RecordingError(
                        f"{self.path}: damaged recording ({host} at {t / 1000:.3f} refers to a "
                        "missing keyframe)"
                    )
                (keyframe_data,) = found
            else:
                keyframe_data = data
            cached = self._decoder.keyframe(host, key, keyframe_data)
            self._keyframes[(ident, key)] = cached
            if len(self._keyframes) > _KEYFRAME_CACHE:
                self._keyframes.popitem(last=False)
        else:
            self._keyframes.move_to_end((ident, key))
        return cached if t == key else self._decoder.delta(cached, t, data)

    # --- states, coverage ----------------------------------------------------------------------

    def state_at(self, host: str, t: float) -> tuple[HostState, str | None] | None:
        """The host's stream state at ``t`` as the console saw it; None before the first."""
        ident = self._host(host)
        with self._read() as db:
            row = db.execute(
                "SELECT state, reason FROM states WHERE host = ? AND t <= ? "
                "ORDER BY t DESC LIMIT 1",
                (ident, to_ms(t)),
            ).fetchone()
        if row is None:
            return None
        try:
            return HostState(row[0]), row[1]
        except ValueError:
            return HostState.STALE, f"recorded state {row[0]!r}"

    def covers(self, t: float) -> bool:
        """Whether a console was recording at ``t`` (no gap between sessions); a millisecond
        of slack, as rows keep whole milliseconds."""
        return any(s.started - 0.001 <= t <= s.until + 0.001 for s in self.sessions)

    # --- episodes and actions ------------------------------------------------------------------

    def episodes(
        self, start: float | None = None, end: float | None = None, host: str | None = None
    ) -> list[Episode]:
        """Episodes that were open at some time within [start, end], by when they began."""
        where, values = _where(
            ("since <= ?", end), ("(until IS NULL OR until >= ?)", start), ("host = ?", host)
        )
        with self._read() as db:
            rows = db.execute(
                "SELECT kind, ident, host, gpu, code, severity, message, remediation, since, "
                f"until, labels FROM episodes{where} ORDER BY since, id",
                values,
            ).fetchall()
        return [_episode(row) for row in rows]

    def open_episodes(self, t: float) -> list[Episode]:
        """Episodes open at ``t`` (begun at or before, not yet ended)."""
        return [e for e in self.episodes(t, t) if e.open_at(t)]

    def onsets(self, severity: Severity = Severity.WARNING) -> list[tuple[float, Severity]]:
        """When episodes at least this severe began, each time once with the worst severity that
        began then, in time order."""
        with self._read() as db:
            rows = db.execute(
                "SELECT since, MAX(severity) FROM episodes WHERE severity >= ? "
                "GROUP BY since ORDER BY since",
                (int(severity),),
            ).fetchall()
        return [(since, Severity(worst)) for since, worst in rows]

    def actions(
        self, start: float | None = None, end: float | None = None, host: str | None = None
    ) -> list[dict[str, Any]]:
        """Audit log entries recorded in [start, end] (for ``host``, or any), oldest first."""
        where, values = _where(("t >= ?", start), ("t <= ?", end), ("host = ?", host))
        with self._read() as db:
            rows = db.execute(f"SELECT entry FROM actions{where} ORDER BY t, id", values)
            return [json.loads(entry) for (entry,) in rows]


def _where(*conditions: tuple[str, object]) -> tuple[str, list[object]]:
    """A WHERE clause of the conditions whose value is given, and their values in order."""
    given = [(clause, value) for clause, value in conditions if value is not None]
    where = f" WHERE {' AND '.join(clause for clause, _ in given)}" if given else ""
    return where, [value for _, value in given]


def _episode(row: tuple[Any, ...]) -> Episode:
    kind, ident, host, gpu, code, severity, message, remediation, since, until, labels = row
    return Episode(
        kind,
        ident,
        host,
        gpu,
        code,
        Severity(severity),
        message,
        remediation,
        since,
        until,
        tuple((str(k), str(v)) for k, v in json.loads(labels)),
    )
