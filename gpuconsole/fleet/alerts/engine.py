"""The alert engine: rules over the latest readings, with Prometheus's pending → firing cycle.

Each evaluation takes the new snapshots and the time of the readings (not the wall clock, so a
replay or the demo gives the same alerts every time) and tests every rule against the latest
snapshot of every host it knows:

- a condition that starts to hold makes an alert *pending*, stamped with that time (``since``);
- once it has held for the rule's ``for`` it is *firing*;
- the first evaluation where it does not hold resolves it (it leaves the active list).

A host whose latest snapshot is older than ``stale_after`` counts as having no readings, as a
Prometheus series goes stale: its alerts resolve rather than fire on old data.

Acknowledging and silencing are the operator's marks on an alert and change nothing about its
state: an acknowledgement lasts until the alert resolves, a silence until its time runs out
(in readings' time), even across a resolve and a new start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean

from gpuconsole.core.model import Finding, GpuState, HostSnapshot, Severity
from gpuconsole.fleet.alerts.defaults import DEFAULT_RULES
from gpuconsole.fleet.alerts.expr import READINGS
from gpuconsole.fleet.alerts.rules import AlertRule
from gpuconsole.fleet.store import FleetStore
from gpuconsole.rules import health

PENDING = "pending"
FIRING = "firing"
STALE_AFTER_SECONDS = 300.0
"""Prometheus's default lookback: a series with no sample for 5 minutes is gone."""

AlertKey = tuple[str, str, int | None]
"""(rule, host, gpu): one alert per rule per GPU, or per host for host-wide ones."""


@dataclass(frozen=True, slots=True)
class Alert:
    """One active alert."""

    rule: str
    host: str
    gpu: int | None
    severity: Severity
    state: str
    """"pending" or "firing"."""
    since: float
    """When the condition began to hold (epoch seconds, readings' time)."""
    message: str
    labels: tuple[tuple[str, str], ...] = ()
    remedy: str = ""
    """What to do: the remediation of the finding a findings rule matched; empty for a
    condition rule, which names no remedy."""

    @property
    def key(self) -> AlertKey:
        return (self.rule, self.host, self.gpu)

    @property
    def where(self) -> str:
        return self.host if self.gpu is None else f"{self.host} GPU {self.gpu}"


@dataclass(frozen=True, slots=True)
class _Match:
    gpu: int | None
    value: float | None
    severity: Severity | None = None
    detail: str = ""
    remedy: str = ""


FindingsOf = Callable[[HostSnapshot], Sequence[Finding]]


class AlertEngine:
    """Evaluates rules on readings; keeps each alert's state between evaluations."""

    def __init__(
        self,
        rules: Sequence[AlertRule] = DEFAULT_RULES,
        *,
        stale_after: float = STALE_AFTER_SECONDS,
        findings: FindingsOf | None = None,
    ) -> None:
        self.rules = tuple(rules)
        self.stale_after = stale_after
        self._findings_of = findings or _health_once_per_snapshot()
        self._latest: dict[str, HostSnapshot] = {}
        self._matched: dict[str, tuple[HostSnapshot, Sequence[Finding], list[list[_Match]]]] = {}
        """Per host: the snapshot and findings last tested, and each rule's matches on them."""
        self._active: dict[AlertKey, Alert] = {}
        self._acknowledged: set[AlertKey] = set()
        self._silenced: dict[AlertKey, float] = {}
        self.now: float | None = None
        """The time of the last evaluation."""

    def evaluate(self, snapshots: Iterable[HostSnapshot], now: float) -> list[Alert]:
        """Take new snapshots, test every rule at ``now``; the active alerts, worst first."""
        self._take(snapshots)

        def since(key: AlertKey) -> float:
            before = self._active.get(key)
            return now if before is None else before.since

        return self._evaluate_latest(now, since)

    def replay(self, snapshots: Iterable[HostSnapshot]) -> list[Alert]:
        """The alerts a recorded history leaves active at its end.

        The same as evaluating at every reading's time, in time order, but each host on its
        own: only a host's readings start or end its alerts, so each alert of its latest
        snapshot is traced back through the host's earlier snapshots while it held without a
        break (a gap longer than ``stale_after`` is a break). A host with no alert costs one
        test, where evaluating every host at every time costs hosts × times.
        """
        histories: dict[str, list[HostSnapshot]] = {}
        for snapshot in snapshots:
            histories.setdefault(snapshot.host, []).append(snapshot)
        if not histories:
            return self.active()
        since: dict[AlertKey, float] = {}
        for history in histories.values():
            history.sort(key=lambda s: s.time)
            since.update(self._held_since(history))
        self._take(history[-1] for history in histories.values())
        now = max(history[-1].time for history in histories.values())
        return self._evaluate_latest(now, lambda key: since.get(key, now))

    def _take(self, snapshots: Iterable[HostSnapshot]) -> None:
        for snapshot in snapshots:
            known = self._latest.get(snapshot.host)
            if known is None or snapshot.time >= known.time:
                self._latest[snapshot.host] = snapshot

    def _evaluate_latest(self, now: float, since: Callable[[AlertKey], float]) -> list[Alert]:
        """Every rule on each host's latest snapshot that is not stale at ``now``."""
        self.now = now
        live = [s for s in self._latest.values() if s.time >= now - self.stale_after]
        active: dict[AlertKey, Alert] = {}
        for snapshot in live:
            for rule, matches in zip(self.rules, self._host_matches(snapshot), strict=True):
                for match in matches:
                    key = (rule.name, snapshot.host, match.gpu)
                    active[key] = self._alert(rule, snapshot.host, match, now, since(key))
        self._acknowledged = {key for key in self._acknowledged if key in active}
        self._silenced = {k: t for k, t in self._silenced.items() if t > now}
        self._active = active
        return self.active()

    def _held_since(self, history: Sequence[HostSnapshot]) -> dict[AlertKey, float]:
        """For each alert of the host's latest snapshot, the time of the first snapshot of the
        unbroken run of snapshots it held on. Earlier snapshots are tested only against the
        rules still being traced, and the health rules run only when one of those needs them.
        """
        latest = history[-1]
        matched = zip(self.rules, self._host_matches(latest), strict=True)
        since = {(rule.name, latest.host, m.gpu): latest.time for rule, ms in matched for m in ms}
        tracing = set(since)
        later = latest
        for snapshot in reversed(history[:-1]):
            if not tracing or later.time - snapshot.time > self.stale_after:
                break
            traced = {key[0] for key in tracing}
            rules = [rule for rule in self.rules if rule.name in traced]
            needs_health = any(rule.findings for rule in rules)
            findings = self._findings_of(snapshot) if needs_health else ()
            held = {
                (rule.name, snapshot.host, m.gpu)
                for rule in rules
                for m in self._matches(rule, snapshot, findings)
            }
            tracing &= held
            for key in tracing:
                since[key] = snapshot.time
            later = snapshot
        return since

    def active(self) -> list[Alert]:
        """Pending and firing alerts: the most severe first (a critical one pending before a
        warning firing: it is the next page), firing before pending, then the oldest."""
        return sorted(
            self._active.values(),
            key=lambda a: (
                -a.severity,
                a.state != FIRING,
                a.since,
                a.host,
                a.rule,
                -1 if a.gpu is None else a.gpu,
            ),
        )

    # --- the operator's marks ------------------------------------------------------------------

    def acknowledge(self, key: AlertKey) -> None:
        """Mark an active alert as seen, until it resolves."""
        if key in self._active:
            self._acknowledged.add(key)

    def silence(self, key: AlertKey, seconds: float) -> None:
        """Silence an alert for ``seconds`` of readings' time from the last evaluation."""
        self._silenced[key] = (self.now or 0.0) + seconds

    def unacknowledge(self, key: AlertKey) -> None:
        self._acknowledged.discard(key)

    def unsilence(self, key: AlertKey) -> None:
        self._silenced.pop(key, None)

    def acknowledged(self, key: AlertKey) -> bool:
        return key in self._acknowledged

    def silenced_until(self, key: AlertKey) -> float | None:
        until = self._silenced.get(key)
        return until if until is not None and (self.now is None or until > self.now) else None

    # --- evaluation ------------------------------------------------------------------------------

    def _alert(self, rule: AlertRule, host: str, match: _Match, now: float, since: float) -> Alert:
        firing = now - since >= rule.for_seconds
        severity = rule.severity if rule.severity is not None else match.severity
        return Alert(
            rule=rule.name,
            host=host,
            gpu=match.gpu,
            severity=Severity.WARNING if severity is None else severity,
            state=FIRING if firing else PENDING,
            since=since,
            message=rule.render(host, match.gpu, match.value, match.detail),
            labels=rule.labels,
            remedy=match.remedy,
        )

    def _host_matches(self, snapshot: HostSnapshot) -> list[list[_Match]]:
        """Each rule's matches on a host's snapshot, tested once while neither the snapshot nor
        its findings change: a host without a new reading this round (or a replay's latest
        snapshot, traced first and then evaluated) is not tested again."""
        findings = self._findings_of(snapshot)
        known = self._matched.get(snapshot.host)
        if known is None or known[0] is not snapshot or known[1] is not findings:
            matches = [self._matches(rule, snapshot, findings) for rule in self.rules]
            known = (snapshot, findings, matches)
            self._matched[snapshot.host] = known
        return known[2]

    def _matches(
        self, rule: AlertRule, snapshot: HostSnapshot, findings: Sequence[Finding]
    ) -> list[_Match]:
        if rule.findings:
            return _finding_matches(rule, findings)
        condition = rule.condition
        assert condition is not None
        if rule.scope == "host":
            value = condition.test(_host_lookup(snapshot))
            return [] if value is None else [_Match(None, value)]
        matches = []
        for gpu in snapshot.gpus:
            value = condition.test(_gpu_lookup(gpu, snapshot))
            if value is not None:
                matches.append(_Match(gpu.index, value))
        return matches


def _finding_matches(rule: AlertRule, findings: Sequence[Finding]) -> list[_Match]:
    """The worst of the rule's findings on each GPU (or on the host)."""
    worst: dict[int | None, Finding] = {}
    for finding in findings:
        if finding.code not in rule.findings:
            continue
        known = worst.get(finding.gpu)
        if known is None or finding.severity > known.severity:
            worst[finding.gpu] = finding
    return [_Match(gpu, None, f.severity, f.message, f.remediation) for gpu, f in worst.items()]


def _health_once_per_snapshot() -> FindingsOf:
    """The health rules on a snapshot, computed once however many finding rules ask."""
    cache: dict[str, tuple[HostSnapshot, Sequence[Finding]]] = {}

    def findings(snapshot: HostSnapshot) -> Sequence[Finding]:
        known = cache.get(snapshot.host)
        if known is None or known[0] is not snapshot:
            known = (snapshot, health.evaluate(snapshot))
            cache[snapshot.host] = known
        return known[1]

    return findings


def findings_from(store: FleetStore) -> FindingsOf:
    """The store's findings for a host's latest snapshot (computed once per reading, with the
    host's history and stream state); the health rules for any other, as in a replay."""

    replayed = _health_once_per_snapshot()

    def findings(snapshot: HostSnapshot) -> Sequence[Finding]:
        if store.latest(snapshot.host) is snapshot:
            return store.findings(snapshot.host)
        return replayed(snapshot)

    return findings


def _gpu_lookup(gpu: GpuState, snapshot: HostSnapshot) -> Callable[[str], float | None]:
    return lambda name: READINGS[name].read(gpu, snapshot)


def _host_lookup(snapshot: HostSnapshot) -> Callable[[str], float | None]:
    """Each reading's mean over the host's GPUs that report it (avg by host in PromQL)."""

    def lookup(name: str) -> float | None:
        read = READINGS[name].read
        values = [v for g in snapshot.gpus if (v := read(g, snapshot)) is not None]
        return fmean(values) if values else None

    return lookup
