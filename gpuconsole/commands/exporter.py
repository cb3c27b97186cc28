"""The Prometheus subcommands of `gpuconsole`: ``exporter``, ``rules export``, ``grafana export``.

`gpuconsole.cli` registers them with `add_commands` and runs them; errors are printed as one
line and turned into an exit code here.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from gpuconsole.prom import dcgm
from gpuconsole.telemetry import Source

DEFAULT_PORT = 9400
"""dcgm-exporter's port: Prometheus scrape configs written for it work unchanged."""
DEFAULT_ADDRESS = "127.0.0.1"
"""This machine only: what hosts and jobs run where is not for the whole network unless asked."""
EXIT_BAD_INPUT = 2
EXIT_UNREADABLE = 3

AddOptions = Callable[[argparse.ArgumentParser], None]


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    source_options: tuple[AddOptions, ...],
) -> None:
    """Register the subcommands; ``source_options`` add the options choosing what to watch."""
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
    for add in source_options:
        add(exporter)
    for name, what in (("rules", "alert rules"), ("grafana", "dashboard")):
        group = commands.add_parser(name, help=f"the console's {what} for Prometheus/Grafana")
        sub = group.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)
        export = sub.add_parser(
            "export",
            help="write the Prometheus rules file (YAML)"
            if name == "rules"
            else "write a Grafana dashboard (JSON) over dcgm-exporter's metrics",
        )
        export.add_argument(
            "-o", "--output", type=Path, metavar="FILE", help="write here (default: stdout)"
        )
        export.add_argument(
            "--host-label",
            choices=dcgm.HOST_LABELS,
            default=dcgm.HOST_LABEL,
            help="the host's label: Hostname (dcgm-exporter before 4.8.3, gpuconsole exporter) "
            "or hostname (dcgm-exporter 4.8.3 and later)",
        )
        if name == "rules":
            # SUPPRESS: when not given here, args.alerts stays what `gpuconsole --alerts FILE`
            # set (a subcommand's default would overwrite the global option's value).
            export.add_argument(
                "--alerts",
                type=Path,
                default=argparse.SUPPRESS,
                metavar="FILE",
                help="alert rules file (default: the global --alerts, else $GPUCONSOLE_ALERTS, "
                "else alerts.toml in the XDG config dir)",
            )


def run_rules_export(args: argparse.Namespace) -> int:
    """Export the rules the console would load: of ``--alerts`` (given before or after ``rules
    export``), else of $GPUCONSOLE_ALERTS, else of the default file, else the built-in ones."""
    from gpuconsole.alerts.config import load_rules
    from gpuconsole.alerts.rules import RuleError
    from gpuconsole.prom.rules_export import rules_yaml

    try:
        rules = load_rules(args.alerts)
    except RuleError as error:
        return _fail(str(error), EXIT_BAD_INPUT)
    return _write(args.output, rules_yaml(rules, args.host_label))


def run_grafana_export(args: argparse.Namespace) -> int:
    from gpuconsole.prom.grafana import dashboard_json

    return _write(args.output, dashboard_json(args.host_label))


def run_exporter(args: argparse.Namespace, source_of: Callable[[], Source]) -> int:
    """Serve until interrupted (Ctrl+C, SIGTERM); ``source_of`` builds what to watch."""
    from gpuconsole.prom.exporter import Exporter

    if not 0 <= args.port <= 65535:
        return _fail(f"--port {args.port}: not a port number", EXIT_BAD_INPUT)
    if not args.refresh > 0:
        return _fail(f"--refresh {args.refresh}: not a positive number of seconds", EXIT_BAD_INPUT)
    source = source_of()
    exporter = Exporter(source, refresh=args.refresh)
    try:
        try:
            address, port = exporter.listen(args.address, args.port)
        except OSError as error:
            return _fail(
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
        close = getattr(source, "close", None)
        if close is not None:
            close()
    return 0


def _address(text: str) -> str:
    """``--address``: an IPv6 address may come bracketed, as a URL writes it."""
    return text[1:-1] if text.startswith("[") and text.endswith("]") else text


def _host_port(address: str, port: int) -> str:
    """``127.0.0.1:9400``, ``[::1]:9400``."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _write(output: Path | None, text: str) -> int:
    if output is None:
        sys.stdout.write(text)
        return 0
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as error:
        return _fail(f"{output}: {error.strerror or error}", EXIT_UNREADABLE)
    return 0


def _fail(message: str, code: int) -> int:
    print(f"gpuconsole: {message}", file=sys.stderr)
    return code
