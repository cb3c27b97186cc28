"""Snapshots and findings as plain JSON-ready dicts, for `--json` output and tickets."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from gpuconsole.core.model import Finding, HostSnapshot, Severity


def finding_dict(finding: Finding) -> dict[str, Any]:
    return {
        "severity": finding.severity.label,
        "code": finding.code,
        "host": finding.host,
        "gpu": finding.gpu,
        "message": finding.message,
        "remediation": finding.remediation,
    }


def snapshot_dict(snapshot: HostSnapshot, findings: Iterable[Finding] = ()) -> dict[str, Any]:
    """Every field of the snapshot (None stays null: missing is not zero), plus findings."""
    data = dataclasses.asdict(snapshot)
    data["findings"] = [finding_dict(f) for f in findings]
    return data


def exit_code(findings: Iterable[Finding]) -> int:
    """0 healthy (or informational only), 1 warnings, 2 anything critical."""
    worst = max((f.severity for f in findings), default=Severity.INFO)
    return {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}[worst]
