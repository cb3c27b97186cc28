"""A problem as one line: how the host screen's findings and the GPU screen's head show the rows
of `gpuconsole.fleet.triage_list`, with the severity, start and remedy the triage view shows."""

from __future__ import annotations

from rich.text import Text

from gpuconsole.fleet.record.when import clock
from gpuconsole.fleet.triage_list import TriageItem
from gpuconsole.ui.widgets.cells import Palette, severity_badge

WRAP_INDENT = 5
"""A wrapped problem's later rows start under its text, past the badge and its blank."""


def problem_line(problem: TriageItem, palette: Palette) -> Text:
    """'CRIT since 20:20:44: GPU 3 stopped answering … → reboot the node …'."""
    line = Text.assemble(severity_badge(problem.severity, palette))
    if problem.since is not None:
        line.append(f" since {clock(problem.since)}:")
    line.append(f" {problem.what}")
    line.append(f" → {problem.next_step}", style="dim")
    return line
