"""Textual's Linux driver, writing to the terminal only the cells that changed.

`DiffDriver.write` passes everything through a `ScreenDiff`. A resize makes the shadow screen
unknown: the driver notes every size Textual is told (the SIGWINCH path asks
`_get_terminal_size`; in-band reports arrive as `Resize` events from the input thread) and the
next write, on the app's thread, starts from an unknown screen of that size. Textual repaints
the whole screen after a resize, so that repaint is written in full.

`StoppingDriver`, under it, makes SIGTERM and SIGHUP leave the terminal as `q` does, and a
terminal that is gone without a SIGHUP too; `QuietInputDriver`, under that, reads the keys on a
thread that sleeps until there are some.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import signal
import termios
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from textual import events
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message

from gpuconsole.ui.terminal.diff import ScreenDiff
from gpuconsole.ui.terminal.keys import WakingEvent, read_keys

if TYPE_CHECKING:
    from textual.app import App


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""What stops the console besides its keys: `kill`, a supervisor, a dropped SSH session."""
STOP_GRACE_S = 5.0
"""How long the way out may take after a stop signal before the terminal is restored at once:
the app's exit takes well under a second, unless the terminal is gone and Textual's writes wait
on it (a dropped SSH session)."""
LEAVE = (
    "\x1b[?2026l\x1b[0m\x1b[?2004l\x1b[?7h\x1b[?2048l\x1b[?1000l\x1b[?1003l\x1b[?1015l"
    "\x1b[?1006l\x1b[<u\x1b[?1049l\x1b[?25h\x1b[?1004l"
)
"""What Textual's `stop_application_mode` turns off (paste, wrap, in-band resize, mouse, the
kitty keyboard, the alternate screen, focus reports; the cursor shown), after ending a frame."""


class QuietInputDriver(LinuxDriver):
    """Textual's Linux driver whose input thread wakes for input, for its parser's timeouts and
    to stop, rather than ten times a second (`keys.read_keys`)."""

    _stopping: WakingEvent | None = None

    def start_application_mode(self) -> None:
        if self._stopping is None:  # before the first input thread; kept across a suspend
            self.exit_event = self._stopping = WakingEvent()
        super().start_application_mode()

    def run_input_thread(self) -> None:
        assert self._stopping is not None  # start_application_mode starts this thread
        read_keys(
            self.fileno,
            XTermParser(self._debug),
            self.process_message,
            self._stopping,
            ended=self.terminal_gone,
        )

    def terminal_gone(self) -> None:
        """The terminal's input ended (in raw mode only a terminal that is gone does that)."""

    def close(self) -> None:
        super().close()
        if self._stopping is not None:
            self._stopping.close()


class StoppingDriver(QuietInputDriver):
    """Textual's Linux driver, stopped by SIGTERM and SIGHUP as by `q`.

    Textual leaves those signals to Python, whose default ends the process on the spot: in the
    alternate screen, mouse reporting on, the cursor hidden, the terminal raw. While in
    application mode this driver catches them. The first asks the app to exit the way `q` does,
    so that the terminal is restored and what the console holds is closed, with exit status 128
    + the signal's number, as a shell reports a process a signal ended. Where that way out has not
    restored the terminal after `STOP_GRACE_S`, or at a second signal, the driver restores it
    itself and ends the process.

    A terminal that goes away sends SIGHUP only to a session it is the controlling terminal of;
    one that was not (a program that opened a pseudo-terminal without making it so) goes
    silently: its output fails (EIO) and its input ends. Textual's writer thread ended at the
    first failed write, after which the app's writes filled its queue and the console waited
    for good, its recording held. Either sign of a terminal gone is taken as a SIGHUP.
    """

    def __init__(
        self,
        app: App[Any],
        *,
        debug: bool = False,
        mouse: bool = True,
        size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size)
        self._before: dict[int, Any] = {}
        """The handlers the stop signals had before application mode."""
        self._stopped_by: int | None = None
        self._signalled = False
        """A stop signal came: a second one restores the terminal and ends the process at
        once."""
        self._grace: threading.Timer | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        """The app's loop, where a terminal gone from another thread asks the app to exit
        (not Textual's own ``_loop``, which its driver posts messages to)."""

    def start_application_mode(self) -> None:
        if not isinstance(self._file, TerminalOutput):  # Textual's writer thread writes through it
            self._file = TerminalOutput(self._file, self.terminal_gone)
        self._event_loop = asyncio.get_running_loop()
        super().start_application_mode()
        if threading.current_thread() is threading.main_thread():  # where signals are handled
            caught = functools.partial(self._caught, self._event_loop)
            self._before = {number: signal.signal(number, caught) for number in STOP_SIGNALS}

    def stop_application_mode(self) -> None:
        super().stop_application_mode()
        if self._grace is not None:
            self._grace.cancel()
        for number, handler in self._before.items():
            signal.signal(number, handler)
        self._before = {}

    def _caught(
        self, loop: asyncio.AbstractEventLoop, number: int, _frame: FrameType | None
    ) -> None:
        if self._signalled:
            self._stop_now()
        self._signalled = True
        if self._stopped_by is None:  # not already leaving for a terminal gone
            self._leave(loop, number)

    def _sigcont_application(self, *args: object) -> None:
        """Textual resumes on SIGCONT (after a Ctrl+Z); a terminal that hangs up sends SIGCONT
        with its SIGHUP (Linux signals the session's foreground group with both), and a resume
        then, while the console leaves, started a second input thread that the exit waited on
        until the grace ran out, its recording left open. Leaving, it is ignored."""
        if self._stopped_by is None:
            super()._sigcont_application(*args)

    def terminal_gone(self) -> None:
        """Leave as on SIGHUP (from the writer or the input thread), unless already leaving."""
        if self._stopped_by is None and self._event_loop is not None:
            self._leave(self._event_loop, signal.SIGHUP)

    def _leave(self, loop: asyncio.AbstractEventLoop, number: int) -> None:
        self._stopped_by = number
        self._grace = threading.Timer(STOP_GRACE_S, self._stop_now)
        self._grace.daemon = True
        self._grace.start()
        try:
            loop.call_soon_threadsafe(functools.partial(self._app.exit, return_code=128 + number))
        except RuntimeError:  # the loop is closed: no way out but this one
            self._stop_now()

    def _stop_now(self) -> None:
        """Restore the terminal without Textual (whose writer may wait on a terminal that is
        gone) and end the process."""
        try:
            os.write(self._file.fileno(), LEAVE.encode())
            if self.attrs_before is not None:
                termios.tcsetattr(self.fileno, termios.TCSANOW, self.attrs_before)
        except (OSError, termios.error):
            pass  # the terminal is gone: nothing to restore
        os._exit(128 + (self._stopped_by or signal.SIGTERM))


class TerminalOutput:
    """The terminal's output as Textual's writer thread writes it: once a write or a flush fails
    (the terminal is gone), it calls ``gone`` and drops everything after, so that the thread
    lives on and the app's writes, queued for it, never wait on a terminal that is not there."""

    def __init__(self, file: TextIO, gone: Callable[[], None]) -> None:
        self._file = file
        self._gone = gone
        self._lost = False

    def write(self, text: str) -> None:
        if not self._lost:
            self._attempt(self._file.write, text)

    def flush(self) -> None:
        if not self._lost:
            self._attempt(self._file.flush)

    def _attempt(self, call: Callable[..., object], *args: str) -> None:
        try:
            call(*args)
        except (OSError, ValueError):  # EIO, EPIPE; ValueError: the file was closed
            self._lost = True
            self._gone()

    def fileno(self) -> int:
        return self._file.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class DiffDriver(StoppingDriver):
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
