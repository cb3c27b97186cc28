"""What the subcommands print never carries a control sequence to the admin's terminal.

Their text holds what hosts, dumps and recordings said. The model's text is already made visible
where it enters (`untrusted.visible`); `GuardedStream` stands in for stdout and stderr while a
subcommand runs, as the last line for text that came another way (a remote command's output, an
exception's message): every control character but newline and tab is written as a visible stand-in,
so nothing printed can move the cursor, retitle the window, write the clipboard or hang the
terminal in an unfinished sequence.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from gpuconsole.core.untrusted import stand_in

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab made visible."""
    return _UNSAFE.sub(stand_in, text) if _UNSAFE.search(text) else text


class GuardedStream:
    """A text stream that writes through `printable`; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_output() -> Iterator[None]:
    """stdout and stderr guarded for the time of the block (a subcommand's run)."""
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = GuardedStream(stdout), GuardedStream(stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = stdout, stderr
