"""A source that always answers with one given snapshot: for screens fed hand-built readings
(real local processes, MIG layouts) that the simulation does not produce."""

from __future__ import annotations

from gpuconsole.core.model import HostSnapshot


class StaticSource:
    def __init__(self, snapshot: HostSnapshot) -> None:
        self.snapshot = snapshot

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self.snapshot.host,)

    def read(self, host: str) -> HostSnapshot:
        return self.snapshot

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        return []
