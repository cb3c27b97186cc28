"""Split terminal output into printable text, control characters and escape sequences."""

from __future__ import annotations

import re
from collections.abc import Iterator

TOKEN = re.compile(
    r"""
    (?P<text>[^\x00-\x1f\x7f-\x9f]+)
    | (?P<csi>\x1b\[(?P<params>[0-?]*)(?P<inter>[\x20-/]*)(?P<final>[@-~]))
    | (?P<osc>\x1b\](?P<body>[^\x07\x1b]*)(?:\x07|\x1b\\))
    | (?P<string>\x1b(?P<kind>[P_^X])(?:[^\x1b]|\x1b(?!\\))*\x1b\\)
    | (?P<partial>\x1b(?:\[[0-?]*[\x20-/]*|\][^\x07]*|[P_^X].*|[\x20-/]*)\Z)
    | (?P<esc>\x1b[\x20-/]*[0-~])
    | (?P<control>[\x00-\x1f\x7f-\x9f])
    """,
    re.VERBOSE | re.DOTALL,
)
"""One token per match; ``lastgroup`` names its kind. ``partial`` is a sequence cut off by the
end of the data (the rest comes with the next write); a lone ESC that starts nothing valid
matches ``control``."""


def scan(data: str) -> Iterator[re.Match[str]]:
    """The tokens of ``data``, in order; every character belongs to exactly one."""
    return TOKEN.finditer(data)
