"""A trend as one line of cells, drawn straight from its parts.

A trend line changes at every reading while its history is shorter than it is wide. As a
`Static`, each change went through Textual's content pipeline (the Text made into Content, then
laid out and rendered to strips). This widget keeps its parts, each a text and a Rich style, and
makes its one strip of them only when they change.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

Part = tuple[str, str]
"""A text and the Rich style it is drawn in ("" for the widget's own)."""


class TrendLine(Widget):
    """One line of styled parts; `show` with the same parts does nothing."""

    DEFAULT_CSS = """
    TrendLine {
        height: 1;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._parts: tuple[Part, ...] = ()
        self._strip: Strip | None = None

    @property
    def plain(self) -> str:
        """What the line reads, without its styles."""
        return "".join(text for text, _ in self._parts)

    def show(self, parts: Sequence[Part]) -> None:
        shown = tuple(parts)
        if shown != self._parts:
            self._parts = shown
            self._strip = None
            self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y:
            return Strip.blank(width, base)
        strip = self._strip
        if strip is None or strip.cell_length != width:
            segments = [
                Segment(text, base + Style.parse(style) if style else base)
                for text, style in self._parts
            ]
            strip = self._strip = Strip(segments).adjust_cell_length(width, base)
        return strip

    def notify_style_update(self) -> None:
        """A theme change or a class changes the base style: make the strip again."""
        super().notify_style_update()
        self._strip = None
