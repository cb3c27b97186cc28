"""Carrying out a repair plan, safely.

Every command is shown exactly as it will run before anything runs; a dry run stops there;
nothing runs without a yes. Steps that need root go through `sudo -n` when the user is not root,
so a password prompt can never hang a step: sudo says it needs one and the plan stops, with the
reason. Each step's output is streamed line by line, each step has a timeout, the first failed
step stops the plan (the later ones assumed it worked), and every command run goes to the audit
log with its exit code.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gpuconsole.actions.repair.model import Plan, Step
from gpuconsole.actions.session import HostShell
from gpuconsole.actions.shell import LineSink, Shell

Confirm = Callable[[Plan, Sequence[str]], Awaitable[bool]]
_SUDO_PASSWORD = ("a password is required", "a terminal is required")
_TAIL_LINES = 20


@dataclass(frozen=True, slots=True)
class StepRun:
    """One step as it ran: the command line exactly, its exit code (None: timed out)."""

    step: Step
    command: str
    exit_code: int | None
    tail: tuple[str, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True, slots=True)
class PlanRun:
    """What happened to a plan on a host, and in what state it left the host."""

    host: str
    plan: Plan
    commands: tuple[str, ...]
    """Every command of the plan, as it runs (or would run) on this host."""
    runs: tuple[StepRun, ...] = ()
    dry_run: bool = False
    confirmed: bool = False
    message: str = ""

    @property
    def completed(self) -> bool:
        return (
            self.confirmed
            and len(self.runs) == len(self.plan.steps)
            and all(r.ok for r in self.runs)
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "cause": self.plan.cause_id,
            "plan": self.plan.title,
            "commands": list(self.commands),
            "dry_run": self.dry_run,
            "confirmed": self.confirmed,
            "completed": self.completed,
            "reboot": self.plan.reboot,
            "message": self.message,
            "steps": [
                {
                    "title": r.step.title,
                    "command": r.command,
                    "exit_code": r.exit_code,
                    "seconds": round(r.seconds, 2),
                    "output_tail": list(r.tail),
                }
                for r in self.runs
            ],
        }


def command_line(step: Step, as_root: bool) -> str:
    """The line that runs ``step``: as it is for root or a step that needs no root, else
    through `sudo -n sh -c` (the step may be a pipeline or redirect, which must run as root
    as a whole)."""
    if as_root or not step.root:
        return step.command
    return f"sudo -n sh -c {shlex.quote(step.command)}"


async def is_root(shell: Shell) -> bool:
    output = await shell.run("id -u", 10.0)
    return output.ok and output.stdout.strip() == "0"


async def execute(
    shell: HostShell,
    plan: Plan,
    *,
    confirm: Confirm | None,
    dry_run: bool = False,
    on_line: LineSink = lambda _line: None,
) -> PlanRun:
    """Show, confirm, then run ``plan``'s steps in order, stopping at the first that fails."""
    host = shell.host
    as_root = await is_root(shell)
    commands = tuple(command_line(step, as_root) for step in plan.steps)
    if not plan.steps:
        return PlanRun(host, plan, commands, message="nothing to run: " + _notes(plan))
    if dry_run:
        return PlanRun(host, plan, commands, dry_run=True, message="dry run: nothing was run")
    if confirm is None or not await confirm(plan, commands):
        return PlanRun(host, plan, commands, message="not confirmed: nothing was run")
    runs: list[StepRun] = []
    for step, command in zip(plan.steps, commands, strict=True):
        on_line(f"$ {command}")
        began = time.monotonic()
        output = await shell.change(command, step.timeout, on_line=on_line, cause=plan.cause_id)
        seconds = time.monotonic() - began
        lines = output.stdout.splitlines() or output.stderr.splitlines()
        run = StepRun(step, command, output.exit_code, tuple(lines[-_TAIL_LINES:]), seconds)
        runs.append(run)
        if not run.ok:
            message = _stopped(host, plan, runs, output.stdout + output.stderr)
            return PlanRun(host, plan, commands, tuple(runs), confirmed=True, message=message)
    done = f"{plan.title}: all {len(runs)} step(s) done on {host}. {plan.outcome}"
    if plan.reboot:
        done += f" Reboot {host} for it to take effect."
    return PlanRun(host, plan, commands, tuple(runs), confirmed=True, message=done)


def _stopped(host: str, plan: Plan, runs: Sequence[StepRun], text: str) -> str:
    """Which step failed, why, what already ran and what did not: the state the host is in."""
    failed = runs[-1]
    index = len(runs)
    if any(words in text for words in _SUDO_PASSWORD):
        why = (
            f"sudo needs a password on {host}: run the repair as root, or allow these commands "
            "without a password (sudoers NOPASSWD)"
        )
    elif failed.exit_code is None:
        why = f"no answer within {failed.step.timeout:g} s (it may still be running on {host})"
    else:
        why = f"exit code {failed.exit_code}"
    ran = ", ".join(f"{i}. {r.step.title}" for i, r in enumerate(runs[:-1], 1)) or "none"
    left = len(plan.steps) - index
    return (
        f"stopped at step {index} of {len(plan.steps)} ({failed.step.title}): {why}. "
        f"Done before it: {ran}. Not run: {left} step(s)."
    )


def _notes(plan: Plan) -> str:
    return " ".join(plan.notes) if plan.notes else "this plan has no steps"
