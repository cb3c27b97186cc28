"""`gpuconsole rules export` and `gpuconsole grafana export`: the console's alert rules as a
Prometheus rules file, and a Grafana dashboard, over dcgm-exporter's metrics as a named
generation of dcgm-exporter names them (or both generations)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuconsole.commands import Subcommands
from gpuconsole.commands.exits import EXIT_BAD_INPUT, fail
from gpuconsole.commands.options import add_generation_option
from gpuconsole.telemetry import dcgm


def add(commands: Subcommands) -> None:
    for name, what, help, run in (
        ("rules", "alert rules", "write the Prometheus rules file (YAML)", run_rules_export),
        (
            "grafana",
            "dashboard",
            "write a Grafana dashboard (JSON) over dcgm-exporter's metrics",
            run_grafana_export,
        ),
    ):
        group = commands.add_parser(name, help=f"the console's {what} for Prometheus/Grafana")
        sub = group.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)
        export = sub.add_parser("export", help=help)
        export.add_argument(
            "-o", "--output", type=Path, metavar="FILE", help="write here (default: stdout)"
        )
        add_generation_option(export, "each reading under either name, joined with PromQL's or")
        export.add_argument(
            "--host-label",
            choices=dcgm.HOST_LABELS,
            help="the host's label: Hostname (dcgm-exporter before 4.8.3) or hostname (4.8.3 "
            "and later); default: hostname for 4.9, either for classic and both",
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
        export.set_defaults(run=run)


def run_rules_export(args: argparse.Namespace) -> int:
    """Export the rules the console would load: of ``--alerts`` (given before or after ``rules
    export``), else of $GPUCONSOLE_ALERTS, else of the default file, else the built-in ones."""
    from gpuconsole.alerts.config import load_rules
    from gpuconsole.alerts.rules import RuleError
    from gpuconsole.prom.rules_export import rules_yaml

    try:
        rules = load_rules(args.alerts)
    except RuleError as error:
        return fail(str(error), EXIT_BAD_INPUT)
    return _write(args.output, rules_yaml(rules, _dialect(args)))


def run_grafana_export(args: argparse.Namespace) -> int:
    from gpuconsole.prom.grafana import dashboard_json

    return _write(args.output, dashboard_json(_dialect(args)))


def _dialect(args: argparse.Namespace) -> dcgm.Dialect:
    return dcgm.Dialect.of(args.dcgm_exporter, args.host_label)


def _write(output: Path | None, text: str) -> int:
    if output is None:
        sys.stdout.write(text)
        return 0
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as error:
        return fail(f"{output}: {error.strerror or error}")
    return 0
