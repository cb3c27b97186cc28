"""Hosts verified together as each other's baseline: the second opinion on a measured figure.

A check that keeps `Figure`s (and sets `Check.peer_remedy`) has each host's figures compared with
the same figures on the other hosts: the same group, that is the same GPU model, direction and
link. Each other host contributes the median of its healthy figures of the group, so an 8-GPU
host counts once, and a host that failed the check's own rule is no one's baseline. With at
least `PEERS_NEEDED` such hosts, a figure under `PEER_WARN_FRACTION` of their median warns and
one under `PEER_FAIL_FRACTION` fails, even where it clears the check's own floor; the verdict is
the worse of the two. With fewer, the evidence says so and the verdict stays the check's own.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from gpuconsole.actions.verify.model import Check, CheckResult, Figure, HostReport, Status
from gpuconsole.rules.limits import PEER_FAIL_FRACTION, PEER_WARN_FRACTION, PEERS_NEEDED


def peer_status(value: float, median: float) -> Status:
    """A figure against its peers' median: higher is better."""
    if value < PEER_FAIL_FRACTION * median:
        return Status.FAIL
    if value < PEER_WARN_FRACTION * median:
        return Status.WARN
    return Status.PASS


def _result(report: HostReport, check_id: str) -> CheckResult | None:
    return next((r for r in report.checks if r.id == check_id), None)


def _host_medians(result: CheckResult | None) -> dict[str, float]:
    """Group -> the median of this host's healthy figures of that group (a figure of nothing
    is no baseline)."""
    values: dict[str, list[float]] = defaultdict(list)
    for figure in result.figures if result else ():
        if figure.healthy and figure.value > 0:
            values[figure.group].append(figure.value)
    return {group: statistics.median(found) for group, found in values.items()}


def _against(result: CheckResult, others: list[dict[str, float]], remedy: str) -> CheckResult:
    """``result`` with its figures judged against the other hosts' medians."""
    groups: dict[str, list[Figure]] = defaultdict(list)
    for figure in result.figures:
        groups[figure.group].append(figure)
    lines, below, statuses, alone = [], [], [], []
    for group, figures in groups.items():
        peers = [medians[group] for medians in others if group in medians]
        unit = figures[0].unit
        if len(peers) < PEERS_NEEDED:
            alone.append(f"{group} ({len(peers)})")
            continue
        median = statistics.median(peers)
        shares = []
        for figure in figures:
            status = peer_status(figure.value, median)
            statuses.append(status)
            shares.append(f"{figure.subject} at {figure.value / median:.1%}")
            if status is not Status.PASS:
                below.append(
                    f"{figure.subject} {figure.value:g} {unit} is {figure.value / median:.1%} of "
                    f"its peers' median {median:.1f} {unit} ({len(peers)} hosts)"
                )
        lines.append(
            f"peers' median for {group}: {median:.1f} {unit} over {len(peers)} other hosts; "
            f"{', '.join(shares)} of it (warn < {PEER_WARN_FRACTION:.0%}, "
            f"fail < {PEER_FAIL_FRACTION:.0%})"
        )
    if alone:
        lines.append(
            f"peers: not compared, fewer than {PEERS_NEEDED} other hosts verified alongside "
            f"had the same figure: {', '.join(alone)}"
        )
    revised = replace(result, evidence=(*result.evidence, *lines))
    if not statuses:
        return revised
    worst = max(statuses, key=lambda s: s.rank)
    if result.status is Status.SKIP:
        status = worst  # the check could not judge; its peers could
    else:
        status = max((result.status, worst), key=lambda s: s.rank)
    if not below:
        return replace(revised, status=status)
    problem = "below its peers: " + "; ".join(below)
    return replace(
        revised,
        status=status,
        summary=problem if result.status.rank == 0 else f"{result.summary}; {problem}",
        remediation=result.remediation or remedy,
    )


def compare(reports: Sequence[HostReport], checks: Sequence[Check]) -> list[HostReport]:
    """The reports with every peer-compared check's result judged against the other hosts too;
    a report with no such result is returned as it was (the same object)."""
    revised = list(reports)
    for check in checks:
        if check.peer_remedy is None:
            continue
        medians = [_host_medians(_result(report, check.id)) for report in revised]
        for position, report in enumerate(revised):
            result = _result(report, check.id)
            if result is None or not result.figures:
                continue
            others = medians[:position] + medians[position + 1 :]
            judged = _against(result, others, check.peer_remedy)
            checks_now = tuple(judged if r is result else r for r in report.checks)
            revised[position] = replace(report, checks=checks_now)
    return revised
