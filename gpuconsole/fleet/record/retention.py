"""Keeping a recording bounded: old readings are thinned, readings past retention deleted.

Readings older than a tier's age keep one per step (the first of each step-long bucket, a real
reading, never an average that no GPU reported); findings, alerts, host states and actions keep
their full time resolution until retention ends. Work is done in small units (one host's
ten minutes), each its own transaction, so the recorder's once-a-second commits never wait long.
Thinned readings are encoded anew, so every kept reading still decodes from two rows.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from gpuconsole.core.model import HostSnapshot
from gpuconsole.fleet.record.codec import KEYFRAME_EVERY_S, Decoder, HostEncoder, RowError, to_ms

CHUNK_S = 600.0
"""One unit of thinning: at most this much of one host's recording."""


@dataclass(frozen=True, slots=True)
class Tier:
    """Readings older than ``age_s`` keep one per ``step_s``."""

    age_s: float
    step_s: float


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a recording keeps what; the defaults keep a week, full resolution for 6 hours."""

    keep_s: float = 7 * 86400.0
    tiers: tuple[Tier, ...] = (Tier(6 * 3600.0, 10.0), Tier(48 * 3600.0, 60.0))

    def __post_init__(self) -> None:
        ages = [t.age_s for t in self.tiers]
        if ages != sorted(ages) or any(t.step_s <= 0 or t.age_s <= 0 for t in self.tiers):
            raise ValueError("retention tiers must have positive ages, in increasing order")
        if self.keep_s <= 0:
            raise ValueError("retention must be a positive duration")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_WHOLE = re.compile(r"[0-9]{1,18}")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``6h``, ``7d``, ``2w`` -> seconds; ValueError otherwise."""
    match = _DURATION.match(text)
    if not match or float(match[1]) <= 0:
        raise ValueError(f"{text!r} is not a duration (like 90s, 15m, 6h, 7d)")
    return float(match[1]) * _UNITS[match[2]]


class Maintenance:
    """Applies a `Retention` to a recording, one small unit of work per `step`."""

    def __init__(
        self, connection: sqlite3.Connection, decoder: Decoder, retention: Retention
    ) -> None:
        self._db = connection
        self._decoder = decoder
        self.retention = retention
        self._host_position = 0

    def step(self, now: float) -> bool:
        """Do one unit of work as of recorded time ``now``; False when there is nothing to do."""
        if self._expire(now):
            return True
        return any(self._thin(tier, now) for tier in self.retention.tiers)

    # --- expiry --------------------------------------------------------------------------------

    def _expire(self, now: float) -> bool:
        cutoff = to_ms(now - self.retention.keep_s)
        done = self._meta_int("expired_until")
        if done is not None and cutoff - done < to_ms(CHUNK_S):
            return False
        with self._transaction():
            for (host,) in self._db.execute("SELECT id FROM hosts").fetchall():
                # Cut at a keyframe, so that no kept delta loses the keyframe it refers to;
                # with none after the cutoff yet, the host's rows wait for the next round.
                edge = self._next_keyframe(host, cutoff)
                if edge is not None:
                    self._db.execute("DELETE FROM readings WHERE host = ? AND t < ?", (host, edge))
                # The last state before the cutoff still says how the host stood after it.
                self._db.execute(
                    "DELETE FROM states WHERE host = ? AND t < "
                    "(SELECT MAX(t) FROM states WHERE host = ? AND t < ?)",
                    (host, host, cutoff),
                )
            self._db.execute(
                "DELETE FROM episodes WHERE until IS NOT NULL AND until < ?", (cutoff / 1000,)
            )
            self._db.execute("DELETE FROM actions WHERE t < ?", (cutoff / 1000,))
            self._db.execute(
                "DELETE FROM sessions WHERE ended IS NOT NULL AND ended < ?", (cutoff / 1000,)
            )
            self._set_meta("expired_until", cutoff)
        self._db.execute("PRAGMA incremental_vacuum")
        return True

    # --- thinning ------------------------------------------------------------------------------

    def _thin(self, tier: Tier, now: float) -> bool:
        """Thin the next window of one host older than the tier's age; False when none is due.

        Windows end on a multiple of the step, so that no step-long bucket is split between
        two of them.
        """
        name = f"thinned:{tier.step_s:g}"
        step = to_ms(tier.step_s)
        start = self._meta_int(name)
        if start is None:
            (first,) = self._db.execute("SELECT MIN(t) FROM readings").fetchone()
            if first is None:
                return False
            start = first - first % step
        limit = to_ms(now - tier.age_s)
        end = min(start + to_ms(CHUNK_S), limit - limit % step)
        if end - start < step:
            return False
        hosts = [row[0] for row in self._db.execute("SELECT id FROM hosts ORDER BY id")]
        with self._transaction():
            if self._host_position < len(hosts):
                self._thin_host(hosts[self._host_position], start, end, tier.step_s)
                self._host_position += 1
            if self._host_position >= len(hosts):
                self._host_position = 0
                self._set_meta(name, end)
        return True

    def _thin_host(self, host: int, start: int, end: int, step_s: float) -> None:
        """Keep the first reading of each step in [start, end); the readings after ``end`` that
        refer to a keyframe in the window (up to the next keyframe) are encoded anew, whole.

        Without a keyframe after ``end`` yet, the recorder's current keyframe may be in the
        window: the host is left for a later round.
        """
        edge = self._next_keyframe(host, end)
        if edge is None:
            return
        rows = self._db.execute(
            "SELECT t, key, data FROM readings WHERE host = ? AND t >= ? AND t < ? ORDER BY t",
            (host, start, edge),
        ).fetchall()
        step = to_ms(step_s)
        kept, tail, buckets = [], [], set()
        for row in rows:
            if row[0] >= end:
                tail.append(row)
            elif row[0] // step not in buckets:
                buckets.add(row[0] // step)
                kept.append(row)
        if len(kept) + len(tail) == len(rows):
            return
        (name,) = self._db.execute("SELECT name FROM hosts WHERE id = ?", (host,)).fetchone()
        keyframes: dict[int, HostSnapshot] = {}

        def reading(t: int, key: int, data: bytes) -> HostSnapshot:
            if key not in keyframes:
                keyframes[key] = self._keyframe(host, name, key, data if t == key else None)
            base = keyframes[key]
            return base if t == key else self._decoder.delta(base, t, data)

        fresh = []
        try:
            for group, every in ((kept, 10 * step_s), (tail, KEYFRAME_EVERY_S)):
                encoder = HostEncoder(keyframe_every_s=every)
                for t, key, data in group:
                    row = encoder.encode(reading(t, key, data))
                    fresh.append((host, row.t, row.key, row.data))
        except RowError:
            return  # a damaged row stays as it is, for the reader to name; expiry ends it
        self._db.execute(
            "DELETE FROM readings WHERE host = ? AND t >= ? AND t < ?", (host, start, edge)
        )
        self._db.executemany("INSERT INTO readings (host, t, key, data) VALUES (?, ?, ?, ?)", fresh)

    def _next_keyframe(self, host: int, t: int) -> int | None:
        (edge,) = self._db.execute(
            "SELECT MIN(t) FROM readings WHERE host = ? AND t >= ? AND t = key", (host, t)
        ).fetchone()
        return edge

    def _keyframe(self, host: int, name: str, key: int, data: bytes | None) -> HostSnapshot:
        if data is None:
            found = self._db.execute(
                "SELECT data FROM readings WHERE host = ? AND t = ? AND key = t", (host, key)
            ).fetchone()
            if found is None:
                raise RowError("its keyframe is missing")
            (data,) = found
        return self._decoder.keyframe(name, key, data)

    # --- helpers -------------------------------------------------------------------------------

    def _meta_int(self, key: str) -> int | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        if row is None or not _WHOLE.fullmatch(str(row[0])):
            return None  # none yet, or damaged: the work is done again
        return int(row[0])

    def _set_meta(self, key: str, value: int) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, str(value)),
        )

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE … COMMIT, or ROLLBACK when the block raises."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
