"""`gpuconsole record`: the fleet recorded without the UI, for a daemon on a bastion host; Ctrl+C,
SIGTERM or --duration stops it."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, EXIT_UNREADABLE, fail, say
from gpuconsole.cli.commands.options import (
    add_alertmanager_option,
    add_demo_options,
    add_inventory_options,
    add_record_option,
    add_refresh_option,
    alertmanager_settings,
    duration,
)
from gpuconsole.cli.commands.sources import alerts_config, close_source, console_source
from gpuconsole.core import paths
from gpuconsole.fleet.record.retention import Retention, Tier

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def add(commands: Subcommands) -> None:
    record = commands.add_parser(
        "record",
        help="record the fleet without the UI (for a daemon on a bastion host); Ctrl+C or "
        "SIGTERM stops",
    )
    add_record_option(
        record,
        "the recording (default: $GPUCONSOLE_RECORDING, else recording.sqlite in the XDG "
        "data dir); an existing one is appended to",
    )
    add_refresh_option(record)
    record.add_argument(
        "--retain",
        type=duration,
        default=Retention().keep_s,
        metavar="DURATION",
        help="delete what is older (default: 7d)",
    )
    record.add_argument(
        "--full-resolution",
        type=duration,
        default=Retention().tiers[0].age_s,
        metavar="DURATION",
        help="keep every reading this long, then one per 10 s, after 48 h one per minute "
        "(default: 6h)",
    )
    record.add_argument(
        "--duration", type=duration, metavar="DURATION", help="stop after this long"
    )
    add_alertmanager_option(record)
    add_demo_options(record)
    add_inventory_options(record)
    record.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Record until stopped (Ctrl+C, SIGTERM, --duration).

    A signal stops it within a second, from the moment the handlers are in (before the source
    and the file are opened): the round in progress is dropped, what was taken is written, the
    session ends, and a line says what the file holds.
    """
    path = args.record or paths.RECORDING.path()
    try:
        retention = _retention_of(args)
    except ValueError as error:
        return fail(f"--retain/--full-resolution: {error}", EXIT_BAD_INPUT)
    with _SignalStop() as stop:
        return _record(args, path, retention, stop)


def _retention_of(args: argparse.Namespace) -> Retention:
    """--retain and --full-resolution, with the coarse tier after 48 h (or twice the full
    resolution's age); ValueError when they do not fit together."""
    full = args.full_resolution
    coarse = max(48 * 3600.0, 2 * full)
    return Retention(args.retain, (Tier(full, 10.0), Tier(coarse, 60.0)))


class _SignalStop:
    """An event that SIGTERM and SIGINT set while installed (``with``); ``by`` names the first."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.by: str | None = None
        self._before: dict[int, Any] = {}

    def _caught(self, number: int, _frame: FrameType | None) -> None:
        self.by = self.by or signal.Signals(number).name
        self.event.set()

    def __enter__(self) -> _SignalStop:
        self._before = {number: signal.signal(number, self._caught) for number in STOP_SIGNALS}
        return self

    def __exit__(self, *_: object) -> None:
        for number, handler in self._before.items():
            signal.signal(number, handler)


def _record(args: argparse.Namespace, path: Path, retention: Retention, stop: _SignalStop) -> int:
    from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSender
    from gpuconsole.fleet.headless import record_fleet
    from gpuconsole.fleet.record.recorder import Recorder
    from gpuconsole.fleet.record.schema import RecordingError
    from gpuconsole.fleet.record.when import stamp

    config = alerts_config(args)
    delivery = alertmanager_settings(args, config.alertmanager)
    source, label = console_source(args)
    try:
        try:
            recorder = Recorder(path, label=label, retention=retention)
        except RecordingError as error:
            return fail(str(error), EXIT_UNREADABLE)
        hosts = len(source.hosts)
        say(
            f"recording {hosts} host{'s' if hosts != 1 else ''} ({label}) into "
            f"{path} every {args.refresh:g} s (Ctrl+C stops)"
        )
        alertmanager = None
        if delivery is not None:
            say(f"firing alerts go to Alertmanager at {', '.join(delivery.urls)}")
            alertmanager = AlertmanagerSender(delivery, interval=args.refresh, log=say)
        try:
            problem = record_fleet(
                source,
                recorder,
                config.rules,
                interval=args.refresh,
                stop=stop.event,
                duration=args.duration,
                alertmanager=alertmanager,
            )
        finally:
            if alertmanager is not None:
                alertmanager.close()
            recorder.close()
        if problem is not None:
            return fail(problem, EXIT_UNREADABLE)
        if stop.by is not None:
            until = recorder.recorded_until
            held = "no readings yet" if until is None else f"readings until {stamp(until)}"
            say(f"stopped by {stop.by}: {path} holds {held}")
    finally:
        close_source(source)
    return 0
