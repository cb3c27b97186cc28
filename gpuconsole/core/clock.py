"""Clocks injected into sources, so that tests and snapshots can fix time."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


def wall_clock() -> float:
    """Seconds since the epoch, as the real sources stamp their readings."""
    return time.time()


class ManualClock:
    """A clock that moves only when told to: same clock + same seed = same readings."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = 1.0) -> None:
        self.now += seconds
