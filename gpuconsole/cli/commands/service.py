"""`gpuconsole drain HOST --reason TEXT` and `gpuconsole resume HOST`: take a node out of its
scheduler (Slurm, or Kubernetes' cordon) and bring it back; the command is shown and confirmed
before it runs, and the scheduler's own word on the node's state is printed after."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, Refused
from gpuconsole.cli.commands.options import add_inventory_options, add_json_option, add_yes_option
from gpuconsole.cli.commands.sources import targets

if TYPE_CHECKING:
    from gpuconsole.actions.service import ServicePlan, ServiceResult


def add(commands: Subcommands) -> None:
    drain = commands.add_parser(
        "drain",
        help="take a host's node out of its scheduler (Slurm drain, or kubectl cordon): no new "
        "jobs land on it; running ones finish",
    )
    drain.add_argument("--reason", required=True, help="why (Slurm keeps it: sinfo -R)")
    resume = commands.add_parser(
        "resume", help="bring a drained node back (Slurm resume, or kubectl uncordon)"
    )
    for parser, change in ((drain, "drain"), (resume, "resume")):
        parser.add_argument(
            "target", metavar="HOST", help="an inventory host, or localhost for this one"
        )
        parser.add_argument(
            "--node", help="the scheduler's name for the node (default: found from the host name)"
        )
        add_yes_option(parser, "do not ask (for scripts)")
        add_json_option(parser)
        add_inventory_options(parser)
        parser.set_defaults(run=run, change=change)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.actions.service import (
        DRAIN,
        ServiceError,
        apply_service,
        checked_reason,
        plan_service,
    )
    from gpuconsole.actions.session import open_shell
    from gpuconsole.hosts.ssh import ConnectFailure

    if args.change == DRAIN:
        try:
            args.reason = checked_reason(args.reason)
        except ServiceError as error:
            raise Refused(str(error), EXIT_BAD_INPUT) from None
    found = targets(args, [args.target])
    if len(found) != 1:
        raise Refused(f"{args.change} takes one host; {args.target} is a group", EXIT_BAD_INPUT)
    (target,) = found

    async def act() -> int:
        async with open_shell(target, args.change) as shell:
            plan = await plan_service(shell, args.change, getattr(args, "reason", None), args.node)
            if not _confirmed(plan, args):
                print(f"{plan.host}: nothing run", file=sys.stderr)
                return 1
            result = await apply_service(shell, plan)
        if args.json:
            print(json.dumps(_result_dict(result), indent=2))
        else:
            print(f"{plan.host}: {result.message}")
        return 0 if result.ok else 2

    try:
        return asyncio.run(act())
    except ServiceError as error:
        raise Refused(str(error)) from None
    except ConnectFailure as error:
        raise Refused(error.reason) from None


def _confirmed(plan: ServicePlan, args: argparse.Namespace) -> bool:
    """Shown exactly, then asked; --yes answers for scripts; no terminal and no --yes is no."""
    shown = f"{plan.host} ({plan.scheduler} node {plan.node}): $ {plan.command}"
    if args.yes:
        if not args.json:
            print(shown, flush=True)
        return True
    if not sys.stdin.isatty():
        print(f"{shown}\nnot run: no terminal to ask; pass --yes", file=sys.stderr)
        return False
    print(shown)
    return input(f"{plan.change} {plan.node}? [y/N] ").strip().lower() in ("y", "yes")


def _result_dict(result: ServiceResult) -> dict[str, object]:
    return asdict(result)
