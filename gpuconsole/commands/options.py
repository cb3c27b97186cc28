"""The options that several commands share, and the checks of their values."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuconsole.commands.exits import EXIT_BAD_INPUT, Refused

MAX_DEMO_HOSTS = 512
"""The most simulated hosts a demo rack has: each keeps about 0.9 MB of recent readings in the
store and takes about 0.1 s of CPU to start (512: about 480 MB, and a polling round that a
signal's stop waits for stays well under a second)."""


def add_inventory_options(parser: argparse.ArgumentParser) -> None:
    """``--hosts`` and ``--inventory``: which SSH hosts (see `sources.inventory`)."""
    parser.add_argument(
        "--hosts",
        metavar="LIST",
        help="SSH hosts to watch, comma-separated: name, user@name, name:port",
    )
    parser.add_argument(
        "--inventory",
        type=Path,
        metavar="FILE",
        help="the hosts.toml to read (default: $GPUCONSOLE_INVENTORY, else the XDG config dir)",
    )


def add_demo_options(parser: argparse.ArgumentParser) -> None:
    """``--demo`` and the simulated rack's size and seed (see `sources.demo_source`)."""
    parser.add_argument(
        "--demo",
        action="store_true",
        help="watch a simulated rack (H100 SXM, A100 PCIe and L40S hosts with faults switched on)",
    )
    parser.add_argument(
        "--demo-hosts",
        type=_demo_hosts,
        default=6,
        metavar="N",
        help=f"how many simulated hosts the demo rack has (default: 6, at most {MAX_DEMO_HOSTS})",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the simulated rack")


def _demo_hosts(text: str) -> int:
    value = positive_int(text)
    if value > MAX_DEMO_HOSTS:
        raise argparse.ArgumentTypeError(
            f"more hosts than a simulated rack has (at most {MAX_DEMO_HOSTS}; each holds about "
            "1 MB of recent readings)"
        )
    return value


def positive_int(text: str) -> int:
    """An option's value that counts something: 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def positive_float(text: str) -> float:
    """An option's value in seconds (or GiB): finite and above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def theme_of(args: argparse.Namespace) -> str:
    """``--theme``, checked when a command opens a screen: the themes are Textual objects, so
    the parser cannot check it without loading Textual for every command."""
    from gpuconsole.themes import DEFAULT_THEME, THEMES

    theme: str = args.theme or DEFAULT_THEME
    if theme not in THEMES:
        known = ", ".join(sorted(THEMES))
        raise Refused(f"unknown theme {theme!r} (known: {known})", code=EXIT_BAD_INPUT)
    return theme
