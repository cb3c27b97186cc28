"""Lines that fit their widget: each cut where a word ends, and where there are more lines than
rows, the last row says how many more there are and where they all are."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.events import Resize

from gpuconsole.ui.widgets.cells import fit_text
from gpuconsole.ui.widgets.steady import Steady


class FittedLines(Steady):
    """Shows its lines fitted to its size, again whenever the size changes. Its height is the
    stylesheet's: it lays nothing out again when its lines change."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: tuple[Text, ...] = ()
        self._elsewhere = ""

    def show_lines(self, lines: Sequence[Text], elsewhere: str = "") -> None:
        """``lines``; ``elsewhere`` ends the line that says how many did not fit (where the
        user finds them all)."""
        self._lines = tuple(lines)
        self._elsewhere = elsewhere
        self._fit()

    def on_resize(self, _event: Resize) -> None:
        self._fit()

    def _fit(self) -> None:
        width = self.content_size.width or 78
        rows = self.content_size.height or len(self._lines)
        lines = list(self._lines)
        if len(lines) > rows:
            more = len(lines) - rows + 1
            lines = [*lines[: rows - 1], Text(f"+{more} more{self._elsewhere}", style="dim")]
        self.show(Text("\n").join(fit_text(line, width) for line in lines))
