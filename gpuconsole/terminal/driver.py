"""Textual's Linux driver, writing to the terminal only the cells that changed.

`DiffDriver.write` passes everything through a `ScreenDiff`. A resize makes the shadow screen
unknown: the driver notes every size Textual is told (the SIGWINCH path asks
`_get_terminal_size`; in-band reports arrive as `Resize` events from the input thread) and the
next write, on the app's thread, starts from an unknown screen of that size. Textual repaints
the whole screen after a resize, so that repaint is written in full.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from textual import events
from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message

from gpuconsole.terminal.diff import ScreenDiff

if TYPE_CHECKING:
    from textual.app import App


class DiffDriver(LinuxDriver):
    """A Linux driver whose output goes through a `ScreenDiff`."""

    def __init__(
        self,
        app: App[Any],
        *,
        debug: bool = False,
        mouse: bool = True,
        size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size)
        self._screen: ScreenDiff | None = None
        self._notes = itertools.count(1)
        self._size_note: tuple[int, tuple[int, int]] | None = None
        """The latest size Textual was told, numbered; replaced whole, so threads may write it."""
        self._applied = 0
        self._writing = False
        self._stale = False
        self._broken = False

    def forget_screen(self) -> None:
        """The terminal may show something else now (a message written over it, a terminal
        that lost its state): the next frame is written in full."""
        self._stale = True

    def _get_terminal_size(self) -> tuple[int, int]:
        size = super()._get_terminal_size()
        self._note_size(size)
        return size

    def process_message(self, message: Message) -> None:
        if isinstance(message, events.Resize):
            self._note_size((message.size.width, message.size.height))
        super().process_message(message)

    def _note_size(self, size: tuple[int, int]) -> None:
        self._size_note = (next(self._notes), size)

    def write(self, data: str) -> None:
        if self._broken:
            super().write(data)
            return
        if self._writing:
            # A signal handler (suspend on SIGTSTP) interrupted a write: this goes out first,
            # unfiltered, and the screen is not trusted afterwards.
            super().write(data)
            self._stale = True
            return
        self._writing = True
        try:
            out = self._filter().feed(data)
        except Exception:
            # A fault in the filter must not take the console away: from here on Textual's own
            # output, which draws every cell it changes with explicit attributes.
            self._broken = True
            self._app.log.error("output filter failed; writing Textual's output unfiltered")
            out = "\x1b[0m\x1b]8;;\x1b\\" + data
        finally:
            self._writing = False
        if out:
            super().write(out)

    def _filter(self) -> ScreenDiff:
        note = self._size_note
        if self._screen is None:
            if note is None:
                note = (0, super()._get_terminal_size())
            self._screen = ScreenDiff(*note[1])
            self._applied = note[0]
        elif self._stale or (note is not None and note[0] != self._applied):
            if note is None:
                self._screen.resize(self._screen.width, self._screen.height)
            else:
                self._applied, (width, height) = note
                self._screen.resize(width, height)
            self._stale = False
        return self._screen
