"""A Static that repaints only when what it shows changes.

`Static.update` repaints the widget (border included) even when the new content equals the old;
at one update a second per widget, that is a few hundred bytes a second to the terminal for
nothing. Screens call `show` every tick and only a real change reaches the terminal.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuconsole.widgets.keyed_table import same_cell


class Steady(Static):
    """Shows a Text or a string; `show` with the same content does nothing."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, markup=False)
        self._shown: Text | str | None = None

    def show(self, content: Text | str) -> None:
        if self._shown is not None and same_cell(content, self._shown):
            return
        self._shown = content
        self.update(content)
