"""What a bundle holds, as files: the readings, the findings and alerts with their timeline, the
actions, and a short summary in Markdown that a ticket can quote as it is."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuconsole.actions.verify.model import HostReport
from gpuconsole.core.jsonout import finding_dict, snapshot_dict
from gpuconsole.core.model import Finding, GpuProcess, HostSnapshot, Severity, affected
from gpuconsole.fleet.record.episodes import ALERT, Episode
from gpuconsole.fleet.record.when import clock, stamp
from gpuconsole.rules.summary import short_model, summarize


@dataclass(frozen=True, slots=True)
class BundleInputs:
    """Everything the console knows about one host around one moment."""

    host: str
    at: float
    """The moment the bundle is about: now, or the replay's cursor."""
    origin: str
    """Where the readings come from, for the summary ("the live console", "recording FILE")."""
    readings: tuple[HostSnapshot, ...] = ()
    findings: tuple[Finding, ...] = ()
    alerts: tuple[Any, ...] = ()
    """Firing alerts (gpuconsole.fleet.alerts.engine.Alert) on the host at ``at``."""
    episodes: tuple[Episode, ...] = ()
    """Findings and alerts open at some time in the window, oldest first."""
    actions: tuple[Mapping[str, Any], ...] = ()
    """Audit log entries about the host."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Why something is missing (no shell on a simulated host, …), one line each."""


def alert_dict(alert: Any) -> dict[str, Any]:
    return {
        "rule": alert.rule,
        "host": alert.host,
        "gpu": alert.gpu,
        "severity": Severity(alert.severity).label,
        "state": alert.state,
        "since": alert.since,
        "message": alert.message,
        "labels": dict(alert.labels),
    }


def data_files(inputs: BundleInputs) -> dict[str, str]:
    """readings.jsonl, findings.json and audit.jsonl."""
    readings = "".join(
        json.dumps(snapshot_dict(s, ()), sort_keys=True) + "\n" for s in inputs.readings
    )
    latest = inputs.readings[-1].processes if inputs.readings else ()
    findings = {
        "host": inputs.host,
        "at": inputs.at,
        "findings": [
            {**finding_dict(f), "affects": list(affected(latest, f.gpu))} for f in inputs.findings
        ],
        "alerts": [alert_dict(a) for a in inputs.alerts],
        "timeline": [e.as_dict() for e in inputs.episodes],
    }
    audit = "".join(json.dumps(dict(a), sort_keys=True) + "\n" for a in inputs.actions)
    return {
        "readings.jsonl": readings,
        "findings.json": json.dumps(findings, indent=2) + "\n",
        "audit.jsonl": audit,
    }


def _affects(processes: Sequence[GpuProcess], gpu: int | None) -> str:
    owners = affected(processes, gpu)
    return f", affects {', '.join(owners)}" if owners else ""


def summary(
    inputs: BundleInputs,
    files: Sequence[str],
    verification: HostReport | None,
    notes: Sequence[str],
    made: float,
) -> str:
    """summary.md: the worst problems with what to do, the timeline, the host, what is missing."""
    lines = [
        f"# Incident bundle: {inputs.host} at {stamp(inputs.at)}",
        "",
        f"Made {stamp(made)} by gpuconsole from {inputs.origin}.",
        "",
        "## Problems at that moment",
        "",
    ]
    latest = inputs.readings[-1].processes if inputs.readings else ()
    problems = [
        (
            finding.severity,
            f"{finding.message} (`{finding.code}`){_affects(latest, finding.gpu)}. "
            f"Next: {finding.remediation}",
        )
        for finding in inputs.findings
    ]
    problems += [
        (
            Severity(alert.severity),
            f"alert `{alert.rule}` firing since {clock(alert.since)} UTC: {alert.message}",
        )
        for alert in inputs.alerts
    ]
    for severity, text in sorted(problems, key=lambda p: -p[0]):
        lines.append(f"- **{severity.name}** {text}")
    if not problems and inputs.readings:
        lines.append("None: every health rule passed and no alert was firing.")
    elif not problems:
        lines.append("Not known: there is no reading of this host for that moment.")
    lines += ["", "## Timeline", ""]
    noted = [e for e in inputs.episodes if e.severity >= Severity.WARNING]
    if noted:
        for episode in noted:
            lines.append(_timeline_line(episode, inputs.at))
    else:
        lines.append("No warning or critical finding or alert in the window.")
    lines += ["", "## Host", "", *_host_lines(inputs, verification)]
    if notes:
        lines += ["", "## Not collected", ""]
        lines += [f"- {note}" for note in notes]
    lines += ["", "## Files", ""]
    lines += [f"- `{name}`: {_FILE_MEANINGS.get(_kind(name), '')}" for name in files]
    return "\n".join(lines) + "\n"


def _timeline_line(episode: Episode, at: float) -> str:
    """One episode as of the bundle's moment: ended before it, open at it, or begun after it (a
    recording's window runs two minutes past the moment). What came after the moment is not the
    state at it, so an end after it is left to findings.json: a recorder that stops closes every
    open episode then, and "ended" would say the problem went away."""
    what = "alert " if episode.kind == ALERT else ""
    if episode.since > at:
        state = "began after the moment"
    elif episode.until is not None and not episode.open_at(at):
        state = f"ended at {clock(episode.until)}"
    else:
        state = "open"
    span = f"{clock(episode.since)} UTC, {state}"
    where = "" if episode.gpu is None else f"GPU {episode.gpu} "
    return f"- {span}: **{episode.severity.name}** {where}{what}`{episode.code}`: {episode.message}"


def _host_lines(inputs: BundleInputs, verification: HostReport | None) -> list[str]:
    lines = []
    if inputs.readings:
        latest = inputs.readings[-1]
        s = summarize(latest)
        lines.append(
            f"- {s.gpu_count}× {short_model(s.model) or 'N/A'}"
            f"{f' ({s.lost_gpus} lost)' if s.lost_gpus else ''}, "
            f"driver {latest.driver_version or 'N/A'}, CUDA {latest.cuda_version or 'N/A'}"
        )
        lines.append(
            f"- {len(inputs.readings)} readings from {clock(inputs.readings[0].time)} to "
            f"{clock(latest.time)} UTC"
        )
    else:
        lines.append("- no readings of this host in the window")
    if verification is not None:
        failing = [c for c in verification.checks if c.status.rank > 0]
        verdict = verification.status.value.upper()
        lines.append(
            f"- verification: {verdict}"
            + (f" ({', '.join(c.id for c in failing)})" if failing else "")
        )
    lines.append(f"- {len(inputs.actions)} action{'s' if len(inputs.actions) != 1 else ''} logged")
    return lines


def _kind(name: str) -> str:
    if name == "nvidia-smi/all.txt":
        return name
    return "nvidia-smi" if name.startswith("nvidia-smi/") else name


_FILE_MEANINGS = {
    "summary.md": "this summary",
    "readings.jsonl": "the host's readings in the window, one JSON object per line",
    "findings.json": "findings and firing alerts at that moment, and the window's timeline",
    "audit.jsonl": "actions the console ran on the host (audit log entries)",
    "nvidia-smi": "`nvidia-smi -q` of one GPU, taken when the bundle was made",
    "nvidia-smi/all.txt": "`nvidia-smi -q` of every GPU, taken when the bundle was made",
    "kernel-log.txt": "the kernel log's NVRM and Xid lines since boot",
    "verification.json": "the verification report (checks that do not load the host)",
    "verification.txt": "the same report as text",
}
