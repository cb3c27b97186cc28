"""Running a recipe on a host (or several) and reading its progress as it streams.

The recipe's source is written to the host, then its launch command streams its JSON lines:
`step` events feed the live view, the `summary` is the result, an `error` event (or, when the
recipe could not even start, the last lines of its output) is the cause shown instead of a
stack trace.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuconsole.actions.launch.commands import LaunchSpec, install_command
from gpuconsole.actions.verify.shell import Shell
from gpuconsole.recipes import recipe_files

RUN_TIMEOUT_S = 1800.0
_TAIL = 15
# What a run that died before its first JSON line printed, and what that means.
_START_FAILURES = (
    ("No module named 'torch'", "no-torch", "torch is not installed for this host's python3"),
    ("python3: not found", "no-python", "the host has no python3"),
    ("python3: command not found", "no-python", "the host has no python3"),
    ("NCCL error", "nccl", "NCCL failed between the processes"),
    ("srun: command not found", "no-slurm", "this host is not a Slurm login node"),
    ("srun: not found", "no-slurm", "this host is not a Slurm login node"),
)

Event = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunResult:
    """A recipe run: its summary (None if it failed), or the failure's kind and message."""

    host: str
    spec: LaunchSpec
    command: str
    summary: Event | None
    error_kind: str | None = None
    error: str | None = None
    exit_code: int | None = None
    steps: tuple[Event, ...] = ()
    tail: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.summary is not None and self.error is None


def parse_event(line: str) -> Event | None:
    """A recipe's JSON event line, or None for any other output (warnings, compile logs)."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        event = json.loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None


def start_failure(lines: Sequence[str]) -> tuple[str, str]:
    """Why a run produced no summary, from what it printed: (kind, one-line message)."""
    text = "\n".join(lines)
    for needle, kind, meaning in _START_FAILURES:
        if needle in text:
            return kind, meaning
    last = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
    return "other", last[:200]


async def run_recipe(
    shell: Shell,
    host: str,
    spec: LaunchSpec,
    command: str,
    on_event: Callable[[Event], None] = lambda _event: None,
    on_line: Callable[[str], None] = lambda _line: None,
    timeout: float = RUN_TIMEOUT_S,
) -> RunResult:
    """Install the recipe on the host, run ``command`` there, follow its events."""
    installed = await shell.run(install_command(recipe_files(spec.recipe)), 30.0)
    if not installed.ok:
        message = (installed.stderr or installed.stdout).strip()[:200] or "no output"
        return RunResult(
            host, spec, command, None, "install", f"cannot write the recipe: {message}"
        )
    events: list[Event] = []

    def line(text: str) -> None:
        event = parse_event(text)
        if event is not None:
            events.append(event)
            on_event(event)
        else:
            on_line(text)

    output = await shell.stream(command, timeout, line)
    return _result(host, spec, command, output.exit_code, events, output.stdout or output.stderr)


def _result(
    host: str,
    spec: LaunchSpec,
    command: str,
    exit_code: int | None,
    events: Sequence[Event],
    text: str,
) -> RunResult:
    steps = tuple(e for e in events if e["event"] == "step")
    summary = next((e for e in reversed(events) if e["event"] == "summary"), None)
    error = next((e for e in reversed(events) if e["event"] == "error"), None)
    tail = tuple(text.splitlines()[-_TAIL:])
    if error is not None:
        kind, message = str(error.get("kind", "other")), _first_line(error.get("message"))
    elif summary is None:
        kind, message = start_failure(tail)
        if exit_code is None:
            kind, message = "timeout", "the run did not finish in time and was stopped"
    else:
        kind = message = None
    if summary is not None and exit_code not in (0, None) and error is None:
        kind, message = "exit", f"the run exited with status {exit_code} after its summary"
    return RunResult(host, spec, command, summary, kind, message, exit_code, steps, tail)


def _first_line(message: object, limit: int = 300) -> str:
    """A failure's first line, cut: compiler errors run to pages."""
    line = next((ln.strip() for ln in str(message or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


async def run_on_nodes(
    shells: Mapping[str, Shell],
    spec: LaunchSpec,
    commands: Mapping[str, str],
    on_event: Callable[[Event], None] = lambda _event: None,
    on_line: Callable[[str], None] = lambda _line: None,
) -> RunResult:
    """A multi-node run: every node's command at once; the first node's events are the run's
    (rank 0 prints them), the others' lines are shown under their host's name."""
    hosts = list(shells)
    head = hosts[0]

    def other(host: str) -> Callable[[str], None]:
        return lambda text: on_line(f"[{host}] {text}")

    results = await asyncio.gather(
        *(
            run_recipe(
                shells[host],
                host,
                spec,
                commands[host],
                on_event if host == head else (lambda _e: None),
                on_line if host == head else other(host),
            )
            for host in hosts
        )
    )
    first = results[0]
    failed = next((r for r in results if r.error is not None and r.summary is None), None)
    if first.summary is None and failed is not None and failed is not first:
        return RunResult(
            head, spec, first.command, None, failed.error_kind, f"{failed.host}: {failed.error}",
            first.exit_code, first.steps, first.tail,
        )  # fmt: skip
    return first
