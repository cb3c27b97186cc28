"""`gpuconsole exporter`: /metrics for Prometheus, every watched host's GPUs under dcgm-exporter's
names, plus the console's findings and host states; serves until Ctrl+C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from gpuconsole.commands import Subcommands
from gpuconsole.commands.exits import EXIT_BAD_INPUT, EXIT_UNREADABLE, fail
from gpuconsole.commands.options import add_demo_options, add_inventory_options
from gpuconsole.commands.sources import close_source, console_source

DEFAULT_PORT = 9400
"""dcgm-exporter's port: Prometheus scrape configs written for it work unchanged."""
DEFAULT_ADDRESS = "127.0.0.1"
"""This machine only: what hosts and jobs run where is not for the whole network unless asked."""


def add(commands: Subcommands) -> None:
    exporter = commands.add_parser(
        "exporter",
        help="serve /metrics for Prometheus: every watched host's GPUs under dcgm-exporter's "
        "names, plus the console's findings and host states",
    )
    exporter.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0: any)"
    )
    exporter.add_argument(
        "--address",
        type=_address,
        default=DEFAULT_ADDRESS,
        help=f"address to listen on (default: {DEFAULT_ADDRESS}, this machine only; 0.0.0.0 "
        "or :: for every interface; IPv6 as ::1 or [::1])",
    )
    exporter.add_argument(
        "--refresh",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between readings of the hosts (default: 1)",
    )
    add_demo_options(exporter)
    add_inventory_options(exporter)
    exporter.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (Ctrl+C, SIGTERM)."""
    from gpuconsole.prom.exporter import Exporter

    if not 0 <= args.port <= 65535:
        return fail(f"--port {args.port}: not a port number", EXIT_BAD_INPUT)
    if not args.refresh > 0:
        return fail(f"--refresh {args.refresh}: not a positive number of seconds", EXIT_BAD_INPUT)
    source, _label = console_source(args)
    exporter = Exporter(source, refresh=args.refresh)
    try:
        try:
            address, port = exporter.listen(args.address, args.port)
        except OSError as error:
            return fail(
                f"cannot listen on {_host_port(args.address, args.port)}: "
                f"{error.strerror or error}",
                EXIT_UNREADABLE,
            )
        stop = threading.Event()

        def stop_on(_signal: int, _frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, stop_on)
        signal.signal(signal.SIGINT, stop_on)
        hosts = len(exporter.store.hosts)
        print(
            f"gpuconsole: serving {hosts} host{'s' if hosts != 1 else ''} at "
            f"http://{_host_port(address, port)}/metrics (Ctrl+C stops)",
            file=sys.stderr,
            flush=True,
        )
        exporter.run(stop)
    finally:
        exporter.close()
        close_source(source)
    return 0


def _address(text: str) -> str:
    """``--address``: an IPv6 address may come bracketed, as a URL writes it."""
    return text[1:-1] if text.startswith("[") and text.endswith("]") else text


def _host_port(address: str, port: int) -> str:
    """``127.0.0.1:9400``, ``[::1]:9400``."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
