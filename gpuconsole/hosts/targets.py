"""The hosts an action can run on: this machine or an inventory host, and what is known of it.

Every action (verify, repair, launch, memory trials, bundles) takes a `Target`; the console's
sources say which of their hosts have one (`TargetFinder`): a simulated host has none. The
commands resolve the names they are given into targets here (`resolve_targets`, `find_target`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gpuconsole.hosts.inventory import HostEntry

if TYPE_CHECKING:
    from gpuconsole.hosts.inventory import Inventory

LOCAL_NAMES = frozenset({"local", "localhost"})
"""The names that mean this machine wherever a command takes a host."""


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

    def target_for(self, host: str) -> Target | None: ...


class UnknownHost(LookupError):
    """A name that is neither this machine nor a host or group of the inventory."""


def local_target() -> Target:
    """This machine, by its own host name."""
    here = socket.gethostname()
    return Target(here, None, Context(here))


def inventory_target(entry: HostEntry) -> Target:
    """An inventory host, reached over SSH."""
    return Target(entry.name, entry, Context(entry.name, entry.expected_gpus))


def resolve_targets(
    names: Sequence[str],
    inventory_for: Callable[[str | None], Inventory],
    *,
    every: bool = False,
) -> list[Target]:
    """The targets ``names`` (and ``every``: all the inventory's hosts) mean, each once.

    A name of `LOCAL_NAMES` is this machine, listed first; any other name is an inventory host,
    or a group standing for its hosts; no name at all, without ``every``, is this machine.
    ``inventory_for`` is asked for the inventory only when a name or ``every`` needs it, with
    the first name that does (None for ``every`` alone). `UnknownHost` for a name it lacks.
    """
    if not names and not every:
        return [local_target()]
    wanted = [n for n in names if n not in LOCAL_NAMES]
    targets = [local_target()] if len(wanted) < len(names) else []
    if not wanted and not every:
        return targets
    inventory = inventory_for(wanted[0] if wanted else None)
    groups = inventory.groups()
    chosen = [h.name for h in inventory.hosts] if every else []
    for name in wanted:
        if name in groups:
            chosen.extend(groups[name])
        else:
            try:
                chosen.append(inventory.get(name).name)
            except KeyError as error:
                raise UnknownHost(error.args[0]) from None
    targets.extend(inventory_target(inventory.get(name)) for name in dict.fromkeys(chosen))
    return targets


def find_target(name: str, inventory: Callable[[], Inventory | None]) -> Target | None:
    """``name``'s target: this machine (by a name of `LOCAL_NAMES` or its own host name), else
    the inventory's host of that name; None when it is neither. ``inventory`` is asked only for
    a name that is not this machine's."""
    local = local_target()
    if name in LOCAL_NAMES or name == local.name:
        return local
    hosts = inventory()
    if hosts is None:
        return None
    try:
        return inventory_target(hosts.get(name))
    except KeyError:
        return None
