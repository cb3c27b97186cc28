"""What a driver repair is made of: the host's distribution, the causes found with their
evidence, and plans of steps, each step a shell command line shown exactly as it will run."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from gpuconsole.actions.verify.model import CheckResult


class Family(str, Enum):
    """Which package tools a host has."""

    DEBIAN = "debian"  # Debian, Ubuntu: apt-get, ubuntu-drivers, update-initramfs
    RHEL = "rhel"  # RHEL, Rocky, Alma, Fedora: dnf, dracut
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Distro:
    """The host's distribution (from /etc/os-release) and running kernel."""

    family: Family
    id: str | None = None
    version_id: str | None = None
    kernel: str | None = None


@dataclass(frozen=True, slots=True)
class Cause:
    """A reason the driver does not work, found in the evidence."""

    id: str
    title: str
    explanation: str
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Walked:
    """One stop of the diagnosis walk: what was asked, the answer, and what it rests on."""

    cause_id: str
    question: str
    found: bool | None
    """True: this cause is present; False: ruled out; None: could not tell (a tool is missing)."""
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """One command of a plan. ``command`` is a complete shell line, every argument quoted."""

    title: str
    command: str
    root: bool = True
    """Run through `sudo -n` when the user is not root."""
    timeout: float = 600.0


@dataclass(frozen=True, slots=True)
class Plan:
    """What fixes one cause on this host's distribution."""

    cause_id: str
    title: str
    steps: tuple[Step, ...]
    outcome: str
    """What the host looks like when the plan worked."""
    reboot: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The walk over the causes, the causes found (in walk order) and the checks it read."""

    host: str
    distro: Distro
    walk: tuple[Walked, ...]
    causes: tuple[Cause, ...]
    results: tuple[CheckResult, ...] = field(default=())

    @property
    def healthy(self) -> bool:
        return not self.causes
