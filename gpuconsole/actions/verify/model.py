"""What a verification is made of: probes (commands run on a host), their outputs, checks that
judge those outputs, and the results with their evidence and remedy.

A check never runs anything itself: it names the probes it needs and judges their `CommandOutput`s.
The runner runs each distinct probe once per host, so tests can judge recorded outputs and a
rack of hosts runs the same commands once each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from gpuconsole.actions.output import CommandOutput
from gpuconsole.hosts.targets import Context


class Status(str, Enum):
    """A check's verdict; ordered by `rank` so the worst of several can be found."""

    PASS = "pass"
    SKIP = "skip"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        return {"pass": 0, "skip": 0, "warn": 1, "fail": 2}[self.value]


@dataclass(frozen=True, slots=True)
class Probe:
    """A shell command run on the host (through `sh -c`), with its own timeout."""

    name: str
    command: str
    timeout: float = 15.0
    heavy: bool = False
    """Loads the host (a bandwidth or disk test): run alone, after the light probes."""


@dataclass(frozen=True, slots=True)
class Figure:
    """A figure a check measured, kept so that hosts verified together can be compared by it
    (`peers`): a GPU's host->device GB/s, say."""

    subject: str
    """What was measured, as evidence names it: "GPU 0 H2D"."""
    group: str
    """What it is comparable with: only figures of the same group on other hosts are its peers
    ("NVIDIA H200 H2D on Gen5 x16")."""
    value: float
    unit: str
    healthy: bool
    """It cleared the check's own rule (or the check could not judge it): only healthy figures
    make up a peers' median, so one broken host does not drag the baseline down."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A judge's answer: status, one-line summary, the lines that matter, and the remedy."""

    status: Status
    summary: str
    evidence: tuple[str, ...] = ()
    remediation: str | None = None
    figures: tuple[Figure, ...] = ()


Evidence = Mapping[str, CommandOutput]
Judge = Callable[[Evidence, Context], Verdict]


@dataclass(frozen=True, slots=True)
class Check:
    """One verification: a stable kebab-case id, what it checks, its probes and its judge."""

    id: str
    title: str
    probes: tuple[Probe, ...]
    judge: Judge
    peer_remedy: str | None = None
    """Set for a check whose figures are compared across the hosts verified together: the fix
    when a host falls below its peers. None: each host is judged alone."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's result on one host, with the commands it ran."""

    id: str
    title: str
    status: Status
    summary: str
    commands: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    remediation: str | None = None
    figures: tuple[Figure, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status.value,
            "summary": self.summary,
            "evidence": {"commands": list(self.commands), "lines": list(self.evidence)},
            "remediation": self.remediation,
        }


@dataclass(frozen=True, slots=True)
class HostReport:
    """Every check's result on one host, or why the host could not be verified at all."""

    host: str
    checks: tuple[CheckResult, ...] = ()
    error: str | None = None
    seconds: float = 0.0

    @property
    def status(self) -> Status:
        if self.error is not None:
            return Status.FAIL
        return max((c.status for c in self.checks), key=lambda s: s.rank, default=Status.PASS)

    def as_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "status": self.status.value,
            "error": self.error,
            "seconds": round(self.seconds, 2),
            "checks": [c.as_dict() for c in self.checks],
        }
