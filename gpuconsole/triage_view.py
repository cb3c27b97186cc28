"""The triage list: every finding and firing alert of the fleet, worst first, then newest.

Each item says what to do next: a finding carries its rule's remediation (for an XID, the
catalog's action); an alert takes its runbook label, else the remediation of the finding it
fires on, else that of the worst finding on the same GPU (a hot-GPU alert and the temperature
finding advise the same).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuconsole.model import Finding, Severity
from gpuconsole.record.episodes import ALERT, FINDING, alert_ident, finding_ident
from gpuconsole.store import FleetStore

Since = Callable[[str], "float | None"]
_RUNBOOK_LABELS = ("runbook", "remediation", "action", "runbook_url")


@dataclass(frozen=True, slots=True)
class TriageItem:
    """One line of the triage view."""

    key: str
    kind: str
    severity: Severity
    host: str
    gpu: int | None
    code: str
    what: str
    next_step: str
    since: float | None
    """When it began (as far as the console saw); None when it does not know."""

    @property
    def where(self) -> str:
        return self.host if self.gpu is None else f"{self.host} GPU {self.gpu}"


def triage_items(
    store: FleetStore,
    alerts: Iterable[Any],
    since: Since,
    rules: Sequence[Any] = (),
) -> list[TriageItem]:
    """Every finding of every host and every firing alert, worst first, then newest, then by
    host and GPU. ``rules`` are the alert rules (to find the findings an alert fires on)."""
    items = []
    for host in store.hosts:
        for finding in store.findings(host):
            ident = finding_ident(finding)
            items.append(
                TriageItem(
                    ident,
                    FINDING,
                    finding.severity,
                    host,
                    finding.gpu,
                    finding.code,
                    finding.message,
                    finding.remediation,
                    since(ident),
                )
            )
    findings_of = {rule.name: tuple(getattr(rule, "findings", ())) for rule in rules}
    for alert in alerts:
        if alert.state != "firing":
            continue
        host_findings = store.findings(alert.host) if alert.host in store.hosts else ()
        items.append(
            TriageItem(
                alert_ident(alert),
                ALERT,
                alert.severity,
                alert.host,
                alert.gpu,
                alert.rule,
                alert.message,
                alert_next_step(alert, host_findings, findings_of.get(alert.rule, ())),
                alert.since,
            )
        )
    return sorted(items, key=_order)


def _order(item: TriageItem) -> tuple[object, ...]:
    newest = -item.since if item.since is not None else float("inf")
    return (-item.severity, newest, item.host, -1 if item.gpu is None else item.gpu, item.key)


def alert_next_step(alert: Any, findings: Iterable[Finding], codes: Sequence[str]) -> str:
    """What to do about a firing alert; see the module's docstring."""
    labels = dict(alert.labels)
    for name in _RUNBOOK_LABELS:
        if labels.get(name):
            return labels[name]
    same_gpu = [f for f in findings if f.gpu == alert.gpu]
    for candidates in ([f for f in same_gpu if f.code in codes], same_gpu):
        if candidates:
            return max(candidates, key=lambda f: f.severity).remediation
    where = alert.host if alert.gpu is None else f"{alert.host} GPU {alert.gpu}"
    return f"open {where} and check the readings behind alert rule {alert.rule}"
