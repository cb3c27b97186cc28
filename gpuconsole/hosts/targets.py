"""The hosts an action can run on: this machine or an inventory host, and what is known of it.

Every action (verify, repair, launch, memory trials, bundles) takes a `Target`; the console's
sources say which of their hosts have one (`TargetFinder`): a simulated host has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gpuconsole.hosts.inventory import HostEntry


@dataclass(frozen=True, slots=True)
class Context:
    """What an action may know of its host besides what it reads there."""

    host: str
    expected_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """A host to act on: this machine (``entry`` None) or an inventory host over SSH."""

    name: str
    entry: HostEntry | None = None
    context: Context = field(default_factory=lambda: Context("localhost"))


@runtime_checkable
class TargetFinder(Protocol):
    """How to reach a host of the fleet to act on it: None for one that cannot be (simulated)."""

    def verify_target(self, host: str) -> Target | None: ...
