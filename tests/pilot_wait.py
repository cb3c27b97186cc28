"""Waiting, in a pilot test, for something a worker or another process does."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.pilot import Pilot


async def until(pilot: Pilot[object], condition: Callable[[], bool], timeout: float) -> None:
    """Let the app run until ``condition`` holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.1)
