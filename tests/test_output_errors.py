"""Standard output that cannot be written is one line and its own exit code, for every command:
`gpuconsole … > /dev/full` (a full disk) and `gpuconsole … >&-` (closed) say so on stderr, exit
74, and print no traceback, whether the write fails mid-command or at the last flush.

The commands are the parser's: a new subcommand fails `test_every_command_is_run_here` until it
is given a run below (or a reason why it writes nothing to standard output).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from standin import write_standin_smi

from gpuconsole.cli import global_options
from gpuconsole.cli.main import EXIT_OUTPUT, build_parser

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total "
    "capacity of 139.81 GiB of which 2.30 GiB is free. Including non-PyTorch memory, this process "
    "has 137.49 GiB memory in use. Of the allocated memory 129.59 GiB is allocated by PyTorch, and "
    "7.40 GiB is reserved by PyTorch but unallocated.\n"
)
REFUSED = "127.0.0.1:1"
"""An SSH host that answers at once: nothing listens on port 1."""

RUNS: dict[str, tuple[str, ...]] = {
    "snapshot": ("snapshot", "--demo"),
    "triage": ("triage", "--from", str(FIXTURES / "h200-q-loaded.xml")),
    "hosts check": ("hosts", "check", "--hosts", REFUSED),
    "verify": ("verify", REFUSED, "--hosts", REFUSED),
    "repair": ("repair", REFUSED, "--hosts", REFUSED, "--dry-run"),
    "drain": ("drain", "localhost", "--reason", "fan", "--node", "n1", "--yes"),
    "resume": ("resume", "localhost", "--node", "n1", "--yes"),
    "launch": ("launch", "resnet50", "--gpus", "1"),
    "memory": ("memory", "resnet50"),
    "oom": ("oom", "{oom}"),
    "bench history": ("bench", "history"),
    "rules export": ("rules", "export"),
    "grafana export": ("grafana", "export"),
    "replay": ("replay", "{recording}", "--list"),
    "bundle": ("bundle", "--demo", "h100-01", "-o", "{bundles}"),
}
"""A run of each command that writes to standard output, on stand-ins only ({bin})."""
QUIET = {
    "": "the console is a full-screen UI on the terminal, not a stream",
    "exporter": "serves /metrics over HTTP; its news goes to stderr",
    "record": "writes the recording; its news goes to stderr",
}
"""The commands that write nothing to standard output, and why."""

STANDINS = {
    "python3": '#!/bin/sh\necho "ModuleNotFoundError: No module named torch" >&2\nexit 1\n',
    "scontrol": "#!/bin/sh\nexit 0\n",
    "sinfo": '#!/bin/sh\necho "drained|fan"\n',
}
"""A recipe's interpreter that fails at once (launch and memory print their plan and their first
trial first), and a Slurm that does what it is told (drain and resume print the command)."""


def test_every_command_is_run_here() -> None:
    commands = set(global_options.leaf_commands(build_parser()))
    assert set(RUNS) | set(QUIET) == commands
    assert not set(RUNS) & set(QUIET)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The stand-ins, an OOM message, a recording and a bundle folder, in a home of their own."""
    root = tmp_path_factory.mktemp("world")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    write_standin_smi(bin_dir, gpus=1)
    for name, script in STANDINS.items():
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    (root / "oom.log").write_text(OOM)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    env.update({"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(root / "home")})
    for variable in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[variable] = str(root / variable.lower())
    recording = root / "rec.sqlite"
    done = gpuconsole("record", "--demo", "--duration", "1s", "--record", str(recording), env=env)
    assert done.returncode == 0, done.stderr
    return {
        "oom": str(root / "oom.log"),
        "recording": str(recording),
        "bundles": str(root / "bundles"),
        "env": env,  # type: ignore[dict-item]
    }


def run_in(
    command: str, world: dict[str, str], stdout: int, preexec: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    """``command``'s run (`RUNS`) in ``world``, its standard output ``stdout``."""
    words = [word.format(**world) for word in RUNS[command]]
    env = world["env"]
    return gpuconsole(*words, env=env, stdout=stdout, preexec_fn=preexec)  # type: ignore[arg-type]


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("command", sorted(RUNS))
def test_a_full_disk_is_one_line(command: str, world: dict[str, str]) -> None:
    with open("/dev/full", "w") as full:
        done = run_in(command, world, full.fileno())
    assert done.returncode == EXIT_OUTPUT, done.stderr
    assert one_line(done.stderr) == (
        "gpuconsole: cannot write standard output: No space left on device; "
        "the output is incomplete"
    )


def close_stdout() -> None:
    os.close(1)


@pytest.mark.parametrize("command", sorted(RUNS))
def test_a_closed_stdout_is_one_line(command: str, world: dict[str, str]) -> None:
    done = run_in(command, world, subprocess.DEVNULL, preexec=close_stdout)
    assert done.returncode == EXIT_OUTPUT, done.stderr
    assert one_line(done.stderr) == (
        "gpuconsole: cannot write standard output: it is closed; the output is incomplete"
    )


def test_a_reader_that_has_gone_is_still_no_error(world: dict[str, str]) -> None:
    """`… | head`, which the same place handles: exit 0 and nothing said."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = run_in("grafana export", world, write_end)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")


def close_stderr() -> None:
    os.close(2)


def test_a_closed_stderr_is_news_nobody_wants(world: dict[str, str], tmp_path: Path) -> None:
    """`gpuconsole record … 2>&-`: the recorder's news goes nowhere, and it records."""
    recording = tmp_path / "rec.sqlite"
    done = gpuconsole(
        *("record", "--demo", "--duration", "1s", "--record", str(recording)),
        env=world["env"],  # type: ignore[arg-type]
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=close_stderr,
    )
    assert done.returncode == 0
    assert recording.stat().st_size > 0
