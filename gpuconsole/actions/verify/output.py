"""Verification reports as text for a terminal or a ticket, and the exit code scripts read."""

from __future__ import annotations

from collections.abc import Sequence

from gpuconsole.actions.verify.model import HostReport, Status


def exit_code(reports: Sequence[HostReport]) -> int:
    """0 every check passed (or skipped), 1 warnings, 2 a failure or an unreachable host."""
    return max((report.status.rank for report in reports), default=0)


def reports_text(reports: Sequence[HostReport]) -> str:
    """Per host: a verdict line, then one line per check; evidence and fix under each warning
    and failure, so the first failure never hides the rest."""
    blocks = []
    for report in reports:
        lines = [f"{report.host}: {report.status.value.upper()} ({report.seconds:.1f} s)"]
        if report.error is not None:
            lines.append(f"  not reached: {report.error}")
        width = max((len(c.id) for c in report.checks), default=0)
        for result in report.checks:
            lines.append(f"  {result.status.value:<4}  {result.id:<{width}}  {result.summary}")
            if result.status in (Status.WARN, Status.FAIL):
                lines.extend(f"        $ {command}" for command in result.commands)
                lines.extend(f"        | {line}" for line in result.evidence)
                if result.remediation:
                    lines.append(f"        fix: {result.remediation}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
