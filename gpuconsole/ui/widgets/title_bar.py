"""The title line at the top of every screen: the fleet, where the user is, and when the newest
reading was taken, fitted to the width.

A line made of parts: on the left what the fleet is (its name, its hosts' states, its GPUs, its
problems), on the right where the user is and when the readings shown were taken. Where the line
is short, the least telling parts shorten first, then go (`Part.rank`); the screen's name never
goes, nor do the fleet's problems and the time while there is any room for them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.events import Resize

from gpuconsole.core.model import HostState, Severity
from gpuconsole.fleet.host_state import DRAIN, state_word
from gpuconsole.fleet.store import FleetStore
from gpuconsole.fleet.triage_list import TriageItem
from gpuconsole.ui.widgets.cells import Palette, duration
from gpuconsole.ui.widgets.steady import Steady

_SEPARATOR = " · "
_MIN_GAP = 2


@dataclass(frozen=True, slots=True)
class Part:
    """A piece of the title line: its forms, the fullest first, and its rank. Where the line is
    too long, the part of the highest rank takes its next form, then goes; rank 0 never goes."""

    forms: tuple[Text, ...]
    rank: int
    right: bool = False
    """Shown on the right, with where the user is."""


def part(*forms: Text | str, rank: int, right: bool = False) -> Part:
    return Part(tuple(Text(f) if isinstance(f, str) else f for f in forms), rank, right)


def fit_title(parts: Sequence[Part], width: int) -> Text:
    """The parts in ``width`` cells: the left ones, then the right ones flush right."""
    chosen = [0] * len(parts)

    def line() -> Text:
        shown = [(p, p.forms[c]) for p, c in zip(parts, chosen, strict=True) if c < len(p.forms)]
        left = Text(_SEPARATOR).join(form for p, form in shown if not p.right)
        right = Text(_SEPARATOR).join(form for p, form in shown if p.right)
        gap = width - left.cell_len - right.cell_len
        if not left.plain or not right.plain:
            return left + right
        return left + Text(" " * max(gap, _MIN_GAP)) + right

    fitted = line()
    while fitted.cell_len > width:
        candidates = [
            i for i, p in enumerate(parts) if chosen[i] < len(p.forms) - (0 if p.rank else 1)
        ]
        if not candidates:
            break
        worst = max(candidates, key=lambda i: (parts[i].rank, i))
        chosen[worst] += 1
        fitted = line()
    return fitted


def fleet_parts(
    store: FleetStore, label: str, palette: Palette, problems: Sequence[TriageItem]
) -> list[Part]:
    """'gpuconsole · demo rack · 6 hosts: 5 live, 1 down · 40 GPUs · 2 critical, 1 warning':
    the hosts counted by their state word and by the severity of their worst problem."""
    states = Counter(state_word(store.status(h).state, store.latest(h)) for h in store.hosts)
    worst: dict[str, Severity] = {}
    for problem in problems:
        worst[problem.host] = max(problem.severity, worst.get(problem.host, problem.severity))
    severities = Counter(worst.values())
    gpus = sum(len(s.gpus) for host in store.hosts if (s := store.latest(host)) is not None)
    counted = ", ".join(f"{n} {word}" for word, n in _ordered(states))
    parts = [
        part(Text("gpuconsole", style="bold"), rank=7),
        part(label, rank=4),
        part(f"{len(store.hosts)} hosts: {counted}", counted, rank=3),
        part(f"{gpus} GPUs", rank=6),
    ]
    for severity in (Severity.CRITICAL, Severity.WARNING):
        if severities[severity]:
            word = "critical" if severity is Severity.CRITICAL else "warning"
            style = f"bold {palette.severity(severity)}"
            shown = f"{severities[severity]} {word}"
            parts.append(part(Text(shown, style=style), rank=1))
    return parts


def reading_part(newest: float | None, now: float, stale: bool, palette: Palette) -> Part | None:
    """When the newest reading shown was taken (UTC), and, once it is stale, how long ago."""
    if newest is None:
        return None
    stamp = time.strftime("%H:%M:%S", time.gmtime(newest))
    if not stale:
        return part(
            Text(f"read {stamp} UTC", style="dim"), Text(stamp, style="dim"), rank=2, right=True
        )
    style = f"bold {palette['severity-warning']}"
    ago = f"{duration(now - newest)} ago"
    return part(
        Text(f"read {stamp} UTC, {ago}", style=style), Text(ago, style=style), rank=1, right=True
    )


def _ordered(words: Counter[str]) -> list[tuple[str, int]]:
    """The state words counted, in `HostState`'s order, ``drain`` after ``live``."""
    order = [HostState.LIVE.value, DRAIN, *(s.value for s in HostState if s is not HostState.LIVE)]
    return [(word, words[word]) for word in order if words[word]]


class TitleBar(Steady):
    """Shows its parts fitted to its width, again whenever the width changes."""

    DEFAULT_CSS = """
    TitleBar {
        height: 1;
        padding: 0 1;
        background: $panel;
    }
    """

    def __init__(self) -> None:
        super().__init__(id="title-bar")
        self._parts: tuple[Part, ...] = ()

    def show_parts(self, parts: Sequence[Part]) -> None:
        self._parts = tuple(parts)
        self.show(fit_title(self._parts, self.content_size.width or 78))

    def on_resize(self, _event: Resize) -> None:
        self.show(fit_title(self._parts, self.content_size.width or 78))
