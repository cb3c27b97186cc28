"""Take a node out of its scheduler's service, and back: Slurm's drain and resume, or
Kubernetes' cordon and uncordon, chosen by what the host runs.

What runs is planned first (`plan_service`: which scheduler, which node, the exact command) so
that it can be shown and confirmed; `apply_service` runs it through the action's shell, which
logs it (`HostShell.change`), then asks the scheduler for the node's state, so that the answer
is the scheduler's, not ours.

The host's Slurm node is the one whose NodeName, NodeHostName or NodeAddr is the host's short
name (`scontrol show node`), as slurmd names itself: the agent's rule
(`gpuconsole.telemetry.agent.slurm_node`), by which readings name the node; ``node`` overrides
it. Kubernetes' node is
the host's name as ``kubectl get node`` knows it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

from gpuconsole.actions.session import HostShell
from gpuconsole.core.untrusted import visible
from gpuconsole.telemetry.agent import slurm_node

DRAIN, RESUME = "drain", "resume"
Change = Literal["drain", "resume"]
SLURM, KUBERNETES = "slurm", "kubernetes"
MAX_REASON = 200
"""Longest reason kept: Slurm shows it in ``sinfo -R``, one line of a terminal."""
_TIMEOUT_S = 20.0
_PROBE = (
    "printf 'host %s\\n' \"$(hostname -s 2>/dev/null || hostname)\"; "
    "command -v scontrol >/dev/null 2>&1 && echo has scontrol; "
    "command -v kubectl >/dev/null 2>&1 && echo has kubectl; true"
)
_SINFO_FLAGS = {
    "*": "not responding",
    "~": "powered off",
    "#": "powering up",
    "%": "powering down",
    "!": "to be powered down",
    "$": "in a maintenance reservation",
    "@": "to be rebooted",
    "^": "rebooting",
    "-": "planned for a job",
}
"""What the mark after a state in sinfo's ``%T`` means (sinfo(1), NODE STATE CODES)."""
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


class ServiceError(Exception):
    """Why a node cannot be taken out or brought back; one line naming the host."""


@dataclass(frozen=True, slots=True)
class ServicePlan:
    """What `apply_service` will run on the host, and how it then reads the node's state."""

    host: str
    change: Change
    scheduler: str
    node: str
    command: str
    state_command: str
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ServiceResult:
    """What happened: whether the command succeeded, and the node's state as the scheduler
    then says it ("drained", "draining", "idle"; "SchedulingDisabled"...)."""

    plan: ServicePlan
    ok: bool
    state: str
    message: str


def checked_reason(reason: str) -> str:
    """``reason`` as Slurm will keep it; ServiceError for an empty one, one with control
    characters, or one longer than `MAX_REASON`."""
    text = reason.strip()
    if not text:
        raise ServiceError("--reason: say why the node is taken out (sinfo -R shows it)")
    if any(not ch.isprintable() for ch in text):
        raise ServiceError("--reason: one line of printable text, without control characters")
    if len(text) > MAX_REASON:
        raise ServiceError(f"--reason: {len(text)} characters, more than {MAX_REASON}")
    return text


async def plan_service(
    shell: HostShell, change: Change, reason: str | None = None, node: str | None = None
) -> ServicePlan:
    """Which scheduler the host runs and what ``change`` means there; runs nothing that
    changes the host. ServiceError when it runs neither, or the node is not found."""
    if change == DRAIN:
        reason = checked_reason(reason or "")
    if node is not None and not _NODE_NAME.fullmatch(node):
        raise ServiceError(f"--node {node!r}: not a node name")
    probe = await shell.run(_PROBE, _TIMEOUT_S)
    if not probe.ok:
        raise ServiceError(f"{shell.host}: cannot ask what it runs: {_said(probe.stderr)}")
    lines = probe.stdout.splitlines()
    short = next((line[5:].strip() for line in lines if line.startswith("host ")), shell.host)
    if "has scontrol" in lines:
        found = node or await _slurm_node(shell, short)
        if found is not None:
            return _slurm_plan(shell.host, change, found, reason)
    if "has kubectl" in lines:
        return _kubernetes_plan(shell.host, change, node or short, reason)
    if "has scontrol" in lines:
        raise ServiceError(
            f"{shell.host}: Slurm knows no node named {short} (NodeName, NodeHostName or "
            "NodeAddr); name it with --node"
        )
    raise ServiceError(f"{shell.host}: runs neither Slurm (scontrol) nor Kubernetes (kubectl)")


async def _slurm_node(shell: HostShell, short: str) -> str | None:
    nodes = await shell.run("scontrol -o show node", _TIMEOUT_S)
    if not nodes.ok:
        raise ServiceError(f"{shell.host}: scontrol show node failed: {_said(nodes.stderr)}")
    found = slurm_node(nodes.stdout, short)
    name = None if found is None else str(found["name"])
    return name if name is not None and _NODE_NAME.fullmatch(name) else None


def _slurm_plan(host: str, change: Change, node: str, reason: str | None) -> ServicePlan:
    if change == DRAIN:
        command = f"scontrol update nodename={node} state=drain reason={shlex.quote(reason or '')}"
    else:
        command = f"scontrol update nodename={node} state=resume"
    state = f"sinfo -h -n {node} -o '%T|%E'"
    return ServicePlan(host, change, SLURM, node, command, state, reason)


def _kubernetes_plan(host: str, change: Change, node: str, reason: str | None) -> ServicePlan:
    if not _NODE_NAME.fullmatch(node):
        raise ServiceError(f"{host}: {node!r} is not a Kubernetes node name")
    verb = "cordon" if change == DRAIN else "uncordon"
    state = f"kubectl get node {node} -o jsonpath='{{.spec.unschedulable}}'"
    return ServicePlan(host, change, KUBERNETES, node, f"kubectl {verb} {node}", state, reason)


async def apply_service(shell: HostShell, plan: ServicePlan) -> ServiceResult:
    """Run the plan's command (logged, with the reason), then read the node's state back."""
    done = await shell.change(
        plan.command, _TIMEOUT_S, scheduler=plan.scheduler, node=plan.node, reason=plan.reason
    )
    after = await shell.run(plan.state_command, _TIMEOUT_S)
    state = _state(plan, after.stdout) if after.ok else f"unknown ({_said(after.stderr)})"
    if not done.ok:
        said = _said(done.stderr or done.stdout) if done.exit_code is not None else "timed out"
        return ServiceResult(plan, False, state, f"{plan.command}: {said}")
    return ServiceResult(plan, True, state, f"{plan.node} is now {state}")


def _state(plan: ServicePlan, stdout: str) -> str:
    """sinfo's ``state|reason``, or Kubernetes' unschedulable flag, as one phrase, safe to
    print (the reason is whatever an admin of the cluster typed)."""
    text = visible(stdout.strip(), MAX_REASON + 100)
    if plan.scheduler == KUBERNETES:
        return "cordoned (unschedulable)" if text == "true" else "schedulable"
    state, _, reason = text.partition("|")
    flag = _SINFO_FLAGS.get(state[-1:]) if state else None
    if flag is not None:
        state = f"{state[:-1]} ({flag})"
    if reason and reason != "none":
        return f"{state}, reason: {reason}"
    return state or "unknown"


def _said(text: str) -> str:
    """The last line a command printed, clipped and safe to print, or a word for nothing."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return visible(lines[-1], 200) if lines else "no output"
