"""The replay's time cursor: one line under every screen with the cursor's time, play state and
a timeline of the recording where warning and critical findings begin."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from gpuconsole.core.model import Severity
from gpuconsole.fleet.record.when import clock, stamp
from gpuconsole.ui.widgets.cells import Palette

_MIN_TIMELINE = 10


@dataclass(frozen=True, slots=True)
class CursorState:
    """What the bar shows."""

    start: float
    end: float
    cursor: float
    playing: bool
    speed: int
    onsets: Sequence[tuple[float, Severity]]
    """When findings began, with the worst severity that began then, in time order."""
    recorded: bool = True
    """False in a gap: no console was recording at the cursor."""


def cursor_line(state: CursorState, width: int, palette: Palette) -> Text:
    """``▶ 2026-01-01 03:12:05 UTC ├──┃──●───┤ 00:00:00–23:59:59 10×``."""
    glyph = "▶" if state.playing else "⏸"
    head = Text.assemble((f"{glyph} ", "bold"), (stamp(state.cursor), "bold"))
    if not state.recorded:
        head.append(" (not recorded)", style=palette["severity-warning"])
    tail = Text(f" {clock(state.start)}–{clock(state.end)}", style="dim")
    tail.append(f" {state.speed}×")
    room = width - head.cell_len - tail.cell_len - 4
    if room < _MIN_TIMELINE:
        return Text.assemble(head, tail)
    return Text.assemble(head, " ├", timeline(state, room, palette), "┤", tail)


def timeline(state: CursorState, width: int, palette: Palette) -> Text:
    """``width`` cells over the recording: onsets marked ``┃`` in their severity's colour, the
    cursor ``●``."""
    span = max(state.end - state.start, 1e-9)
    worst: dict[int, Severity] = {}
    for t, severity in state.onsets:
        cell = min(width - 1, max(0, int((t - state.start) / span * width)))
        worst[cell] = max(severity, worst.get(cell, severity))
    at = min(width - 1, max(0, int((state.cursor - state.start) / span * width)))
    line = Text()
    for cell in range(width):
        if cell == at:
            line.append("●", style="bold")
        elif cell in worst:
            line.append("┃", style=palette.severity(worst[cell]))
        else:
            line.append("─", style="dim")
    return line


class CursorBar(Static):
    """Docked under a screen's content; the replay app updates every bar it put on a screen."""

    DEFAULT_CSS = """
    CursorBar {
        dock: bottom;
        height: 1;
        padding: 0 1;
        background: $panel;
        margin-bottom: 1;
    }
    """

    def __init__(self) -> None:
        super().__init__(markup=False)
        self._state: CursorState | None = None

    def show(self, state: CursorState, palette: Palette) -> None:
        self._state = state
        self.update(cursor_line(state, max(20, (self.size.width or 120) - 2), palette))

    def on_resize(self) -> None:
        if self._state is not None:
            app_palette = getattr(self.app, "palette", None)
            if app_palette is not None:
                self.show(self._state, app_palette)
