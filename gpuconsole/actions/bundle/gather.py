"""What a bundle collects on the host itself, through its shell: ``nvidia-smi -q`` of each GPU,
the kernel log's NVRM and XID lines, and the verification checks that do not load the host.

Every command has a timeout (a GPU that fell off the bus makes nvidia-smi hang). What could not
be collected is said in one line each (``notes``), never raised: a bundle is written anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.shell import Shell
from gpuconsole.actions.verify.checks import CHECKS
from gpuconsole.actions.verify.model import Check, HostReport
from gpuconsole.actions.verify.runner import verify_with
from gpuconsole.hosts.targets import Context

SMI_TIMEOUT_S = 20.0
KERNEL_LOG_TIMEOUT_S = 20.0
SMI_AT_ONCE = 4
KERNEL_LOG_LINES = 5000
LOG_UNREADABLE = 77

KERNEL_LOG_COMMAND = (
    "if command -v journalctl >/dev/null 2>&1"
    ' && [ -n "$(journalctl -k -b -q --no-pager -n 1 2>/dev/null)" ]; then'
    ' echo "# source: journalctl -k -b";'
    " journalctl -k -b -q --no-pager -o short-iso"
    f" | grep -E 'NVRM|Xid' | tail -n {KERNEL_LOG_LINES};"
    " exit 0; fi; "
    "command -v dmesg >/dev/null 2>&1"
    ' || { echo "neither journalctl (with kernel messages) nor dmesg is available" >&2;'
    " exit 127; }; "
    "if ! dmesg >/dev/null 2>&1; then dmesg 2>&1 >/dev/null | head -n 1 >&2;"
    f" exit {LOG_UNREADABLE}; fi; "
    'echo "# source: dmesg"; '
    f"dmesg | grep -E 'NVRM|Xid' | tail -n {KERNEL_LOG_LINES}; exit 0"
)
"""This boot's NVRM and Xid lines from the journal, else from dmesg; exit 77 with dmesg's
complaint when this user may not read the kernel log."""


def smi_command(gpu: int | None) -> str:
    """``nvidia-smi -q`` of one GPU (or of all when ``gpu`` is None)."""
    which = "" if gpu is None else f" -i {gpu}"
    return f"command -v nvidia-smi >/dev/null 2>&1 || exit 127; nvidia-smi -q{which}"


def light_checks(checks: Sequence[Check] = CHECKS) -> tuple[Check, ...]:
    """The checks without a heavy probe (bandwidth and disk tests load the host; not during an
    incident)."""
    return tuple(c for c in checks if not any(p.heavy for p in c.probes))


@dataclass
class Gathered:
    """Files to put into the bundle (name → text), the verification, and what went wrong."""

    files: dict[str, str] = field(default_factory=dict)
    verification: HostReport | None = None
    notes: list[str] = field(default_factory=list)


async def gather(
    shell: Shell,
    context: Context,
    gpus: Sequence[int],
    *,
    checks: Sequence[Check] | None = None,
    smi_timeout: float = SMI_TIMEOUT_S,
    log_timeout: float = KERNEL_LOG_TIMEOUT_S,
) -> Gathered:
    """Run everything on the host; ``gpus`` are its GPU indices (none known: one ``-q`` of all)."""
    result = Gathered()
    limit = asyncio.Semaphore(SMI_AT_ONCE)

    async def smi(gpu: int | None) -> tuple[int | None, CommandOutput]:
        async with limit:
            return gpu, await shell.run(smi_command(gpu), smi_timeout)

    wanted: list[int | None] = list(gpus) or [None]
    outputs, log = await asyncio.gather(
        asyncio.gather(*(smi(g) for g in wanted)),
        shell.run(KERNEL_LOG_COMMAND, log_timeout),
    )
    for gpu, output in outputs:
        name = "nvidia-smi/all.txt" if gpu is None else f"nvidia-smi/gpu-{gpu}.txt"
        result.files[name] = output.stdout if output.stdout.strip() else ""
        problem = _problem(output, "nvidia-smi")
        if problem is not None:
            which = "all GPUs" if gpu is None else f"GPU {gpu}"
            result.notes.append(f"nvidia-smi -q of {which}: {problem}")
            if not result.files[name]:
                result.files[name] = f"not collected: {problem}\n"
    result.files["kernel-log.txt"] = log.stdout if log.ok else ""
    problem = _problem(log, "the kernel log")
    if problem is not None:
        result.notes.append(f"kernel log: {problem}")
        result.files["kernel-log.txt"] = f"not collected: {problem}\n"
    selected = light_checks() if checks is None else tuple(checks)
    result.verification = await verify_with(shell, selected, context)
    return result


def _problem(output: CommandOutput, what: str) -> str | None:
    """Why an output is not what was asked for, in one line; None when it is."""
    if output.timed_out:
        detail = output.stderr or "no answer"
        if what == "nvidia-smi":
            return f"{detail} (a GPU that fell off the bus makes nvidia-smi hang)"
        return detail
    if output.missing:
        return output.stderr.strip() or f"{what} is not installed on the host"
    if output.exit_code == LOG_UNREADABLE:
        return (
            f"not readable by this user ({output.stderr.strip() or 'permission denied'}); "
            "run as root or add the user to the adm group"
        )
    if not output.ok:
        first = (output.stderr or output.stdout).strip().splitlines()
        return f"exit code {output.exit_code}" + (f": {first[0]}" if first else "")
    return None
