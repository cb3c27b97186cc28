"""The options that several commands share, and the checks of their values."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, Refused
from gpuconsole.telemetry import dcgm

if TYPE_CHECKING:
    from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSettings

MAX_DEMO_HOSTS = 512
"""The most simulated hosts a demo rack has: each keeps about 0.9 MB of recent readings in the
store and takes about 0.1 s of CPU to start (512: about 480 MB, and a polling round that a
signal's stop waits for stays well under a second)."""

MAX_SECONDS = 36500 * 86400.0
"""The longest time an option takes (a refresh, a retention, a duration): 36500d, a hundred
years. Longer ones mean nothing more, and would overflow a recording's times (64-bit
milliseconds) and the waits between readings (`threading.TIMEOUT_MAX`, about 292 years)."""


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


def add_alertmanager_option(parser: argparse.ArgumentParser) -> None:
    """``--alertmanager URL``, as often as there are Alertmanagers (see
    `alertmanager_settings`)."""
    parser.add_argument(
        "--alertmanager",
        action="append",
        type=_alertmanager_url,
        metavar="URL",
        help="send firing alerts to this Alertmanager (its base URL, like http://am:9093; give "
        "each member of a cluster); replaces the alerts file's [alertmanager] urls",
    )


def _alertmanager_url(text: str) -> str:
    from gpuconsole.fleet.alerts.alertmanager import alertmanager_url

    try:
        return alertmanager_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def alertmanager_settings(
    args: argparse.Namespace, settings: AlertmanagerSettings
) -> AlertmanagerSettings | None:
    """Where firing alerts go: --alertmanager's URLs, else the alerts file's, with the file's
    resend and timeout either way; None where there is no URL."""
    from gpuconsole.fleet.alerts.alertmanager import MAX_URLS

    urls = tuple(dict.fromkeys(args.alertmanager)) if args.alertmanager else settings.urls
    if not urls:
        return None
    if len(urls) > MAX_URLS:
        raise Refused(f"--alertmanager: {len(urls)} URLs, more than {MAX_URLS}", EXIT_BAD_INPUT)
    return replace(settings, urls=urls)


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
        help=f"how many simulated hosts the demo rack has (default: 6, at most {MAX_DEMO_HOSTS}; "
        "means --demo)",
    )
    parser.add_argument(
        "--seed", type=int, default=7, help="seed of the simulated rack (means --demo)"
    )


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
    from gpuconsole.ui.themes import DEFAULT_THEME, THEMES

    theme: str = args.theme or DEFAULT_THEME
    if theme not in THEMES:
        known = ", ".join(sorted(THEMES))
        raise Refused(f"unknown theme {theme!r} (known: {known})", code=EXIT_BAD_INPUT)
    return theme


def add_generation_option(parser: argparse.ArgumentParser, both: str) -> None:
    """``--dcgm-exporter``, the generation of dcgm-exporter's metric names, for the exporter and
    both exports alike: one default (`dcgm.DEFAULT_GENERATION`) for the three, so that they work
    together as they are. ``both`` says what "both" does for the command."""
    choices = {
        dcgm.CURRENT: f"dcgm-exporter {dcgm.CURRENT} and later: base units, host label hostname",
        dcgm.CLASSIC: "dcgm-exporter 4.8 and before",
        dcgm.BOTH: both,
    }
    named = [
        f"{choice} ({'default: ' if choice == dcgm.DEFAULT_GENERATION else ''}{what})"
        for choice, what in choices.items()
    ]
    parser.add_argument(
        "--dcgm-exporter",
        choices=dcgm.CHOICES,
        default=dcgm.DEFAULT_GENERATION,
        metavar="GENERATION",
        help=f"whose metric names: {', '.join(named[:-1])} or {named[-1]}",
    )
