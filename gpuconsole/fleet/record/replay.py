"""A recording as a telemetry source: the console's own screens show it, at a time cursor.

`ReplaySource.read` gives each host's reading at the cursor, or raises `SourceError` with the
state the console recorded for the host then (down, stale…), so the store shows what the console
showed; where the recording is damaged, the host is stale with a reason that says so. `backfill`
gives the readings before the cursor, for trends and duration rules (a recording opened with
``skip_damaged`` leaves damaged ones out and notes them). Moving the cursor is the caller's
business (the replay screen); the source only reads at it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuconsole.core.model import HostSnapshot, HostState
from gpuconsole.fleet.alerts.engine import Alert
from gpuconsole.fleet.record.episodes import ALERT, Episode
from gpuconsole.fleet.record.reader import DamagedReading, Recording
from gpuconsole.fleet.record.schema import RecordingError
from gpuconsole.fleet.record.when import clock
from gpuconsole.telemetry import SourceError


class ReplaySource:
    """Reads a `Recording` at ``cursor`` (clamped to the recording's span)."""

    def __init__(self, recording: Recording, at: float | None = None) -> None:
        if recording.start is None or recording.end is None:
            raise SourceError(f"{recording.path}: the recording holds no readings")
        self.recording = recording
        self.start: float = recording.start
        self.end: float = recording.end
        self._cursor = self.clamp(self.end if at is None else at)

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.recording.hosts

    @property
    def cursor(self) -> float:
        return self._cursor

    def clamp(self, t: float) -> float:
        return min(max(t, self.start), self.end)

    def move_to(self, t: float) -> float:
        """Put the cursor at ``t`` (within the recording); returns where it is now."""
        self._cursor = self.clamp(t)
        return self._cursor

    def read(self, host: str) -> HostSnapshot:
        try:
            return self._read(host, self._cursor)
        except DamagedReading as damaged:
            what = damaged.damage.what
        except RecordingError as error:  # SQLite's own pages damaged, say
            what = str(error)
        raise SourceError(f"{host}: the recording is damaged here: {what}", state=HostState.STALE)

    def _read(self, host: str, t: float) -> HostSnapshot:
        if not self.recording.covers(t):
            raise SourceError(
                f"{host}: not recorded at {clock(t)} UTC (no console was recording)",
                state=HostState.CONNECTING,
            )
        state = self.recording.state_at(host, t)
        if state is None:
            raise SourceError(
                f"{host}: not recorded yet at {clock(t)} UTC", state=HostState.CONNECTING
            )
        if state[0] is not HostState.LIVE:
            raise SourceError(state[1] or f"{host}: {state[0].value}", state=state[0])
        snapshot = self.recording.snapshot_at(host, t)
        if snapshot is None:
            raise SourceError(
                f"{host}: no reading recorded by {clock(t)} UTC", state=HostState.CONNECTING
            )
        return snapshot

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        """The host's readings in the ``seconds`` up to the cursor, oldest first."""
        return self.recording.snapshots(host, self._cursor - seconds, self._cursor)

    def episodes_at(self) -> list[Episode]:
        """The findings and alerts the console had open at the cursor."""
        return self.recording.open_episodes(self._cursor)


class EpisodesAt:
    """The findings and alerts open at the cursor, as recorded: when each began, and the alerts
    that were firing. Loaded with episodes read beforehand (off the UI thread)."""

    def __init__(self, episodes: Iterable[Episode] = ()) -> None:
        self.load(episodes)

    def load(self, episodes: Iterable[Episode]) -> None:
        episodes = list(episodes)
        self._since = {e.ident: e.since for e in episodes}
        self._alerts = [e.as_alert() for e in episodes if e.kind == ALERT]

    def since(self, ident: str) -> float | None:
        return self._since.get(ident)

    def alerts(self) -> list[Alert]:
        return list(self._alerts)
