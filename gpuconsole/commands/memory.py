"""`gpuconsole memory RECIPE`: short trials of a recipe with each memory fix, the cheapest set
that fits, and (--apply) the recipe launched with it."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from gpuconsole.commands import Subcommands
from gpuconsole.commands.exits import EXIT_BAD_INPUT, Refused
from gpuconsole.commands.launch import RECIPES
from gpuconsole.commands.options import add_inventory_options, positive_float, positive_int
from gpuconsole.commands.sources import targets

if TYPE_CHECKING:
    from gpuconsole.actions.memory.trials import Trial


def add(commands: Subcommands) -> None:
    memory = commands.add_parser(
        "memory",
        help="short trials of a recipe with each memory fix (mixed precision, checkpointing, "
        "compression, expandable segments, micro-batches) and the cheapest set that fits",
    )
    memory.add_argument("recipe", choices=RECIPES)
    memory.add_argument("--host", metavar="NAME", help="an inventory host (default: this host)")
    memory.add_argument(
        "--target",
        type=_memory_target,
        metavar="GIB|N%",
        help="the peak to fit under, in GiB or as a share of the fp32 run's peak "
        "(default: the card's memory less a 20 %% reserve)",
    )
    memory.add_argument(
        "--fixes",
        metavar="SET",
        help="try only this set (as the report names it, e.g. bf16+checkpoint) and find the "
        "largest batch with it",
    )
    memory.add_argument("--amp", choices=("bf16", "fp16"), default="bf16", help="mixed precision")
    memory.add_argument(
        "--batch-size",
        type=positive_int,
        metavar="N",
        help="the job's batch (default: the recipe's)",
    )
    memory.add_argument("--gpu", type=int, default=0, metavar="INDEX", help="the GPU to try on")
    memory.add_argument(
        "--steps", type=positive_int, default=8, metavar="N", help="measured steps per trial"
    )
    memory.add_argument(
        "--apply", action="store_true", help="then launch the recipe with the recommended fixes"
    )
    memory.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_inventory_options(memory)
    memory.set_defaults(run=run)


def _memory_target(text: str) -> tuple[float | None, float | None]:
    """``--target``: (GiB, None) or (None, share) for ``N%``."""
    share = text.endswith("%")
    value = positive_float(text.removesuffix("%"))
    if share and value >= 100:
        raise argparse.ArgumentTypeError(f"{text}: a share under 100%")
    return (None, value / 100) if share else (value, None)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.actions.launch.commands import LaunchSpec
    from gpuconsole.actions.memory.output import report_dict, report_text, trial_line
    from gpuconsole.actions.memory.session import (
        DoctorRequest,
        MemoryDoctorError,
        MemoryReport,
        Schedule,
        run_doctor,
    )
    from gpuconsole.actions.memory.trials import parse_fixes
    from gpuconsole.commands.launch import launch_recipe

    hosts = targets(args, [args.host] if args.host else [])  # trials run on one GPU of one host
    try:
        only = parse_fixes(args.fixes) if args.fixes else None
    except ValueError as error:
        raise Refused(f"--fixes {error}", code=EXIT_BAD_INPUT) from None
    target_gib, target_share = args.target or (None, None)
    request = DoctorRequest(
        args.recipe,
        target_gib,
        target_share,
        only,
        args.amp,
        args.batch_size,
        args.gpu,
        tuple(args.recipe_args),
        Schedule(steps=args.steps),
    )
    shown = MemoryReport(hosts[0].name, args.recipe)

    def on_trial(trial: Trial) -> None:
        shown.trials.append(trial)
        if not args.json:
            print(trial_line(trial, shown), flush=True)

    try:
        report = asyncio.run(run_doctor(hosts[0], request, on_trial=on_trial))
    except MemoryDoctorError as error:
        raise Refused(f"memory {args.recipe}: {error}", code=EXIT_BAD_INPUT) from None
    if args.json:
        print(json.dumps(report_dict(report), indent=2))
    else:
        print()
        print(report_text(report))
    if not args.apply:
        return 0 if report.recommended is not None else 1
    if report.recommended is None:
        raise Refused("--apply: nothing tried fits the target, so nothing was launched")
    fixed = report.recommended.fixes.arguments(report.batch_size or 1)
    spec = LaunchSpec(args.recipe, "baseline", None, (*fixed, *args.recipe_args))
    return launch_recipe(hosts, spec, gpus=None, slurm_nodes=None, as_json=args.json)
