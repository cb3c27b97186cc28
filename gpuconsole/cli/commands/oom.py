"""`gpuconsole oom LOG`: why a job ran out of GPU memory, from PyTorch's message, and the fixes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import fail
from gpuconsole.cli.commands.options import (
    add_demo_options,
    add_host_option,
    add_inventory_options,
    add_json_option,
)
from gpuconsole.cli.commands.sources import snapshot_of


def add(commands: Subcommands) -> None:
    oom = commands.add_parser(
        "oom", help="explain a PyTorch 'CUDA out of memory' error from a log (- reads stdin)"
    )
    oom.add_argument(
        "log", metavar="LOG", help="a log or traceback holding the message; - for stdin"
    )
    add_host_option(oom, "the inventory host it ran on, to name the card's processes")
    oom.add_argument(
        "--here", action="store_true", help="it ran on this host: read its GPUs' processes"
    )
    add_json_option(oom)
    add_inventory_options(oom)
    add_demo_options(oom)
    oom.set_defaults(run=run)


PASTE_PROMPT = (
    "Paste the log or traceback with the 'CUDA out of memory' message, then press Ctrl-D on a "
    "line of its own."
)


def run(args: argparse.Namespace) -> int:
    from gpuconsole.actions.memory.oom import OomParseError, diagnose, parse_oom, read_log
    from gpuconsole.actions.memory.output import diagnosis_dict, diagnosis_text

    name = "stdin" if args.log == "-" else args.log
    try:
        if args.log == "-":
            if sys.stdin.isatty():  # a person at a terminal, not a pipe: say what to do
                print(PASTE_PROMPT, file=sys.stderr, flush=True)
            text = read_log(sys.stdin.buffer)
        else:
            with Path(args.log).open("rb") as log:
                text = read_log(log)
        message = parse_oom(text)
    except OSError as error:
        return fail(f"{name}: {error.strerror or error}")
    except OomParseError as error:
        return fail(f"{name}: {error}")
    processes = ()
    if args.host or args.here or args.demo or args.hosts is not None or args.inventory is not None:
        processes = snapshot_of(args).processes  # which refuses an inventory no host is read of
    diagnosis = diagnose(message, processes)
    if args.json:
        print(json.dumps(diagnosis_dict(diagnosis), indent=2))
    else:
        print(diagnosis_text(diagnosis))
    return 0
