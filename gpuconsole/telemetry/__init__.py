"""Telemetry sources: each one reads hosts and yields `HostSnapshot`s.

Sources block (NVML, subprocess, SSH round trips): callers run `read` off the UI thread.
"""

from __future__ import annotations

from typing import Protocol

from gpuconsole.model import HostSnapshot


class SourceError(Exception):
    """A host could not be read. The message is one line that names the host and the cause."""


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
