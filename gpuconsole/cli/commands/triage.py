"""`gpuconsole triage --from FILE`: the findings of a saved nvidia-smi dump."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import fail
from gpuconsole.cli.commands.options import add_json_option

if TYPE_CHECKING:
    from gpuconsole.core.model import HostSnapshot


def add(commands: Subcommands) -> None:
    triage = commands.add_parser(
        "triage", help="findings of a saved nvidia-smi dump (-q -x XML or -q text)"
    )
    triage.add_argument("--from", dest="dump", required=True, type=Path, metavar="FILE")
    add_json_option(triage)
    triage.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuconsole.cli.output import findings_text, shown_path
    from gpuconsole.core.jsonout import exit_code, finding_dict
    from gpuconsole.core.untrusted import visible
    from gpuconsole.rules import health
    from gpuconsole.telemetry.smi import SmiParseError, parse_dump, read_dump

    path: Path = args.dump
    shown = shown_path(path)  # the file's name is whatever its sender chose: one line, always
    try:
        snapshot = parse_dump(read_dump(path), host=shown_path(path.stem), time=time.time())
    except OSError as error:
        return fail(f"{shown}: {error.strerror or error}")
    except SmiParseError as error:
        return fail(f"{shown}: {visible(str(error))}")
    findings = health.evaluate(snapshot)
    if args.json:
        print(
            json.dumps(
                {
                    "file": str(path),
                    "gpus": len(snapshot.gpus),
                    "attached_gpus": snapshot.attached_gpus or len(snapshot.gpus),
                    "bus_ids": [gpu.pci_bus_id for gpu in snapshot.gpus],
                    "driver_version": snapshot.driver_version,
                    "findings": [finding_dict(f) for f in findings],
                },
                indent=2,
            )
        )
    else:
        print(f"{shown}: {len(snapshot.gpus)} GPUs, driver {snapshot.driver_version or 'N/A'}")
        if snapshot.attached_gpus:
            print(_partial_note(snapshot))
        print(findings_text(findings))
    return exit_code(findings)


def _partial_note(snapshot: HostSnapshot) -> str:
    """What a dump of fewer GPUs than the host has (``nvidia-smi -q -i``) means for its numbers:
    they are the dump's order, not the host's, so each is named by its bus id."""
    names = ", ".join(
        f"GPU {gpu.index} = {gpu.pci_bus_id or 'bus id N/A'}" for gpu in snapshot.gpus
    )
    return (
        f"  a dump of {len(snapshot.gpus)} of the {snapshot.attached_gpus} GPUs attached "
        f"(nvidia-smi -i); its GPU numbers are the dump's order: {names}"
    )
