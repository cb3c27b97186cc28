"""`gpuconsole hosts check`: connect to every host of the inventory once and say how each is.

Each host is waited for until its first reading or its first definite answer (a refused host
key, a refused login, a refused connection, an agent that cannot read GPUs), and the result
says which it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuconsole.core.model import HostState
from gpuconsole.core.untrusted import visible
from gpuconsole.hosts.inventory import Inventory
from gpuconsole.hosts.source import SshSource
from gpuconsole.hosts.ssh import SshSettings
from gpuconsole.hosts.supervisor import Supervisor

READING, ANSWER, TIMEOUT = "reading", "answer", "timeout"
"""What ended the wait for a host: its first reading, a definite answer, or the timeout."""
MAX_CHECKED_HOSTS = 1024
"""The most hosts one check connects to; a larger inventory is refused before any connection.

A check holds a task, a connection and an agent per host at once and connects 16 at a time
within one wait (the longest connect timeout + 5 s): past about a thousand hosts the wait ends
before the last ones have been tried, and they would be reported as hosts that did not answer
(2,000 hosts refusing at once took 7.5 s on a 2-core machine; 200,000 took 750 MB and never
settled). A fleet that size is checked a rack at a time, or watched through Prometheus."""


class TooManyHosts(ValueError):
    """An inventory larger than one check connects to; the message is one line that says so."""


@dataclass(frozen=True, slots=True)
class HostCheck:
    """One host's answer: its state (the words of `HostState`), why, its GPU count, what ended
    the wait for it (`READING`, `ANSWER`, `TIMEOUT`), and what connecting changed."""

    name: str
    state: str
    reason: str | None
    gpus: int | None
    answered_by: str = READING
    notices: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.state == HostState.LIVE.value and self.reason is None

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "state": self.state,
            "reason": self.reason,
            "gpus": self.gpus,
            "answered_by": self.answered_by,
            "notices": list(self.notices),
        }


def check_hosts(
    inventory: Inventory, settings: SshSettings | None = None, timeout: float | None = None
) -> list[HostCheck]:
    """Connect to every host at once (bounded), wait for each one's first reading or definite
    answer.

    ``timeout`` defaults to the longest connect timeout of the inventory plus the agent's start.
    `TooManyHosts` for more than `MAX_CHECKED_HOSTS` hosts.
    """
    if len(inventory.hosts) > MAX_CHECKED_HOSTS:
        raise TooManyHosts(
            f"hosts check: {visible(inventory.source)} holds {len(inventory.hosts):,} hosts, "
            f"more than the {MAX_CHECKED_HOSTS:,} one check connects to; check a rack at a time "
            "(--hosts NAMES, or an inventory of that rack), or watch a fleet this size through "
            "Prometheus (gpuconsole --prometheus URL)"
        )
    wait = timeout or max(h.connect_timeout for h in inventory.hosts) + 5.0
    source = SshSource(Supervisor(inventory.hosts, settings))
    started = time.monotonic()
    try:
        source.settle(wait)
        waited = time.monotonic() - started
        return [_result(source.supervisor, name, waited) for name in source.hosts]
    finally:
        source.close()


def _result(supervisor: Supervisor, name: str, waited: float) -> HostCheck:
    link = supervisor.link(name)
    notices = tuple(link.notices)
    if link.latest is not None:
        gpus = len(link.latest.gpus)
        expected = link.entry.expected_gpus
        reason = None
        if expected is not None and gpus != expected:
            reason = f"{name}: {gpus} GPUs found, the inventory expects {expected}"
        return HostCheck(name, HostState.LIVE.value, reason, gpus, READING, notices)
    if link.state is not HostState.CONNECTING:
        return HostCheck(name, link.state.value, link.reason, None, ANSWER, notices)
    last = f" ({link.reason})" if link.reason else ""
    reason = f"{name}: no reading and no definite answer within {waited:.0f} s{last}"
    return HostCheck(name, HostState.DOWN.value, reason, None, TIMEOUT, notices)


def exit_code(results: list[HostCheck]) -> int:
    """0 every host live as expected, 1 a live host differs from the inventory, 2 any not live."""
    if any(r.state != HostState.LIVE.value for r in results):
        return 2
    return 0 if all(r.ok for r in results) else 1


def results_text(results: list[HostCheck]) -> str:
    """A header, then one line per host (name, state, what ended the wait, GPUs, reason), each
    followed by its notices."""
    width = max(len("HOST"), *(len(r.name) for r in results))
    lines = [f"{'HOST':<{width}}  {'STATE':<17}  {'ENDED':<7}  {'GPUS':>7}  REASON"]
    for r in results:
        gpus = "-" if r.gpus is None else f"{r.gpus} GPUs"
        lines.append(
            f"{r.name:<{width}}  {r.state:<17}  {r.answered_by:<7}  {gpus:>7}  "
            f"{r.reason or ''}".rstrip()
        )
        lines += [f"{'':<{width}}  note: {notice}" for notice in r.notices]
    return "\n".join(lines)
