"""The triage list: one row per problem of the fleet, worst first, then newest.

One problem is one finding's identity (`finding_ident`: host, GPU, code and, for an XID, its
number) together with the alerts raised on it. An alert is raised on a finding when the alert's
rule watches the finding's code (`watched_codes`) on the same host and GPU; where several of the
GPU's findings are watched, it goes to the worst of them (the first of equals, as the alert engine
picks the finding a findings rule reports). A firing alert on no finding is a problem of its own,
a row by itself; a pending one on no finding is not yet a problem and has no row.

Each row says what to do next from what made it: a finding's row carries that finding's
remediation (for an XID, the catalog's action); an alert's own row takes its rule's runbook
label, else names the rule and the readings it watches. A row never borrows the remedy of
another finding on the same GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuconsole.core.model import Finding, Severity, affected
from gpuconsole.core.xid import FALLEN_OFF_THE_BUS
from gpuconsole.fleet.alerts.engine import FIRING
from gpuconsole.fleet.record.episodes import ALERT, FINDING, alert_ident, finding_ident
from gpuconsole.fleet.store import FleetStore

Since = Callable[[str], "float | None"]
_RUNBOOK_LABELS = ("runbook", "remediation", "action", "runbook_url")
_READING_CODES: dict[str, tuple[str, ...]] = {
    "memory_used_pct": ("mem-pressure",),
    "memory_used_mib": ("mem-pressure",),
    "memory_free_mib": ("mem-pressure",),
    "temperature_c": ("thermal-throttle", "temp-high"),
    "slowdown_temperature_c": ("thermal-throttle",),
    "power_w": ("power-cap",),
    "power_limit_w": ("power-cap",),
    "ecc_uncorrected": ("ecc-uncorrectable",),
    "remap_pending": ("row-remap-pending",),
    "remap_failure": ("row-remap-failure",),
    "pcie_gen": ("pcie-degraded",),
    "pcie_width": ("pcie-degraded",),
    "pcie_max_gen": ("pcie-degraded",),
    "pcie_max_width": ("pcie-degraded",),
    "xid": ("xid",),
}
"""The health rules that test a reading: a condition over it watches their findings."""


def watched_codes(rule: Any) -> frozenset[str]:
    """The finding codes a rule watches: a findings rule's own codes; for a condition, the codes
    of the health rules that test the readings it names (``memory_used_pct > 80`` watches
    ``mem-pressure``, as the built-in rules share their thresholds with the health rules)."""
    if rule.findings:
        codes = frozenset(rule.findings)
    else:
        condition = rule.condition
        readings = condition.readings if condition is not None else frozenset()
        codes = frozenset(code for name in readings for code in _READING_CODES.get(name, ()))
    # an XID 79 is folded into its GPU's gpu-lost row (`_problems`): watching XIDs watches that
    return codes | {"gpu-lost"} if "xid" in codes else codes


@dataclass(frozen=True, slots=True)
class RowAlert:
    """An alert as a triage row shows it."""

    rule: str
    state: str
    """"pending" or "firing"."""
    since: float
    severity: Severity


@dataclass(frozen=True, slots=True)
class TriageItem:
    """One row of the triage view: one problem."""

    key: str
    kind: str
    """FINDING for a finding's row (its alerts folded in), ALERT for an alert on no finding."""
    severity: Severity
    host: str
    gpu: int | None
    code: str
    what: str
    next_step: str
    since: float | None
    """When it began (as far as the console saw); None when it does not know."""
    alerts: tuple[RowAlert, ...] = ()
    affects: tuple[str, ...] = ()
    """Whose work runs where the problem is: "job 41327 (alice, llama-ft)", a container."""

    @property
    def where(self) -> str:
        return self.host if self.gpu is None else f"{self.host} GPU {self.gpu}"

    @property
    def alert_state(self) -> RowAlert | None:
        """The row's alert that says most: firing before pending, then the oldest."""
        return min(self.alerts, key=lambda a: (a.state != FIRING, a.since), default=None)


def triage_items(
    store: FleetStore,
    alerts: Iterable[Any],
    since: Since,
    rules: Sequence[Any] = (),
) -> list[TriageItem]:
    """One row per problem (see the module's docstring), worst first, then newest, then by
    host and GPU. ``alerts`` are the active ones (pending and firing); ``rules`` the alert rules,
    to know which findings each alert watches; ``since`` the onset of an episode's identity."""
    watches = {rule.name: watched_codes(rule) for rule in rules}
    problems = {host: _problems(store.findings(host)) for host in store.hosts}
    folded: dict[str, list[Any]] = {}
    alone = []
    for alert in alerts:
        findings = [f for f, _ in problems.get(alert.host, [])]
        on = _raised_on(alert, findings, watches.get(alert.rule, frozenset()))
        if on is not None:
            folded.setdefault(finding_ident(on), []).append(alert)
        elif alert.state == FIRING:
            alone.append(alert)
    items = [
        _finding_row(finding, since, folded.get(finding_ident(finding), []), also)
        for host in store.hosts
        for finding, also in problems[host]
    ]
    items.extend(_alert_row(alert, since, rules) for alert in alone)
    return sorted((_with_affected(item, store) for item in items), key=_order)


def _with_affected(item: TriageItem, store: FleetStore) -> TriageItem:
    snapshot = store.latest(item.host) if item.host in store.hosts else None
    owners = affected(snapshot.processes, item.gpu) if snapshot is not None else ()
    return dataclasses.replace(item, affects=owners) if owners else item


def _problems(findings: Sequence[Finding]) -> list[tuple[Finding, tuple[str, ...]]]:
    """A host's findings, one per problem, each with the identities folded into it: a GPU
    fallen off the bus is its ``gpu-lost`` finding, its XID 79 (the driver's word for the same
    fall, dated by the driver's event) folded in rather than a second row."""
    fallen = {
        f.gpu: finding_ident(f)
        for f in findings
        if finding_ident(f).endswith(f"/xid/{FALLEN_OFF_THE_BUS}")
    }
    lost = {f.gpu for f in findings if f.code == "gpu-lost"}
    return [
        (f, (fallen[f.gpu],) if f.code == "gpu-lost" and f.gpu in fallen else ())
        for f in findings
        if not (f.gpu in lost and finding_ident(f) == fallen.get(f.gpu))
    ]


def _raised_on(alert: Any, findings: Sequence[Finding], codes: frozenset[str]) -> Finding | None:
    """The finding of ``alert``'s host that the alert is raised on, if any."""
    candidates = [f for f in findings if f.gpu == alert.gpu and f.code in codes]
    return max(candidates, key=lambda f: f.severity, default=None)


def _alert_since(alert: Any, since: Since) -> float:
    """When a firing alert's episode began; a pending alert is no episode yet."""
    began = since(alert_ident(alert)) if alert.state == FIRING else None
    return alert.since if began is None else began


def _finding_row(
    finding: Finding, since: Since, alerts: Sequence[Any], also: Sequence[str] = ()
) -> TriageItem:
    """``finding``'s row; it began at the earliest onset of it, of the identities folded into
    it (``also``) and of its alerts."""
    ident = finding_ident(finding)
    shown = tuple(
        RowAlert(a.rule, a.state, _alert_since(a, since), a.severity)
        for a in sorted(alerts, key=lambda a: a.rule)
    )
    firing = [a.severity for a in shown if a.state == FIRING]
    onsets = (since(ident), *map(since, also), *(a.since for a in shown))
    known = [t for t in onsets if t is not None]
    return TriageItem(
        ident,
        FINDING,
        max((finding.severity, *firing)),
        finding.host,
        finding.gpu,
        finding.code,
        finding.message,
        finding.remediation,
        min(known, default=None),
        shown,
    )


def _alert_row(alert: Any, since: Since, rules: Sequence[Any]) -> TriageItem:
    began = _alert_since(alert, since)
    rule = next((r for r in rules if r.name == alert.rule), None)
    return TriageItem(
        alert_ident(alert),
        ALERT,
        alert.severity,
        alert.host,
        alert.gpu,
        alert.rule,
        alert.message,
        alert_next_step(alert, rule),
        began,
        (RowAlert(alert.rule, alert.state, began, alert.severity),),
    )


def _order(item: TriageItem) -> tuple[object, ...]:
    newest = -item.since if item.since is not None else float("inf")
    return (-item.severity, newest, item.host, -1 if item.gpu is None else item.gpu, item.key)


def alert_next_step(alert: Any, rule: Any | None) -> str:
    """What to do about an alert raised on no finding: its rule's runbook label, else a look at
    the readings its rule watches."""
    labels = dict(alert.labels)
    for name in _RUNBOOK_LABELS:
        if labels.get(name):
            return labels[name]
    watching = ""
    if rule is not None and rule.condition is not None:
        watching = f" ({rule.condition.text})"
    return f"open {alert.where} and check the readings behind alert rule {alert.rule}{watching}"
