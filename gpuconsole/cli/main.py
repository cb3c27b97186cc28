"""The `gpuconsole` command: the console itself, and subcommands for scripts and tickets.

This module only builds the parser from the command modules (`gpuconsole.cli.commands`) and runs
the command asked for; each command's options and work live in its module.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from gpuconsole import __version__
from gpuconsole.cli import global_options
from gpuconsole.cli.commands import (
    Command,
    bench,
    bundle,
    console,
    export,
    exporter,
    hosts,
    launch,
    memory,
    oom,
    record,
    repair,
    replay,
    service,
    snapshot,
    triage,
    verify,
)
from gpuconsole.cli.commands.exits import Refused, fail

DESCRIPTION = """\
A terminal operations console for GPU servers: every GPU of every host at a glance
(utilization, memory, thermals, power, throttling, errors, processes, topology).

Keys: arrows move, Enter opens a host, Space shows a host's GPUs, t shows the topology,
s sorts, / filters, Esc goes back, ? lists every key, Ctrl+P opens the command palette,
q quits.
"""

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
(GPU count), 2 a host is not live; a bad inventory exits 2 with one line naming file and line,
and so does one of more hosts than one check connects to (1,024).
Every command exits 74 with one line when its standard output or error cannot be written (a full
disk, a closed descriptor); what it did (a bundle written, a node drained) stands. A reader that
has gone (`| head`) is no error: exit 0, nothing said.

The inventory is --hosts, else --inventory FILE, else $GPUCONSOLE_INVENTORY, else
~/.config/gpuconsole/hosts.toml where it exists. SSH decides as `ssh -o BatchMode=yes HOST`
does, with the settings `ssh -G HOST` prints ($GPUCONSOLE_SSH_CONFIG is given as `ssh -F`):
an unknown host key is refused unless StrictHostKeyChecking is accept-new, a changed or
revoked one is refused loudly.
"""

COMMANDS: tuple[Command, ...] = (
    snapshot,
    triage,
    hosts,
    verify,
    repair,
    service,
    launch,
    memory,
    oom,
    bench,
    exporter,
    export,
    record,
    replay,
    bundle,
)
"""The command modules, in the order `--help` lists their commands."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuconsole",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuconsole {__version__}")
    console.add_options(parser)
    parser.set_defaults(run=console.run)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add(commands)
    return parser


EXIT_OUTPUT = 74
"""Standard output or error could not be written: sysexits.h's EX_IOERR, a code no command
gives for a reason of its own."""


_STDOUT, _STDERR = "standard output", "standard error"


class OutputLost(Exception):
    """Standard output or error cannot be written; raised where it is written (`_Checked`) and
    said once, by `main`. Not an OSError, so that no command takes it for an error of its own
    files (a bundle's, a recording's) and reports it as one."""

    def __init__(self, stream: str, error: OSError) -> None:
        super().__init__(f"cannot write {stream}: {error.strerror or error}")
        self.stream = stream
        self.errno = error.errno


class _Checked:
    """A standard stream whose write errors are `OutputLost`; a closed one (the shell's `>&-`,
    where Python sets the stream to None) fails its first write as a closed descriptor does."""

    def __init__(self, stream: TextIO | None, name: str, fd: int) -> None:
        self._stream = stream if stream is not None else _held(fd)
        self._closed = stream is None
        self._name = name

    def write(self, text: str) -> int:
        try:
            if self._closed:
                raise OSError(errno.EBADF, "it is closed")
            return self._stream.write(text)
        except OSError as error:
            raise OutputLost(self._name, error) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as error:
            raise OutputLost(self._name, error) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _hold_closed_descriptors() -> None:
    """Hold each standard descriptor the shell closed (`>&-`) with /dev/null, so that no file
    the command opens takes its number, and no child it starts writes into that file."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, os.O_RDWR)
            if held != fd:
                os.dup2(held, fd)
                os.close(held)


def _held(fd: int) -> TextIO:
    """A stream on a standard descriptor that `_hold_closed_descriptors` holds."""
    return open(fd, "w", closefd=False)


def _discard(stream: TextIO | None) -> None:
    """What is still buffered for ``stream`` goes nowhere, so that the interpreter's last
    flush cannot fail again and print an "Exception ignored" of its own."""
    try:
        fd = stream.fileno() if stream is not None else -1
    except (OSError, ValueError):  # not a descriptor of this process (a test's capture)
        return
    if fd >= 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; an error writing standard output or error is said here, once."""
    _hold_closed_descriptors()
    streams = sys.stdout, sys.stderr
    sys.stdout = _Checked(sys.stdout, _STDOUT, 1)  # type: ignore[assignment]
    # a closed stderr (`2>&-`) is news nobody wants: it goes nowhere and the command goes on
    sys.stderr = _Checked(sys.stderr or _held(2), _STDERR, 2)  # type: ignore[assignment]
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # here, where an error is said, not at the interpreter's exit
    except OutputLost as lost:
        stdout, stderr = streams
        _discard(stdout if lost.stream == _STDOUT else stderr)
        if lost.errno == errno.EPIPE:  # `… | head`: the reader has seen enough, no error
            return 0
        if lost.stream == _STDOUT and stderr is not None:
            with contextlib.suppress(OSError):
                print(f"gpuconsole: {lost}; the output is incomplete", file=stderr)
        return EXIT_OUTPUT
    finally:
        sys.stdout, sys.stderr = streams


def _run(argv: Sequence[str] | None) -> int:
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
    from gpuconsole.ui.terminal.plain import guarded_output

    try:
        with guarded_output():
            try:
                return args.run(args)
            except Refused as refused:  # its line may quote a host: it goes out guarded too
                return fail(str(refused), refused.code)
    except KeyboardInterrupt:  # Ctrl+C: each command has cleaned up on its way out
        print("gpuconsole: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
