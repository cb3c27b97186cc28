"""NO_COLOR (no-color.org): the console writes no colour at all.

Textual honours NO_COLOR by turning every colour into a grey (its `Monochrome` filter): the
terminal still receives 256-colour codes, and text the themes colour as a warning (CRIT, 92 °C)
comes out a grey dimmer than the rest. Here the colours are taken out of every segment instead,
and emphasis is left to the attributes (bold, dim, reverse, underline), which the console's
no-colour palette (`widgets.cells.NO_COLOUR_BANDS`) and stylesheet use where colour would speak.
"""

from __future__ import annotations

from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.filter import LineFilter


@lru_cache(maxsize=1024)
def _without_colour(style: Style) -> Style:
    """The style's attributes, link and meta (where Textual keeps what a click on it does)."""
    plain = style.without_color
    return plain + Style.from_meta(style.meta) if style.meta else plain


class Colourless(LineFilter):
    """Remove every foreground, background and underline colour; keep the attributes."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        return [
            Segment(text, None if style is None else _without_colour(style), control)
            for text, style, control in segments
        ]


def colourless() -> list[LineFilter]:
    """The line filters of an app under NO_COLOR: only `Colourless`. Textual's own (colours to
    greys, ANSI colours to truecolor, dim as a blended colour) would each bring colour back."""
    return [Colourless()]
