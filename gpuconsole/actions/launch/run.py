"""Running a recipe on a host (or several) and reading its progress as it streams.

The recipe's source is written to the host, then its launch command streams its JSON lines:
`step` events feed the live view, the `summary` is the result, an `error` event (or, when the
recipe could not even start, the last lines of its output) is the cause shown instead of a
stack trace. Both the writing and the run go to the audit log, under the shell's action.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuconsole.actions.launch.commands import RECIPE_DIR, LaunchSpec, install_command
from gpuconsole.actions.session import HostShell
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


async def install_recipe(shell: HostShell, spec: LaunchSpec) -> str | None:
    """Write the recipe's files to the host; None when written, else why not (one line)."""
    files = recipe_files(spec.recipe)
    installed = await shell.change(
        install_command(files),
        30.0,
        logged=f"write {', '.join(files)} to {RECIPE_DIR}",
        step="install",
        recipe=spec.recipe,
    )
    if installed.ok:
        return None
    message = (installed.stderr or installed.stdout).strip()[:200] or "no output"
    return f"cannot write the recipe: {message}"


async def run_recipe(
    shell: HostShell,
    spec: LaunchSpec,
    command: str,
    on_event: Callable[[Event], None] = lambda _event: None,
    on_line: Callable[[str], None] = lambda _line: None,
    timeout: float = RUN_TIMEOUT_S,
) -> RunResult:
    """Install the recipe on the host, run ``command`` there, follow its events."""
    failure = await install_recipe(shell, spec)
    if failure is not None:
        return RunResult(shell.host, spec, command, None, "install", failure)
    return await follow_recipe(shell, spec, command, on_event, on_line, timeout)


async def follow_recipe(
    shell: HostShell,
    spec: LaunchSpec,
    command: str,
    on_event: Callable[[Event], None],
    on_line: Callable[[str], None],
    timeout: float = RUN_TIMEOUT_S,
) -> RunResult:
    """Run ``command`` (the recipe already installed) and follow its events."""
    events: list[Event] = []

    def line(text: str) -> None:
        event = parse_event(text)
        if event is not None:
            events.append(event)
            on_event(event)
        else:
            on_line(text)

    output = await shell.change(command, timeout, on_line=line, step="run", recipe=spec.recipe)
    return _result(
        shell.host, spec, command, output.exit_code, events, output.stdout or output.stderr
    )


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
    shells: Mapping[str, HostShell],
    spec: LaunchSpec,
    commands: Mapping[str, str],
    on_event: Callable[[Event], None] = lambda _event: None,
    on_line: Callable[[str], None] = lambda _line: None,
) -> RunResult:
    """A multi-node run under the first node's name. The recipe is written to every node before
    any starts (nodes may share a home). Rank 0 prints the steps and the summary, and the
    rendezvous puts it on any node, so every node's events count; other lines are shown under
    their host's name unless they come from the first node. When a node fails, the others are
    stopped: they would wait for it until the rendezvous times out."""
    hosts = list(shells)
    head = hosts[0]
    written = await asyncio.gather(*(install_recipe(shells[host], spec) for host in hosts))
    for host, failure in zip(hosts, written, strict=True):
        if failure is not None:
            return RunResult(head, spec, commands[head], None, "install", f"{host}: {failure}")

    def lines_of(host: str) -> Callable[[str], None]:
        return on_line if host == head else (lambda text: on_line(f"[{host}] {text}"))

    pending = {
        asyncio.ensure_future(follow_recipe(shells[h], spec, commands[h], on_event, lines_of(h)))
        for h in hosts
    }
    finished: list[RunResult] = []
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            finished.extend(task.result() for task in done)
            if any(result.exit_code != 0 for result in finished):
                await _stop(pending)
                pending = set()
    except asyncio.CancelledError:
        await _stop(pending)
        raise
    return _merged(head, spec, commands[head], finished)


async def _stop(tasks: set[asyncio.Future[RunResult]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _merged(head: str, spec: LaunchSpec, command: str, finished: Sequence[RunResult]) -> RunResult:
    """One result of the nodes' (in the order they finished): the summary and steps of the node
    that had them, the cause of the first node that failed."""
    source = next((r for r in finished if r.summary is not None), None)
    failed = next((r for r in finished if r.exit_code != 0), None)
    summary = source.summary if source else None
    steps = source.steps if source else ()
    if failed is None and source is not None:
        return replace(source, host=head, command=command)
    if failed is None:  # every node ended well, and none printed a summary
        last = finished[-1]
        return RunResult(
            head, spec, command, None, "other", "no node printed a summary", 0, steps, last.tail
        )
    kind, message = failed.error_kind or "exit", failed.error or "the node failed"
    return RunResult(
        head,
        spec,
        command,
        summary,
        kind,
        f"{failed.host}: {message}",
        failed.exit_code,
        steps,
        failed.tail,
    )
