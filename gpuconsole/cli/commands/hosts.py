"""`gpuconsole hosts check`: connect to each inventory host once and say how it is."""

from __future__ import annotations

import argparse
import json

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, Refused
from gpuconsole.cli.commands.options import add_inventory_options, add_json_option
from gpuconsole.cli.commands.sources import required_inventory


def add(commands: Subcommands) -> None:
    hosts = commands.add_parser("hosts", help="the SSH hosts of the inventory")
    hosts_commands = hosts.add_subparsers(dest="hosts_command", metavar="COMMAND", required=True)
    check = hosts_commands.add_parser(
        "check",
        help="connect to each host once; wait for its first reading or definite answer; print "
        "name, state, which it was, GPU count and reason",
    )
    add_json_option(check)
    add_inventory_options(check)
    check.set_defaults(run=run_check)


def run_check(args: argparse.Namespace) -> int:
    from gpuconsole.hosts.check import TooManyHosts, check_hosts, exit_code, results_text

    try:
        results = check_hosts(required_inventory(args, "hosts check"))
    except TooManyHosts as error:
        raise Refused(str(error), EXIT_BAD_INPUT) from None
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        print(results_text(results))
    return exit_code(results)
