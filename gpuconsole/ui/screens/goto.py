"""Replay's `g`: a modal that asks for the time to move the cursor to."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class GoToScreen(ModalScreen[str | None]):
    """Asks for a time: ``03:12``, ``2026-01-01 03:12:05``, ``+5m``, ``-90s``."""

    BINDINGS = [Binding("escape", "dismiss_none", "Cancel", id="replay.goto-cancel")]
    CSS = """
    GoToScreen { align: center middle; }
    GoToScreen #goto-body {
        width: 64;
        height: auto;
        padding: 1 2;
        border: round $primary;
        background: $surface;
    }
    """

    def compose(self) -> ComposeResult:
        with Vertical(id="goto-body"):
            yield Static("Go to (UTC): 03:12, 2026-01-01 03:12:05, +5m or -90s", markup=False)
            yield Input(placeholder="time", id="goto-input")

    @on(Input.Submitted, "#goto-input")
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
