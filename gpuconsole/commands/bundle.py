"""`gpuconsole bundle HOST`: an incident bundle from the command line.

What the bundle knows of the host's past comes from, in this order: the simulated rack
(``--demo``), the recording (``--record FILE``, else the default one where it holds the host),
else one fresh reading. What it collects on the host itself needs a shell there: this machine
(``local`` or its own name) or an inventory host over SSH.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuconsole import paths

if TYPE_CHECKING:
    from gpuconsole.actions.bundle.contents import BundleInputs
    from gpuconsole.actions.bundle.make import BundleResult
    from gpuconsole.hosts.targets import Target
    from gpuconsole.model import HostSnapshot
    from gpuconsole.record.reader import Recording
    from gpuconsole.telemetry import Source

EXIT_BAD_INPUT = 2
EXIT_UNREADABLE = 3
SIMULATED = "nvidia-smi -q, kernel log, verification: a simulated host has no shell to run them in"

AddOptions = Callable[[argparse.ArgumentParser], None]
TargetOf = Callable[[str], "Target | None"]


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    source_options: tuple[AddOptions, ...],
) -> None:
    bundle = commands.add_parser(
        "bundle",
        help="write an incident bundle of one host for a ticket (tar.gz): readings, findings, "
        "alerts, nvidia-smi -q, kernel log, verification, actions, summary",
    )
    bundle.add_argument(
        "host", metavar="HOST", help="an inventory host, 'local', or a host of the recording"
    )
    bundle.add_argument(
        "--record",
        type=Path,
        metavar="FILE",
        help="take the readings from this recording (default: the default recording, where it "
        "holds the host)",
    )
    bundle.add_argument(
        "--at",
        metavar="TIME",
        help="the moment the bundle is about, in a recording (03:12, 2026-01-01 03:12:05; "
        "default: its end)",
    )
    bundle.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="PATH",
        help="the .tar.gz to write (it must not exist), or a folder to write it in (default: "
        "bundles in the XDG data dir)",
    )
    bundle.add_argument("--json", action="store_true", help="print JSON instead of text")
    for add in source_options:
        add(bundle)


def run_bundle(
    args: argparse.Namespace,
    demo_source: Callable[[], Source],
    target_of: TargetOf,
    rules_of: Callable[[], Sequence[Any]],
) -> int:
    """Write the bundle; ``target_of`` says how to reach a host's shell (None: no such host)."""
    from gpuconsole.actions.bundle.archive import BundleError
    from gpuconsole.actions.bundle.make import make_bundle
    from gpuconsole.record.schema import RecordingError

    try:
        inputs, target = _inputs(args, demo_source, target_of, rules_of)
        result = asyncio.run(make_bundle(inputs, target, args.output))
    except (BundleError, RecordingError) as error:
        return _fail(str(error), EXIT_UNREADABLE)
    except _BadInput as error:
        return _fail(str(error), EXIT_BAD_INPUT)
    if args.json:
        data = {"path": str(result.path), "files": list(result.files), "notes": list(result.notes)}
        print(json.dumps(data, indent=2))
    else:
        print(_text(result))
    return 0


class _BadInput(Exception):
    pass


def _inputs(
    args: argparse.Namespace,
    demo_source: Callable[[], Source],
    target_of: TargetOf,
    rules_of: Callable[[], Sequence[Any]],
) -> tuple[BundleInputs, Target | None]:
    from gpuconsole.actions.bundle.inputs import (
        WINDOW_BEFORE_S,
        history_inputs,
        recorded_inputs,
    )
    from gpuconsole.alerts.engine import AlertEngine

    host: str = args.host
    if args.demo:
        source = demo_source()
        if host not in source.hosts:
            raise _BadInput(f"no host {host!r} in the demo rack (hosts: {', '.join(source.hosts)})")
        history = source.backfill(host, int(WINDOW_BEFORE_S))
        alerts = AlertEngine(rules_of()).replay(history)
        return history_inputs(host, "the demo rack", history, alerts, (SIMULATED,)), None
    target = target_of(host)
    name = target.name if target is not None else host
    recording = _recording(args.record, name)
    if recording is not None:
        try:
            assert recording.end is not None
            at = recording.end
            if args.at is not None:
                at = _moment(args.at, recording)
            notes = () if target is not None else (_not_in_inventory(name),)
            return recorded_inputs(recording, name, at, notes), target
        finally:
            recording.close()
    if args.at is not None:
        raise _BadInput(f"--at needs a recording that holds {name} (give --record FILE)")
    if target is None:
        raise _BadInput(
            f"unknown host {host!r}: not 'local', not in the inventory, not in the recording "
            f"{args.record or paths.RECORDING.path()}"
        )
    history, notes = _read_now(target)
    if history:
        name = history[0].host  # this machine as its own source names it
    alerts = AlertEngine(rules_of()).replay(history)
    origin = (
        "a reading taken now (no recording holds this host)"
        if history
        else "the host itself (no recording holds it, and no reading could be taken)"
    )
    return history_inputs(name, origin, history, alerts, notes), target


def _recording(path: Path | None, host: str) -> Recording | None:
    """The recording to take the host's past from: ``path`` (it must hold the host), else the
    default one where it exists and holds the host."""
    from gpuconsole.record.reader import Recording

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


def _moment(text: str, recording: Recording) -> float:
    from gpuconsole.record.when import parse_moment

    try:
        return parse_moment(text, recording.start, recording.end)
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
        if target.entry is None:
            from gpuconsole.telemetry.local import local_source

            source = local_source()
            snapshot = source.read(source.hosts[0])
            return [snapshot], ()
        from gpuconsole.hosts.source import SshSource
        from gpuconsole.hosts.supervisor import Supervisor

        remote = SshSource(Supervisor([target.entry]))
        try:
            remote.settle(target.entry.connect_timeout + 5.0)
            return [remote.read(target.name)], ()
        finally:
            remote.close()
    except SourceError as error:
        return [], (f"readings: none ({error})",)


def _text(result: BundleResult) -> str:
    lines = [f"bundle written: {result.path}"]
    lines += [f"  not collected: {note}" for note in result.notes]
    return "\n".join(lines)


def _fail(message: str, code: int) -> int:
    print(f"gpuconsole: {message}", file=sys.stderr)
    return code
