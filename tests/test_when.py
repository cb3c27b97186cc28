"""Where a time the user types lands in a recording (`record.when.resolve_moment`): always inside
its span, or refused in one line that names the span. Properties over random spans (seconds to
days, across midnight) and random texts, checked against a plain count of UTC days; then the
issue's cases."""

from __future__ import annotations

import calendar
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuconsole.fleet.record.when import LATEST_S, clock, resolve_moment, stamp

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DAY = 86400
NAME = "rec.sqlite"


@dataclass(frozen=True)
class Span:
    start: float
    end: float


@st.composite
def spans(draw: st.DrawFn) -> Span:
    """A recording's first and last reading, to the millisecond as recordings keep them: from a
    single reading to days long, often across a midnight (UTC)."""
    length_ms = draw(
        st.one_of(
            st.integers(0, 60_000),
            st.integers(0, 3_600_000),
            st.integers(0, 4 * DAY * 1000),
        )
    )
    if draw(st.booleans()):  # begin shortly before a midnight
        day = draw(st.integers(1, int(LATEST_S) // DAY - 10))
        start_ms = day * DAY * 1000 - draw(st.integers(0, 3_600_000))
    else:
        start_ms = draw(st.integers(0, (int(LATEST_S) - 5 * DAY) * 1000))
    return Span(start_ms / 1000, (start_ms + length_ms) / 1000)


@dataclass(frozen=True)
class TimeOfDay:
    text: str
    seconds: int | None
    """Of the day, when the text is a valid time of day."""
    grain: int


@st.composite
def times_of_day(draw: st.DrawFn) -> TimeOfDay:
    """``HH:MM`` or ``HH:MM:SS`` (sometimes ``H:MM``, sometimes with `` UTC``), a few of them out
    of range (``24:00``, ``12:60``)."""
    hours, minutes = draw(st.integers(0, 25)), draw(st.integers(0, 61))
    seconds = draw(st.none() | st.integers(0, 61))
    text = f"{hours:02d}:{minutes:02d}" if draw(st.booleans()) else f"{hours}:{minutes:02d}"
    if seconds is not None:
        text += f":{seconds:02d}"
    text += draw(st.sampled_from(["", " UTC", " "]))
    valid = hours <= 23 and minutes <= 59 and (seconds or 0) <= 59
    of_day = hours * 3600 + minutes * 60 + (seconds or 0)
    return TimeOfDay(text, of_day if valid else None, 60 if seconds is None else 1)


@dataclass(frozen=True)
class Absolute:
    text: str
    moment: float
    grain: int


@st.composite
def iso_times(draw: st.DrawFn) -> Absolute:
    """An ISO 8601 date and time as users type it: a space or ``T``, to the minute or second or
    a fraction of one, with no offset (UTC), ``Z`` or ``±HH:MM``."""
    year, month = draw(st.integers(1970, 2500)), draw(st.integers(1, 12))
    day = draw(st.integers(1, calendar.monthrange(year, month)[1]))
    hours, minutes, seconds = draw(st.integers(0, 23)), draw(st.integers(0, 59)), None
    text = f"{year:04d}-{month:02d}-{day:02d}{draw(st.sampled_from(['T', ' ']))}"
    text += f"{hours:02d}:{minutes:02d}"
    fraction = ""
    if draw(st.booleans()):
        seconds = draw(st.integers(0, 59))
        text += f":{seconds:02d}"
        if draw(st.booleans()):
            fraction = str(draw(st.integers(0, 999_999)))
            text += f".{fraction}"
    offset_minutes = draw(st.sampled_from([None, 0, 480, -300, 330, -(23 * 60 + 59)]))
    if offset_minutes is None:
        offset_minutes = 0
    elif offset_minutes == 0 and draw(st.booleans()):
        text += "Z"
    else:
        sign = "-" if offset_minutes < 0 else "+"
        text += f"{sign}{abs(offset_minutes) // 60:02d}:{abs(offset_minutes) % 60:02d}"
    moment = calendar.timegm((year, month, day, hours, minutes, seconds or 0))
    moment -= offset_minutes * 60
    return Absolute(text, moment + float(f"0.{fraction or 0}"), 60 if seconds is None else 1)


epochs = st.builds(
    lambda whole, fraction: Absolute(f"{whole}{fraction}", float(f"{whole}{fraction}"), 1),
    st.integers(100_000_000, 1 << 35),
    st.sampled_from(["", ".5", ".001", ".999999"]),
)


def latest_of_day(of_day: int, grain: int, span: Span) -> float | None:
    """The oracle, by counting days: the latest day whose ``of_day`` names a stretch (of
    ``grain`` seconds) that the span reaches into, as the moment inside the span."""
    found = None
    for day in range(int(span.start) // DAY - 1, int(span.end) // DAY + 2):
        moment = day * DAY + of_day
        if moment <= span.end and moment + grain > span.start:
            found = max(moment, span.start)
    return found


def check_refusal(message: str, span: Span) -> None:
    """One line that names the recording and what it holds."""
    assert len(message.splitlines()) == 1, message
    assert f"{NAME} holds " in message or f"not in {NAME}, which holds " in message
    assert stamp(span.start).removesuffix(" UTC") in message and clock(span.end) in message


def resolved(text: str, span: Span) -> float | str:
    """The moment, or the refusal's message."""
    try:
        return resolve_moment(text, span.start, span.end, NAME)
    except ValueError as error:
        return str(error)


@PROPERTY
@given(span=spans(), at=times_of_day())
def test_a_time_of_day_is_its_latest_moment_in_the_span_or_refused(
    span: Span, at: TimeOfDay
) -> None:
    got = resolved(at.text, span)
    expected = None if at.seconds is None else latest_of_day(at.seconds, at.grain, span)
    if expected is None:
        assert isinstance(got, str), f"{at.text} gave {got} outside {span}"
        check_refusal(got, span)
    else:
        assert got == expected
        assert span.start <= got <= span.end


@PROPERTY
@given(span=spans(), at=st.one_of(iso_times(), epochs))
def test_a_date_and_time_is_used_as_it_is_when_the_span_holds_it(span: Span, at: Absolute) -> None:
    got = resolved(at.text, span)
    if at.moment <= span.end and at.moment + at.grain > span.start:
        assert got == max(at.moment, span.start)
    else:
        assert isinstance(got, str), f"{at.text} gave {got} outside {span}"
        check_refusal(got, span)


@st.composite
def moments_in(draw: st.DrawFn, span: Span) -> str:
    """A moment inside the span, written as a user would copy it from the screen."""
    t = draw(st.floats(span.start, span.end))
    return draw(
        st.sampled_from(
            [clock(t), clock(t)[:5], stamp(t), stamp(t).removesuffix(" UTC"), f"{t:.3f}"]
        )
    )


@PROPERTY
@given(data=st.data(), span=spans())
def test_a_moment_copied_from_inside_the_span_is_found_there(
    data: st.DataObject, span: Span
) -> None:
    text = data.draw(moments_in(span))
    got = resolved(text, span)
    assert isinstance(got, float), got
    assert span.start <= got <= span.end


@PROPERTY
@given(
    span=spans(),
    text=st.text(max_size=60)
    | st.text(alphabet="0123456789:-+.TZ UTC\n\x1b", max_size=30)
    | st.sampled_from(["", " ", "now", "24:00", "12:60", "2026-02-30 01:00", "9" * 400]),
)
def test_anything_typed_lands_inside_the_span_or_is_refused_in_one_line(
    span: Span, text: str
) -> None:
    got = resolved(text, span)
    if isinstance(got, str):
        check_refusal(got, span)
    else:
        assert span.start <= got <= span.end


# --- the cases ---------------------------------------------------------------------------

START = calendar.timegm((2026, 12, 3, 8, 43, 10)) + 0.4
END = calendar.timegm((2026, 12, 3, 8, 49, 55)) + 0.7


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("08:45", "2026-12-03 08:45:00"),
        ("08:45:30 UTC", "2026-12-03 08:45:30"),
        ("08:43", "2026-12-03 08:43:10"),  # the minute the recording begins in: its start
        ("08:49:55", "2026-12-03 08:49:55"),
        ("2026-12-03 08:47", "2026-12-03 08:47:00"),
        ("2026-12-03T16:47:05+08:00", "2026-12-03 08:47:05"),
        ("2026-12-03T08:47:05Z", "2026-12-03 08:47:05"),
        (str(calendar.timegm((2026, 12, 3, 8, 46, 0))), "2026-12-03 08:46:00"),
    ],
)
def test_times_inside_the_recording(text: str, expected: str) -> None:
    assert stamp(resolve_moment(text, START, END, NAME)) == f"{expected} UTC"


HOLDS = "2026-12-03 08:43:10 to 08:49:55 UTC"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("07:00", f"07:00: not in rec.sqlite, which holds {HOLDS}"),
        ("08:43:09", f"08:43:09: not in rec.sqlite, which holds {HOLDS}"),
        ("08:50", f"08:50: not in rec.sqlite, which holds {HOLDS}"),
        ("2026-12-04 08:45", f"'2026-12-04 08:45': not in rec.sqlite, which holds {HOLDS}"),
        (
            "lunchtime",
            "lunchtime: not a time (try 03:12, 2026-01-01 03:12, an ISO 8601 time or epoch "
            f"seconds); rec.sqlite holds {HOLDS}",
        ),
        ("25:00", f"25:00: not a time of day; rec.sqlite holds {HOLDS}"),
        (
            "a\nb",
            f"a␊b: not a time (try 03:12, 2026-01-01 03:12, an ISO 8601 time or epoch "
            f"seconds); rec.sqlite holds {HOLDS}",
        ),
    ],
)
def test_times_outside_the_recording_are_refused_naming_its_span(text: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        resolve_moment(text, START, END, NAME)
    assert str(refused.value) == message


def test_across_midnight_a_time_of_day_is_the_one_the_recording_holds() -> None:
    start = calendar.timegm((2026, 12, 3, 23, 58, 0))
    end = calendar.timegm((2026, 12, 4, 0, 3, 0))
    assert stamp(resolve_moment("23:59", start, end, NAME)) == "2026-12-03 23:59:00 UTC"
    assert stamp(resolve_moment("00:01", start, end, NAME)) == "2026-12-04 00:01:00 UTC"
    with pytest.raises(ValueError, match="which holds 2026-12-03 23:58:00 to 2026-12-04 00:03:00"):
        resolve_moment("12:00", start, end, NAME)


def test_over_days_a_time_of_day_is_the_latest_one() -> None:
    start = calendar.timegm((2026, 12, 1, 0, 0, 0))
    end = calendar.timegm((2026, 12, 3, 12, 0, 0))
    assert stamp(resolve_moment("03:12", start, end, NAME)) == "2026-12-03 03:12:00 UTC"
    assert stamp(resolve_moment("13:00", start, end, NAME)) == "2026-12-02 13:00:00 UTC"
