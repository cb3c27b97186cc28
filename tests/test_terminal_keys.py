"""The input thread: keys reach the app, a lone ESC becomes Escape once its wait is over, the
thread sleeps while nothing comes, and stops when the driver stops it (`terminal.keys`)."""

from __future__ import annotations

import contextlib
import os
import pty
import queue
import selectors
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from textual import events
from textual._xterm_parser import XTermParser
from textual.message import Message

from gpuconsole.ui.terminal import keys
from gpuconsole.ui.terminal.keys import POLL_S, WakingEvent, read_keys, timeout_due_in


@dataclass
class Reader:
    """`read_keys` on a thread, reading a pipe; what it delivers, and the timeouts it slept."""

    write_fd: int
    stopping: WakingEvent
    thread: threading.Thread
    delivered: queue.Queue[Message] = field(default_factory=queue.Queue)
    timeouts: list[float | None] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    """When the input was found ended (`read_keys`'s ``ended``)."""

    def next_key(self, within: float = 5.0) -> str:
        while True:
            event = self.delivered.get(timeout=within)
            if isinstance(event, events.Key):
                return event.key


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reader]:
    timeouts: list[float | None] = []

    class CountingSelector(selectors.SelectSelector):
        def select(self, timeout: float | None = None) -> list:
            timeouts.append(timeout)
            return super().select(timeout)

    monkeypatch.setattr(keys.selectors, "SelectSelector", CountingSelector)
    read_fd, write_fd = os.pipe()
    stopping = WakingEvent()
    delivered: queue.Queue[Message] = queue.Queue()
    ends: list[float] = []
    thread = threading.Thread(
        target=read_keys,
        args=(read_fd, XTermParser(), delivered.put, stopping),
        kwargs={"ended": lambda: ends.append(time.monotonic())},
        daemon=True,
    )
    found = Reader(write_fd, stopping, thread, delivered, timeouts, ends)
    thread.start()
    yield found
    stopping.set()
    thread.join(5)
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):  # the test closed it
            os.close(fd)
    stopping.close()


def test_keys_and_a_lone_escape_reach_the_app(reader: Reader) -> None:
    os.write(reader.write_fd, b"q")
    assert reader.next_key() == "q"
    os.write(reader.write_fd, b"\x1b")  # Escape, or the start of a sequence: the parser waits
    assert reader.next_key() == "escape"
    os.write(reader.write_fd, "é".encode()[:1])  # half a character, read alone...
    time.sleep(0.3)
    os.write(reader.write_fd, "é".encode()[1:])  # ...then its other half
    assert reader.next_key() == "é"
    assert reader.thread.is_alive()


def test_it_sleeps_until_input_comes(reader: Reader) -> None:
    """Nothing pending: it waits with no timeout, where Textual's thread wakes ten times a
    second; with a lone ESC pending, it waits only until the parser's timeout is due."""
    os.write(reader.write_fd, b"\x1b")
    assert reader.next_key() == "escape"
    time.sleep(0.5)
    waits = list(reader.timeouts)
    assert waits[-1] is None
    assert len(waits) <= 4  # idle start, the ESC, its timeout, asleep again
    assert any(wait is not None and 0 < wait <= 0.2 for wait in waits)


def test_setting_the_event_stops_a_sleeping_thread(reader: Reader) -> None:
    os.write(reader.write_fd, b"x")
    assert reader.next_key() == "x"
    reader.stopping.set()
    reader.thread.join(5)
    assert not reader.thread.is_alive()


def test_at_the_end_of_the_input_it_waits_to_be_stopped_without_spinning(reader: Reader) -> None:
    """A terminal that is gone reads as empty at once, again and again: reading it in a loop
    would take a whole core until the console ends."""
    os.close(reader.write_fd)
    time.sleep(0.3)
    assert len(reader.timeouts) <= 3
    assert reader.thread.is_alive()
    assert len(reader.ends) == 1  # the driver is told once: it leaves as on a hang-up
    reader.stopping.set()
    reader.thread.join(5)
    assert not reader.thread.is_alive()


def test_a_terminal_whose_other_side_closed_ends_the_input_once() -> None:
    """A pseudo-terminal whose other side is closed fails its reads with EIO: that ends the
    input as an empty read does, and does not end the thread with an error."""
    master, slave = pty.openpty()
    stopping = WakingEvent()
    ends: list[float] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            read_keys(slave, XTermParser(), lambda _: None, stopping, ended=lambda: ends.append(1))
        except BaseException as error:  # the test reports it
            failed.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    os.close(master)
    deadline = time.monotonic() + 5
    while not ends and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ends == [1]
    assert thread.is_alive() and not failed
    stopping.set()
    thread.join(5)
    assert not thread.is_alive() and not failed
    os.close(slave)
    stopping.close()


def test_a_restarted_thread_forgets_the_wake_that_stopped_the_last() -> None:
    """After a suspend (Ctrl+Z) Textual clears the exit event and starts a new input thread:
    the byte that woke the old one must not end the new one's first sleep."""
    read_fd, write_fd = os.pipe()
    stopping = WakingEvent()
    stopping.set()
    stopping.clear()
    delivered: queue.Queue[Message] = queue.Queue()
    thread = threading.Thread(
        target=read_keys, args=(read_fd, XTermParser(), delivered.put, stopping), daemon=True
    )
    thread.start()
    os.write(write_fd, b"k")
    key = delivered.get(timeout=5)
    stopping.set()
    thread.join(5)
    stopping.close()
    os.close(read_fd)
    os.close(write_fd)
    assert isinstance(key, events.Key) and key.key == "k"
    assert not thread.is_alive()


def test_a_closed_event_writes_to_no_file() -> None:
    """Set after close, the event must not write to whatever file took its descriptor's
    number since."""
    stopping = WakingEvent()
    had = (stopping.wake_fd, stopping._write_fd)
    stopping.close()
    read_fd, write_fd = os.pipe()
    try:
        if (read_fd, write_fd) != had:
            pytest.skip("the new pipe did not take the event's numbers")
        stopping.set()
        os.set_blocking(read_fd, False)
        with pytest.raises(BlockingIOError):
            os.read(read_fd, 1)
    finally:
        os.close(read_fd)
        os.close(write_fd)


class _Silent:
    """A parser that does not say when its timeout is due."""


@pytest.mark.parametrize(
    ("due", "expected"),
    [(None, None), (-1.0, 0.0)],
)
def test_the_wait_follows_the_parsers_timeout(due: float | None, expected: float | None) -> None:
    parser = XTermParser()
    parser._timeout_time = None if due is None else time.monotonic() + due
    assert timeout_due_in(parser) == expected


def test_a_parser_that_does_not_say_is_asked_as_textual_does() -> None:
    assert timeout_due_in(_Silent()) == POLL_S  # type: ignore[arg-type]
