"""The console itself: `gpuconsole` with no command opens the TUI on what the options choose
(see `sources.console_source`), recording as it watches unless told not to."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, TextIO

from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, Refused
from gpuconsole.cli.commands.options import (
    add_alertmanager_option,
    add_alerts_option,
    add_demo_options,
    add_inventory_options,
    add_record_option,
    add_refresh_option,
    alertmanager_settings,
)
from gpuconsole.cli.commands.sources import alerts_config, close_source, console_source
from gpuconsole.core import paths

if TYPE_CHECKING:
    from gpuconsole.fleet.record.recorder import Recorder


def add_options(parser: argparse.ArgumentParser) -> None:
    """The console's options, on the top parser: the global options (see `global_options`)."""
    add_demo_options(parser)
    add_inventory_options(parser)
    add_refresh_option(parser)
    parser.add_argument(
        "--theme",
        default=None,
        metavar="NAME",
        help="colour theme: gpuconsole-dark (the default) or gpuconsole-light; NO_COLOR=1 "
        "turns colour off",
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="read the fleet from a Prometheus server that scrapes dcgm-exporter (fleets too "
        "big for SSH, thousands of GPUs)",
    )
    add_alerts_option(parser)
    add_alertmanager_option(parser)
    add_record_option(
        parser,
        "record readings, findings, alerts and actions into FILE (default: "
        "recording.sqlite in the XDG data dir; the demo records only when given a FILE)",
    )
    parser.add_argument(
        "--no-record", action="store_true", help="do not record (replay needs a recording)"
    )


def run(args: argparse.Namespace) -> int:
    # Textual is imported here, not at the top: scripts running a subcommand never load it.
    from gpuconsole.cli.commands.options import theme_of
    from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSender
    from gpuconsole.fleet.record.schema import RecordingError
    from gpuconsole.ui.app import GpuConsoleApp

    theme = theme_of(args)
    config = alerts_config(args)
    delivery = alertmanager_settings(args, config.alertmanager)
    source, label = console_source(args)
    try:
        refuse_without_terminal(_INSTEAD)
        recorder = console_recorder(args, label)
    except RecordingError as error:
        close_source(source)
        raise Refused(str(error)) from None
    except Refused:
        close_source(source)
        raise
    # The alerts screen says when alerts are not delivered: nothing is printed under the UI.
    alertmanager = None if delivery is None else AlertmanagerSender(delivery, interval=args.refresh)
    app = GpuConsoleApp(
        source,
        label=label,
        refresh=args.refresh,
        theme=theme,
        alert_rules=config.rules,
        recorder=recorder,
        alertmanager=alertmanager,
    )
    try:
        app.run()
    finally:
        if alertmanager is not None:
            alertmanager.close()
        if recorder is not None:
            recorder.close()
        close_source(source)
    return app.return_code or 0  # 128 + the signal's number when SIGTERM or SIGHUP stopped it


_INSTEAD = "`gpuconsole snapshot --json` reads once and `gpuconsole record` records"


def refuse_without_terminal(instead: str) -> None:
    """`Refused` unless the console has a terminal to draw on: standard input (its keys),
    output and error (where Textual draws) each a terminal, one that takes escape sequences.
    ``instead`` says what does the work without one.

    Checked after the options and the source, so that what is wrong with what was asked is said
    first; without a terminal, the console would write escape sequences into a file or pipe and
    wait for keys that never come."""
    streams = {"input": sys.stdin, "output": sys.stdout, "error": sys.stderr}
    missing = [name for name, stream in streams.items() if not _is_terminal(stream)]
    if missing:
        which = " and ".join(missing)
        why = f"standard {which} {'is' if len(missing) == 1 else 'are'} not a terminal"
    elif os.environ.get("TERM") == "dumb":
        why = "TERM=dumb takes no escape sequences"
    else:
        return
    raise Refused(f"the console needs a terminal ({why}); without one, {instead}", EXIT_BAD_INPUT)


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except ValueError:  # closed
        return False


def console_recorder(args: argparse.Namespace, label: str) -> Recorder | None:
    """The console's recorder: --record FILE, else the default file (not for the demo).

    When the default file cannot be recorded into (another gpuconsole records it, say), the
    console watches without recording and a line says so; a file named by --record is an error.
    """
    from gpuconsole.fleet.record.recorder import Recorder
    from gpuconsole.fleet.record.schema import RecordingError

    if args.no_record or (args.demo and args.record is None):
        return None
    path = args.record or paths.RECORDING.path()
    try:
        return Recorder(path, label=label)
    except RecordingError as error:
        if args.record is not None:
            raise
        print(f"gpuconsole: not recording: {error}", file=sys.stderr)
        return None
