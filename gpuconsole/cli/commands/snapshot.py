"""`gpuconsole snapshot`: one reading of a host and its findings, as text or JSON."""

from __future__ import annotations

import argparse
import json

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.options import (
    add_demo_options,
    add_host_option,
    add_inventory_options,
    add_json_option,
)
from gpuconsole.cli.commands.sources import snapshot_of


def add(commands: Subcommands) -> None:
    snapshot = commands.add_parser(
        "snapshot", help="print this host's readings and findings once, then exit"
    )
    add_json_option(snapshot)
    add_host_option(
        snapshot,
        "read this inventory host over SSH instead of this host (with --demo: this host "
        "of the demo rack instead of its first)",
    )
    add_demo_options(snapshot)
    add_inventory_options(snapshot)
    snapshot.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuconsole.cli.output import findings_text, snapshot_text
    from gpuconsole.core.jsonout import exit_code, snapshot_dict
    from gpuconsole.rules import health

    snapshot = snapshot_of(args)
    findings = health.evaluate(snapshot)
    if args.json:
        print(json.dumps(snapshot_dict(snapshot, findings), indent=2))
    else:
        print(snapshot_text(snapshot))
        print(findings_text(findings))
    return exit_code(findings)
