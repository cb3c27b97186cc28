"""Reading a recording: a host's reading at any time, ranges of readings, states, episodes.

A reading at ``t`` is the latest one recorded at or before ``t``: two row lookups (its row and
its keyframe's), whatever the recording's length. Decoded keyframes are cached, so stepping or
playing through a recording decodes each keyframe once. Safe to share between threads (one lock
around the connection). A recording still being written can be read: `refresh` sees new rows.

A recording may be damaged, or written by anyone (a ticket brings it), so nothing read from it is
trusted: every row's values are checked (a time is a time, a severity a severity, a reading
decodes and passes `gpuconsole.core.untrusted.vetted`), text is made visible, and every query is
bounded (rows longer than `codec.MAX_ROW_BYTES` are refused unread, at most ``MAX_*`` rows are
read at once). A damaged part is met as the caller chose: by default the first one raises
`RecordingError` naming it (a bundle, a script: all or nothing); with ``skip_damaged`` (replay)
it is left out, noted in `damage`, and the rest reads on. A reading asked for at a time whose
row is damaged raises `DamagedReading` either way: there is no reading to give.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuconsole.core.model import HostSnapshot, HostState, Severity
from gpuconsole.core.untrusted import MAX_GPUS, MAX_TEXT_CHARS, shown, vetted, visible
from gpuconsole.fleet.record import schema
from gpuconsole.fleet.record.codec import KEYFRAME_EVERY_S, MAX_ROW_BYTES, Decoder, RowError, to_ms
from gpuconsole.fleet.record.episodes import ALERT, FINDING, Episode
from gpuconsole.fleet.record.schema import RecordingError
from gpuconsole.fleet.record.when import LATEST_S, is_time, stamp

_KEYFRAME_CACHE = 1024
MAX_HOSTS = 100_000
"""A recording of more hosts is refused (opening reads each host's span)."""
MAX_NAME_CHARS = 255
"""Host names and labels are cut to this many characters (as `vetted` cuts a reading's host)."""
MAX_SESSIONS = 100_000
MAX_EPISODES = 100_000
"""At most this many episodes (or actions) are read at once."""
MAX_READINGS = 20_000
"""At most this many readings of one host are read at once (a bundle's twelve minutes at 10 Hz
are 7,200); past it, the latest are kept."""
MAX_JSON_CHARS = 1 << 16
"""An episode's labels or an action's entry longer than this is refused unread."""
MAX_DAMAGE_NOTED = 10_000
"""Damaged rows noted one by one; past it, only that there were more."""
_LATEST_MS = to_ms(LATEST_S)
_SEVERITIES = frozenset(int(s) for s in Severity)
_CHECK_CHUNK = 4096
"""Rows a `check` reads per query (the lock is let go in between)."""
_ROW = (
    "t, key, length(data), typeof(data), "
    f"CASE WHEN typeof(data) = 'blob' AND length(data) <= {MAX_ROW_BYTES} THEN data END"
)
"""A readings row as read: its data only where it is bytes no longer than a row may be."""
_HAS_KEYFRAME = (
    "(key = t OR EXISTS (SELECT 1 FROM readings k WHERE k.host = r.host AND k.t = r.key "
    "AND k.key = k.t))"
)
_MISSHAPEN = (
    "(typeof(key) != 'integer' OR key < 0 OR key > t OR typeof(data) != 'blob' OR "
    f"length(data) > {MAX_ROW_BYTES} OR NOT {_HAS_KEYFRAME})"
)
"""A readings row that `_row_problem` finds wrong without its contents."""


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


@dataclass(frozen=True, slots=True)
class Damage:
    """A part of a recording that cannot be read: what is wrong (one line), in which table,
    and, for readings and states, whose and when (a stretch of ``rows`` rows)."""

    what: str
    table: str
    host: str | None = None
    start: float | None = None
    end: float | None = None
    rows: int = 1

    def line(self) -> str:
        """``h100-01 2026-01-01 00:10:00–00:10:59 UTC (60 readings): …``."""
        if self.start is None or self.end is None:
            return f"{self.table}: {self.what}"
        when = stamp(self.start)
        if self.end != self.start:
            when = f"{when.removesuffix(' UTC')}–{stamp(self.end)[11:]}"
        count = f", {self.rows} {self.table}" if self.rows > 1 else ""
        return f"{self.host or self.table} {when}{count}: {self.what}"

    def joins(self, other: Damage) -> bool:
        """Whether ``other`` continues this stretch (same fault, a keyframe period apart)."""
        if (self.what, self.table, self.host) != (other.what, other.table, other.host):
            return False
        if None in (self.start, self.end, other.start, other.end):
            return False
        assert self.start is not None and self.end is not None and other.start is not None
        return self.start - KEYFRAME_EVERY_S <= other.start <= self.end + KEYFRAME_EVERY_S

    def joined(self, other: Damage) -> Damage:
        assert self.start is not None and self.end is not None
        assert other.start is not None and other.end is not None
        return replace(
            self,
            start=min(self.start, other.start),
            end=max(self.end, other.end),
            rows=self.rows + other.rows,
        )


class DamageLog:
    """The damaged parts of a recording found so far, each row once (a replay meets the same
    damaged row again and again), joined into stretches. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str, str | None, float | None]] = set()
        self._stretches: list[Damage] = []
        self.more = False
        """Whether damage went unnoted past `MAX_DAMAGE_NOTED` rows."""

    def note(self, damage: Damage) -> bool:
        """Note a damaged row; True when it was not noted before."""
        key = (damage.what, damage.table, damage.host, damage.start)
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) >= MAX_DAMAGE_NOTED:
                self.more = True
                return False
            self._seen.add(key)
            for i, stretch in enumerate(self._stretches):
                if stretch.joins(damage):
                    self._stretches[i] = stretch.joined(damage)
                    break
            else:
                self._stretches.append(damage)
            return True

    def stretches(self) -> list[Damage]:
        """What was found, in the order of the recording (table rows first)."""
        with self._lock:
            found = list(self._stretches)
        return sorted(found, key=lambda d: (d.start is not None, d.start or 0.0, d.host or ""))

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._stretches)


class DamagedReading(RecordingError):
    """The reading asked for is in a damaged row; ``damage`` says which and what is wrong."""

    def __init__(self, path: Path, damage: Damage) -> None:
        super().__init__(f"{path}: damaged recording ({damage.line()})")
        self.damage = damage


def _open(path: Path) -> tuple[sqlite3.Connection, dict[str, str]]:
    """`schema.open_for_reading`, where a file that cannot be read is said to be one, with the
    reason (not called "not a gpuconsole recording"), as is a folder on its way that cannot be
    entered."""
    try:
        if path.is_file():  # only a file: opening a FIFO would wait for a writer
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        return schema.open_for_reading(path)
    except OSError as error:
        raise RecordingError(f"{path}: cannot read: {error.strerror or error}") from None


class Recording:
    """An open recording, read-only. `RecordingError` (one line naming the file) when it is not
    one; see the module's docstring for damaged parts and ``skip_damaged``."""

    def __init__(self, path: Path, *, skip_damaged: bool = False) -> None:
        self.path = path
        self.skip_damaged = skip_damaged
        self.damage = DamageLog()
        self._db, meta = _open(path)
        self.label = visible(meta.get("label", ""), MAX_NAME_CHARS)
        self._lock = threading.Lock()
        self._keyframes: OrderedDict[tuple[int, int], HostSnapshot] = OrderedDict()
        try:
            self._decoder = Decoder(schema.recorded_schema(meta, path))
            self.refresh()
        except RecordingError:
            self._db.close()
            raise
        except sqlite3.Error as error:
            self._db.close()
            raise RecordingError(f"{path}: damaged recording ({error})") from None

    def refresh(self) -> None:
        """Read the hosts, span and sessions again (the file may still be being written)."""
        with self._read() as db:
            (count,) = db.execute("SELECT COUNT(*) FROM hosts").fetchone()
            if count > MAX_HOSTS:
                raise RecordingError(
                    f"{self.path}: {count} hosts, more than gpuconsole reads ({MAX_HOSTS})"
                )
            ids = self._hosts(db)
            sessions = self._sessions(db)
            firsts, lasts = [], []
            for ident in ids.values():
                span = db.execute(
                    "SELECT MIN(t), MAX(t) FROM readings WHERE host = ? AND t BETWEEN 0 AND ?",
                    (ident, _LATEST_MS),
                ).fetchone()
                if all(isinstance(t, int) for t in span):
                    firsts.append(span[0])
                    lasts.append(span[1])
        self._ids = ids
        self.sessions = sessions
        self.start = min(firsts) / 1000 if firsts else None
        """The first reading's time; None for a recording without readings."""
        self.end = max(lasts) / 1000 if lasts else None

    def _hosts(self, db: sqlite3.Connection) -> dict[str, int]:
        ids: dict[str, int] = {}
        for ident, name in db.execute(
            "SELECT id, CASE WHEN typeof(name) = 'text' THEN substr(name, 1, ?) END FROM hosts "
            "ORDER BY id",
            (MAX_NAME_CHARS + 1,),
        ):
            problem = None
            if not isinstance(ident, int):
                problem = f"host id {shown(ident)} is not a number"
            elif not isinstance(name, str) or not name:
                problem = f"host {ident} has no name"
            elif visible(name, MAX_NAME_CHARS) in ids:
                problem = f"host name {shown(name)} repeated"
            if problem is None:
                ids[visible(name, MAX_NAME_CHARS)] = ident
            else:
                self._damaged(Damage(problem, "hosts"))
        return ids

    def _sessions(self, db: sqlite3.Connection) -> tuple[Session, ...]:
        rows = db.execute(
            "SELECT id, started, last, ended, substr(label, 1, ?) FROM sessions LIMIT ?",
            (MAX_NAME_CHARS + 1, MAX_SESSIONS + 1),
        ).fetchall()
        if len(rows) > MAX_SESSIONS:
            self._damaged(
                Damage(f"more than {MAX_SESSIONS} sessions (the rest left out)", "sessions")
            )
        sessions = []
        for ident, started, last, ended, label in rows[:MAX_SESSIONS]:
            times = {"started": started, "last": last, "ended": ended}
            bad = [
                f"{name} {shown(value)}"
                for name, value in times.items()
                if not (is_time(value) or (value is None and name != "started"))
            ]
            if bad:
                self._damaged(
                    Damage(f"row {shown(ident)}: {', '.join(bad)} not a time", "sessions")
                )
                continue
            text = label if isinstance(label, str) else ""
            sessions.append(Session(started, last, ended, visible(text, MAX_NAME_CHARS)))
        return tuple(sorted(sessions, key=lambda s: s.started))

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

    def _damaged(self, damage: Damage) -> None:
        """Note ``damage`` when damaged parts are skipped; else raise it."""
        if not self.skip_damaged:
            raise RecordingError(f"{self.path}: damaged recording ({damage.line()})")
        self.damage.note(damage)

    # --- readings ------------------------------------------------------------------------------

    def snapshot_at(self, host: str, t: float) -> HostSnapshot | None:
        """The host's latest reading at or before ``t``; None when there is none.

        `DamagedReading` when that reading's row is damaged: no older reading stands in for it.
        """
        ident = self._host(host)
        with self._read() as db:
            row = db.execute(
                f"SELECT {_ROW} FROM readings WHERE host = ? AND t BETWEEN 0 AND ? "
                "ORDER BY t DESC LIMIT 1",
                (ident, min(to_ms(t), _LATEST_MS)),
            ).fetchone()
            if row is None:
                return None
            try:
                return self._reading(db, host, ident, *row)
            except DamagedReading as damaged:
                self.damage.note(damaged.damage)
                raise

    def snapshots(self, host: str, start: float, end: float) -> list[HostSnapshot]:
        """The host's readings with ``start <= time <= end``, oldest first (at most the latest
        `MAX_READINGS`); damaged ones as ``skip_damaged`` says."""
        ident = self._host(host)
        window = (max(0, to_ms(start)), min(to_ms(end), _LATEST_MS))
        with self._read() as db:
            rows = db.execute(
                f"SELECT {_ROW} FROM readings WHERE host = ? AND t BETWEEN ? AND ? "
                "ORDER BY t DESC LIMIT ?",
                (ident, *window, MAX_READINGS + 1),
            ).fetchall()
            if len(rows) > MAX_READINGS:
                what = f"more than {MAX_READINGS} readings asked for at once (the latest read)"
                self._damaged(Damage(what, "readings", host, window[0] / 1000, window[1] / 1000))
                rows = rows[:MAX_READINGS]
            readings = []
            for row in reversed(rows):
                try:
                    readings.append(self._reading(db, host, ident, *row))
                except DamagedReading as damaged:
                    self._damaged(damaged.damage)
            return readings

    def _reading(self, db: sqlite3.Connection, host: str, ident: int, *row: Any) -> HostSnapshot:
        """One row's reading (a `_ROW`); `DamagedReading` when it cannot be read."""
        t, key = row[:2]
        when = t / 1000 if isinstance(t, int | float) else None
        problem = _row_problem(*row)
        if problem is not None:
            raise self._damaged_reading(host, when, problem)
        try:
            return self._decode(db, host, ident, t, key, row[4])
        except RowError as error:
            raise self._damaged_reading(host, when, str(error)) from None
        except (ValueError, TypeError, OverflowError, RecursionError) as error:
            what = f"reading does not pass the checks ({type(error).__name__}: {error})"
            raise self._damaged_reading(host, when, visible(what, 200)) from None

    def _damaged_reading(self, host: str, t: float | None, what: str) -> DamagedReading:
        return DamagedReading(self.path, Damage(what, "readings", host, t, t))

    def _decode(
        self, db: sqlite3.Connection, host: str, ident: int, t: int, key: int, data: bytes
    ) -> HostSnapshot:
        cached = self._keyframes.get((ident, key))
        if cached is None:
            keyframe = data
            if t != key:
                found = db.execute(
                    f"SELECT {_ROW} FROM readings WHERE host = ? AND t = ? AND key = t",
                    (ident, key),
                ).fetchone()
                problem = _missing(key) if found is None else _row_problem(*found)
                if problem is not None:
                    raise RowError(problem)
                keyframe = found[4]
            cached = vetted(self._decoder.keyframe(host, key, keyframe))
            self._keyframes[(ident, key)] = cached
            if len(self._keyframes) > _KEYFRAME_CACHE:
                self._keyframes.popitem(last=False)
        else:
            self._keyframes.move_to_end((ident, key))
        # A delta shares its keyframe's unchanged GPUs: only what it changed is checked again.
        return cached if t == key else vetted(self._decoder.delta(cached, t, data), cached)

    # --- checking --------------------------------------------------------------------------------

    def count_readings(self, start: float | None = None, end: float | None = None) -> int:
        """How many readings rows lie in [start, end] (default: all)."""
        with self._read() as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM readings WHERE t BETWEEN ? AND ?", _window(start, end)
            ).fetchone()
        return count

    def check(
        self, start: float | None = None, end: float | None = None, *, contents: bool = True
    ) -> list[Damage]:
        """Look for damage in [start, end] (default: all of it) without building readings; noted
        in `damage`, and all noted so far returned. `RecordingError` at the first damage unless
        ``skip_damaged``.

        Readings' times, keyframes, kinds and lengths are checked in SQL (about a million rows a
        second); with ``contents``, that each row also inflates to a JSON object (tens of
        thousands a second). A row whose JSON is not a reading is found when it is read. The
        episodes, states and actions there are checked too.
        """
        low, high = _window(start, end)
        self._check_stray()
        for name, ident in self._ids.items():
            self._check_host(name, ident, low, high, contents)
            self._check_states(name, ident, low, high)
        self.episodes(start, end)
        self.actions(start, end)
        return self.damage.stretches()

    def _check_stray(self) -> None:
        """Readings no host or time of this recording can reach: their host is not in the
        hosts table, or their time is not a time."""
        names = {ident: name for name, ident in self._ids.items()}
        with self._read() as db:
            rows = db.execute(
                "SELECT host, CASE WHEN typeof(t) != 'integer' OR t < 0 OR t > ? THEN 'time' "
                "ELSE 'host' END AS what, COUNT(*) FROM readings "
                "WHERE typeof(t) != 'integer' OR t < 0 OR t > ? OR host NOT IN "
                "(SELECT id FROM hosts) GROUP BY host, what LIMIT ?",
                (_LATEST_MS, _LATEST_MS, MAX_DAMAGE_NOTED),
            ).fetchall()
        for host, kind, count in rows:
            if kind == "time":
                what = f"{count} of {names.get(host, f'host {shown(host)}')} at no time"
            else:
                what = f"{count} of host {shown(host)}, which the hosts table lacks"
            self._damaged(Damage(what, "readings"))

    def _check_host(self, host: str, ident: int, low: int, high: int, contents: bool) -> None:
        """One host's readings in [low, high] ms, a chunk per query (others read in between)."""
        only = "" if contents else f"AND {_MISSHAPEN}"  # without contents, SQL finds them
        after = low - 1
        while True:
            with self._read() as db:
                rows = db.execute(
                    f"SELECT {_ROW}, {_HAS_KEYFRAME} FROM readings r "
                    f"WHERE host = ? AND t > ? AND t <= ? {only} ORDER BY t LIMIT ?",
                    (ident, after, high, _CHECK_CHUNK),
                ).fetchall()
            for *row, has_keyframe in rows:
                problem = _row_problem(*row, has_keyframe=bool(has_keyframe), contents=contents)
                if problem is not None:
                    when = row[0] / 1000
                    self._damaged(Damage(problem, "readings", host, when, when))
            if len(rows) < _CHECK_CHUNK:
                return
            after = rows[-1][0]

    def _check_states(self, host: str, ident: int, low: int, high: int) -> None:
        with self._read() as db:
            rows = db.execute(
                "SELECT t, substr(state, 1, 64), typeof(reason) FROM states WHERE host = ? "
                "AND t BETWEEN ? AND ? AND (typeof(t) != 'integer' OR typeof(state) != 'text' "
                "OR typeof(reason) NOT IN ('text', 'null')) LIMIT ?",
                (ident, low, high, MAX_DAMAGE_NOTED),
            ).fetchall()
        for t, state, reason in rows:
            what = f"state {shown(state)} at {shown(t)} with a reason of {reason}"
            self._damaged(Damage(what, "states", host, t / 1000, t / 1000))

    # --- states, coverage ----------------------------------------------------------------------

    def state_at(self, host: str, t: float) -> tuple[HostState, str | None] | None:
        """The host's stream state at ``t`` as the console saw it; None before the first."""
        ident = self._host(host)
        with self._read() as db:
            row = db.execute(
                "SELECT substr(state, 1, 64), substr(reason, 1, ?) FROM states WHERE host = ? "
                "AND t BETWEEN 0 AND ? ORDER BY t DESC LIMIT 1",
                (MAX_TEXT_CHARS + 1, ident, min(to_ms(t), _LATEST_MS)),
            ).fetchone()
        if row is None:
            return None
        state, reason = row
        reason = visible(reason) if isinstance(reason, str) else None
        try:
            return HostState(state), reason
        except ValueError:
            return HostState.STALE, f"recorded state {shown(state)}"

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
                "SELECT id, kind, ident, host, gpu, code, severity, substr(message, 1, ?), "
                "substr(remediation, 1, ?), since, until, "
                f"CASE WHEN length(labels) <= ? THEN labels END FROM episodes{where} "
                "ORDER BY since, id LIMIT ?",
                (MAX_TEXT_CHARS + 1, MAX_TEXT_CHARS + 1, MAX_JSON_CHARS, *values, MAX_EPISODES + 1),
            ).fetchall()
        if len(rows) > MAX_EPISODES:
            self._damaged(
                Damage(f"more than {MAX_EPISODES} at once (the rest left out)", "episodes")
            )
        episodes = []
        for row in rows[:MAX_EPISODES]:
            try:
                episodes.append(_episode(row[1:]))
            except ValueError as error:
                self._damaged(Damage(f"row {shown(row[0])}: {error}", "episodes"))
        return episodes

    def open_episodes(self, t: float) -> list[Episode]:
        """Episodes open at ``t`` (begun at or before, not yet ended)."""
        return [e for e in self.episodes(t, t) if e.open_at(t)]

    def onsets(self, severity: Severity = Severity.WARNING) -> list[tuple[float, Severity]]:
        """When episodes at least this severe began, each time once with the worst severity that
        began then, in time order (severities that are none are left out: `episodes` names
        them)."""
        with self._read() as db:
            rows = db.execute(
                "SELECT since, MAX(severity) FROM episodes WHERE severity >= ? AND severity <= ? "
                "AND since BETWEEN 0 AND ? GROUP BY since ORDER BY since LIMIT ?",
                (int(severity), int(max(Severity)), LATEST_S, MAX_EPISODES),
            ).fetchall()
        return [
            (since, Severity(worst))
            for since, worst in rows
            if is_time(since) and worst in _SEVERITIES
        ]

    def actions(
        self, start: float | None = None, end: float | None = None, host: str | None = None
    ) -> list[dict[str, Any]]:
        """Audit log entries recorded in [start, end] (for ``host``, or any), oldest first."""
        where, values = _where(("t >= ?", start), ("t <= ?", end), ("host = ?", host))
        with self._read() as db:
            rows = db.execute(
                f"SELECT id, CASE WHEN length(entry) <= ? THEN entry END FROM actions{where} "
                "ORDER BY t, id LIMIT ?",
                (MAX_JSON_CHARS, *values, MAX_EPISODES),
            ).fetchall()
        entries = []
        for ident, text in rows:
            entry = _json(text)
            if isinstance(entry, dict):
                entries.append(entry)
            else:
                what = f"row {shown(ident)}: not a logged action (JSON object of at most "
                self._damaged(Damage(f"{what}{MAX_JSON_CHARS} chars)", "actions"))
        return entries


def _row_problem(
    t: Any,
    key: Any,
    size: Any,
    kind: Any,
    data: Any,
    *,
    has_keyframe: bool = True,
    contents: bool = False,
) -> str | None:
    """What is wrong with a readings row (a `Recording._ROW`) short of decoding it (with
    ``contents``: that it inflates to a JSON object); None: nothing. The reader and
    `Recording.check` word it alike, so a row found by both is one damaged row."""
    if not isinstance(t, int):
        return f"reading time {shown(t)} is not a time"
    if not isinstance(key, int) or not 0 <= key <= _LATEST_MS:
        return f"keyframe time {shown(key)} is not a time"
    if key > t:
        return f"its keyframe (at {stamp(key / 1000)}) is later than itself"
    if not has_keyframe:
        return _missing(key)
    if kind != "blob":
        return f"the data is {kind}, not bytes"
    if data is None:
        return f"{size} bytes, more than a row may hold ({MAX_ROW_BYTES})"
    if contents:
        try:
            Decoder.unpack(data)
        except RowError as error:
            return str(error)
    return None


def _missing(key: int) -> str:
    return f"its keyframe (at {stamp(key / 1000)}) is missing"


def _window(start: float | None, end: float | None) -> tuple[int, int]:
    """[start, end] as the milliseconds a readings row may have (default: all of them)."""
    low = 0 if start is None else max(0, to_ms(start))
    return low, _LATEST_MS if end is None else min(to_ms(end), _LATEST_MS)


def _where(*conditions: tuple[str, object]) -> tuple[str, list[object]]:
    """A WHERE clause of the conditions whose value is given, and their values in order."""
    given = [(clause, value) for clause, value in conditions if value is not None]
    where = f" WHERE {' AND '.join(clause for clause, _ in given)}" if given else ""
    return where, [value for _, value in given]


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _text(name: str, value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} {shown(value)} is not text")
    return visible(value, limit)


def _episode(row: tuple[Any, ...]) -> Episode:
    """An episodes row as an `Episode`; ValueError saying what is wrong with it."""
    kind, ident, host, gpu, code, severity, message, remediation, since, until, labels = row
    if kind not in (FINDING, ALERT):
        raise ValueError(f"kind {shown(kind)} is neither {FINDING} nor {ALERT}")
    if isinstance(severity, bool) or severity not in _SEVERITIES:
        raise ValueError(f"severity {shown(severity)} is not a severity")
    if not is_time(since):
        raise ValueError(f"since {shown(since)} is not a time")
    if until is not None and not (is_time(until) and until >= since):
        raise ValueError(f"until {shown(until)} is not a time after since")
    if gpu is not None and not (isinstance(gpu, int) and 0 <= gpu < MAX_GPUS):
        raise ValueError(f"GPU {shown(gpu)} is not a GPU index")
    pairs = _json(labels)
    if not (
        isinstance(pairs, list)
        and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in pairs
        )
    ):
        raise ValueError("labels are not a list of name and value pairs")
    return Episode(
        kind,
        _text("ident", ident),
        _text("host", host, MAX_NAME_CHARS),
        gpu,
        _text("code", code, 64),
        Severity(severity),
        _text("message", message),
        _text("remediation", remediation),
        float(since),
        None if until is None else float(until),
        tuple((visible(k, 256), visible(v, 1024)) for k, v in pairs),
    )
