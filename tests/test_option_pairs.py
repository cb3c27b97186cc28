"""No option is dropped in silence: where a command would not read an option beside another
(--hosts with --demo, --inventory with --hosts, --hosts without --host in `snapshot`), it is
refused with one line, as a global option a command does not read is; where it can be honoured,
it is (`snapshot --demo-hosts 5` is a snapshot of a five-host demo rack). Durations are bounded
where they are parsed.

The cases of the issue run the real CLI. `test_every_pair_refused_is_one_not_read` walks the
parser: for each command, every combination of the options that choose what it watches, held
against what `gpuconsole.cli.commands.sources` then reads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_runner import gpuconsole
from test_hostile_cli import REQUIRED  # what each command needs besides its options

from gpuconsole.cli import global_options
from gpuconsole.cli.commands import oom, sources
from gpuconsole.cli.commands.console import console_recorder
from gpuconsole.cli.commands.exits import Refused
from gpuconsole.cli.main import build_parser

INVENTORY = '[hosts.gpu01]\naddress = "127.0.0.1"\n'


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def refused(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    return one_line(result.stderr)


# --- the cases, through the CLI ----------------------------------------------------------


def test_snapshot_demo_hosts_is_a_snapshot_of_that_demo_rack() -> None:
    """It read this host (and, with no GPU here, failed); --demo-hosts means the demo, whose
    host --host picks (h100-04 exists in a rack of 12, not in one of 6)."""
    result = gpuconsole("snapshot", "--demo-hosts", "5", "--json")
    assert result.returncode in (0, 1, 2), result.stderr
    assert json.loads(result.stdout)["host"] == "h100-01"
    result = gpuconsole("snapshot", "--demo-hosts", "12", "--host", "h100-04", "--json")
    assert result.returncode in (0, 1, 2), result.stderr
    assert json.loads(result.stdout)["host"] == "h100-04"
    line = refused(gpuconsole("snapshot", "--demo", "--host", "h100-04"))
    assert line.startswith("gpuconsole: --host 'h100-04': no such host in the demo rack (hosts: ")


def test_snapshot_demo_host_is_that_demo_host() -> None:
    """It asked the inventory for --host and ignored --demo."""
    result = gpuconsole("--demo", "snapshot", "--host", "a100-02", "--json")
    assert result.returncode in (0, 1, 2), result.stderr
    assert json.loads(result.stdout)["host"] == "a100-02"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ("record", "--demo", "--hosts", "good", "--duration", "1s"),
            "--hosts does not apply with --demo (the demo watches a simulated rack)",
        ),
        (
            ("exporter", "--demo", "--inventory", "X", "--port", "0"),
            "--inventory does not apply with --demo (the demo watches a simulated rack)",
        ),
        (
            ("--demo-hosts", "3", "--hosts", "gpu01"),
            "--hosts does not apply with --demo-hosts (the demo watches a simulated rack)",
        ),
        (
            ("--prometheus", "http://127.0.0.1:9", "--hosts", "gpu01"),
            "--hosts does not apply with --prometheus (the hosts are those Prometheus scrapes)",
        ),
        (
            ("hosts", "check", "--hosts", "gpu01", "--inventory", "hosts.toml"),
            "--inventory does not apply with --hosts (--hosts stands for the whole inventory)",
        ),
        (
            ("--record", "rec.sqlite", "--no-record"),
            "--record does not apply with --no-record (it records nothing)",
        ),
        (
            ("snapshot", "--hosts", "gpu01"),
            "--hosts does not apply: without --host, this reads this machine",
        ),
        (
            ("oom", "train.log", "--here", "--demo"),
            "--here does not apply with --demo (it reads a host of the demo rack)",
        ),
        (
            ("bundle", "h100-01", "--demo", "--record", "rec.sqlite"),
            "--record does not apply with --demo (the demo's past is simulated afresh, not "
            "recorded)",
        ),
        (
            ("bundle", "local", "--hosts", "gpu01"),
            "--hosts does not apply: local is this machine, which the bundle reads itself",
        ),
    ],
    ids=[
        "record-demo-hosts",
        "exporter-demo-inventory",
        "console-demo-hosts",
        "console-prometheus-hosts",
        "hosts-check-both",
        "console-record-no-record",
        "snapshot-hosts",
        "oom-here-demo",
        "bundle-demo-record",
        "bundle-local-hosts",
    ],
)
def test_an_option_not_read_beside_another_is_refused(
    argv: tuple[str, ...], line: str, tmp_path: Path
) -> None:
    """Before, each ran with one of the two dropped (the exporter and the console until
    stopped, which the timeout does)."""
    assert refused(gpuconsole(*argv, timeout=30)) == f"gpuconsole: {line}"


def test_hosts_for_a_command_that_acts_on_this_machine_is_refused() -> None:
    """`verify --hosts gpu01` verified this machine: only a named host reads the inventory."""
    assert refused(gpuconsole("verify", "--hosts", "gpu01", "--json", timeout=120)) == (
        "gpuconsole: --hosts does not apply: no host of it is named, so this acts on this machine"
    )


def test_targets_refuse_an_inventory_they_do_not_read(tmp_path: Path) -> None:
    """launch, memory, repair, verify, drain and resume find their hosts through
    `sources.targets`: an inventory given must be the one they act on, so it is refused where
    only this machine is meant (no name, or ``local``) and read where a host of it is."""
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(INVENTORY)
    cases = [((), False, False), (("local",), False, False), (("gpu01",), False, True)]
    cases.append(((), True, True))
    for names, every, read in cases:
        for given in (
            {"hosts": "gpu01", "inventory": None},
            {"hosts": None, "inventory": inventory},
        ):
            args = argparse.Namespace(**given)
            if read:
                assert [t.name for t in sources.targets(args, names, every)][-1] == "gpu01"
                continue
            with pytest.raises(Refused) as caught:
                sources.targets(args, names, every)
            flag = "--hosts" if given["hosts"] else "--inventory"
            assert str(caught.value) == (
                f"{flag} does not apply: no host of it is named, so this acts on this machine"
            )


# --- durations bounded where they are parsed -----------------------------------------------------


@pytest.mark.parametrize("value", ["99999999999999999999w", "9" * 400])
@pytest.mark.parametrize("option", ["--retain", "--full-resolution", "--refresh", "--duration"])
def test_record_refuses_a_duration_too_long_before_it_starts(
    option: str, value: str, tmp_path: Path
) -> None:
    """--retain 99999999999999999999w started recording and stopped on an OverflowError."""
    path = tmp_path / "rec.sqlite"
    result = gpuconsole(
        "record", "--demo", "--record", str(path), option, value, "--duration", "2s"
    )
    if option == "--duration":  # the later --duration wins: give the long one last
        result = gpuconsole(
            "record", "--demo", "--record", str(path), "--duration", "2s", option, value
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    bound = (  # --refresh is held to the agent's bounds (tests/test_option_definitions.py)
        "is not between 0.1 and 3600 seconds"
        if option == "--refresh"
        else "is longer than 36500d (a hundred years)"
    )
    assert result.stderr.strip().splitlines()[-1] == (
        f"gpuconsole record: error: argument {option}: {value!r} {bound}"
    )
    assert not path.exists()


def test_record_takes_a_hundred_years_and_no_more(tmp_path: Path) -> None:
    path = tmp_path / "rec.sqlite"
    result = gpuconsole("record", "--demo", "--record", str(path), "--retain", "36501d")
    assert result.returncode == 2, result.stderr
    assert not path.exists()
    result = gpuconsole(
        "record", "--demo", "--record", str(path), "--retain", "36500d", "--duration", "2s"
    )
    assert result.returncode == 0, result.stderr
    assert "Error" not in result.stderr


def test_exporter_refuses_a_refresh_too_long() -> None:
    """It served, then raised OverflowError from its first wait; now the parse refuses it."""
    result = gpuconsole("exporter", "--demo", "--port", "0", "--refresh", "1e300", timeout=30)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "gpuconsole exporter: error: argument --refresh: '1e300' is not between 0.1 and 3600 "
        "seconds"
    )


# --- every pair, held against what the command reads ---------------------------------------------

GIVEN: dict[str, tuple[str, ...]] = {
    "demo": (),
    "demo_hosts": ("3",),
    "seed": ("3",),
    "prometheus": ("http://prom:9090",),
    "hosts": ("gpu01",),
    "inventory": ("hosts.toml",),
    "record": ("rec.sqlite",),
    "no_record": (),
    "host": ("gpu01",),
}
"""The options that choose what a command watches or reads, and a value for each."""
OWN = {"snapshot": {"host"}, "oom": {"host"}}
"""A command's own options among `GIVEN` that `DECIDERS` read."""


def _console(args: argparse.Namespace) -> None:
    sources.console_source(args)
    console_recorder(args, "label")


def _record(args: argparse.Namespace) -> None:
    _ = args.record  # `record.run` reads --record first, always
    sources.console_source(args)


DECIDERS: dict[str, Callable[[argparse.Namespace], object]] = {
    "": _console,
    "record": _record,
    "exporter": sources.console_source,
    "snapshot": sources.snapshot_of,
    "oom": oom.run,  # on `OOM_LOG`: what it reads of the hosts is decided as it goes
    **{
        command: sources.inventory
        for command in ("hosts check", "verify", "repair", "drain", "resume", "launch", "memory")
    },
}
"""Where each command decides what it reads of the options in `GIVEN`: in `sources`, or the
command itself where that is cheap with the sources stubbed (`oom`)."""
OOM_LOG = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.50 GiB is free. Of the allocated memory 70.00 GiB is "
    "allocated by PyTorch, and 1.58 GiB is reserved by PyTorch but unallocated.\n"
)
"""A log `oom` parses (made by hand, in torch 2.x's words)."""
GAPS: dict[str, str] = {}
"""Where an option is still dropped: refusing it at parse time would refuse it alone (the parse
honours each option a command reads, `test_hostile_cli`); the command must refuse it."""
NOT_WALKED = {
    "bundle": "its demo or recording is chosen in `bundle._inputs`, which builds the bundle's "
    "inputs as it reads; its pair (--demo with --record) is a CLI case above",
}


class Reads(argparse.Namespace):
    """A namespace that notes each option read."""

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        object.__setattr__(self, "_reads", set())

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            object.__getattribute__(self, "_reads").add(name)
        return object.__getattribute__(self, name)


class _Stub:
    """Stands in for a source, a supervisor, a recorder: it holds nothing open."""

    hosts = ("stub",)
    url = "http://prom:9090"

    def __init__(self, *_: object, **__: object) -> None:
        pass

    def read(self, _host: str) -> None:
        return None

    def close(self) -> None:
        pass


@pytest.fixture
def nothing_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deciders as they are, the sources and recorders they would open stubbed."""
    import gpuconsole.fleet.record.recorder
    import gpuconsole.hosts.source
    import gpuconsole.hosts.supervisor
    import gpuconsole.telemetry.local
    import gpuconsole.telemetry.prometheus

    monkeypatch.setattr(gpuconsole.telemetry.local, "local_source", _Stub)
    monkeypatch.setattr(gpuconsole.hosts.source, "FleetSource", _Stub)
    monkeypatch.setattr(gpuconsole.hosts.source, "SshSource", _Stub)
    monkeypatch.setattr(gpuconsole.hosts.supervisor, "Supervisor", _Stub)
    monkeypatch.setattr(gpuconsole.telemetry.prometheus, "PrometheusSource", _Stub)
    monkeypatch.setattr(gpuconsole.fleet.record.recorder, "Recorder", _Stub)
    monkeypatch.setattr(sources, "read_now", lambda _entry: argparse.Namespace(processes=()))


def _decide(
    decider: Callable[[argparse.Namespace], object], args: argparse.Namespace
) -> tuple[set[str], str | None]:
    """What ``decider`` reads of ``args``, and its refusal of an option it does not read, if
    it refuses one (``--hosts does not apply: …``). Another refusal (no inventory, say) ends
    its reading: what it read until then counts."""
    tracked = Reads(**vars(args))
    refusal = None
    try:
        decider(tracked)
    except Refused as refused:
        if "does not apply" in str(refused):
            refusal = str(refused)
    return object.__getattribute__(tracked, "_reads"), refusal


def _words(command: str, given: tuple[str, ...], flags: dict[str, str], own: set[str]) -> list[str]:
    """``gpuconsole [BEFORE] COMMAND REQUIRED [AFTER]``: each option after the command where
    the command has it (`own`), else before it (--prometheus before record)."""
    before = [word for dest in given if dest not in own for word in (flags[dest], *GIVEN[dest])]
    after = [word for dest in given if dest in own for word in (flags[dest], *GIVEN[dest])]
    return [*before, *command.split(), *REQUIRED.get(command, ()), *after]


def test_every_pair_refused_is_one_not_read(
    nothing_opened: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """For every command and every combination of the options in `GIVEN` it takes: parsing
    refuses it exactly when the command, deciding what to read (`DECIDERS`), would leave one
    of them unread, and the line names one so left; else the command reads them all, or
    refuses the one it would not read itself (--hosts where only this machine is named), or it
    is a known gap (`GAPS`). An option it would read is never refused.

    The reads are noted on the namespace, so the table in `global_options` is held to the code
    that reads the options, not to a copy of itself. --demo-hosts and --seed mean --demo, as
    `global_options.parse` documents."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    (tmp_path / "train.log").write_text(OOM_LOG)
    flags = global_options.global_flags(build_parser())
    for command in global_options.leaf_commands(build_parser()):
        if global_options.USES[command] & set(GIVEN):  # every such command is walked
            assert command in DECIDERS or command in NOT_WALKED, command
    walked = 0
    dropped: list[tuple[str, set[str], set[str]]] = []
    for command, parser in global_options.leaf_commands(build_parser()).items():
        own = {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}
        names = {**flags, **own}
        taken = sorted(
            dest
            for dest in GIVEN
            if dest in global_options.USES[command] or dest in OWN.get(command, set())
        )
        if not taken:
            continue
        if command in NOT_WALKED:
            continue
        decider = DECIDERS[command]
        for size in range(1, len(taken) + 1):
            for given in itertools.combinations(taken, size):
                words = _words(command, given, names, set(own) if command else set())
                plain = build_parser().parse_args(words)
                if set(given) & global_options.DEMO_SIZE:
                    plain.demo = True
                reads, refusal = _decide(decider, plain)
                unread = set(given) - reads
                walked += 1
                try:
                    global_options.parse(build_parser(), words)
                except SystemExit as exited:
                    line = capsys.readouterr().err
                    assert exited.code == 2
                    named = line.removeprefix("gpuconsole: ").split()[0]
                    if refusal is None:  # (a refusal's own check reads what it refuses)
                        assert unread, f"{words}: refused, yet every option is read: {line}"
                        assert named in {names[dest] for dest in unread}, (words, line, unread)
                    assert named in {names[dest] for dest in given}, (words, line)
                    continue
                if refusal is not None:  # where the names are resolved: the inventory unread
                    assert refusal.split()[0] in {names[dest] for dest in given}, refusal
                elif unread:
                    dropped.append((command, set(given), unread))
    assert walked > 500
    for command, given, unread in dropped:
        silence = f"`{command}` with {sorted(given)}: {sorted(unread)} dropped in silence"
        assert command in GAPS and unread <= global_options.INVENTORY, silence
        assert not given & {"host", "demo", *global_options.DEMO_SIZE}, (command, given)
    assert {command for command, _, _ in dropped} == set(GAPS), "a gap closed: take it out"
