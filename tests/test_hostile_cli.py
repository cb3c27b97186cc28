"""The command line held to what it says: global options a command does not read are refused,
the ones it reads are honoured; `triage --from` reads a bounded amount of anything; the audit log
is the user's alone.
"""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
from pathlib import Path

import pytest
from cli_runner import gpuconsole

from gpuconsole.cli import global_options
from gpuconsole.cli.main import build_parser, main
from gpuconsole.core import audit, paths

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"

REQUIRED: dict[str, tuple[str, ...]] = {
    "triage": ("--from", "dump.xml"),
    "launch": ("resnet50",),
    "memory": ("resnet50",),
    "oom": ("train.log",),
    "replay": ("recording.sqlite",),
    "bundle": ("gpu01",),
    "drain": ("gpu01", "--reason", "fan"),
    "resume": ("gpu01",),
}
"""What each command needs besides its options, so that it parses."""
GIVEN: dict[str, tuple[tuple[str, ...], object]] = {
    "refresh": (("5",), 5.0),
    "theme": (("gpuconsole-light",), "gpuconsole-light"),
    "prometheus": (("http://prom:9090",), "http://prom:9090"),
    "alerts": (("alerts.toml",), Path("alerts.toml")),
    "alertmanager": (("http://127.0.0.1:9093/",), ["http://127.0.0.1:9093"]),
    "record": (("rec.sqlite",), Path("rec.sqlite")),
    "no_record": ((), True),
    "demo": ((), True),
    "demo_hosts": (("3",), 3),
    "seed": (("3",), 3),
    "hosts": (("gpu01",), "gpu01"),
    "inventory": (("hosts.toml",), Path("hosts.toml")),
}
"""A value to give each global option, and the value the command should then see."""

FLAGS = global_options.global_flags(build_parser())
COMMANDS = sorted(global_options.USES)
PAIRS = [(command, dest) for command in COMMANDS for dest in sorted(FLAGS)]


def words(command: str, *before: str) -> list[str]:
    """``gpuconsole BEFORE COMMAND REQUIRED``: the options given before the command."""
    return [*before, *command.split(), *REQUIRED.get(command, ())]


def given(dest: str) -> list[str]:
    return [FLAGS[dest], *GIVEN[dest][0]]


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# --- the table of which command reads which global option ---------------------------------------


def test_the_table_names_every_command_and_every_global_option() -> None:
    assert set(global_options.USES) == set(global_options.leaf_commands(build_parser()))
    assert set(FLAGS) == set(GIVEN), "a global option without a test value"
    for command, uses in global_options.USES.items():
        assert uses <= set(FLAGS), command


def test_an_option_a_command_has_itself_is_one_it_reads() -> None:
    """record's own --refresh, snapshot's own --demo: where a command repeats a global option,
    the table must say it reads it, or its own option would be refused."""
    for command, parser in global_options.leaf_commands(build_parser()).items():
        own = {a.dest for a in parser._actions if a.option_strings and a.dest in FLAGS}
        assert own <= global_options.USES[command], command


@pytest.mark.parametrize(("command", "dest"), PAIRS)
def test_a_global_option_is_refused_or_honoured(
    command: str, dest: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = words(command, *given(dest))
    if dest in global_options.USES[command]:
        args = global_options.parse(build_parser(), argv)
        assert getattr(args, dest) == GIVEN[dest][1]
        return
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert one_line(capsys.readouterr().err) == (
        f"gpuconsole: {FLAGS[dest]} does not apply to `{command}`"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_defaults_are_those_argparse_gives(command: str) -> None:
    """Not given, every global option has the value it had before given-ness was tracked."""
    plain = build_parser().parse_args(words(command))
    args = global_options.parse(build_parser(), words(command))
    for dest in FLAGS:
        assert getattr(args, dest) == getattr(plain, dest), dest
    assert not hasattr(args, global_options.COMMAND_DEST)


def test_given_before_and_after_the_command_the_later_wins() -> None:
    args = global_options.parse(build_parser(), ["--refresh", "5", "record", "--refresh", "2"])
    assert args.refresh == 2.0
    args = global_options.parse(
        build_parser(), ["--demo-hosts", "3", "snapshot", "--demo-hosts", "4"]
    )
    assert args.demo_hosts == 4
    args = global_options.parse(build_parser(), ["record", "--refresh", "2"])
    assert args.refresh == 2.0


def test_refresh_before_record_is_honoured() -> None:
    """The issue's case: record polls every --refresh seconds (`record_fleet(interval=...)`), so
    the option given before it applies; argparse let record's own default replace it."""
    result = gpuconsole("--refresh", "5", "record", "--demo", "--duration", "1s")
    assert result.returncode == 0, result.stderr
    assert "every 5 s (Ctrl+C stops)" in result.stderr


def test_alerts_before_rules_export_is_honoured(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.toml"
    alerts.write_text(
        '[[rule]]\nname = "gpu-very-hot"\nexpr = "temperature_c >= 95"\nseverity = "critical"\n'
        'message = "{host} GPU {gpu} at {value} C"\n'
    )
    result = gpuconsole("--alerts", str(alerts), "rules", "export")
    assert result.returncode == 0, result.stderr
    assert 'alert: "GpuVeryHot"' in result.stdout
    alerts.write_text('[[rule]]\nname = "gpu-hot"\nexpr = "temp > 85"\nseverity = "info"\n')
    result = gpuconsole("--alerts", str(alerts), "rules", "export")
    assert result.returncode == 2
    assert one_line(result.stderr).startswith(f"gpuconsole: {alerts}: rule 'gpu-hot'")


def test_demo_before_snapshot_is_honoured() -> None:
    result = gpuconsole("--demo", "snapshot", "--json")
    assert result.returncode in (0, 1, 2), result.stderr
    assert json.loads(result.stdout)["host"]


@pytest.mark.parametrize(
    ("before", "command"),
    [
        (("--refresh", "5"), "triage"),
        (("--theme", "gpuconsole-light"), "snapshot"),
        (("--no-record",), "record"),
        (("--prometheus", "http://prom:9090"), "bundle"),
        (("--alerts", "alerts.toml"), "grafana export"),
    ],
)
def test_an_option_that_does_not_apply_exits_2_with_one_line(
    before: tuple[str, ...], command: str
) -> None:
    result = gpuconsole(*words(command, *before))
    assert result.returncode == 2
    assert result.stdout == ""
    assert one_line(result.stderr) == f"gpuconsole: {before[0]} does not apply to `{command}`"


# --- triage --from: bounded whatever the file is --------------------------------------------------

ADDRESS_SPACE = 1 << 30
"""RLIMIT_AS for the triage child: room for Python and its imports, not for a 1 GiB read."""


def limited_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def triage(path: Path | str, *, limit: bool = False) -> subprocess.CompletedProcess[str]:
    return gpuconsole("triage", "--from", str(path), preexec_fn=limited_memory if limit else None)


def test_a_sparse_1_gib_dump_is_refused_unread_under_a_memory_limit(tmp_path: Path) -> None:
    big = tmp_path / "zeros.xml"
    with big.open("wb") as file:
        file.truncate(1 << 30)
    result = triage(big, limit=True)
    assert result.returncode == 3
    assert one_line(result.stderr) == (
        f"gpuconsole: {big}: 1.0 GiB, larger than the 8.0 MiB a dump may be "
        "(nvidia-smi -q -x of 8 GPUs is ~220 KB)"
    )


def test_the_memory_limit_leaves_room_for_a_real_dump() -> None:
    """So that the test above fails for the read, not for the limit."""
    result = triage(FIXTURES / "h200-q-loaded.xml", limit=True)
    assert result.returncode in (0, 1, 2), result.stderr
    assert "1 GPUs, driver 580" in result.stdout


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/dev/zero", "it holds more than the 8.0 MiB a dump may be"),
        ("/dev/urandom", "it holds more than the 8.0 MiB a dump may be"),
        ("{tmp}/missing.xml", "No such file or directory"),
        ("{tmp}", "Is a directory"),
        ("{tmp}/utf16.xml", "not a text dump: a NUL byte at offset 3 (UTF-16, or binary)"),
        ("{tmp}/random.txt", "neither nvidia-smi -q -x XML nor -q text"),
    ],
)
def test_what_is_not_a_dump_is_one_line(tmp_path: Path, path: str, says: str) -> None:
    text = (FIXTURES / "h200-q.xml").read_text(encoding="utf-8")
    (tmp_path / "utf16.xml").write_text(text, encoding="utf-16")
    (tmp_path / "random.txt").write_bytes(bytes(range(1, 256)) * 64)
    where = path.format(tmp=tmp_path)
    result = triage(where)
    assert result.returncode == 3
    line = one_line(result.stderr)
    assert line.startswith(f"gpuconsole: {where}: {says}"), line


def test_a_dump_with_bytes_that_are_not_utf8_is_triaged(tmp_path: Path) -> None:
    text = (FIXTURES / "h200-q-loaded.txt").read_text(encoding="utf-8")
    dump = tmp_path / "latin1.txt"
    dump.write_bytes(text.replace("python3", "pyth\xe9n").encode("latin-1"))
    result = triage(dump)
    assert result.returncode in (0, 1, 2), result.stderr
    assert "1 GPUs, driver 580" in result.stdout


# --- the audit log: 0600 in 0700 directories -----------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def usual_umask() -> object:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_the_audit_log_is_created_0600_in_a_0700_state_dir(usual_umask: object) -> None:
    state = Path(os.environ["XDG_STATE_HOME"])
    assert not state.exists()
    audit.record("signal-process", host="gpu01", pid=42)
    log = paths.AUDIT_LOG.path()
    assert log == state / "gpuconsole" / "audit.jsonl"
    assert mode(log) == 0o600
    assert mode(log.parent) == 0o700
    assert mode(state) == 0o700  # created by the console, so 0700 as the XDG spec asks
    assert json.loads(log.read_text())["pid"] == 42


def test_an_older_wider_log_and_state_dir_are_narrowed(usual_umask: object) -> None:
    own = Path(os.environ["XDG_STATE_HOME"]) / "gpuconsole"
    own.mkdir(parents=True, mode=0o755)
    own.chmod(0o755)
    log = own / "audit.jsonl"
    log.write_text('{"action": "earlier"}\n')
    log.chmod(0o644)
    audit.record("repair-step", host="gpu01")
    assert (mode(own), mode(log)) == (0o700, 0o600)
    assert [json.loads(line)["action"] for line in log.read_text().splitlines()] == [
        "earlier",
        "repair-step",
    ]


def test_a_log_named_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, usual_umask: object
) -> None:
    fresh = tmp_path / "new" / "dir" / "audit.jsonl"
    monkeypatch.setenv(paths.AUDIT_LOG.variable, str(fresh))
    audit.record("repair-step", host="gpu01")
    assert (mode(fresh), mode(fresh.parent), mode(fresh.parent.parent)) == (0o600, 0o700, 0o700)
    shared = tmp_path / "team-audit.jsonl"
    shared.write_text("")
    shared.chmod(0o640)
    monkeypatch.setenv(paths.AUDIT_LOG.variable, str(shared))
    audit.record("repair-step", host="gpu01")
    assert mode(shared) == 0o640  # its owner chose it


# --- one-line refusals ---------------------------------------------------------------------------


def test_a_refusal_quoting_a_host_reaches_the_terminal_as_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refusal's line may quote what a host or a server said: it goes out through the same
    guard as the command's other output, escape sequences made visible."""
    from gpuconsole.cli.commands import exits, snapshot

    def refuse(args: object) -> int:
        raise exits.Refused("gpu01: \x1b]0;pwned\x07\x1b[2Jno reading", code=2)

    monkeypatch.setattr(snapshot, "run", refuse)
    assert main(["snapshot"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "\x1b" not in line and "\x07" not in line
    assert line.startswith("gpuconsole: gpu01: ") and line.endswith("no reading")


def test_repair_on_a_group_is_one_line_naming_its_hosts(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.toml"
    inventory.write_text('[groups.rack-a]\nhosts = ["gpu-a", "gpu-b"]\n')
    result = gpuconsole("repair", "rack-a", "--inventory", str(inventory), "--dry-run")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line == "gpuconsole: repair takes one host; rack-a is a group of 2 (gpu-a, gpu-b)"


OOM_MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total "
    "capacity of 139.81 GiB of which 2.30 GiB is free. Including non-PyTorch memory, this process "
    "has 137.49 GiB memory in use. Of the allocated memory 129.59 GiB is allocated by PyTorch, and "
    "7.40 GiB is reserved by PyTorch but unallocated.\n"
)


@pytest.mark.parametrize(
    "command",
    [
        ["oom", "{oom}"],
        ["oom", "{oom}", "--json"],
        ["triage", "--from", str(FIXTURES / "h200-q-loaded.txt")],
        ["snapshot", "--demo"],
    ],
)
def test_a_reader_that_has_gone_is_no_traceback(command: list[str], tmp_path: Path) -> None:
    """`gpuconsole … | head` when head has already exited: the pipe is closed before the first
    write, so every write meets EPIPE. One place handles it: exit 0, nothing on stderr."""
    message = tmp_path / "oom.log"
    message.write_text(OOM_MESSAGE)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = gpuconsole(*(word.format(oom=message) for word in command), stdout=write_end)
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
