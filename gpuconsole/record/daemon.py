"""Recording without the UI (`gpuconsole record`): the console's polling loop, headless.

Each round reads every host, feeds the store and the alert engine as the console does, and
hands the round to the recorder. Rounds are chained (the next starts one interval after the last
one started, never overlapping), until ``stop`` is set or ``duration`` has passed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from gpuconsole.alerts.defaults import DEFAULT_RULES
from gpuconsole.alerts.rules import AlertRule
from gpuconsole.poller import collect
from gpuconsole.record.recorder import Recorder
from gpuconsole.record.timeline import Timeline
from gpuconsole.rounds import primed, take_round
from gpuconsole.telemetry import Source

HISTORY_SECONDS = 120


def record_fleet(
    source: Source,
    recorder: Recorder,
    rules: Sequence[AlertRule] = DEFAULT_RULES,
    *,
    interval: float = 1.0,
    stop: threading.Event | None = None,
    duration: float | None = None,
    on_round: Callable[[int], None] | None = None,
) -> str | None:
    """Record until stopped; returns why recording failed (one line), or None."""
    stop = stop or threading.Event()
    store, alerts = primed(source, HISTORY_SECONDS, rules)
    timeline = Timeline(recorder)
    began = time.monotonic()
    rounds = 0
    while not stop.is_set():
        started = time.monotonic()
        readings = collect(source)
        changed = take_round(store, alerts, readings)
        if rounds == 0:
            changed |= set(store.hosts)  # the first round states every host's findings
        problem = timeline.note(store, readings, changed, alerts.active())
        if problem is not None:
            return problem
        rounds += 1
        if on_round is not None:
            on_round(rounds)
        if duration is not None and time.monotonic() - began >= duration:
            break
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    return recorder.error
