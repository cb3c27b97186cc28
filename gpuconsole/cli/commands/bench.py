"""`gpuconsole bench history`: the benchmark runs `launch` kept, newest first, regressions
flagged."""

from __future__ import annotations

import argparse
import json

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import Refused
from gpuconsole.cli.commands.options import add_host_option, add_json_option


def add(commands: Subcommands) -> None:
    bench = commands.add_parser("bench", help="benchmark results kept by `launch`")
    bench_commands = bench.add_subparsers(dest="bench_command", metavar="COMMAND", required=True)
    history = bench_commands.add_parser("history", help="earlier runs, newest first, flagged")
    add_host_option(history)
    history.add_argument("--recipe", metavar="NAME")
    add_json_option(history)
    history.set_defaults(run=run_history)


def run_history(args: argparse.Namespace) -> int:
    from gpuconsole.bench.history import BenchHistory, HistoryError
    from gpuconsole.bench.output import history_json, history_text
    from gpuconsole.bench.review import REVIEW_LIMIT, judged

    history = BenchHistory()
    try:
        results = history.runs(host=args.host, recipe=args.recipe)
        verdicts = judged(results, history.runs(limit=REVIEW_LIMIT)) if results else []
    except HistoryError as error:
        raise Refused(str(error)) from None
    if args.json:
        print(json.dumps(history_json(results), indent=2))
    else:
        print(history_text(results, verdicts) if results else "no benchmark runs recorded yet")
    return 0
