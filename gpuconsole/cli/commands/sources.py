"""What a command watches, reads or acts on, from its options: the demo rack, this host, the
inventory's hosts, a Prometheus server, and the alert rules.

Each refuses with one line (`Refused`) when what was asked for cannot be had: a bad inventory
or alerts file, an unknown host, no GPU telemetry.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, Refused
from gpuconsole.core import paths

if TYPE_CHECKING:
    from gpuconsole.core.model import HostSnapshot
    from gpuconsole.fleet.alerts.config import AlertsConfig
    from gpuconsole.fleet.alerts.rules import AlertRule
    from gpuconsole.hosts.inventory import HostEntry, Inventory
    from gpuconsole.hosts.targets import Target
    from gpuconsole.telemetry import Source
    from gpuconsole.telemetry.sim import SimSource

DEMO_LEAD_SECONDS = 900
"""The demo rack starts this long before now: its trend lines are full and its first scheduled
faults have happened by the time the console opens."""


def demo_source(args: argparse.Namespace) -> SimSource:
    """The simulated rack of ``--demo-hosts`` and ``--seed``."""
    from gpuconsole.core.clock import wall_clock
    from gpuconsole.telemetry.sim import SimSource, demo_rack

    rack = demo_rack(hosts=args.demo_hosts, seed=args.seed, epoch=wall_clock() - DEMO_LEAD_SECONDS)
    return SimSource(rack, wall_clock)


def inventory(args: argparse.Namespace) -> Inventory | None:
    """The hosts of --hosts, else of --inventory, else of the default file where it exists."""
    from gpuconsole.hosts.inventory import InventoryError, hosts_from_option, load_inventory

    try:
        if args.hosts is not None:
            return hosts_from_option(args.hosts)
        path = args.inventory or paths.INVENTORY.path()
        if args.inventory is None and not path.exists():
            return None
        return load_inventory(path)
    except InventoryError as error:
        raise Refused(str(error), code=EXIT_BAD_INPUT) from None


def required_inventory(args: argparse.Namespace, subject: str) -> Inventory:
    """The inventory, or a one-line refusal that says how to give one; ``subject`` is what
    needs it."""
    hosts = inventory(args)
    if hosts is None:
        raise Refused(
            f"{subject}: no inventory (give --hosts or --inventory, or write hosts.toml; "
            "see `gpuconsole --help`)",
            code=EXIT_BAD_INPUT,
        )
    return hosts


def targets(args: argparse.Namespace, names: Sequence[str], every: bool = False) -> list[Target]:
    """The hosts to act on that ``names`` mean (see `resolve_targets`); an unknown one is
    refused, and so are --hosts and --inventory where only this machine is meant (no name, or
    ``local``): the inventory they give would not be read."""
    from gpuconsole.hosts.targets import UnknownHost, resolve_targets

    asked: list[str | None] = []

    def inventory_for(name: str | None) -> Inventory:
        asked.append(name)
        return required_inventory(args, name or "--all")

    try:
        found = resolve_targets(names, inventory_for, every=every)
    except UnknownHost as error:
        raise Refused(str(error), code=EXIT_BAD_INPUT) from None
    if not asked:
        refuse_unread_inventory(args, "no host of it is named, so this acts on this machine")
    return found


def refuse_unread_inventory(args: argparse.Namespace, why: str) -> None:
    """For a command that reads or acts on this machine only: `Refused` where --hosts or
    --inventory was given, an inventory it would not read (``why`` says so)."""
    for given, flag in ((args.hosts, "--hosts"), (args.inventory, "--inventory")):
        if given is not None:
            raise Refused(f"{flag} does not apply: {why}", code=EXIT_BAD_INPUT)


def console_source(args: argparse.Namespace) -> tuple[Source, str]:
    """What the console watches, and its label: the demo, a Prometheus server, or this host's
    GPUs and the inventory's hosts."""
    from gpuconsole.hosts.source import FleetSource
    from gpuconsole.telemetry import SourceError
    from gpuconsole.telemetry.local import local_source

    if args.demo:
        return demo_source(args), "demo rack"
    if args.prometheus:
        from gpuconsole.telemetry.prometheus import PrometheusSource

        try:
            source = PrometheusSource(args.prometheus)
        except SourceError as error:
            raise Refused(str(error)) from None
        return source, f"Prometheus {source.url}"
    hosts = inventory(args)
    try:
        local: Source | None = local_source()
    except SourceError as error:
        if hosts is None:
            raise Refused(f"no local GPU telemetry: {error}. Try `gpuconsole --demo`.") from None
        local = None
    if hosts is None:
        assert local is not None
        return FleetSource(local, None), "this host"
    # asyncssh loads here, only where there are SSH hosts to watch.
    from gpuconsole.hosts.source import SshSource
    from gpuconsole.hosts.supervisor import Supervisor

    remote = SshSource(Supervisor(hosts.hosts, interval=args.refresh))
    try:
        source = FleetSource(local, remote)
    except SourceError as error:
        remote.close()
        raise Refused(str(error), code=EXIT_BAD_INPUT) from None
    count = len(source.hosts)
    return source, f"{count} host{'s' if count != 1 else ''} ({hosts.source})"


def close_source(source: Source) -> None:
    """Close ``source`` if it holds something open (SSH connections, a Prometheus session)."""
    close = getattr(source, "close", None)
    if close is not None:
        close()


def read_now(entry: HostEntry | None) -> HostSnapshot:
    """One reading taken now: of this host (``entry`` None: NVML, else nvidia-smi), or of an
    inventory host over SSH; `SourceError` when there is none."""
    if entry is None:
        from gpuconsole.telemetry.local import local_source

        local = local_source()
        return local.read(local.hosts[0])
    from gpuconsole.hosts.source import SshSource
    from gpuconsole.hosts.supervisor import Supervisor

    remote = SshSource(Supervisor([entry]))
    try:
        remote.settle(entry.connect_timeout + 5.0)
        return remote.read(entry.name)
    finally:
        remote.close()


def snapshot_of(args: argparse.Namespace) -> HostSnapshot:
    """One reading: of a host of the demo rack (--host, else its first), of an inventory host
    over SSH (--host), or of this host."""
    from gpuconsole.telemetry import SourceError

    if args.demo:
        demo = demo_source(args)
        host = demo.hosts[0] if args.host is None else args.host
        if host not in demo.hosts:
            raise Refused(
                f"--host {host!r}: no such host in the demo rack (hosts: {', '.join(demo.hosts)})",
                code=EXIT_BAD_INPUT,
            )
        try:
            return demo.read(host)
        except SourceError as error:
            raise Refused(f"cannot read {host}: {error}") from None
    if args.host is None:
        refuse_unread_inventory(args, "without --host, this reads this machine")
        try:
            return read_now(None)
        except SourceError as error:
            raise Refused(
                f"cannot read this host: {error}. Try `gpuconsole snapshot --demo`."
            ) from None
    hosts = required_inventory(args, f"--host {args.host}")
    try:
        entry = hosts.get(args.host)
    except KeyError as error:
        raise Refused(str(error.args[0]), code=EXIT_BAD_INPUT) from None
    try:
        return read_now(entry)
    except SourceError as error:
        raise Refused(f"cannot read {entry.name}: {error}") from None


def alert_rules(args: argparse.Namespace) -> tuple[AlertRule, ...]:
    """The built-in alert rules changed by the user's alerts file (--alerts), if any."""
    return alerts_config(args).rules


def alerts_config(args: argparse.Namespace) -> AlertsConfig:
    """The user's alerts file (--alerts), if any: the rules, and where their alerts go."""
    from gpuconsole.fleet.alerts.config import load_config
    from gpuconsole.fleet.alerts.rules import RuleError

    try:
        return load_config(args.alerts)
    except RuleError as error:
        raise Refused(str(error), code=EXIT_BAD_INPUT) from None
