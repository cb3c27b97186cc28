"""`gpuconsole launch RECIPE`: a training recipe run as a benchmark (python or torchrun on a host,
torchrun across hosts, srun on a Slurm login node), kept and compared with its history."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
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
    positive_int,
)
from gpuconsole.cli.commands.sources import targets

if TYPE_CHECKING:
    from gpuconsole.actions.launch.commands import LaunchSpec
    from gpuconsole.actions.launch.session import HostGpus, Launch
    from gpuconsole.hosts.targets import Target


def add(commands: Subcommands) -> None:
    launch = commands.add_parser(
        "launch",
        help="run a training recipe as a benchmark (python or torchrun on a host, torchrun "
        "across hosts, srun on a Slurm login node) and compare it with its history",
    )
    add_recipe_argument(launch)
    add_host_option(launch, "an inventory host (default: this host)")
    launch.add_argument(
        "--nodes", metavar="H1,H2", help="inventory hosts for one multi-node run (c10d rendezvous)"
    )
    launch.add_argument(
        "--slurm",
        type=positive_int,
        metavar="NODES",
        help="the host is a Slurm login node: srun the job on this many nodes (--gpus each)",
    )
    launch.add_argument(
        "--gpus",
        type=positive_int,
        metavar="N",
        help="GPUs per host (default: all; fewer: the best-connected set)",
    )
    add_preset_option(launch)
    add_steps_option(launch, None, "measured steps")
    add_json_option(launch)
    add_inventory_options(launch)
    launch.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuconsole.actions.launch.commands import LaunchSpec

    spec = LaunchSpec(args.recipe, args.preset, args.steps, tuple(args.recipe_args))
    if args.nodes:
        hosts = targets(args, [n for n in args.nodes.split(",") if n])
        if len(hosts) < 2:
            raise Refused("--nodes: name two or more hosts", code=EXIT_BAD_INPUT)
    else:
        hosts = targets(args, [args.host] if args.host else [])
    return launch_recipe(hosts, spec, gpus=args.gpus, slurm_nodes=args.slurm, as_json=args.json)


def launch_recipe(
    hosts: Sequence[Target],
    spec: LaunchSpec,
    *,
    gpus: int | None,
    slurm_nodes: int | None,
    as_json: bool,
) -> int:
    """Run ``spec`` on ``hosts``, keep the result in the benchmark history, print it; the exit
    code: 0 finished, 1 finished but flagged slow against the history, 2 failed."""
    import asyncio

    from gpuconsole.actions.launch.commands import LaunchError
    from gpuconsole.actions.launch.output import result_dict, result_text, step_text
    from gpuconsole.actions.launch.record import record_run
    from gpuconsole.actions.launch.session import launch
    from gpuconsole.bench.history import BenchHistory, HistoryError

    def on_plan(plan: Launch, _gpus: HostGpus) -> None:
        if not as_json:
            for host, command in plan.commands.items():
                print(f"{host} ({plan.engine}): $ {command}", flush=True)

    def on_event(event: dict[str, object]) -> None:
        if not as_json and event.get("event") == "step":
            print(step_text(event), flush=True)

    try:
        plan, host_gpus, result = asyncio.run(
            launch(
                hosts,
                spec,
                gpus=gpus,
                slurm_nodes=slurm_nodes,
                on_plan=on_plan,
                on_event=on_event,
            )
        )
    except LaunchError as error:
        raise Refused(f"launch {spec.recipe}: {error}") from None
    try:
        stored, judgement = record_run(BenchHistory(), result, host_gpus.driver)
    except HistoryError as error:
        print(f"gpuconsole: {error} (the result was not kept)", file=sys.stderr)
        stored, judgement = None, None
    if as_json:
        print(json.dumps(result_dict(plan, result, stored, judgement), indent=2))
    else:
        print(result_text(result, judgement))
    if not result.ok:
        return 2
    return 1 if judgement is not None and judgement.flagged else 0
