"""How a command that cannot go on ends: one line on stderr and an exit code.

A command either returns the code after `fail` printed the line, or raises `Refused` from
wherever it finds the problem (a helper that reads the inventory, say), and `gpuconsole.cli.main`
prints it.
"""

from __future__ import annotations

import sys

from gpuconsole.core.untrusted import visible

EXIT_BAD_INPUT = 2
"""A bad option, host, group, time or alert rule."""
EXIT_UNREADABLE = 3
"""Nothing to read (no driver, an unreachable host), or a file that cannot be read or written."""


class Refused(Exception):
    """A command cannot go on; the message is the one line to print, the code the exit code."""

    def __init__(self, message: str, code: int = EXIT_UNREADABLE) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = EXIT_UNREADABLE) -> int:
    """Print ``message`` as gpuconsole's one line on stderr (a newline or control character it
    quotes from outside made visible); return ``code``."""
    print(f"gpuconsole: {visible(message)}", file=sys.stderr)
    return code


def say(line: str) -> None:
    """A line of news on stderr, where a daemon's log takes it (the recorder and the exporter:
    what they serve or record, and, from a sending thread, when alerts stop and start reaching
    Alertmanager)."""
    print(f"gpuconsole: {visible(line)}", file=sys.stderr, flush=True)
