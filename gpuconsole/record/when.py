"""Times as the console writes and reads them: UTC, to the second.

A user asks for a moment as ``03:12`` (the latest such time in the recording), ``03:12:05``,
``2026-01-01 03:12``, an ISO 8601 time with its offset (``2026-01-01T03:12+08:00``), or epoch
seconds. Bare times are UTC, as every screen shows them.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone

LATEST_S = float(1 << 34)
"""No time read from a file is later than this (the year 2514): a time past it, like a 400-digit
number, is not a time (and `time.gmtime` could not show it)."""
_TIME_OF_DAY = re.compile(r"^\s*(\d{1,2}):(\d{2})(?::(\d{2}))?\s*$")
_EPOCH = re.compile(r"^\s*\d{9,}(?:\.\d+)?\s*$")


def is_time(value: object) -> bool:
    """Whether ``value`` (read from a file) is a time: epoch seconds, 1970 to `LATEST_S`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return 0.0 <= value <= LATEST_S  # NaN compares false


def clock(t: float) -> str:
    """``03:12:05``."""
    return time.strftime("%H:%M:%S", time.gmtime(t))


def stamp(t: float) -> str:
    """``2026-01-01 03:12:05 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def file_stamp(t: float) -> str:
    """``20260101T031205Z``: for file names."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def parse_moment(text: str, start: float | None = None, end: float | None = None) -> float:
    """``text`` as epoch seconds; ValueError with the reason otherwise.

    A time of day alone is the latest such moment at or before ``end`` (and, when that falls
    before ``start``, the first one after it): "what happened at 03:12" means the last 03:12.
    """
    if _EPOCH.match(text):
        if not is_time(float(text)):
            raise ValueError(f"{text[:40]!r} is later than any time ({stamp(LATEST_S)})")
        return float(text)
    if match := _TIME_OF_DAY.match(text.strip().removesuffix("UTC")):
        hours, minutes, seconds = int(match[1]), int(match[2]), int(match[3] or 0)
        if hours > 23 or minutes > 59 or seconds > 59:
            raise ValueError(f"{text!r} is not a time of day")
        reference = datetime.fromtimestamp(end if end is not None else time.time(), timezone.utc)
        moment = reference.replace(hour=hours, minute=minutes, second=seconds, microsecond=0)
        if moment > reference:
            moment -= timedelta(days=1)
        if start is not None and moment.timestamp() < start:
            moment += timedelta(days=1)
        return moment.timestamp()
    spelled = text.strip().removesuffix("UTC").strip()
    if spelled.endswith("Z"):  # Python 3.10's fromisoformat does not read "Z"
        spelled = spelled[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(spelled.replace(" ", "T", 1))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time (try 03:12, 2026-01-01 03:12 or an ISO 8601 time)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()
