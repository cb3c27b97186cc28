"""A repair as text: the walk over the causes, the plans exactly as they will run, the result."""

from __future__ import annotations

from gpuconsole.actions.repair.execute import PlanRun
from gpuconsole.actions.repair.model import Diagnosis, Plan
from gpuconsole.actions.repair.session import RepairReport

_ANSWERS = {True: "FOUND", False: "clear", None: "unknown"}


def diagnosis_text(diagnosis: Diagnosis) -> str:
    distro = diagnosis.distro
    lines = [
        f"{diagnosis.host}: diagnosis ({distro.id or distro.family.value} "
        f"{distro.version_id or ''}, kernel {distro.kernel or 'unknown'})".replace(" ,", ",")
    ]
    width = max((len(w.cause_id) for w in diagnosis.walk), default=0)
    for walked in diagnosis.walk:
        lines.append(
            f"  {_ANSWERS[walked.found]:<7}  {walked.cause_id:<{width}}  {walked.question}"
        )
        if walked.found:
            lines.extend(f"           | {line}" for line in walked.evidence)
    if diagnosis.healthy:
        lines.append("no cause found: the driver works on this host")
    else:
        for cause in diagnosis.causes:
            lines.append(f"cause: {cause.title}. {cause.explanation}")
    return "\n".join(lines)


def plan_text(number: int, plan: Plan, commands: tuple[str, ...]) -> str:
    reboot = " (needs a reboot)" if plan.reboot else ""
    lines = [f"plan {number}: {plan.title}{reboot}"]
    lines.extend(f"  $ {command}" for command in commands)
    if not commands:
        lines.append("  (no command can be run for you)")
    lines.append(f"  afterwards: {plan.outcome}")
    lines.extend(f"  note: {note}" for note in plan.notes)
    return "\n".join(lines)


def run_text(run: PlanRun) -> str:
    return f"  -> {run.message}"


def report_text(report: RepairReport) -> str:
    """The whole report, for --json's text twin and for a run without a terminal."""
    if report.error is not None:
        return f"{report.host}: not reached: {report.error}"
    assert report.diagnosis is not None
    blocks = [diagnosis_text(report.diagnosis)]
    runs = {run.plan.cause_id: run for run in report.runs}
    for number, plan in enumerate(report.plans, 1):
        run = runs.get(plan.cause_id)
        commands = run.commands if run else tuple(step.command for step in plan.steps)
        blocks.append(plan_text(number, plan, commands) + ("\n" + run_text(run) if run else ""))
    if report.after is not None:
        status = report.after.status.value
        failing = [c.id for c in report.after.checks if c.status.rank == 2]
        blocks.append(
            f"verified again: {status}"
            + (f" (still failing: {', '.join(failing)})" if failing else "")
        )
    return "\n\n".join(blocks)
