"""Lines that fit their widget: each wrapped where words end onto as many rows as it needs, and
where they need more rows than there are, the last row says how many lines did not fit and
where they all are."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.events import Resize

from gpuconsole.ui.widgets.cells import ELLIPSIS, fit_text, wrap_text
from gpuconsole.ui.widgets.steady import Steady


class FittedLines(Steady):
    """Shows its lines wrapped to its width and fitted to its height, again whenever the size
    changes. Its height is the stylesheet's (its owner sets it from `rows_needed`): it lays
    nothing out again when its lines change."""

    def __init__(
        self, *, indent: int = 0, id: str | None = None, classes: str | None = None
    ) -> None:
        """``indent``: the blanks that start each wrapped row after a line's first."""
        super().__init__(id=id, classes=classes)
        self._indent = indent
        self._lines: tuple[Text, ...] = ()
        self._elsewhere = ""

    def show_lines(self, lines: Sequence[Text], elsewhere: str = "") -> None:
        """``lines``; ``elsewhere`` ends the line that says how many did not fit (where the
        user finds them all)."""
        self._lines = tuple(lines)
        self._elsewhere = elsewhere
        self._fit()

    def rows_needed(self, lines: Sequence[Text], width: int) -> int:
        """How many rows ``lines`` take wrapped to ``width`` cells."""
        return sum(len(wrap_text(line, width, self._indent)) for line in lines)

    def on_resize(self, _event: Resize) -> None:
        self._fit()

    def _fit(self) -> None:
        width = self.content_size.width or 78
        wrapped = [wrap_text(line, width, self._indent) for line in self._lines]
        every = [row for line_rows in wrapped for row in line_rows]
        rows = self.content_size.height or len(every)
        if len(every) <= rows:
            self.show(Text("\n").join(every))
            return
        room = rows - 1  # the last row says what did not fit
        shown: list[Text] = []
        whole = 0
        for line_rows in wrapped:
            if len(shown) + len(line_rows) > room:
                break
            shown.extend(line_rows)
            whole += 1
        if not whole and room > 0:  # the first line alone is too long: its first rows, cut
            first = wrapped[0]
            shown = [*first[: room - 1], fit_text(first[room - 1] + ELLIPSIS, width)]
            whole = 1
        note = Text(f"+{len(wrapped) - whole} more{self._elsewhere}", style="dim")
        self.show(Text("\n").join([*shown, fit_text(note, width)]))
