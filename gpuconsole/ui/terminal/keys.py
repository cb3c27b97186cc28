"""The terminal's input, read on a thread that sleeps until there is something to do.

Textual's Linux driver wakes its input thread ten times a second, input or not, to ask its
parser whether a lone ESC has waited long enough to be the Escape key: about 0.8 ms of CPU a
second on a 2-core build machine, a sixth of what the whole console cost there while it watched
an idle GPU. The parser knows when it waits for such a timeout (`Parser._timeout_time`, Textual
8.2.8). `read_keys` sleeps until input comes, the driver stops it, or that timeout is due, and
asks the parser only then; where a parser does not say, it asks ten times a second as Textual
does.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
import time
from codecs import getincrementaldecoder
from collections.abc import Callable, Iterable

from textual._parser import Parser
from textual.message import Message

POLL_S = 0.1
"""How often a parser that does not say when its timeout is due is asked (Textual's own)."""
_UNKNOWN = object()


class WakingEvent(threading.Event):
    """An event whose `set` also wakes a thread waiting in `read_keys`, through a pipe.

    The driver stops its input thread by setting its exit event and joining the thread; a
    thread asleep in `select` until input comes would never see it set without this wake."""

    def __init__(self) -> None:
        super().__init__()
        self.wake_fd, self._write_fd = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._write_fd, False)

    def set(self) -> None:
        super().set()
        if self._write_fd < 0:  # closed: nobody waits, and the number may be another file's now
            return
        with contextlib.suppress(OSError):  # a full pipe wakes the reader as well
            os.write(self._write_fd, b"\0")

    def drain(self) -> None:
        """Forget the wakes written so far (a restarted thread must not wake for an old one)."""
        with contextlib.suppress(OSError):  # BlockingIOError once it is empty
            while os.read(self.wake_fd, 4096):
                pass

    def close(self) -> None:
        for fd in (self.wake_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.wake_fd = self._write_fd = -1


def timeout_due_in(parser: Parser[Message]) -> float | None:
    """Seconds until the parser's pending timeout is due (0 if it is), on its clock
    (`time.monotonic` on Linux); None when it waits for none; `POLL_S` when it does not say."""
    due = getattr(parser, "_timeout_time", _UNKNOWN)
    if due is None:
        return None
    if isinstance(due, (int, float)):
        return max(0.0, due - time.monotonic())
    return POLL_S


def read_keys(
    fileno: int,
    parser: Parser[Message],
    deliver: Callable[[Message], None],
    stopping: WakingEvent,
    ended: Callable[[], None] = lambda: None,
) -> None:
    """Read ``fileno`` until ``stopping`` is set, giving ``deliver`` every event ``parser``
    makes of the input and every one its timeouts release. At the end of the input (a terminal
    that is gone reads as empty, or fails with EIO) it calls ``ended`` once and only waits to
    be stopped."""
    decode = getincrementaldecoder("utf-8")(errors="replace").decode
    stopping.drain()
    with selectors.SelectSelector() as selector:
        selector.register(fileno, selectors.EVENT_READ)
        selector.register(stopping.wake_fd, selectors.EVENT_READ)

        def hand_on(events: Iterable[Message]) -> None:
            for event in events:
                deliver(event)

        while not stopping.is_set():
            for key, _ in selector.select(timeout_due_in(parser)):
                if key.fd != fileno:
                    stopping.drain()
                    continue
                try:
                    data = os.read(fileno, 4096)
                except OSError:  # EIO: a pseudo-terminal whose other side is closed
                    data = b""
                if not data:
                    selector.unregister(fileno)
                    ended()
                    break
                text = decode(data)
                if text:  # not only the start of a character: to the parser, "" is the end
                    hand_on(parser.feed(text))
            hand_on(parser.tick())
