"""`gpuconsole verify`: check hosts' GPU stack, concurrently; evidence and a fix for each
problem."""

from __future__ import annotations

import argparse
import json

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.options import add_inventory_options, add_json_option
from gpuconsole.cli.commands.sources import targets


def add(commands: Subcommands) -> None:
    verify = commands.add_parser(
        "verify",
        help="check hosts' GPU stack (driver, CUDA, frameworks, PCIe, NVLink, disks): "
        "evidence and a fix for every problem",
    )
    verify.add_argument(
        "targets",
        nargs="*",
        metavar="HOST",
        help="inventory hosts or groups to verify (default: this host; 'local' is this host)",
    )
    verify.add_argument("--all", action="store_true", help="every host of the inventory")
    add_json_option(verify)
    add_inventory_options(verify)
    verify.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.actions.verify.checks import CHECKS
    from gpuconsole.actions.verify.output import exit_code, reports_text
    from gpuconsole.actions.verify.runner import verify_targets

    reports = asyncio.run(verify_targets(targets(args, args.targets, every=args.all), CHECKS))
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    else:
        print(reports_text(reports))
    return exit_code(reports)
