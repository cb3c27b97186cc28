"""`gpuconsole hosts check`: connect to every host of the inventory once and say how each is."""

from __future__ import annotations

from dataclasses import dataclass

from gpuconsole.hosts.inventory import Inventory
from gpuconsole.hosts.source import SshSource
from gpuconsole.hosts.ssh import SshSettings
from gpuconsole.hosts.supervisor import Supervisor
from gpuconsole.model import HostState


@dataclass(frozen=True, slots=True)
class HostCheck:
    """One host's answer: its state (the words of `HostState`), why, and its GPU count."""

    name: str
    state: str
    reason: str | None
    gpus: int | None

    @property
    def ok(self) -> bool:
        return self.state == HostState.LIVE.value and self.reason is None

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "state": self.state, "reason": self.reason, "gpus": self.gpus}


def check_hosts(
    inventory: Inventory, settings: SshSettings | None = None, timeout: float | None = None
) -> list[HostCheck]:
    """Connect to every host at once (bounded), wait for its first reading or first failure.

    ``timeout`` defaults to the longest connect timeout of the inventory plus the agent's start.
    """
    wait = timeout or max(h.connect_timeout for h in inventory.hosts) + 5.0
    source = SshSource(Supervisor(inventory.hosts, settings))
    try:
        source.settle(wait)
        return [_result(source.supervisor, name, wait) for name in source.hosts]
    finally:
        source.close()


def _result(supervisor: Supervisor, name: str, waited: float) -> HostCheck:
    link = supervisor.link(name)
    gpus = len(link.latest.gpus) if link.latest is not None else None
    if link.latest is not None:
        expected = link.entry.expected_gpus
        reason = None
        if expected is not None and gpus != expected:
            reason = f"{name}: {gpus} GPUs found, the inventory expects {expected}"
        return HostCheck(name, HostState.LIVE.value, reason, gpus)
    if link.state is HostState.CONNECTING or link.state is HostState.LIVE:
        reason = link.reason or f"{name}: no reading within {waited:g} s"
        return HostCheck(name, HostState.DOWN.value, reason, None)
    return HostCheck(name, link.state.value, link.reason, None)


def exit_code(results: list[HostCheck]) -> int:
    """0 every host live as expected, 1 a live host differs from the inventory, 2 any not live."""
    if any(r.state != HostState.LIVE.value for r in results):
        return 2
    return 0 if all(r.ok for r in results) else 1


def results_text(results: list[HostCheck]) -> str:
    width = max(len(r.name) for r in results)
    lines = []
    for r in results:
        gpus = "-" if r.gpus is None else f"{r.gpus} GPUs"
        lines.append(f"{r.name:<{width}}  {r.state:<17}  {gpus:>7}  {r.reason or ''}".rstrip())
    return "\n".join(lines)
