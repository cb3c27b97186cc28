"""Text on the screen never carries a control character to the terminal.

Textual writes a text segment's characters to the terminal as they are; Rich leaves ESC in
them. `untrusted.visible` already turns every control character of what a host sends into a
printable stand-in where it enters the model; this guard is the last line for any text that
reached a widget another way (an error message, a file name, a bug): at the one place where
Textual turns a strip of segments into terminal output (`Strip.render`, used by both the
cell-diffing driver and Textual's own), control characters are removed from text segments.
They occupy no cells (Rich counts them as zero wide), so the layout stays as it was.
"""

from __future__ import annotations

import re
from typing import Any

from rich.segment import Segment
from textual.strip import Strip

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_render = Strip.render


def _guarded_render(self: Strip, console: Any) -> str:
    if self._render_cache is None and any(_CONTROL.search(s.text) for s in self._segments):
        clean = [Segment(_CONTROL.sub("", t), style, c) for t, style, c in self._segments]
        self._render_cache = _render(Strip(clean), console)
    return _render(self, console)


def guard_strips() -> None:
    """Install the guard (idempotent): every app of the console calls it before it draws."""
    Strip.render = _guarded_render  # type: ignore[method-assign]
