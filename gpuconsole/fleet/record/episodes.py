"""Episodes: a finding or a firing alert from the moment it appears until it goes away.

The health rules say what is wrong now; an episode says since when. Each finding has an identity
that outlives its changing message (a temperature in the text, a count of repeats): host, GPU,
code and, for XIDs, the XID number. The console keeps an `OnsetTracker` to order its triage view
newest first; the recorder keeps one to write episodes as they open, worsen and close.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuconsole.core.model import Finding, Severity, XidEvent
from gpuconsole.fleet.alerts.engine import FIRING, Alert

FINDING = "finding"
ALERT = "alert"
_XID_NUMBER = re.compile(r"XID (\d+)")
GRACE_S = 30.0
"""A finding back within this long continues its episode (see `OnsetTracker`)."""


def finding_ident(finding: Finding) -> str:
    """``host/gpu/code`` (the GPU empty for a host-wide finding), the XID number for XIDs."""
    gpu = "" if finding.gpu is None else str(finding.gpu)
    ident = f"{finding.host}/{gpu}/{finding.code}"
    if finding.code == "xid" and (match := _XID_NUMBER.search(finding.message)):
        ident += f"/{match[1]}"
    return ident


def alert_ident(alert: Alert) -> str:
    """``alert:rule/host/gpu`` plus the alert's labels: one alert rule fires once per series."""
    gpu = "" if alert.gpu is None else str(alert.gpu)
    labels = ",".join(f"{k}={v}" for k, v in sorted(alert.labels))
    return f"alert:{alert.rule}/{alert.host}/{gpu}" + (f"/{labels}" if labels else "")


def _onset(finding: Finding, t: float, xids: dict[tuple[int, int | None], float]) -> float:
    if finding.code == "xid" and (match := _XID_NUMBER.search(finding.message)):
        return min(t, xids.get((int(match[1]), finding.gpu), t))
    return t


@dataclass(frozen=True, slots=True)
class Episode:
    """A finding or a firing alert over time; ``until`` is None while it is still present."""

    kind: str
    ident: str
    host: str
    gpu: int | None
    code: str
    severity: Severity
    message: str
    remediation: str
    since: float
    until: float | None = None
    labels: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def open_at(self, t: float) -> bool:
        return self.since <= t and (self.until is None or t < self.until)

    def as_dict(self) -> dict[str, Any]:
        """As JSON output and bundles write it."""
        return {
            "kind": self.kind,
            "host": self.host,
            "gpu": self.gpu,
            "code": self.code,
            "severity": self.severity.label,
            "message": self.message,
            "remediation": self.remediation,
            "since": self.since,
            "until": self.until,
            "labels": dict(self.labels),
        }

    def as_finding(self) -> Finding:
        """The finding as the console reported it when the episode began (or got worse)."""
        return Finding(
            self.severity, self.code, self.message, self.remediation, self.host, self.gpu
        )

    def as_alert(self) -> Alert:
        """A recorded alert episode as the firing `Alert` it was."""
        return Alert(
            rule=self.code,
            host=self.host,
            gpu=self.gpu,
            severity=self.severity,
            state=FIRING,
            since=self.since,
            message=self.message,
            labels=self.labels,
        )

    @classmethod
    def of_finding(cls, finding: Finding, since: float) -> Episode:
        return cls(
            FINDING,
            finding_ident(finding),
            finding.host,
            finding.gpu,
            finding.code,
            finding.severity,
            finding.message,
            finding.remediation,
            since,
        )

    @classmethod
    def of_alert(cls, alert: Alert) -> Episode:
        """An alert as an episode; it carries its own ``since``."""
        return cls(
            ALERT,
            alert_ident(alert),
            alert.host,
            alert.gpu,
            alert.rule,
            alert.severity,
            alert.message,
            "",
            alert.since,
            labels=tuple(alert.labels),
        )


@dataclass(frozen=True, slots=True)
class Changes:
    """What one update did: episodes that began, got worse, or ended (by identity, with when)."""

    opened: tuple[Episode, ...] = ()
    worsened: tuple[Episode, ...] = ()
    closed: tuple[tuple[str, float], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.opened or self.worsened or self.closed)


class OnsetTracker:
    """The episodes open now: one host's findings at a time, the fleet's alerts all at once.

    A finding that goes away and comes back within ``grace_s`` continues its episode: a GPU at
    its power cap or near a threshold flaps from one reading to the next, and an episode per
    flap would bury the timeline (and the recording) in noise. An episode ends, once the grace
    has passed, at the moment the finding first went away.
    """

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._open: dict[str, Episode] = {}
        self._gone: dict[str, float] = {}
        """Open episodes whose finding went away (when), not for long enough yet to end."""
        self._by_host: dict[str, set[str]] = {}
        self._alerts: set[str] = set()

    def since(self, ident: str) -> float | None:
        episode = self._open.get(ident)
        return None if episode is None else episode.since

    def open_episodes(self) -> list[Episode]:
        return list(self._open.values())

    def episodes_now(self) -> list[Episode]:
        """The open episodes as a statement of this moment needs them (a bundle of now): one
        whose finding went away, still within its grace, ended when it went away. The tracker
        keeps it open only so that it goes on if the finding comes back within the grace."""
        return [
            replace(episode, until=self._gone[ident]) if ident in self._gone else episode
            for ident, episode in self._open.items()
        ]

    def update_host(
        self,
        host: str,
        t: float,
        findings: Iterable[Finding],
        xid_events: Iterable[XidEvent] = (),
    ) -> Changes:
        """The host's findings as of ``t``: the whole set, not only what is new.

        An XID finding begins when the driver reported the XID (its event's time, from
        ``xid_events``), which may be before the console saw it.
        """
        first_seen: dict[tuple[int, int | None], float] = {}
        for event in xid_events:
            key = (event.xid, event.gpu)
            first_seen[key] = min(event.time, first_seen.get(key, event.time))
        now = {
            e.ident: e for e in (Episode.of_finding(f, _onset(f, t, first_seen)) for f in findings)
        }
        changes, self._by_host[host] = self._apply(now, self._by_host.get(host, set()), t)
        return changes

    def resume(self, episodes: Iterable[Episode]) -> Changes:
        """Open findings' episodes that began before this tracker's first update (in the history
        a fleet session was primed with), each with its own ``since``; open ones stay as they are.
        """
        opened = []
        for episode in episodes:
            if episode.kind != FINDING or episode.ident in self._open:
                continue
            self._open[episode.ident] = episode
            self._by_host.setdefault(episode.host, set()).add(episode.ident)
            opened.append(episode)
        return Changes(tuple(opened))

    def update_alerts(self, t: float, alerts: Iterable[Alert]) -> Changes:
        """The firing alerts as of ``t``; pending ones are not episodes yet."""
        now = {e.ident: e for e in (Episode.of_alert(a) for a in alerts if a.state == "firing")}
        changes, self._alerts = self._apply(now, self._alerts, t)
        return changes

    def flush(self) -> list[tuple[str, float]]:
        """End the episodes within their grace now, each when its finding went away."""
        ended = list(self._gone.items())
        for ident, _ in ended:
            self._open.pop(ident, None)
        self._gone.clear()
        return ended

    def _apply(
        self, now: Mapping[str, Episode], before: set[str], t: float
    ) -> tuple[Changes, set[str]]:
        """The changes, and the identities still open among ``before`` and ``now``."""
        opened, worsened = [], []
        for ident, candidate in now.items():
            self._gone.pop(ident, None)
            current = self._open.get(ident)
            if current is None:
                self._open[ident] = candidate
                opened.append(candidate)
            elif candidate.severity > current.severity:
                episode = replace(candidate, since=current.since)
                self._open[ident] = episode
                worsened.append(episode)
        still = set(now)
        closed = []
        for ident in before - still:
            went = self._gone.setdefault(ident, t)
            if t - went >= self.grace_s:
                del self._gone[ident]
                self._open.pop(ident, None)
                closed.append((ident, went))
            else:
                still.add(ident)
        return Changes(tuple(opened), tuple(worsened), tuple(closed)), still
