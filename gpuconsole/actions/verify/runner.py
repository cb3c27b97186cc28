"""Run checks on hosts: every distinct probe once per host, light probes a few at a time, heavy
ones (bandwidth, disk) alone afterwards; hosts concurrently, then each host's figures against
its peers' (`peers`). One check's failure, or a judge's bug, never hides the other checks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.session import open_shell
from gpuconsole.actions.shell import Shell
from gpuconsole.actions.verify import peers
from gpuconsole.actions.verify.model import Check, CheckResult, HostReport, Probe, Status
from gpuconsole.hosts.ssh import ConnectFailure, SshSettings
from gpuconsole.hosts.targets import Context, Target

LIGHT_PROBES_AT_ONCE = 4


def judge_all(
    checks: Sequence[Check], evidence: dict[str, CommandOutput], context: Context
) -> tuple[CheckResult, ...]:
    """Each check's verdict on the outputs; a judge that raises gives a failed result, not a
    crash (the rest still count)."""
    results = []
    for check in checks:
        commands = tuple(probe.command for probe in check.probes)
        try:
            verdict = check.judge(evidence, context)
        except Exception as error:  # a judge's bug must not hide the other checks
            results.append(
                CheckResult(
                    check.id,
                    check.title,
                    Status.FAIL,
                    f"the check itself failed: {type(error).__name__}: {error}",
                    commands,
                )
            )
            continue
        results.append(
            CheckResult(
                check.id,
                check.title,
                verdict.status,
                verdict.summary,
                commands,
                verdict.evidence,
                verdict.remediation,
                verdict.figures,
            )
        )
    return tuple(results)


def distinct_probes(checks: Sequence[Check]) -> list[Probe]:
    """The probes the checks need, each once, in first-use order."""
    probes: dict[str, Probe] = {}
    for check in checks:
        for probe in check.probes:
            probes.setdefault(probe.name, probe)
    return list(probes.values())


async def run_probes(shell: Shell, probes: Sequence[Probe]) -> dict[str, CommandOutput]:
    limit = asyncio.Semaphore(LIGHT_PROBES_AT_ONCE)

    async def light(probe: Probe) -> tuple[str, CommandOutput]:
        async with limit:
            return probe.name, await shell.run(probe.command, probe.timeout)

    outputs = dict(await asyncio.gather(*(light(p) for p in probes if not p.heavy)))
    for probe in (p for p in probes if p.heavy):
        outputs[probe.name] = await shell.run(probe.command, probe.timeout)
    return outputs


async def verify_with(shell: Shell, checks: Sequence[Check], context: Context) -> HostReport:
    began = time.monotonic()
    evidence = await run_probes(shell, distinct_probes(checks))
    results = judge_all(checks, evidence, context)
    return HostReport(context.host, results, seconds=time.monotonic() - began)


async def verify_target(
    target: Target, checks: Sequence[Check], settings: SshSettings | None = None
) -> HostReport:
    """One host: this machine's shell, or the host's over SSH."""
    try:
        async with open_shell(target, "verify", settings) as shell:
            return await verify_with(shell, checks, target.context)
    except ConnectFailure as failure:
        return HostReport(target.name, error=failure.reason)


async def verify_targets(
    targets: Sequence[Target],
    checks: Sequence[Check],
    settings: SshSettings | None = None,
    on_report: Callable[[HostReport], None] | None = None,
    hosts_at_once: int = 16,
) -> list[HostReport]:
    """Every target concurrently (bounded); reports in the targets' order, each judged against
    the other hosts too (`peers`) once all are in.

    ``on_report`` hears of each host as soon as it is verified, then once more for each host
    whose report the comparison with its peers revised.
    """
    limit = asyncio.Semaphore(hosts_at_once)

    async def one(target: Target) -> HostReport:
        async with limit:
            report = await verify_target(target, checks, settings)
        if on_report is not None:
            on_report(report)
        return report

    alone = await asyncio.gather(*(one(t) for t in targets))
    together = peers.compare(alone, checks)
    if on_report is not None:
        for before, after in zip(alone, together, strict=True):
            if after is not before:
                on_report(after)
    return together
