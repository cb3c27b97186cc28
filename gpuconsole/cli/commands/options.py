"""The options that several commands share, each defined once with its bounds, and the checks
of their values.

An option that more than one command (or the console and a command) takes is added by one
``add_*`` function here, so that it is spelled, parsed and bounded alike everywhere: a command
passes only what the option means for it (its help, where that differs). Its bounds come from
the one place that holds them (--refresh's from the agent, which refuses any other interval).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, Refused
from gpuconsole.fleet.record.retention import parse_duration
from gpuconsole.recipes import RECIPES
from gpuconsole.telemetry import dcgm
from gpuconsole.telemetry.agent import MAX_INTERVAL_S, MIN_INTERVAL_S

if TYPE_CHECKING:
    from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSettings

MAX_DEMO_HOSTS = 512
"""The most simulated hosts a demo rack has: each keeps about 0.9 MB of recent readings in the
store and takes about 0.1 s of CPU to start (512: about 480 MB, and a polling round that a
signal's stop waits for stays well under a second)."""

MAX_SECONDS = 36500 * 86400.0
"""The longest time a duration option takes (a retention, a duration): 36500d, a hundred
years. Longer ones mean nothing more, and would overflow a recording's times (64-bit
milliseconds) and the waits between readings (`threading.TIMEOUT_MAX`, about 292 years)."""

REFRESH_BOUNDS_S = (MIN_INTERVAL_S, MAX_INTERVAL_S)
"""--refresh's bounds, both taken: the agent's (`gpuconsole.telemetry.agent`), which refuses
any other interval; a host watched over SSH would show as down instead of being read."""
DEFAULT_REFRESH_S = 1.0

PRESETS = ("baseline", "tuned")
"""The recipes' presets (each recipe's ``PRESETS``), as `launch` and `memory` name them."""
DEFAULT_PRESET = "tuned"

PORTS = (0, 65535)
"""A TCP port to listen on; 0: any free one."""

JSON_HELP = "print JSON instead of text"


# --- values --------------------------------------------------------------------------------------


def seconds(text: str, like: str = "90s, 15m, 6h, 7d") -> float:
    """A time as an option gives it: plain seconds (``90``, ``0.5``, ``1e3``) or a duration
    (``90s``, ``15m``, ``6h``, ``7d``, ``2w``: `parse_duration`); unbounded (the option bounds
    it: `refresh_seconds`, `duration`). ``like`` gives examples for the refusal."""
    try:
        return parse_duration(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds or a duration (like {like})"
        ) from None


def refresh_seconds(text: str) -> float:
    """``--refresh``: seconds between readings, within the agent's bounds (`REFRESH_BOUNDS_S`)."""
    low, high = REFRESH_BOUNDS_S
    value = seconds(text, like="5s, 2m")
    if not low <= value <= high:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is not between {low:g} and {high:g} seconds")
    return value


def duration(text: str) -> float:
    """A duration option (``--retain``, ``--duration``): above 0, at most `MAX_SECONDS`."""
    value = seconds(text)
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (like 90s, 15m, 6h, 7d)")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is longer than {MAX_SECONDS / 86400:.0f}d (a hundred years)"
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
    """An option's value that measures something (GiB): finite and above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def port(text: str) -> int:
    """A port to listen on, within `PORTS`."""
    low, high = PORTS
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a port number ({low} to {high}; {low}: any)"
        )
    return value


# --- options -------------------------------------------------------------------------------------


def add_refresh_option(parser: argparse.ArgumentParser) -> None:
    """``--refresh``: seconds between readings, for the console, `record` and `exporter` alike."""
    low, high = REFRESH_BOUNDS_S
    parser.add_argument(
        "--refresh",
        type=refresh_seconds,
        default=DEFAULT_REFRESH_S,
        metavar="SECONDS",
        help=f"seconds between readings, {low:g} to {high:g}; a duration like 5s or 2m works "
        f"too (default: {DEFAULT_REFRESH_S:g})",
    )


def add_json_option(parser: argparse.ArgumentParser, help: str = JSON_HELP) -> None:
    """``--json``: print JSON instead of text (``help``: where it means something narrower)."""
    parser.add_argument("--json", action="store_true", help=help)


def add_yes_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--yes``: run what changes a host without asking; ``help`` says what runs."""
    parser.add_argument("--yes", action="store_true", help=help)


def add_host_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--host NAME``: the one host a command is about; ``help`` says where the name is found
    (the inventory, the demo rack, a recording, the benchmark history)."""
    parser.add_argument("--host", metavar="NAME", help=help)


def add_alerts_option(parser: argparse.ArgumentParser) -> None:
    """``--alerts FILE``: the alert rules file (see `sources.alerts_config`)."""
    parser.add_argument(
        "--alerts",
        type=Path,
        metavar="FILE",
        help="alert rules file (default: $GPUCONSOLE_ALERTS, else alerts.toml in the XDG "
        "config dir)",
    )


def add_record_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--record FILE``: a recording; ``help`` says whether the command writes or reads it."""
    parser.add_argument("--record", type=Path, metavar="FILE", help=help)


def add_output_option(parser: argparse.ArgumentParser, metavar: str, help: str) -> None:
    """``-o``/``--output``: where a command writes what it makes (``help``: what, and where by
    default)."""
    parser.add_argument("-o", "--output", type=Path, metavar=metavar, help=help)


def add_at_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--at TIME``: a moment in a recording, read by `gpuconsole.fleet.record.when.
    resolve_moment` once the recording is open (its refusal names what the recording holds);
    ``what`` says what the moment is for."""
    parser.add_argument(
        "--at",
        metavar="TIME",
        help=f"{what}: 03:12 (the last 03:12 in the recording), 2026-01-01 03:12:05, an ISO "
        "8601 time or epoch seconds; UTC unless it says otherwise; a time the recording does "
        "not hold is refused (default: the recording's end)",
    )


def add_recipe_argument(parser: argparse.ArgumentParser) -> None:
    """``RECIPE``: one of the recipes the console ships (`gpuconsole.recipes.RECIPES`)."""
    parser.add_argument("recipe", choices=tuple(RECIPES))


def add_preset_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--preset``: one of `PRESETS`, `DEFAULT_PRESET` unless given."""
    parser.add_argument("--preset", choices=PRESETS, default=DEFAULT_PRESET, help=help)


def add_steps_option(parser: argparse.ArgumentParser, default: int | None, help: str) -> None:
    """``--steps N``: the measured steps of a recipe's run (of each trial, for `memory`)."""
    parser.add_argument("--steps", type=positive_int, default=default, metavar="N", help=help)


def add_host_label_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--host-label``: dcgm-exporter's host label (`dcgm.HOST_LABELS`); ``help`` says which
    the command uses when it is not given."""
    parser.add_argument("--host-label", choices=dcgm.HOST_LABELS, help=help)


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
