"""The `gpuconsole` command: the console itself, and (later) subcommands for scripts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpuconsole import __version__

DESCRIPTION = """\
A terminal operations console for GPU servers: every GPU of every host at a glance
(utilization, memory, thermals, power, throttling, errors, processes, topology).

Keys: arrows move, Enter opens a host, Space shows a host's GPUs, t shows the topology,
s sorts, / filters, Esc goes back, ? lists every key, Ctrl+P opens the command palette,
q quits.
"""

# The demo rack starts this long before now: enough for full trend lines and for the first
# scheduled fault to have happened, little enough to simulate at start-up in a blink.
DEMO_LEAD_SECONDS = 900

EPILOG = """\
examples:
  gpuconsole --demo                 a simulated rack of six hosts with faults on
  gpuconsole --demo --demo-hosts 64 a 64-host simulated rack
  gpuconsole --demo --theme gpuconsole-light
"""


def build_parser() -> argparse.ArgumentParser:
    from gpuconsole.themes import DEFAULT_THEME, THEMES

    parser = argparse.ArgumentParser(
        prog="gpuconsole",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuconsole {__version__}")
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
    parser.add_argument(
        "--seed", type=int, default=7, help="seed of the simulated rack (default: 7)"
    )
    parser.add_argument(
        "--refresh",
        type=_positive_float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between readings (default: 1)",
    )
    parser.add_argument(
        "--theme",
        default=DEFAULT_THEME,
        choices=sorted(THEMES),
        help=f"colour theme (default: {DEFAULT_THEME}); NO_COLOR=1 turns colour off",
    )
    return parser


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
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from gpuconsole.app import GpuConsoleApp
    from gpuconsole.clock import wall_clock
    from gpuconsole.telemetry.sim import SimSource, demo_rack

    # Until a local telemetry source exists, the console's embedded default is the demo rack.
    now = wall_clock()
    rack = demo_rack(hosts=args.demo_hosts, seed=args.seed, epoch=now - DEMO_LEAD_SECONDS)
    app = GpuConsoleApp(
        SimSource(rack, wall_clock), label="demo rack", refresh=args.refresh, theme=args.theme
    )
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
