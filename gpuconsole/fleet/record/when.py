"""Times as the console writes and reads them: UTC, to the second.

A user asks for a moment of a recording as ``03:12`` (the latest such time in the recording),
``03:12:05``, ``2026-01-01 03:12``, an ISO 8601 time with its offset (``2026-01-01T03:12+08:00``),
or epoch seconds; `resolve_moment` decides which moment that is, or refuses it, for every caller.
Bare times are UTC, as every screen shows them.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone

from gpuconsole.core.untrusted import visible

LATEST_S = float(1 << 34)
"""No time read from a file is later than this (the year 2514): a time past it, like a 400-digit
number, is not a time (and `time.gmtime` could not show it)."""
_TIME_OF_DAY = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", re.ASCII)
_EPOCH = re.compile(r"\d+(?:\.\d+)?", re.ASCII)
_DATE_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[T ](\d{2})(?::(\d{2})(?::(\d{2})(?:[.,](\d+))?)?)?)?"
    r"\s*(Z|[+-]\d{2}(?::?\d{2})?)?",
    re.IGNORECASE | re.ASCII,
)
"""The ISO 8601 times a user types: a date, a time to the hour, minute, second or a fraction of
one (``T`` or a space between), and an offset (``Z``, ``+08``, ``-05:30``; none is UTC). Read
here, not by `datetime.fromisoformat`, whose forms differ from one Python to the next."""


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


def resolve_moment(text: str, start: float, end: float, holder: str) -> float:
    """The moment ``text`` names inside ``holder``'s span [start, end], as epoch seconds; else a
    ValueError whose message is one line naming the span, so the user can pick a time in it.

    A time of day alone (``03:12``, ``03:12:05``) is the latest such moment in the span: "what
    happened at 03:12" asks about the last 03:12 the recording holds, never one before it began
    or after it ended. A date and time (ISO 8601, an offset allowed) or epoch seconds is that
    moment, if the span holds it. A text names a stretch as long as it is precise (``03:12`` a
    minute, ``03:12:05`` a second, a date a day): when the span begins inside that stretch
    (``08:43`` of a recording from 08:43:10.4), the answer is the span's start, so every time
    the refusal shows (to the second) can be typed back.
    """
    try:
        moment, grain = _spelled(text)
    except ValueError as error:
        raise ValueError(f"{_quoted(text)}: {error}; {holder} holds {_span(start, end)}") from None
    if isinstance(moment, tuple):  # a time of day: its last occurrence at or before the end
        hours, minutes, seconds = moment
        last = datetime.fromtimestamp(end, timezone.utc)
        day = last.replace(hour=hours, minute=minutes, second=seconds, microsecond=0)
        moment = (day if day <= last else day - timedelta(days=1)).timestamp()
    if moment <= end and moment + grain > start:
        return max(moment, start)
    raise ValueError(f"{_quoted(text)}: not in {holder}, which holds {_span(start, end)}")


def _spelled(text: str) -> tuple[float | tuple[int, int, int], float]:
    """What ``text`` names (epoch seconds, or a time of day as hours, minutes and seconds) and
    the seconds its precision covers; ValueError with the reason when it names no time."""
    plain = text.strip().removesuffix("UTC").strip()
    if _EPOCH.fullmatch(plain):
        return float(plain), 1.0
    if match := _TIME_OF_DAY.fullmatch(plain):
        hours, minutes, seconds = int(match[1]), int(match[2]), int(match[3] or 0)
        if hours > 23 or minutes > 59 or seconds > 59:
            raise ValueError("not a time of day")
        return (hours, minutes, seconds), 60.0 if match[3] is None else 1.0
    match = _DATE_TIME.fullmatch(plain)
    if match is None:
        raise ValueError(
            "not a time (try 03:12, 2026-01-01 03:12, an ISO 8601 time or epoch seconds)"
        )
    year, month, day, hours, minutes, seconds, fraction, offset = match.groups()
    try:
        moment = datetime(
            int(year),
            int(month),
            int(day),
            int(hours or 0),
            int(minutes or 0),
            int(seconds or 0),
            tzinfo=_offset(offset),
        )
    except ValueError as error:
        raise ValueError(f"not a time ({error})") from None
    grain = 1.0 if seconds else 60.0 if minutes else 3600.0 if hours else 86400.0
    return moment.timestamp() + float(f"0.{fraction or 0}"), grain


def _offset(text: str | None) -> timezone:
    """``Z``, ``+08``, ``-05:30`` or ``+0530`` as a time zone; none written is UTC."""
    if text is None or text.upper() == "Z":
        return timezone.utc
    digits = text[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:] or 0)
    if hours > 23 or minutes > 59:
        raise ValueError(f"UTC offset {text} is out of range")
    sign = -1 if text[0] == "-" else 1
    return timezone(sign * timedelta(hours=hours, minutes=minutes))


def _span(start: float, end: float) -> str:
    """``2026-01-01 03:10:00 to 03:40:00 UTC``; the end's date too when it is another day."""
    if time.gmtime(start)[:3] == time.gmtime(end)[:3]:
        return f"{stamp(start).removesuffix(' UTC')} to {clock(end)} UTC"
    return f"{stamp(start).removesuffix(' UTC')} to {stamp(end)}"


def _quoted(text: str) -> str:
    """What the user typed, as a refusal quotes it: made visible, cut short, and in quotes
    where it is empty or holds a space (so the refusal's colon is not mistaken for part of it).
    """
    shown = visible(text, 40)
    return shown if shown and not any(c.isspace() for c in shown) else f"'{shown}'"
