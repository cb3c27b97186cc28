"""A Static that repaints only when what it shows changes.

`Static.update` repaints the widget (border included) even when the new content equals the old,
and lays out the whole screen again; at one update a second per widget, that is a few hundred
bytes a second to the terminal and a layout per tick for nothing. Screens call `show` every tick:
only a real change is painted, and only a widget sized by its content asks for a layout.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuconsole.ui.widgets.keyed_table import same_cell


class Steady(Static):
    """Shows a Text or a string; `show` with the same content does nothing."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, markup=False)
        self._shown: Text | str | None = None

    def show(self, content: Text | str) -> None:
        before = self._shown
        if before is not None and same_cell(content, before):
            return
        self._shown = content
        self.update(content, layout=before is None or self._resized(before, content))

    def _resized(self, before: Text | str, after: Text | str) -> bool:
        """Whether the new content can change this widget's size, and so the screen's layout.

        A layout of the whole screen costs more than the repaint itself: a title bar or a trend
        line whose size the stylesheet fixes never needs one, nor does a list of unwrapped lines
        that keeps its number of lines.
        """
        height, width = self.styles.height, self.styles.width
        if width is not None and width.is_auto:
            return True
        if height is None or height.is_auto:
            wraps = self.styles.text_wrap != "nowrap"
            return wraps or _lines(before) != _lines(after)
        return False


def _lines(content: Text | str) -> int:
    plain = content.plain if isinstance(content, Text) else content
    return plain.count("\n") + 1
