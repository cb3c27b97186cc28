"""Notices (Textual's toasts) that never break a path inside a name.

A toast wraps its text at spaces and folds a word longer than its line wherever the line ends: a
bundle's path came out as two halves of a file name. Here a notice too long for one line gets each
path on lines of its own, the home directory written ``~``, broken only after a ``/``.
"""

from __future__ import annotations

import os
import re

NOTICE_WIDTH = 56
"""The cells of a notice's line: app.tcss makes a toast 60 cells wide, less padding and border."""
_SHORT = 20
"""A path this short stays where it is in the text."""
_PATH = re.compile(r"(?<!\S)~?/[^\s]*[^\s.,;:)]")


def laid_out(message: str, width: int = NOTICE_WIDTH) -> str:
    """``message`` with each long path on lines of its own where the message does not fit a
    line."""
    if len(message) <= width or not _PATH.search(message):
        return message
    home = os.path.expanduser("~")

    def own_lines(match: re.Match[str]) -> str:
        path = match.group()
        if len(path) <= _SHORT:
            return path
        if home not in ("", "/") and (path == home or path.startswith(home + "/")):
            path = "~" + path[len(home) :]
        return "\n" + "\n".join(_broken(path, width)) + "\n"

    laid = _PATH.sub(own_lines, message)
    return "\n".join(line.strip() for line in laid.split("\n") if line.strip())


def _broken(path: str, width: int) -> list[str]:
    """``path`` in lines of at most ``width`` cells, each ending after a ``/`` (a single name
    longer than a line stays whole: the toast folds it, as it must)."""
    lines = [""]
    for piece in re.findall(r"[^/]*/|[^/]+$", path):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return lines
