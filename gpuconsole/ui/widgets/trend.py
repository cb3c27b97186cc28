"""Sparkline text on a fixed scale, so that a steady 95 % does not look like a swing."""

from __future__ import annotations

from collections.abc import Sequence

_LEVELS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], low: float, high: float, width: int) -> str:
    """The last ``width`` values as block characters between ``low`` and ``high``."""
    span = high - low
    shown = values[-width:] if width > 0 else []
    cells = []
    for value in shown:
        level = 0.0 if span <= 0 else (min(max(value, low), high) - low) / span
        cells.append(_LEVELS[min(int(level * len(_LEVELS)), len(_LEVELS) - 1)])
    return "".join(cells).rjust(width)
