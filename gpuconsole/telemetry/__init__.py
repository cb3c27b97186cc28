"""Telemetry sources: each one reads hosts and yields `HostSnapshot`s.

Sources block (NVML, subprocess, SSH round trips): callers run `read` off the UI thread.
"""

from __future__ import annotations

from typing import Protocol

from gpuconsole.core.model import HostSnapshot, HostState


class SourceError(Exception):
    """A host could not be read. The message is one line that names the host and the cause.

    ``state`` is set when the source knows what the host's state is now (a refused host key, a
    lost connection) rather than only that this tick brought no reading.
    """

    def __init__(self, message: str, state: HostState | None = None) -> None:
        super().__init__(message)
        self.state = state


class Source(Protocol):
    """Where readings come from."""

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts this source can read, in display order."""
        ...

    def read(self, host: str) -> HostSnapshot:
        """Read one host now; raise `SourceError` when it cannot be read."""
        ...

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        """Readings of the last ``seconds`` if the source can replay them, oldest first, else []."""
        ...
