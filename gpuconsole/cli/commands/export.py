"""`gpuconsole rules export` and `gpuconsole grafana export`: the console's alert rules as a
Prometheus rules file, and a Grafana dashboard, over dcgm-exporter's metrics as a named
generation of dcgm-exporter names them (or both generations).

``-o FILE`` never writes through a link: a symbolic link at FILE (one planted in /tmp, onto
another of the user's files) is refused, and the export goes to a new file beside FILE that is
renamed over it, so that FILE is the whole export or what it was, and another name of the old
file (a hard link) keeps the old text."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from pathlib import Path

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, fail
from gpuconsole.cli.commands.options import (
    add_alerts_option,
    add_generation_option,
    add_host_label_option,
    add_output_option,
)
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
        add_output_option(export, "FILE", "write here (default: stdout)")
        add_generation_option(export, "each reading under either name, joined with PromQL's or")
        add_host_label_option(
            export,
            "the host's label: Hostname (dcgm-exporter before 4.8.3) or hostname (4.8.3 "
            "and later); default: hostname for 4.9, either for classic and both",
        )
        if name == "rules":  # given before `rules export`, it counts too (`global_options`)
            add_alerts_option(export)
        export.set_defaults(run=run)


def run_rules_export(args: argparse.Namespace) -> int:
    """Export the rules the console would load: of ``--alerts`` (given before or after ``rules
    export``), else of $GPUCONSOLE_ALERTS, else of the default file, else the built-in ones."""
    from gpuconsole.fleet.alerts.config import load_rules
    from gpuconsole.fleet.alerts.rules import RuleError
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
        if output.is_symlink():
            return fail(
                f"{output}: is a symbolic link; the export writes no file through a link: "
                "give the path of the file itself"
            )
        _replace(output, text.encode("utf-8"))
    except OSError as error:
        return fail(f"{output}: {error.strerror or error}")
    return 0


def _replace(output: Path, data: bytes) -> None:
    """``data`` in a new file beside ``output`` (never through a link: O_EXCL, O_NOFOLLOW),
    renamed over it; the new file has the mode of the one it replaces. Something there that is
    not a file (a device, a pipe) is written into, never through a link."""
    try:
        old = output.lstat()
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        handle = os.open(output, os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY)
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        return
    temporary = output.with_name(f".{output.name}.{os.urandom(4).hex()}.tmp")
    made = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        with os.fdopen(made, "wb") as out:
            if old is not None:
                os.fchmod(out.fileno(), stat.S_IMODE(old.st_mode))
            out.write(data)
        os.replace(temporary, output)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
