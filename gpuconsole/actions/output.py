"""What a command run on a host printed: every action's shells return it, and verify's checks
judge it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CommandOutput:
    """What a command printed. ``exit_code`` is None when it did not finish (timed out)."""

    command: str
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None

    @property
    def missing(self) -> bool:
        """The program is not installed (the shell's 127, or its 'not found' words)."""
        return self.exit_code == 127 or "command not found" in self.stderr

    def lines(self, limit: int = 6) -> tuple[str, ...]:
        """The first non-empty lines of stdout, else of stderr: the evidence worth showing."""
        text = self.stdout if self.stdout.strip() else self.stderr
        return tuple(line.rstrip() for line in text.splitlines() if line.strip())[:limit]
