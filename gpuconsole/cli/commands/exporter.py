"""`gpuconsole exporter`: /metrics for Prometheus, every watched host's GPUs under dcgm-exporter's
names (of the generation --dcgm-exporter names; by default the one `rules export` and `grafana
export` read), plus the console's findings and host states; serves until Ctrl+C or SIGTERM. Given
--alertmanager, it evaluates the alert rules too and sends their firing alerts there (only then:
where Prometheus scrapes it, Prometheus evaluates the exported rules and sends their alerts)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, EXIT_UNREADABLE, fail, say
from gpuconsole.cli.commands.options import (
    add_alertmanager_option,
    add_demo_options,
    add_generation_option,
    add_host_label_option,
    add_inventory_options,
    add_refresh_option,
    alertmanager_settings,
    port,
)
from gpuconsole.cli.commands.sources import alerts_config, close_source, console_source
from gpuconsole.telemetry import dcgm

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
        "--port", type=port, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0: any)"
    )
    exporter.add_argument(
        "--address",
        type=_address,
        default=DEFAULT_ADDRESS,
        help=f"address to listen on (default: {DEFAULT_ADDRESS}, this machine only; 0.0.0.0 "
        "or :: for every interface; IPv6 as ::1 or [::1])",
    )
    add_refresh_option(exporter)
    add_generation_option(exporter, "each reading under either name, in either's unit")
    add_host_label_option(
        exporter,
        "the host's label: Hostname (dcgm-exporter before 4.8.3) or hostname (4.8.3 and "
        "later), to match the fleet's dcgm-exporter; default: Hostname for classic, hostname "
        "for 4.9 and both",
    )
    exporter.add_argument(
        "--driver-label",
        choices=dcgm.DRIVER_LABELS,
        help="the driver version's label: DCGM_FI_DRIVER_VERSION (dcgm-exporter before 4.9) or "
        "DCGM_FI_SYSTEM_DRIVER_VERSION (4.9 and later); default: the former for classic, the "
        "latter for 4.9 and both",
    )
    add_demo_options(exporter)
    add_inventory_options(exporter)
    add_alertmanager_option(exporter)
    exporter.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (Ctrl+C, SIGTERM)."""
    from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSender
    from gpuconsole.prom.exporter import Exporter, Naming

    if args.alerts is not None and not args.alertmanager:
        return fail(
            "--alerts: the exporter evaluates alert rules only to send their alerts to "
            "--alertmanager (Prometheus evaluates `gpuconsole rules export`'s)",
            EXIT_BAD_INPUT,
        )
    config = alerts_config(args) if args.alertmanager else None
    delivery = None if config is None else alertmanager_settings(args, config.alertmanager)
    source, _label = console_source(args)
    alertmanager = None
    if delivery is not None:
        say(f"firing alerts go to Alertmanager at {', '.join(delivery.urls)}")
        alertmanager = AlertmanagerSender(delivery, interval=args.refresh, log=say)
    naming = Naming.of(args.dcgm_exporter, args.host_label, args.driver_label)
    exporter = Exporter(
        source,
        refresh=args.refresh,
        naming=naming,
        rules=() if config is None else config.rules,
        alertmanager=alertmanager,
    )
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
        if alertmanager is not None:
            alertmanager.close()
        close_source(source)
    return 0


def _address(text: str) -> str:
    """``--address``: an IPv6 address may come bracketed, as a URL writes it."""
    return text[1:-1] if text.startswith("[") and text.endswith("]") else text


def _host_port(address: str, port: int) -> str:
    """``127.0.0.1:9400``, ``[::1]:9400``."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
