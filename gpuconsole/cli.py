"""The `gpuconsole` command: the console itself, and subcommands for scripts and tickets."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuconsole import __version__

if TYPE_CHECKING:
    from gpuconsole.telemetry.sim import SimSource

DESCRIPTION = """\
A terminal operations console for GPU servers: every GPU of every host at a glance
(utilization, memory, thermals, power, throttling, errors, processes, topology).

Keys: arrows move, Enter opens a host, Space shows a host's GPUs, t shows the topology,
s sorts, / filters, Esc goes back, ? lists every key, Ctrl+P opens the command palette,
q quits.
"""

# The demo rack starts this long before now: its trend lines are full and its first scheduled
# faults have happened by the time the console opens.
DEMO_LEAD_SECONDS = 900

EPILOG = """\
examples:
  gpuconsole --demo                  a simulated rack of six hosts with faults on
  gpuconsole --demo --demo-hosts 64  a 64-host simulated rack
  gpuconsole                         this host's GPUs (NVML, else nvidia-smi)
  gpuconsole snapshot --json         this host's readings and findings as JSON
  gpuconsole triage --from dump.xml  findings of a saved `nvidia-smi -q -x` (or -q) dump

exit codes of snapshot and triage: 0 healthy, 1 warnings, 2 critical findings,
3 nothing to read (no driver, an unreadable dump).
"""

EXIT_UNREADABLE = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuconsole",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuconsole {__version__}")
    _add_demo_options(parser)
    parser.add_argument(
        "--refresh",
        type=_positive_float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between readings (default: 1)",
    )
    parser.add_argument(
        "--theme",
        default=None,
        metavar="NAME",
        help="colour theme: gpuconsole-dark (the default) or gpuconsole-light; NO_COLOR=1 "
        "turns colour off",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    snapshot = commands.add_parser(
        "snapshot", help="print this host's readings and findings once, then exit"
    )
    snapshot.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_demo_options(snapshot)
    triage = commands.add_parser(
        "triage", help="findings of a saved nvidia-smi dump (-q -x XML or -q text)"
    )
    triage.add_argument("--from", dest="dump", required=True, type=Path, metavar="FILE")
    triage.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def _add_demo_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--demo",
        action="store_true",
        help="watch a simulated rack (H100 SXM, A100 PCIe and L40S hosts with faults switched on)",
    )
    parser.add_argument(
        "--demo-hosts",
        type=_positive_int,
        default=6,
        metavar="N",
        help="how many simulated hosts the demo rack has (default: 6)",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the simulated rack")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _demo_source(args: argparse.Namespace) -> SimSource:
    from gpuconsole.clock import wall_clock
    from gpuconsole.telemetry.sim import SimSource, demo_rack

    rack = demo_rack(hosts=args.demo_hosts, seed=args.seed, epoch=wall_clock() - DEMO_LEAD_SECONDS)
    return SimSource(rack, wall_clock)


def _fail(message: str) -> int:
    print(f"gpuconsole: {message}", file=sys.stderr)
    return EXIT_UNREADABLE


def run_console(args: argparse.Namespace) -> int:
    # Textual is imported here, not at the top: scripts running a subcommand never load it.
    from gpuconsole.app import GpuConsoleApp
    from gpuconsole.telemetry import SourceError
    from gpuconsole.telemetry.local import local_source
    from gpuconsole.themes import DEFAULT_THEME, THEMES

    theme = args.theme or DEFAULT_THEME
    if theme not in THEMES:
        known = ", ".join(sorted(THEMES))
        print(f"gpuconsole: unknown theme {theme!r} (known: {known})", file=sys.stderr)
        return 2
    if args.demo:
        source, label, local = _demo_source(args), "demo rack", frozenset[str]()
    else:
        try:
            source = local_source()
        except SourceError as error:
            return _fail(f"no local GPU telemetry: {error}. Try `gpuconsole --demo`.")
        label, local = "this host", frozenset(source.hosts)
    app = GpuConsoleApp(source, label=label, refresh=args.refresh, theme=theme, local_hosts=local)
    app.run()
    return 0


def run_snapshot(args: argparse.Namespace) -> int:
    from gpuconsole import health
    from gpuconsole.cli_output import findings_text, snapshot_text
    from gpuconsole.jsonout import exit_code, snapshot_dict
    from gpuconsole.telemetry import SourceError
    from gpuconsole.telemetry.local import local_source

    try:
        source = _demo_source(args) if args.demo else local_source()
        snapshot = source.read(source.hosts[0])
    except SourceError as error:
        return _fail(f"cannot read this host: {error}. Try `gpuconsole snapshot --demo`.")
    findings = health.evaluate(snapshot)
    if args.json:
        print(json.dumps(snapshot_dict(snapshot, findings), indent=2))
    else:
        print(snapshot_text(snapshot))
        print(findings_text(findings))
    return exit_code(findings)


def run_triage(args: argparse.Namespace) -> int:
    from gpuconsole import health
    from gpuconsole.cli_output import findings_text
    from gpuconsole.jsonout import exit_code, finding_dict
    from gpuconsole.telemetry.smi import SmiParseError, parse_dump

    path: Path = args.dump
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        return _fail(f"{path}: {error.strerror or error}")
    try:
        snapshot = parse_dump(text, host=path.stem, time=time.time())
    except SmiParseError as error:
        return _fail(f"{path}: {error}")
    findings = health.evaluate(snapshot)
    if args.json:
        print(
            json.dumps(
                {
                    "file": str(path),
                    "gpus": len(snapshot.gpus),
                    "driver_version": snapshot.driver_version,
                    "findings": [finding_dict(f) for f in findings],
                },
                indent=2,
            )
        )
    else:
        print(f"{path}: {len(snapshot.gpus)} GPUs, driver {snapshot.driver_version or 'N/A'}")
        print(findings_text(findings))
    return exit_code(findings)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runners = {None: run_console, "snapshot": run_snapshot, "triage": run_triage}
    return runners[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
