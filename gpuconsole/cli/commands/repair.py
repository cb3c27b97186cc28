"""`gpuconsole repair [HOST]`: why the NVIDIA driver does not work on a host, and the plans that
fix it, each shown before it runs and run only on a yes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, Refused
from gpuconsole.cli.commands.options import add_inventory_options, add_json_option, add_yes_option
from gpuconsole.cli.commands.sources import targets

if TYPE_CHECKING:
    from gpuconsole.actions.repair.model import Plan


def add(commands: Subcommands) -> None:
    repair = commands.add_parser(
        "repair",
        help="find why the NVIDIA driver does not work on a host and fix it: every command "
        "shown first, nothing run without a yes",
    )
    repair.add_argument(
        "target", nargs="?", metavar="HOST", help="an inventory host (default: this host)"
    )
    repair.add_argument(
        "--dry-run", action="store_true", help="diagnose and show the plans; run nothing"
    )
    add_yes_option(repair, "run the plans without asking (for scripts)")
    add_json_option(repair)
    add_inventory_options(repair)
    repair.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.actions.repair.output import diagnosis_text, plan_text, report_text
    from gpuconsole.actions.repair.session import repair_target

    found = targets(args, [args.target] if args.target else [])
    if len(found) != 1:  # a group: repair asks and runs one host's plans at a time
        names = ", ".join(t.name for t in found)
        raise Refused(
            f"repair takes one host; {args.target} is a group of {len(found)} ({names})",
            code=EXIT_BAD_INPUT,
        )
    (target,) = found
    interactive = not args.json and sys.stdin.isatty()
    numbers: dict[str, int] = {}

    async def confirm(plan: Plan, commands: Sequence[str]) -> bool:
        if args.yes:
            return True
        if not interactive:
            print(f"{plan.title}: not run: no terminal to ask; pass --yes", file=sys.stderr)
            return False
        numbers[plan.cause_id] = len(numbers) + 1
        print(plan_text(numbers[plan.cause_id], plan, tuple(commands)))
        answer = await asyncio.to_thread(input, f"run these on {target.name}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    def show(line: str) -> None:
        if not args.json:
            print(f"  {line}", flush=True)

    report = asyncio.run(repair_target(target, confirm=confirm, dry_run=args.dry_run, on_line=show))
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    elif interactive and not args.dry_run and report.diagnosis is not None:
        print(diagnosis_text(report.diagnosis))
        for done in report.runs:
            print(f"{done.plan.title}: {done.message}")
        if report.after is not None:
            print(f"verified again: {report.after.status.value}")
    else:
        print(report_text(report))
    return report.exit_code
