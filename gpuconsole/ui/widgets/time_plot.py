"""A plot of one reading over a span of time, drawn by textual-plotext: a time axis in UTC
clock times, lines at the GPU's limits, and marks where findings began and ended.

The readings are averaged into buckets of at least `MIN_BUCKET_S` (two dots of the braille
canvas per cell): an hour of 1 Hz readings does not draw 3,600 points, and a bucket without a
reading leaves a gap, where the GPU or its host did not answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from textual.app import RenderResult
from textual.color import Color, ColorParseError
from textual_plotext import PlotextPlot

MIN_BUCKET_S = 2.0
"""A bucket holds at least two 1 Hz readings, so that a reading late by a moment is no gap."""
_TICK_STEPS_S = (60, 120, 300, 600, 900, 1800, 3600)
_TICK_CELLS = 8
"""Room for one clock label ("00:15") and the space between two."""
_FRAME_ROWS = 4
"""Rows of a plot that hold no readings: the title, the frame's top and bottom, the times."""
_Rgb = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Level:
    """A horizontal line at a limit of the GPU (its slowdown temperature, its power limit)."""

    value: float
    color: str


@dataclass(frozen=True, slots=True)
class Mark:
    """A vertical line at a moment: where a finding began, or ended."""

    time: float
    color: str


@dataclass(frozen=True, slots=True)
class TimeSeries:
    """What one plot shows: ``points`` (time, value), oldest first, over ``start``..``end``."""

    title: str
    start: float
    end: float
    points: tuple[tuple[float, float], ...]
    color: str
    low: float
    high: float
    levels: tuple[Level, ...] = ()
    marks: tuple[Mark, ...] = ()


def clock_ticks(start: float, end: float, cells: int) -> tuple[list[float], list[str]]:
    """Ticks at whole minutes of UTC (every 1, 2, 5... minutes, as many as ``cells`` can
    label), as offsets from ``start`` with their ``HH:MM`` labels."""
    most = max(2, cells // _TICK_CELLS)
    step = next((s for s in _TICK_STEPS_S if (end - start) / s <= most), _TICK_STEPS_S[-1])
    first = math.ceil(start / step) * step
    moments = [float(t) for t in range(int(first), int(end) + 1, step)]
    return [t - start for t in moments], [time.strftime("%H:%M", time.gmtime(t)) for t in moments]


def value_ticks(low: float, high: float, most: int) -> list[float]:
    """Round values (steps of 1, 2, 2.5 or 5 times a power of ten) from ``low`` to ``high``:
    the most of them, up to ``most``. Give no more than the plot has rows less one, so that no
    two share a row (plotext would show one of them, not always the same)."""
    span = high - low
    if span <= 0 or most < 1:
        return []
    power = 10.0 ** math.floor(math.log10(span / max(most, 1)))
    for step in (m * power * scale for scale in (1, 10, 100) for m in (1.0, 2.0, 2.5, 5.0)):
        first = math.ceil(low / step) * step
        ticks = [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]
        if len(ticks) <= most:
            return ticks
    return [low]


def bucketed(
    points: Sequence[tuple[float, float]], start: float, end: float, buckets: int
) -> list[list[tuple[float, float]]]:
    """``points`` averaged into at most ``buckets`` equal spans of ``start``..``end`` (none
    shorter than `MIN_BUCKET_S`), as runs of consecutive buckets that hold a reading; x is the
    bucket's middle, as an offset from ``start``."""
    width = max((end - start) / max(buckets, 1), MIN_BUCKET_S)
    sums: dict[int, tuple[float, int]] = {}
    for t, value in points:
        if start <= t <= end:
            slot = min(int((t - start) / width), int((end - start) / width))
            total, count = sums.get(slot, (0.0, 0))
            sums[slot] = (total + value, count + 1)
    runs: list[list[tuple[float, float]]] = []
    previous = None
    for slot in sorted(sums):
        total, count = sums[slot]
        point = (min((slot + 0.5) * width, end - start), total / count)
        if previous is None or slot != previous + 1:
            runs.append([])
        runs[-1].append(point)
        previous = slot
    return runs


def rgb(color: str) -> _Rgb | str:
    """A theme colour as plotext takes it; plotext's own default where there is none."""
    try:
        return Color.parse(color).rgb
    except ColorParseError:
        return "default"


class TimePlot(PlotextPlot):
    """One `TimeSeries`; `show` with an equal one draws nothing again."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._series: TimeSeries | None = None

    @property
    def series(self) -> TimeSeries | None:
        return self._series

    def show(self, series: TimeSeries) -> None:
        if series != self._series:
            self._series = series
            self.refresh()

    def render(self) -> RenderResult:
        """Drawn again only when Textual asks: a new series (`show`), a new size or theme."""
        self._draw()
        return super().render()

    def _draw(self) -> None:
        plt = self.plt
        plt.clear_figure()
        series = self._series
        if series is None:
            return
        span = series.end - series.start
        plt.title(series.title)
        plt.xlim(0, span)
        plt.ylim(series.low, series.high)
        ticks = value_ticks(series.low, series.high, self.size.height - _FRAME_ROWS - 1)
        plt.yticks(ticks, [f"{tick:g}" for tick in ticks])
        plt.xticks(*clock_ticks(series.start, series.end, self.size.width))
        for level in series.levels:
            plt.hline(level.value, rgb(level.color))
        for mark in series.marks:
            if series.start <= mark.time <= series.end:
                plt.vline(mark.time - series.start, rgb(mark.color))
        runs = bucketed(series.points, series.start, series.end, 2 * self.size.width)
        for run in runs:
            plt.plot(
                [x for x, _ in run], [y for _, y in run], marker="braille", color=rgb(series.color)
            )
        if not runs:
            middle = (series.low + series.high) / 2
            plt.text("no readings", span / 2, middle, alignment="center")
