"""`gpuconsole bundle HOST`: an incident bundle from the command line.

What the bundle knows of the host's past comes from, in this order: the simulated rack
(``--demo``), the recording (``--record FILE``, else the default one where it holds the host),
else one fresh reading. What it collects on the host itself needs a shell there: this machine
(``local`` or its own name) or an inventory host over SSH.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, EXIT_UNREADABLE, fail
from gpuconsole.cli.commands.options import (
    add_at_option,
    add_demo_options,
    add_inventory_options,
    add_json_option,
    add_output_option,
    add_record_option,
)
from gpuconsole.cli.commands.sources import (
    alert_rules,
    demo_source,
    inventory,
    read_now,
    refuse_unread_inventory,
)
from gpuconsole.core import paths

if TYPE_CHECKING:
    from gpuconsole.actions.bundle.contents import BundleInputs
    from gpuconsole.actions.bundle.make import BundleResult
    from gpuconsole.core.model import HostSnapshot
    from gpuconsole.fleet.record.reader import Recording
    from gpuconsole.hosts.inventory import Inventory
    from gpuconsole.hosts.targets import Target

SIMULATED = "nvidia-smi -q, kernel log, verification: a simulated host has no shell to run them in"


def add(commands: Subcommands) -> None:
    bundle = commands.add_parser(
        "bundle",
        help="write an incident bundle of one host for a ticket (tar.gz): readings, findings, "
        "alerts, nvidia-smi -q, kernel log, verification, actions, summary",
    )
    bundle.add_argument(
        "host", metavar="HOST", help="an inventory host, 'local', or a host of the recording"
    )
    add_record_option(
        bundle,
        "take the readings from this recording (default: the default recording, where it "
        "holds the host)",
    )
    add_at_option(bundle, "the moment the bundle is about")
    add_output_option(
        bundle,
        "PATH",
        "the .tar.gz to write (it must not exist), or a folder to write it in (default: "
        "bundles in the XDG data dir)",
    )
    add_json_option(bundle)
    add_demo_options(bundle)
    add_inventory_options(bundle)
    bundle.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the bundle."""
    import asyncio

    from gpuconsole.actions.bundle.archive import BundleError
    from gpuconsole.actions.bundle.make import make_bundle
    from gpuconsole.cli.output import shown_path
    from gpuconsole.core.untrusted import visible
    from gpuconsole.fleet.record.schema import RecordingError

    try:
        inputs, target = _inputs(args)
        result = asyncio.run(make_bundle(inputs, target, args.output))
    except (BundleError, RecordingError) as error:
        return fail(visible(str(error)), EXIT_UNREADABLE)
    except _BadInput as error:
        return fail(visible(str(error)), EXIT_BAD_INPUT)
    except OSError as error:  # a folder on the way to -o that cannot be entered, say
        if error.filename is None:
            raise
        return fail(f"{shown_path(error.filename)}: {error.strerror or error}", EXIT_UNREADABLE)
    if args.json:
        data = {"path": str(result.path), "files": list(result.files), "notes": list(result.notes)}
        print(json.dumps(data, indent=2))
    else:
        print(_text(result))
    return 0


class _BadInput(Exception):
    pass


def _inputs(args: argparse.Namespace) -> tuple[BundleInputs, Target | None]:
    from gpuconsole.actions.bundle.inputs import (
        WINDOW_BEFORE_S,
        history_inputs,
        recorded_inputs,
    )
    from gpuconsole.fleet.alerts.engine import AlertEngine
    from gpuconsole.hosts.targets import find_target

    host: str = args.host
    if args.demo:
        source = demo_source(args)
        if host not in source.hosts:
            raise _BadInput(f"no host {host!r} in the demo rack (hosts: {', '.join(source.hosts)})")
        if args.at is not None:  # as for a live host: refused, not ignored
            raise _BadInput(
                "--at: the demo rack is made up afresh each run, so it has no past to "
                "go back to; record it (gpuconsole record --demo --record FILE) and give --record "
                "FILE, or leave out --at for a bundle of now"
            )
        history = source.backfill(host, int(WINDOW_BEFORE_S))
        alerts = AlertEngine(alert_rules(args)).replay(history)
        return history_inputs(host, "the demo rack", history, alerts, (SIMULATED,)), None
    asked: list[bool] = []

    def from_inventory() -> Inventory | None:
        asked.append(True)
        return inventory(args)

    target = find_target(host, from_inventory)
    if not asked:
        refuse_unread_inventory(args, f"{host} is this machine, which the bundle reads itself")
    name = target.name if target is not None else host
    recording = _recording(args.record, name)
    if recording is not None:
        try:
            assert recording.start is not None and recording.end is not None
            at = recording.end
            if args.at is not None:
                at = _moment(args.at, recording.start, recording.end, recording.path)
            notes = () if target is not None else (_not_in_inventory(name),)
            return recorded_inputs(recording, name, at, notes), target
        finally:
            recording.close()
    if target is None:
        raise _BadInput(
            f"unknown host {host!r}: not 'local', not in the inventory, not in the recording "
            f"{args.record or paths.RECORDING.path()}"
        )
    if args.at is not None:  # a bundle of now has no past to go back to: refused, not ignored
        default = paths.RECORDING.path()
        looked = f"{default} does not" if default.is_file() else f"there is no {default}"
        raise _BadInput(
            f"--at: no recording holds {name} ({looked}), so there is no past to go back to; "
            "give --record FILE, or leave out --at for a bundle of now"
        )
    history, notes = _read_now(target)
    if history:
        name = history[0].host  # this machine as its own source names it
    alerts = AlertEngine(alert_rules(args)).replay(history)
    origin = (
        "a reading taken now (no recording holds this host)"
        if history
        else "the host itself (no recording holds it, and no reading could be taken)"
    )
    return history_inputs(name, origin, history, alerts, notes), target


def _recording(path: Path | None, host: str) -> Recording | None:
    """The recording to take the host's past from: ``path`` (it must hold the host), else the
    default one where it exists and holds the host."""
    from gpuconsole.fleet.record.reader import Recording

    explicit = path is not None
    path = path or paths.RECORDING.path()
    if not explicit and not path.is_file():
        return None
    recording = Recording(path)
    if host in recording.hosts and recording.end is not None:
        return recording
    recording.close()
    if explicit:
        raise _BadInput(f"{path}: no host {host!r} in this recording")
    return None


def _moment(text: str, start: float, end: float, path: Path) -> float:
    """--at inside the recording, or a refusal that names what the recording holds."""
    from gpuconsole.fleet.record.when import resolve_moment

    try:
        return resolve_moment(text, start, end, str(path))
    except ValueError as error:
        raise _BadInput(f"--at {error}") from None


def _not_in_inventory(host: str) -> str:
    return (
        f"nvidia-smi -q, kernel log, verification: {host} is neither this machine nor an "
        "inventory host, so it was not contacted"
    )


def _read_now(target: Target) -> tuple[list[HostSnapshot], tuple[str, ...]]:
    """One reading of the host now (NVML or nvidia-smi here, the agent over SSH)."""
    from gpuconsole.telemetry import SourceError

    try:
        return [read_now(target.entry)], ()
    except SourceError as error:
        return [], (f"readings: none ({error})",)


def _text(result: BundleResult) -> str:
    from gpuconsole.cli.output import shown_path

    lines = [f"bundle written: {shown_path(result.path)}"]
    lines += [f"  not collected: {note}" for note in result.notes]
    return "\n".join(lines)
