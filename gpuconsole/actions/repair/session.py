"""One repair of one host, start to end: diagnose, plan, show, confirm, run, verify again."""

from __future__ import annotations

from dataclasses import dataclass

from gpuconsole.actions.repair.diagnosis import DIAGNOSIS_CHECKS, diagnose, probes
from gpuconsole.actions.repair.execute import Confirm, PlanRun, execute
from gpuconsole.actions.repair.model import Diagnosis, Plan, Walked
from gpuconsole.actions.repair.plans import PlanFacts, facts_from, plan_for
from gpuconsole.actions.session import HostShell, open_shell
from gpuconsole.actions.shell import LineSink
from gpuconsole.actions.verify.model import HostReport
from gpuconsole.actions.verify.runner import run_probes, verify_with
from gpuconsole.hosts.ssh import ConnectFailure, SshSettings
from gpuconsole.hosts.targets import Context, Target

ACTION = "repair-step"
"""What each command a repair runs is logged as."""


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What the repair found, planned and ran, and the verification after it (if it ran)."""

    host: str
    diagnosis: Diagnosis | None
    plans: tuple[Plan, ...] = ()
    runs: tuple[PlanRun, ...] = ()
    after: HostReport | None = None
    error: str | None = None

    @property
    def exit_code(self) -> int:
        """0 nothing wrong or all fixed; 1 causes found, nothing run; 2 a step failed, the
        host is still failing, or it could not be reached."""
        if self.error is not None:
            return 2
        if self.diagnosis is None or self.diagnosis.healthy:
            return 0
        if any(run.confirmed and not run.completed for run in self.runs):
            return 2
        if self.after is not None:
            return 0 if self.after.status.rank < 2 else 2
        return 1

    def as_dict(self) -> dict[str, object]:
        diagnosis = self.diagnosis
        return {
            "host": self.host,
            "error": self.error,
            "distro": None if diagnosis is None else diagnosis.distro.family.value,
            "walk": [] if diagnosis is None else [_walked_dict(w) for w in diagnosis.walk],
            "causes": [] if diagnosis is None else [c.id for c in diagnosis.causes],
            "plans": [_plan_dict(p) for p in self.plans],
            "runs": [run.as_dict() for run in self.runs],
            "after": None if self.after is None else self.after.as_dict(),
        }


def _walked_dict(walked: Walked) -> dict[str, object]:
    return {
        "cause": walked.cause_id,
        "question": walked.question,
        "found": walked.found,
        "evidence": list(walked.evidence),
    }


def _plan_dict(plan: Plan) -> dict[str, object]:
    return {
        "cause": plan.cause_id,
        "title": plan.title,
        "commands": [step.command for step in plan.steps],
        "reboot": plan.reboot,
        "outcome": plan.outcome,
        "notes": list(plan.notes),
    }


def plans_for(diagnosis: Diagnosis, facts: PlanFacts) -> tuple[Plan, ...]:
    """One plan per cause, in the walk's order. Where no driver is installed at all, loading
    one (the driver-not-loaded plan) has nothing to load: the install plan stands alone."""
    found = {cause.id for cause in diagnosis.causes}
    plans = []
    for cause in diagnosis.causes:
        if cause.id == "driver-not-loaded" and "no-driver-installed" in found:
            continue
        plan = plan_for(cause, diagnosis.distro, facts)
        if plan is not None:
            plans.append(plan)
    return tuple(plans)


async def repair_with(
    shell: HostShell,
    context: Context,
    *,
    confirm: Confirm | None,
    dry_run: bool,
    on_line: LineSink = lambda _line: None,
) -> RepairReport:
    evidence = await run_probes(shell, probes())
    diagnosis = diagnose(evidence, context)
    plans = plans_for(diagnosis, facts_from(evidence, diagnosis))
    runs: list[PlanRun] = []
    for plan in plans:
        run = await execute(shell, plan, confirm=confirm, dry_run=dry_run, on_line=on_line)
        runs.append(run)
        if run.confirmed and not run.completed:
            break  # the host is in the state the message says; later plans assumed this one
    after = None
    if any(run.completed for run in runs):
        after = await verify_with(shell, DIAGNOSIS_CHECKS, context)
    return RepairReport(context.host, diagnosis, plans, tuple(runs), after)


async def repair_target(
    target: Target,
    *,
    confirm: Confirm | None,
    dry_run: bool,
    on_line: LineSink = lambda _line: None,
    settings: SshSettings | None = None,
) -> RepairReport:
    """Repair this machine, or an inventory host over SSH."""
    try:
        async with open_shell(target, ACTION, settings) as shell:
            return await repair_with(
                shell, target.context, confirm=confirm, dry_run=dry_run, on_line=on_line
            )
    except ConnectFailure as failure:
        return RepairReport(target.name, None, error=failure.reason)
