"""The terminal's output under Textual's writer thread (`driver.TerminalOutput`): a terminal that
is gone is said once, and the writer thread goes on draining its queue, so that the app's writes
never wait on it."""

from __future__ import annotations

import errno
import threading

from textual.drivers._writer_thread import MAX_QUEUED_WRITES, WriterThread

from gpuconsole.ui.terminal.driver import TerminalOutput


class GoneTerminal:
    """A terminal that took ``good`` writes, then fails every write and flush with EIO."""

    def __init__(self, good: int) -> None:
        self.good = good
        self.written: list[str] = []

    def write(self, text: str) -> int:
        if len(self.written) >= self.good:
            raise OSError(errno.EIO, "Input/output error")
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        if len(self.written) >= self.good:
            raise OSError(errno.EIO, "Input/output error")

    def fileno(self) -> int:
        return 2


def test_a_terminal_gone_is_said_once_and_later_writes_are_dropped() -> None:
    terminal = GoneTerminal(good=2)
    gone: list[int] = []
    output = TerminalOutput(terminal, lambda: gone.append(1))  # type: ignore[arg-type]
    for frame in ("a", "b", "c", "d"):
        output.write(frame)
        output.flush()
    assert terminal.written == ["a", "b"]
    assert gone == [1]
    assert output.fileno() == 2


def test_the_writer_thread_outlives_the_terminal_and_the_app_never_waits() -> None:
    """Textual's writer thread ended at the first failed write; the app's next writes filled
    its queue of 30 and the app waited on it for good."""
    gone = threading.Event()
    writer = WriterThread(TerminalOutput(GoneTerminal(good=1), gone.set))  # type: ignore[arg-type]
    writer.start()
    done = threading.Event()

    def app_writes() -> None:
        for frame in range(MAX_QUEUED_WRITES * 4):
            writer.write(f"frame {frame}")
        done.set()

    threading.Thread(target=app_writes, daemon=True).start()
    assert done.wait(10), "the app's writes waited on a writer that is gone"
    assert gone.wait(10)
    writer.stop()  # returns: the thread took the stop from its queue
    assert not writer.is_alive()
