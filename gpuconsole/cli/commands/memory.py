"""`gpuconsole memory RECIPE`: short trials of a recipe with each memory fix, the cheapest set
that fits, and (--apply) the recipe launched with it."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, Refused
from gpuconsole.cli.commands.options import (
    add_host_option,
    add_inventory_options,
    add_json_option,
    add_preset_option,
    add_recipe_argument,
    add_steps_option,
    positive_float,
    positive_int,
)
from gpuconsole.cli.commands.sources import targets

if TYPE_CHECKING:
    from gpuconsole.actions.memory.trials import Trial


def add(commands: Subcommands) -> None:
    memory = commands.add_parser(
        "memory",
        help="short trials of a recipe, run as its preset runs it, with each memory fix (mixed "
        "precision, checkpointing, the compiler's memory budget, compression, the optimizer "
        "in backward or on the host, expandable segments, micro-batches) and the cheapest set "
        "that fits",
    )
    add_recipe_argument(memory)
    add_host_option(memory, "an inventory host (default: this host)")
    memory.add_argument(
        "--target",
        type=_memory_target,
        metavar="GIB|N%",
        help="the peak to fit under, in GiB or as a share of the fp32 run's peak "
        "(default: the card's memory less a 20 %% reserve)",
    )
    memory.add_argument(
        "--fixes",
        metavar="SET[,SET...]",
        help="try only these sets (as the report names them, e.g. bf16,bf16+checkpoint), choose "
        "among them and find the largest batch with the choice",
    )
    add_preset_option(
        memory,
        "the job's preset, as `launch` runs it: tuned compiles where the recipe does, "
        "baseline runs eagerly (default tuned)",
    )
    memory.add_argument("--amp", choices=("bf16", "fp16"), default="bf16", help="mixed precision")
    memory.add_argument(
        "--batch-size",
        type=positive_int,
        metavar="N",
        help="the job's batch (default: the recipe's)",
    )
    memory.add_argument("--gpu", type=int, default=0, metavar="INDEX", help="the GPU to try on")
    add_steps_option(
        memory, 20, "measured steps per trial, more (up to 4 × N) until its speed is steady"
    )
    memory.add_argument(
        "--batch-probes",
        type=_probes,
        default=8,
        metavar="N",
        help="at most N short runs search for the largest batch (0: no search)",
    )
    memory.add_argument(
        "--apply", action="store_true", help="then launch the recipe with the recommended fixes"
    )
    add_json_option(memory)
    add_inventory_options(memory)
    memory.set_defaults(run=run)


def _memory_target(text: str) -> tuple[float | None, float | None]:
    """``--target``: (GiB, None) or (None, share) for ``N%``."""
    share = text.endswith("%")
    value = positive_float(text.removesuffix("%"))
    if share and value >= 100:
        raise argparse.ArgumentTypeError(f"{text}: a share under 100%")
    return (None, value / 100) if share else (value, None)


def _probes(text: str) -> int:
    """``--batch-probes``: 0 (no search) or a positive count."""
    return 0 if text.strip() == "0" else positive_int(text)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.actions.memory.output import report_dict, report_text, trial_line
    from gpuconsole.actions.memory.session import (
        DoctorRequest,
        MemoryDoctorError,
        MemoryReport,
        Schedule,
        launch_spec,
        run_doctor,
    )
    from gpuconsole.actions.memory.trials import parse_fix_list
    from gpuconsole.cli.commands.launch import launch_recipe

    hosts = targets(args, [args.host] if args.host else [])  # trials run on one GPU of one host
    try:
        only = parse_fix_list(args.fixes) if args.fixes else None
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
        Schedule(steps=args.steps, batch_probes=args.batch_probes),
        args.preset,
    )
    shown = MemoryReport(hosts[0].name, args.recipe, preset=args.preset, amp=args.amp)

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
    spec = launch_spec(request, report)
    if spec is None:
        raise Refused("--apply: nothing tried fits the target, so nothing was launched")
    return launch_recipe(hosts, spec, gpus=None, slurm_nodes=None, as_json=args.json)
