"""The `gpuconsole` command: the console itself, and subcommands for scripts and tickets."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuconsole import __version__, global_options, paths

if TYPE_CHECKING:
    from gpuconsole.actions.repair.model import Plan
    from gpuconsole.alerts.rules import AlertRule
    from gpuconsole.hosts.inventory import Inventory
    from gpuconsole.hosts.source import SshSource
    from gpuconsole.hosts.targets import Target
    from gpuconsole.model import HostSnapshot
    from gpuconsole.telemetry import Source
    from gpuconsole.telemetry.sim import SimSource

DESCRIPTION = """\
A terminal operations console for GPU servers: every GPU of every host at a glance
(utilization, memory, thermals, power, throttling, errors, processes, topology).

Keys: arrows move, Enter opens a host, Space shows a host's GPUs, t shows the topology,
s sorts, / filters, Esc goes back, ? lists every key, Ctrl+P opens the command palette,
q quits.
"""

# The demo rack starts this long before now: its trend lines are full and its first scheduled
# faults have happened by the time the console opens.
DEMO_LEAD_SECONDS = 900
MAX_DEMO_HOSTS = 512
"""The most simulated hosts a demo rack has: each keeps about 0.9 MB of recent readings in the
store and takes about 0.1 s of CPU to start (512: about 480 MB, and a polling round that a
signal's stop waits for stays well under a second)."""

EPILOG = """\
examples:
  gpuconsole --demo                  a simulated rack of six hosts with faults on
  gpuconsole --demo --demo-hosts 64  a 64-host simulated rack
  gpuconsole                         this host's GPUs (NVML, else nvidia-smi) and the
                                     inventory's hosts, if there is an inventory
  gpuconsole --hosts gpu01,ops@gpu02:2222   watch these hosts over SSH
  gpuconsole --prometheus http://prom:9090 --refresh 5   a fleet of thousands of GPUs, read
                                     from the Prometheus that scrapes their dcgm-exporters
  gpuconsole exporter --port 9400    /metrics of the watched hosts, under dcgm-exporter's names
  gpuconsole rules export -o gpu.rules.yml   the console's alert rules for Prometheus
  gpuconsole grafana export -o gpu.json      a Grafana dashboard over the same metrics
  gpuconsole hosts check --json      connect to every inventory host once, say how each is
  gpuconsole snapshot --host gpu01   one SSH host's readings and findings
  gpuconsole verify                  check this host's driver, CUDA, frameworks, PCIe, disks
  gpuconsole verify --all --json     the same on every inventory host, concurrently
  gpuconsole repair gpu01 --dry-run  why gpu01's driver is broken, and the commands that fix it
  gpuconsole launch resnet50 --host gpu01            the tuned resnet50 benchmark on gpu01
  gpuconsole launch bert --gpus 4 -- --padding fixed  recipe arguments after --
  gpuconsole bench history           earlier benchmark runs, regressions flagged
  gpuconsole memory bert --target 20%  try each memory fix; recommend the cheapest that fits
  gpuconsole oom train.log           why a job ran out of GPU memory, and the fixes
  gpuconsole snapshot --json         this host's readings and findings as JSON
  gpuconsole triage --from dump.xml  findings of a saved `nvidia-smi -q -x` (or -q) dump
  gpuconsole record                  record the fleet without the UI (a bastion daemon)
  gpuconsole replay FILE --at 03:12 --host gpu01   the console on a recording at 03:12 UTC
  gpuconsole replay FILE --list --at 03:12         what began and ended around 03:12
  gpuconsole bundle gpu01            an incident bundle (tar.gz) of gpu01 for a ticket

exit codes of snapshot and triage: 0 healthy, 1 warnings, 2 critical findings,
3 nothing to read (no driver, an unreadable dump, an unreachable host).
exit codes of repair: 0 nothing wrong or all fixed, 1 causes found and nothing run,
2 a step failed, the host still fails verification, or it could not be reached.
exit codes of launch: 0 the run finished, 1 it finished more than 10 % below this host's or
its peers' median, 2 it failed (the cause is printed, not a stack trace).
exit codes of verify: 0 every check passed, 1 warnings, 2 failures or an unreachable host.
exit codes of record, replay and bundle: 0 done, 2 bad input (an unknown host, a bad time),
3 a file that is not a recording, or one that cannot be read or written.
exit codes of exporter, rules export and grafana export: 0 done, 2 a bad alert rule or option,
3 a port that cannot be bound or a file that cannot be written. A bad --alerts file or an
unreachable --prometheus URL stops the console with one line (exit 2 and 3).
exit codes of hosts check: 0 every host live, 1 a live host differs from the inventory
(GPU count), 2 a host is not live; a bad inventory exits 2 with one line naming file and line.

The inventory is --hosts, else --inventory FILE, else $GPUCONSOLE_INVENTORY, else
~/.config/gpuconsole/hosts.toml where it exists. SSH uses ~/.ssh/config, the SSH agent and
~/.ssh/known_hosts: an unknown host key is refused, a changed one is refused loudly.
"""

EXIT_UNREADABLE = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuconsole",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuconsole {__version__}")
    _add_demo_options(parser)
    _add_inventory_options(parser)
    parser.add_argument(
        "--refresh",
        type=_positive_float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between readings (default: 1)",
    )
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
    parser.add_argument(
        "--alerts",
        type=Path,
        metavar="FILE",
        help="alert rules file (default: $GPUCONSOLE_ALERTS, else alerts.toml in the XDG "
        "config dir)",
    )
    from gpuconsole.record.commands import add_console_options

    add_console_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    snapshot = commands.add_parser(
        "snapshot", help="print this host's readings and findings once, then exit"
    )
    snapshot.add_argument("--json", action="store_true", help="print JSON instead of text")
    snapshot.add_argument(
        "--host", metavar="NAME", help="read this inventory host over SSH instead of this host"
    )
    _add_demo_options(snapshot)
    _add_inventory_options(snapshot)
    triage = commands.add_parser(
        "triage", help="findings of a saved nvidia-smi dump (-q -x XML or -q text)"
    )
    triage.add_argument("--from", dest="dump", required=True, type=Path, metavar="FILE")
    triage.add_argument("--json", action="store_true", help="print JSON instead of text")
    hosts = commands.add_parser("hosts", help="the SSH hosts of the inventory")
    hosts_commands = hosts.add_subparsers(dest="hosts_command", metavar="COMMAND", required=True)
    check = hosts_commands.add_parser(
        "check", help="connect to each host once; print name, state, reason and GPU count"
    )
    check.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_inventory_options(check)
    verify = commands.add_parser(
        "verify",
        help="check hosts' GPU stack (driver, CUDA, frameworks, PCIe, NVLink, disks): "
        "evidence and a fix for every problem",
    )
    verify.add_argument(
        "targets",
        nargs="*",
        metavar="HOST",
        help="inventory hosts or groups to verify (default: this host; 'local' is this host)",
    )
    verify.add_argument("--all", action="store_true", help="every host of the inventory")
    verify.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_inventory_options(verify)
    repair = commands.add_parser(
        "repair",
        help="find why the NVIDIA driver does not work on a host and fix it: every command "
        "shown first, nothing run without a yes",
    )
    repair.add_argument(
        "target", nargs="?", metavar="HOST", help="an inventory host (default: this host)"
    )
    repair.add_argument(
        "--dry-run", action="store_true", help="diagnose and show the plans; run nothing"
    )
    repair.add_argument(
        "--yes", action="store_true", help="run the plans without asking (for scripts)"
    )
    repair.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_inventory_options(repair)
    launch = commands.add_parser(
        "launch",
        help="run a training recipe as a benchmark (python or torchrun on a host, torchrun "
        "across hosts, srun on a Slurm login node) and compare it with its history",
    )
    launch.add_argument("recipe", choices=("resnet50", "bert", "detection"))
    launch.add_argument("--host", metavar="NAME", help="an inventory host (default: this host)")
    launch.add_argument(
        "--nodes", metavar="H1,H2", help="inventory hosts for one multi-node run (c10d rendezvous)"
    )
    launch.add_argument(
        "--slurm",
        type=_positive_int,
        metavar="NODES",
        help="the host is a Slurm login node: srun the job on this many nodes (--gpus each)",
    )
    launch.add_argument(
        "--gpus",
        type=_positive_int,
        metavar="N",
        help="GPUs per host (default: all; fewer: the best-connected set)",
    )
    launch.add_argument("--preset", choices=("baseline", "tuned"), default="tuned")
    launch.add_argument("--steps", type=_positive_int, metavar="N", help="measured steps")
    launch.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_inventory_options(launch)
    memory = commands.add_parser(
        "memory",
        help="short trials of a recipe with each memory fix (mixed precision, checkpointing, "
        "compression, expandable segments, micro-batches) and the cheapest set that fits",
    )
    memory.add_argument("recipe", choices=("resnet50", "bert", "detection"))
    memory.add_argument("--host", metavar="NAME", help="an inventory host (default: this host)")
    memory.add_argument(
        "--target",
        type=_memory_target,
        metavar="GIB|N%",
        help="the peak to fit under, in GiB or as a share of the fp32 run's peak "
        "(default: the card's memory less a 20 %% reserve)",
    )
    memory.add_argument(
        "--fixes",
        metavar="SET",
        help="try only this set (as the report names it, e.g. bf16+checkpoint) and find the "
        "largest batch with it",
    )
    memory.add_argument("--amp", choices=("bf16", "fp16"), default="bf16", help="mixed precision")
    memory.add_argument(
        "--batch-size",
        type=_positive_int,
        metavar="N",
        help="the job's batch (default: the recipe's)",
    )
    memory.add_argument("--gpu", type=int, default=0, metavar="INDEX", help="the GPU to try on")
    memory.add_argument(
        "--steps", type=_positive_int, default=8, metavar="N", help="measured steps per trial"
    )
    memory.add_argument(
        "--apply", action="store_true", help="then launch the recipe with the recommended fixes"
    )
    memory.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_inventory_options(memory)
    oom = commands.add_parser(
        "oom", help="explain a PyTorch 'CUDA out of memory' error from a log (- reads stdin)"
    )
    oom.add_argument(
        "log", metavar="LOG", help="a log or traceback holding the message; - for stdin"
    )
    oom.add_argument(
        "--host", metavar="NAME", help="the inventory host it ran on, to name the card's processes"
    )
    oom.add_argument(
        "--here", action="store_true", help="it ran on this host: read its GPUs' processes"
    )
    oom.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_inventory_options(oom)
    _add_demo_options(oom)
    bench = commands.add_parser("bench", help="benchmark results kept by `launch`")
    bench_commands = bench.add_subparsers(dest="bench_command", metavar="COMMAND", required=True)
    history = bench_commands.add_parser("history", help="earlier runs, newest first, flagged")
    history.add_argument("--host", metavar="NAME")
    history.add_argument("--recipe", metavar="NAME")
    history.add_argument("--json", action="store_true", help="print JSON instead of text")
    from gpuconsole.prom.commands import add_commands as add_prometheus_commands

    add_prometheus_commands(commands, (_add_demo_options, _add_inventory_options))
    from gpuconsole.actions.bundle.command import add_command as add_bundle_command
    from gpuconsole.record.commands import add_commands as add_recording_commands

    add_recording_commands(commands, (_add_demo_options, _add_inventory_options))
    add_bundle_command(commands, (_add_demo_options, _add_inventory_options))
    return parser


def _add_inventory_options(parser: argparse.ArgumentParser) -> None:
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


def _add_demo_options(parser: argparse.ArgumentParser) -> None:
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
    value = _positive_int(text)
    if value > MAX_DEMO_HOSTS:
        raise argparse.ArgumentTypeError(
            f"more hosts than a simulated rack has (at most {MAX_DEMO_HOSTS}; each holds about "
            "1 MB of recent readings)"
        )
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _memory_target(text: str) -> tuple[float | None, float | None]:
    """``--target``: (GiB, None) or (None, share) for ``N%``."""
    share = text.endswith("%")
    value = _positive_float(text.removesuffix("%"))
    if share and value >= 100:
        raise argparse.ArgumentTypeError(f"{text}: a share under 100%")
    return (None, value / 100) if share else (value, None)


def _demo_source(args: argparse.Namespace) -> SimSource:
    from gpuconsole.clock import wall_clock
    from gpuconsole.telemetry.sim import SimSource, demo_rack

    rack = demo_rack(hosts=args.demo_hosts, seed=args.seed, epoch=wall_clock() - DEMO_LEAD_SECONDS)
    return SimSource(rack, wall_clock)


def _fail(message: str) -> int:
    print(f"gpuconsole: {message}", file=sys.stderr)
    return EXIT_UNREADABLE


class _Refused(Exception):
    """A command cannot start; the message is the one line to print, the code the exit code."""

    def __init__(self, message: str, code: int = EXIT_UNREADABLE) -> None:
        super().__init__(message)
        self.code = code


def _inventory(args: argparse.Namespace) -> Inventory | None:
    """The hosts of --hosts, else of --inventory, else of the default file where it exists."""
    from gpuconsole.hosts.inventory import (
        InventoryError,
        hosts_from_option,
        load_inventory,
    )

    try:
        if args.hosts is not None:
            return hosts_from_option(args.hosts)
        path = args.inventory or paths.INVENTORY.path()
        if args.inventory is None and not path.exists():
            return None
        return load_inventory(path)
    except InventoryError as error:
        raise _Refused(str(error), code=2) from None


def _required_inventory(args: argparse.Namespace, subject: str) -> Inventory:
    """The inventory, or a one-line refusal that says how to give one."""
    inventory = _inventory(args)
    if inventory is None:
        raise _Refused(
            f"{subject}: no inventory (give --hosts or --inventory, or write hosts.toml; "
            "see `gpuconsole --help`)",
            code=2,
        )
    return inventory


def _ssh_source(inventory: Inventory, refresh: float) -> SshSource:
    from gpuconsole.hosts.source import SshSource
    from gpuconsole.hosts.supervisor import Supervisor

    return SshSource(Supervisor(inventory.hosts, interval=refresh))


def _console_source(args: argparse.Namespace) -> tuple[Source, str]:
    """What the console watches: the demo, or this host's GPUs and the inventory's hosts."""
    from gpuconsole.hosts.source import FleetSource
    from gpuconsole.telemetry import SourceError
    from gpuconsole.telemetry.local import local_source

    if args.demo:
        return _demo_source(args), "demo rack"
    if args.prometheus:
        from gpuconsole.telemetry.prometheus import PrometheusSource

        try:
            source = PrometheusSource(args.prometheus)
        except SourceError as error:
            raise _Refused(str(error)) from None
        return source, f"Prometheus {source.url}"
    inventory = _inventory(args)
    try:
        local: Source | None = local_source()
    except SourceError as error:
        if inventory is None:
            raise _Refused(f"no local GPU telemetry: {error}. Try `gpuconsole --demo`.") from None
        local = None
    if inventory is None:
        assert local is not None
        return FleetSource(local, None), "this host"
    remote = _ssh_source(inventory, args.refresh)
    try:
        source = FleetSource(local, remote)
    except SourceError as error:
        remote.close()
        raise _Refused(str(error), code=2) from None
    count = len(source.hosts)
    return source, f"{count} host{'s' if count != 1 else ''} ({inventory.source})"


def _alert_rules(args: argparse.Namespace) -> tuple[AlertRule, ...]:
    """The built-in alert rules changed by the user's alerts file, if any."""
    from gpuconsole.alerts.config import load_rules
    from gpuconsole.alerts.rules import RuleError

    try:
        return load_rules(args.alerts)
    except RuleError as error:
        raise _Refused(str(error), code=2) from None


def run_console(args: argparse.Namespace) -> int:
    # Textual is imported here, not at the top: scripts running a subcommand never load it.
    from gpuconsole.app import GpuConsoleApp
    from gpuconsole.themes import DEFAULT_THEME, THEMES

    theme = args.theme or DEFAULT_THEME
    if theme not in THEMES:
        known = ", ".join(sorted(THEMES))
        print(f"gpuconsole: unknown theme {theme!r} (known: {known})", file=sys.stderr)
        return 2
    from gpuconsole.record.commands import console_recorder
    from gpuconsole.record.schema import RecordingError

    rules = _alert_rules(args)
    source, label = _console_source(args)
    try:
        recorder = console_recorder(args, label)
    except RecordingError as error:
        close = getattr(source, "close", None)
        if close is not None:
            close()
        raise _Refused(str(error)) from None
    app = GpuConsoleApp(
        source,
        label=label,
        refresh=args.refresh,
        theme=theme,
        alert_rules=rules,
        recorder=recorder,
    )
    try:
        app.run()
    finally:
        if recorder is not None:
            recorder.close()
        close = getattr(source, "close", None)
        if close is not None:
            close()
    return 0


def _snapshot_of(args: argparse.Namespace) -> HostSnapshot:
    """One reading: of the demo, of an inventory host over SSH (--host), or of this host."""
    from gpuconsole.telemetry import SourceError
    from gpuconsole.telemetry.local import local_source

    if args.host is None:
        try:
            source = _demo_source(args) if args.demo else local_source()
            return source.read(source.hosts[0])
        except SourceError as error:
            raise _Refused(
                f"cannot read this host: {error}. Try `gpuconsole snapshot --demo`."
            ) from None
    inventory = _required_inventory(args, f"--host {args.host}")
    try:
        entry = inventory.get(args.host)
    except KeyError as error:
        raise _Refused(str(error.args[0]), code=2) from None
    from gpuconsole.hosts.source import SshSource
    from gpuconsole.hosts.supervisor import Supervisor

    remote = SshSource(Supervisor([entry]))
    try:
        remote.settle(entry.connect_timeout + 5.0)
        try:
            return remote.read(entry.name)
        except SourceError as error:
            raise _Refused(f"cannot read {entry.name}: {error}") from None
    finally:
        remote.close()


def run_snapshot(args: argparse.Namespace) -> int:
    from gpuconsole import health
    from gpuconsole.cli_output import findings_text, snapshot_text
    from gpuconsole.jsonout import exit_code, snapshot_dict

    snapshot = _snapshot_of(args)
    findings = health.evaluate(snapshot)
    if args.json:
        print(json.dumps(snapshot_dict(snapshot, findings), indent=2))
    else:
        print(snapshot_text(snapshot))
        print(findings_text(findings))
    return exit_code(findings)


def run_hosts_check(args: argparse.Namespace) -> int:
    from gpuconsole.hosts.check import check_hosts, exit_code, results_text

    results = check_hosts(_required_inventory(args, "hosts check"))
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        print(results_text(results))
    return exit_code(results)


def run_triage(args: argparse.Namespace) -> int:
    from gpuconsole import health
    from gpuconsole.cli_output import findings_text
    from gpuconsole.jsonout import exit_code, finding_dict
    from gpuconsole.telemetry.smi import SmiParseError, parse_dump, read_dump

    path: Path = args.dump
    try:
        snapshot = parse_dump(read_dump(path), host=path.stem, time=time.time())
    except OSError as error:
        return _fail(f"{path}: {error.strerror or error}")
    except SmiParseError as error:
        return _fail(f"{path}: {error}")
    findings = health.evaluate(snapshot)
    if args.json:
        print(
            json.dumps(
                {
                    "file": str(path),
                    "gpus": len(snapshot.gpus),
                    "driver_version": snapshot.driver_version,
                    "findings": [finding_dict(f) for f in findings],
                },
                indent=2,
            )
        )
    else:
        print(f"{path}: {len(snapshot.gpus)} GPUs, driver {snapshot.driver_version or 'N/A'}")
        print(findings_text(findings))
    return exit_code(findings)


LOCAL_NAMES = frozenset({"local", "localhost"})


def _verify_targets(args: argparse.Namespace) -> list[Target]:
    """This host, and the inventory hosts or groups named (or all of them with --all)."""
    import socket

    from gpuconsole.hosts.targets import Context, Target

    names: list[str] = list(args.targets)
    if not names and not args.all:
        names = ["local"]
    wanted = [n for n in names if n not in LOCAL_NAMES]
    targets = []
    if len(wanted) < len(names):
        here = socket.gethostname()
        targets.append(Target(here, None, Context(here)))
    if not wanted and not args.all:
        return targets
    inventory = _required_inventory(args, wanted[0] if wanted else "--all")
    groups = inventory.groups()
    chosen: list[str] = [h.name for h in inventory.hosts] if args.all else []
    for name in wanted:
        if name in groups:
            chosen.extend(groups[name])
        else:
            try:
                chosen.append(inventory.get(name).name)
            except KeyError as error:
                raise _Refused(str(error.args[0]), code=2) from None
    for name in dict.fromkeys(chosen):
        entry = inventory.get(name)
        targets.append(Target(name, entry, Context(name, entry.expected_gpus)))
    return targets


def run_verify(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.actions.verify.checks import CHECKS
    from gpuconsole.actions.verify.output import exit_code, reports_text
    from gpuconsole.actions.verify.runner import verify_targets

    reports = asyncio.run(verify_targets(_verify_targets(args), CHECKS))
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    else:
        print(reports_text(reports))
    return exit_code(reports)


def run_repair(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.actions.repair.output import diagnosis_text, plan_text, report_text
    from gpuconsole.actions.repair.session import repair_target

    args.targets, args.all = [args.target] if args.target else [], False
    (target,) = _verify_targets(args)
    interactive = not args.json and sys.stdin.isatty()
    numbers: dict[str, int] = {}

    async def confirm(plan: Plan, commands: Sequence[str]) -> bool:
        if args.yes:
            return True
        if not interactive:
            print(f"{plan.title}: not run: no terminal to ask; pass --yes", file=sys.stderr)
            return False
        numbers[plan.cause_id] = len(numbers) + 1
        print(plan_text(numbers[plan.cause_id], plan, tuple(commands)))
        answer = await asyncio.to_thread(input, f"run these on {target.name}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    def show(line: str) -> None:
        if not args.json:
            print(f"  {line}", flush=True)

    report = asyncio.run(repair_target(target, confirm=confirm, dry_run=args.dry_run, on_line=show))
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    elif interactive and not args.dry_run and report.diagnosis is not None:
        print(diagnosis_text(report.diagnosis))
        for run in report.runs:
            print(f"{run.plan.title}: {run.message}")
        if report.after is not None:
            print(f"verified again: {report.after.status.value}")
    else:
        print(report_text(report))
    return report.exit_code


def _launch_targets(args: argparse.Namespace) -> list[Target]:
    if args.nodes:
        args.targets, args.all = [n for n in args.nodes.split(",") if n], False
        targets = _verify_targets(args)
        if len(targets) < 2:
            raise _Refused("--nodes: name two or more hosts", code=2)
        return targets
    args.targets, args.all = [args.host] if args.host else [], False
    return _verify_targets(args)


def run_launch(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.actions.launch.commands import LaunchError, LaunchSpec
    from gpuconsole.actions.launch.output import result_dict, result_text, step_text
    from gpuconsole.actions.launch.record import record_run
    from gpuconsole.actions.launch.session import HostGpus, Launch, launch
    from gpuconsole.bench.history import BenchHistory, HistoryError

    spec = LaunchSpec(args.recipe, args.preset, args.steps, tuple(args.recipe_args))
    targets = _launch_targets(args)

    def on_plan(plan: Launch, _gpus: HostGpus) -> None:
        if not args.json:
            for host, command in plan.commands.items():
                print(f"{host} ({plan.engine}): $ {command}", flush=True)

    def on_event(event: dict[str, object]) -> None:
        if not args.json and event.get("event") == "step":
            print(step_text(event), flush=True)

    try:
        plan, gpus, result = asyncio.run(
            launch(
                targets,
                spec,
                gpus=args.gpus,
                slurm_nodes=args.slurm,
                on_plan=on_plan,
                on_event=on_event,
            )
        )
    except LaunchError as error:
        raise _Refused(f"launch {args.recipe}: {error}") from None
    try:
        stored, judgement = record_run(BenchHistory(), result, gpus.driver)
    except HistoryError as error:
        print(f"gpuconsole: {error} (the result was not kept)", file=sys.stderr)
        stored, judgement = None, None
    if args.json:
        print(json.dumps(result_dict(plan, result, stored, judgement), indent=2))
    else:
        print(result_text(result, judgement))
    if not result.ok:
        return 2
    return 1 if judgement is not None and judgement.flagged else 0


def run_bench_history(args: argparse.Namespace) -> int:
    from gpuconsole.bench.history import BenchHistory, HistoryError
    from gpuconsole.bench.output import history_json, history_text
    from gpuconsole.bench.review import REVIEW_LIMIT, judged

    history = BenchHistory()
    try:
        results = history.runs(host=args.host, recipe=args.recipe)
        verdicts = judged(results, history.runs(limit=REVIEW_LIMIT)) if results else []
    except HistoryError as error:
        raise _Refused(str(error)) from None
    if args.json:
        print(json.dumps(history_json(results), indent=2))
    else:
        print(history_text(results, verdicts) if results else "no benchmark runs recorded yet")
    return 0


def run_memory(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.actions.memory.output import report_dict, report_text, trial_line
    from gpuconsole.actions.memory.session import (
        DoctorRequest,
        MemoryDoctorError,
        MemoryReport,
        Schedule,
        run_doctor,
    )
    from gpuconsole.actions.memory.trials import parse_fixes

    args.nodes = None  # one host: trials run on one GPU
    targets = _launch_targets(args)
    try:
        only = parse_fixes(args.fixes) if args.fixes else None
    except ValueError as error:
        raise _Refused(f"--fixes {error}", code=2) from None
    target_gib, target_share = args.target or (None, None)
    request = DoctorRequest(
        args.recipe,
        target_gib,
        target_share,
        only,
        args.amp,
        args.batch_size,
        args.gpu,
        tuple(args.recipe_args),
        Schedule(steps=args.steps),
    )
    shown = MemoryReport(targets[0].name, args.recipe)

    def on_trial(trial) -> None:  # type: ignore[no-untyped-def]
        shown.trials.append(trial)
        if not args.json:
            print(trial_line(trial, shown), flush=True)

    try:
        report = asyncio.run(run_doctor(targets[0], request, on_trial=on_trial))
    except MemoryDoctorError as error:
        raise _Refused(f"memory {args.recipe}: {error}", code=2) from None
    if args.json:
        print(json.dumps(report_dict(report), indent=2))
    else:
        print()
        print(report_text(report))
    if args.apply:
        if report.recommended is None:
            raise _Refused("--apply: nothing tried fits the target, so nothing was launched")
        args.preset, args.steps, args.gpus, args.slurm, args.nodes = (
            "baseline",
            None,
            None,
            None,
            None,
        )
        args.recipe_args = [
            *report.recommended.fixes.arguments(report.batch_size or 1),
            *args.recipe_args,
        ]
        return run_launch(args)
    return 0 if report.recommended is not None else 1


def run_oom(args: argparse.Namespace) -> int:
    from gpuconsole.actions.memory.oom import OomParseError, diagnose, parse_oom, read_log
    from gpuconsole.actions.memory.output import diagnosis_dict, diagnosis_text

    name = "stdin" if args.log == "-" else args.log
    try:
        if args.log == "-":
            text = read_log(sys.stdin.buffer)
        else:
            with Path(args.log).open("rb") as log:
                text = read_log(log)
        message = parse_oom(text)
    except OSError as error:
        return _fail(f"{name}: {error.strerror or error}")
    except OomParseError as error:
        return _fail(f"{name}: {error}")
    processes = ()
    if args.host or args.here or args.demo:
        processes = _snapshot_of(args).processes
    diagnosis = diagnose(message, processes)
    if args.json:
        print(json.dumps(diagnosis_dict(diagnosis), indent=2))
    else:
        print(diagnosis_text(diagnosis))
    return 0


def run_exporter(args: argparse.Namespace) -> int:
    from gpuconsole.prom.commands import run_exporter as serve

    return serve(args, lambda: _console_source(args)[0])


def run_rules_export(args: argparse.Namespace) -> int:
    from gpuconsole.prom.commands import run_rules_export as export

    return export(args)


def run_grafana_export(args: argparse.Namespace) -> int:
    from gpuconsole.prom.commands import run_grafana_export as export

    return export(args)


def run_record(args: argparse.Namespace) -> int:
    from gpuconsole.record.commands import run_record as record

    return record(args, lambda: _console_source(args), lambda: _alert_rules(args))


def run_replay(args: argparse.Namespace) -> int:
    from gpuconsole.record.commands import run_replay as replay
    from gpuconsole.themes import DEFAULT_THEME, THEMES

    theme = args.theme or DEFAULT_THEME
    if theme not in THEMES:
        raise _Refused(f"unknown theme {theme!r} (known: {', '.join(sorted(THEMES))})", code=2)
    return replay(args, theme, lambda: _alert_rules(args))


def run_bundle(args: argparse.Namespace) -> int:
    from gpuconsole.actions.bundle.command import run_bundle as bundle

    return bundle(
        args,
        lambda: _demo_source(args),
        lambda host: _bundle_target(args, host),
        lambda: _alert_rules(args),
    )


def _bundle_target(args: argparse.Namespace, host: str) -> Target | None:
    """How to reach ``host``'s shell: this machine by 'local' or its own name, an inventory
    host over SSH; None when it is neither."""
    import socket

    from gpuconsole.hosts.targets import Context, Target

    here = socket.gethostname()
    if host in LOCAL_NAMES or host == here:
        return Target(here, None, Context(here))
    inventory = _inventory(args)
    if inventory is None:
        return None
    try:
        entry = inventory.get(host)
    except KeyError:
        return None
    return Target(entry.name, entry, Context(entry.name, entry.expected_gpus))


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # `launch RECIPE [options] -- ARGS`: what follows `--` goes to the recipe untouched.
    extra: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, extra = words[:cut], words[cut + 1 :]
    parser = build_parser()
    args = global_options.parse(parser, words)
    if extra and args.command not in ("launch", "memory"):
        parser.error(
            "arguments after -- are passed to a recipe: only `launch` and `memory` take them"
        )
    args.recipe_args = extra
    runners = {
        None: run_console,
        "snapshot": run_snapshot,
        "triage": run_triage,
        "hosts": run_hosts_check,
        "verify": run_verify,
        "repair": run_repair,
        "launch": run_launch,
        "bench": run_bench_history,
        "memory": run_memory,
        "oom": run_oom,
        "exporter": run_exporter,
        "rules": run_rules_export,
        "grafana": run_grafana_export,
        "record": run_record,
        "replay": run_replay,
        "bundle": run_bundle,
    }
    from gpuconsole.terminal.plain import guarded_output

    try:
        with guarded_output():
            return runners[args.command](args)
    except _Refused as refused:
        print(f"gpuconsole: {refused}", file=sys.stderr)
        return refused.code
    except KeyboardInterrupt:  # Ctrl+C: each command has cleaned up on its way out
        print("gpuconsole: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
