"""The fleet store: the one place between sources and screens.

Sources produce snapshots; the store keeps a bounded history per host, tracks each host's stream
state (live → stale → down), evaluates the health rules once per new reading, and answers the
screens' questions. Screens render from it and never read a source themselves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuconsole.core.model import Finding, GpuState, HostSnapshot, HostState, Severity
from gpuconsole.core.untrusted import visible
from gpuconsole.rules import health

HISTORY_READINGS = 120
"""Readings of each host kept in memory: two minutes at the default refresh of 1 s, what the
trend lines, the duration rules and the alerts' ``for`` need (the console, replay, the headless
recorder and the exporter all keep this many). Ten minutes of a thousand hosts would not fit in
memory: a bundle's ten minutes come from the recording, and a bundle of a console that does not
record says how much of them it holds."""


@dataclass(frozen=True, slots=True)
class HostStatus:
    """A host's stream state, with the reason when it is not live."""

    state: HostState
    reason: str | None = None
    last_seen: float | None = None


class _HostRecord:
    __slots__ = ("findings", "history", "misses", "status")

    def __init__(self, history_length: int) -> None:
        self.history: deque[HostSnapshot] = deque(maxlen=history_length)
        self.status = HostStatus(HostState.CONNECTING)
        self.findings: tuple[Finding, ...] = ()
        self.misses = 0


class FleetStore:
    """Latest readings, bounded history, stream state and findings for every host."""

    def __init__(
        self,
        hosts: Iterable[str],
        history_length: int = HISTORY_READINGS,
        stale_after: int = 3,
        down_after: int = 10,
    ) -> None:
        self._records = {host: _HostRecord(history_length) for host in hosts}
        self._history_length = history_length
        self._stale_after = stale_after
        self._down_after = down_after

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self._records)

    @property
    def history_length(self) -> int:
        """How many readings of each host the store keeps; older ones are dropped."""
        return self._history_length

    def record(self, snapshot: HostSnapshot) -> bool:
        """Take a new reading; False (and nothing changes) when it is no newer than the latest.

        A repeated or out-of-order reading is no evidence that the host is live again.
        """
        return self.record_past(snapshot.host, (snapshot,))

    def record_past(self, host: str, snapshots: Iterable[HostSnapshot]) -> bool:
        """Take readings of a host, oldest first (at start, its recent past), leaving out any no
        newer than the latest; False when none was taken. The health rules run once, on the
        newest: findings are only ever shown for it."""
        rec = self._records[host]
        taken = False
        for snapshot in snapshots:
            if not rec.history or snapshot.time > rec.history[-1].time:
                rec.history.append(snapshot)
                taken = True
        if not taken:
            return False
        rec.misses = 0
        rec.status = HostStatus(HostState.LIVE, None, rec.history[-1].time)
        self._evaluate(host, rec)
        return True

    def record_failure(self, host: str, reason: str, state: HostState | None = None) -> bool:
        """Count one tick without a reading; True when the host's state or reason changed.

        One missed tick is no news (a slow link); three make the host stale, ten make it down.
        A ``state`` the source already knows (the connection is lost, the host key refused)
        takes effect at once.
        """
        rec = self._records[host]
        rec.misses += 1
        if state is None or state is HostState.LIVE:
            state = self._state_after_misses(rec)
            if state is None:
                return False
        before = rec.status
        # The reason quotes what failed: a host's own error text, an SSH server's message.
        rec.status = HostStatus(state, visible(reason, 500), before.last_seen)
        if rec.status == before:
            return False
        self._evaluate(host, rec)
        return True

    def _state_after_misses(self, rec: _HostRecord) -> HostState | None:
        if rec.misses >= self._down_after:
            return HostState.DOWN
        if rec.misses >= self._stale_after and rec.history:
            return HostState.STALE
        return None

    def latest(self, host: str) -> HostSnapshot | None:
        history = self._records[host].history
        return history[-1] if history else None

    def history(self, host: str) -> Sequence[HostSnapshot]:
        return self._records[host].history

    def status(self, host: str) -> HostStatus:
        return self._records[host].status

    def findings(self, host: str) -> tuple[Finding, ...]:
        """This host's findings, worst first."""
        return self._records[host].findings

    def gpu_findings(self, host: str, gpu: int) -> tuple[Finding, ...]:
        return tuple(f for f in self._records[host].findings if f.gpu == gpu)

    def severity(self, host: str) -> Severity | None:
        """The worst severity among the host's findings; None when it has none."""
        findings = self._records[host].findings
        return findings[0].severity if findings else None

    def series(self, host: str, gpu: int, field: str, last: int | None = None) -> list[float]:
        """One GPU field over the kept history, oldest first; readings without a value skipped.
        ``last``: only the newest that many values (a trend line reads no more than it draws,
        every tick)."""
        wanted = len(self._records[host].history) if last is None else max(last, 0)
        values: list[float] = []
        for snapshot in reversed(self._records[host].history):
            if len(values) >= wanted:
                break
            state: GpuState | None = snapshot.gpu(gpu)
            value = getattr(state, field, None) if state is not None else None
            if value is not None:
                values.append(float(value))
        values.reverse()
        return values

    def _evaluate(self, host: str, rec: _HostRecord) -> None:
        findings: list[Finding] = []
        state_finding = health.host_state_finding(host, rec.status.state, rec.status.reason)
        if state_finding is not None:
            findings.append(state_finding)
        if rec.history:
            *previous, latest = rec.history
            findings.extend(health.evaluate(latest, previous))
        findings.sort(key=lambda f: (-f.severity, f.gpu if f.gpu is not None else -1))
        rec.findings = tuple(findings)
