"""The memory doctor's report and the OOM diagnosis, as text for a terminal and as JSON."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuconsole.actions.memory.oom import OomDiagnosis, size_text
from gpuconsole.actions.memory.session import MemoryReport
from gpuconsole.actions.memory.trials import (
    PROBE,
    REPEAT,
    STEADY,
    TRIAL,
    Fixes,
    Trial,
    agreement,
    fits,
    loss_drift,
    memory_parts,
    peak_inversions,
    what_stops,
)


def _change(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return ""
    return f"{(value - reference) / reference:+.0%}"


TRIAL_COLUMNS = (
    "trial", "mode", "peak", "allocated", "vs fp32", "samples/s", "spread", "vs mixed", "loss",
    "target",
)  # fmt: skip


def trial_name(trial: Trial) -> str:
    return trial.fixes.name + (" (again)" if trial.role == REPEAT else "")


def trial_cells(trial: Trial, report: MemoryReport) -> tuple[str, ...]:
    """One row of the trial table (`TRIAL_COLUMNS`): compiled or eager, the peak (and the peak
    of live tensors within it) against the fp32 baseline, the speed and how far apart the halves
    of its measured steps were, the speed against mixed precision alone, the loss (and its
    drift, for compression). A probe of the batch search has a peak and no speed."""
    if not trial.ok:
        failure = f"{trial.error_kind or 'failed'}: {trial.error}"
        return (trial_name(trial), "", failure, *[""] * (len(TRIAL_COLUMNS) - 3))
    baseline, mixed = _references(report)
    drift = loss_drift(trial, report.trials)
    target = report.target_mib
    loss = f"{trial.loss:.4f}" if trial.loss is not None else "N/A"
    probe = trial.role == PROBE
    return (
        trial_name(trial),
        _mode(trial),
        size_text(trial.peak_mib),
        size_text(trial.allocated_mib) if trial.allocated_mib is not None else "",
        _change(trial.peak_mib, baseline.peak_mib if baseline else None),
        "probe" if probe else f"{trial.samples_per_s or 0:,.1f}",
        "" if probe or trial.spread is None else f"{trial.spread:.1%}",
        "" if probe else _change(trial.samples_per_s, mixed.samples_per_s if mixed else None),
        "" if probe else loss + _loss_note(trial, drift),
        "" if target is None else ("fits" if fits(trial, target) else "over"),
    )


def _loss_note(trial: Trial, drift: float | None) -> str:
    if trial.unsound:
        return " (unsound)"
    return f" ({drift:+.2%})" if drift is not None else ""


def _mode(trial: Trial) -> str:
    if trial.compiled is None:
        return ""
    return "compiled" if trial.compiled else "eager"


def _name_width(report: MemoryReport) -> int:
    return max([40, *(len(trial_name(t)) for t in report.trials)])


CELL_WIDTHS = (0, 8, 10, 10, 7, 10, 6, 8, 0, 0)


def trial_line(trial: Trial, report: MemoryReport) -> str:
    cells = trial_cells(trial, report)
    name = _name_width(report)
    if not trial.ok:
        return f"{cells[0]:<{name}} {cells[2]}"
    widths = (name, *CELL_WIDTHS[1:])
    return " ".join(
        f"{c:>{w}}" if i else f"{c:<{w}}"
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    ).rstrip()


def _header(report: MemoryReport) -> str:
    name = _name_width(report)
    titles = ("trial", "mode", "peak", "allocated", "fp32", "samples/s", "spread", "mixed", "loss")
    widths = (name, *CELL_WIDTHS[1:-1])
    return " ".join(
        f"{t:>{w}}" if i else f"{t:<{w}}"
        for i, (t, w) in enumerate(zip(titles, widths, strict=True))
    ).rstrip()


def _references(report: MemoryReport) -> tuple[Trial | None, Trial | None]:
    """The fp32 baseline (memory) and mixed precision alone (throughput), as first measured."""
    measured = [t for t in report.trials if t.ok and t.role == TRIAL and t.fixes.batch_size is None]
    plain = [t for t in measured if t.fixes.count == 0]
    mixed = [t for t in measured if t.fixes.count == 1 and t.fixes.precision != "fp32"]
    return (plain[0] if plain else None), (mixed[0] if mixed else None)


def report_text(report: MemoryReport) -> str:
    source = next((t.source for t in report.trials if t.ok), "nothing measured")
    lines = [
        f"{report.recipe} ({report.preset} preset) on {report.host}, batch "
        f"{report.batch_size or 'N/A'}; memory: {source}",
        _header(report),
    ]
    lines += [trial_line(t, report) for t in report.trials]
    lines.append("")
    if report.target_mib is not None:
        lines.append(f"target: {size_text(report.target_mib)}")
    lines += _recommendation_lines(report)
    lines += _unsound_lines(report)
    lines += _steadiness_lines(report)
    lines += _batch_lines(report)
    lines += _where_lines(report)
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def _recommendation_lines(report: MemoryReport) -> list[str]:
    baseline, mixed = _references(report)
    best = report.recommended
    if best is None:
        if report.target_mib is None:
            return []
        return ["recommended: nothing tried fits the target (shard the model: FSDP, ZeRO)"]
    lines = [
        f"recommended: {best.fixes.name} ({size_text(best.peak_mib)}, "
        f"{best.samples_per_s or 0:,.1f} samples/s, {_mode(best) or 'as the job runs'})"
    ]
    if baseline is not None and baseline.peak_mib:
        lines.append(f"  peak {1 - best.peak_mib / baseline.peak_mib:.0%} below fp32")  # type: ignore[operator]
    if mixed is not None and mixed.samples_per_s and best.samples_per_s:
        change = best.samples_per_s / mixed.samples_per_s - 1
        side = "below" if change < 0 else "above"
        lines.append(f"  throughput {abs(change):.0%} {side} {mixed.fixes.name} alone")
    flags = " ".join(best.fixes.arguments(report.batch_size or 1))
    lines.append(f"  flags: --preset {report.preset} {flags}")
    return lines


def _unsound_lines(report: MemoryReport) -> list[str]:
    reasons: dict[str, list[str]] = {}
    for trial in report.trials:
        if trial.unsound and trial.role == TRIAL:
            reasons.setdefault(trial.unsound, []).append(trial.fixes.name)
    return [f"not recommended, {reason}: {', '.join(names)}" for reason, names in reasons.items()]


def _steadiness_lines(report: MemoryReport) -> list[str]:
    """How far the speeds can be trusted: each set run twice, and the trials whose halves did
    not agree within `STEADY` however long they ran."""
    lines = []
    for again in (t for t in report.trials if t.role == REPEAT and t.ok):
        first = next((t for t in report.trials if t.role == TRIAL and t.fixes == again.fixes), None)
        gap = agreement(first, again) if first is not None else None
        if gap is not None:
            lines.append(
                f"run twice: {again.fixes.name} at {first.samples_per_s:,.1f} and "  # type: ignore[union-attr]
                f"{again.samples_per_s:,.1f} samples/s, {gap:.1%} apart"
            )
    unsteady = [
        trial_name(t)
        for t in report.trials
        if t.ok and t.role != PROBE and t.spread is not None and t.spread > STEADY
    ]
    if unsteady:
        lines.append(
            f"unsteady (the halves of the measured steps more than {STEADY:.0%} apart after "
            f"the most steps allowed): {', '.join(unsteady)}"
        )
    return lines


def _batch_lines(report: MemoryReport) -> list[str]:
    """The largest batch found, and whether the peaks the search measured rose with the batch."""
    largest = report.largest_batch
    if largest is None:
        return []
    searched = _unbatched(largest)
    speed = "" if largest.role == PROBE else f", {largest.samples_per_s or 0:,.1f} samples/s"
    lines = [
        f"largest batch under the target: {largest.fixes.batch_size or report.batch_size} with "
        f"{searched.name} ({size_text(largest.peak_mib)}{speed})"
    ]
    points = [
        (t.fixes.batch_size or report.batch_size or 0, t.peak_mib or 0.0)
        for t in report.trials
        if t.ok and t.role != REPEAT and _unbatched(t) == searched
    ]
    for smaller, larger in peak_inversions(points):
        lines.append(
            f"  not monotone: batch {larger} peaked below batch {smaller}, so a batch above one "
            "that failed may still fit (the allocator's segments or the kernels chosen differ "
            "by shape): the largest batch is the largest measured to fit, not proven"
        )
    return lines


def _unbatched(trial: Trial) -> Fixes:
    """A trial's fixes at the job's batch, in one micro-batch: what a batch search varies."""
    return replace(trial.fixes, batch_size=None, micro_batches=1)


def _where_lines(report: MemoryReport) -> list[str]:
    """Where the memory goes at the smallest peak at the job's batch, and what keeps it over
    the target; then where the fp32 run's memory was at its peak, by allocation site."""
    lines = []
    measured = [t for t in report.trials if t.ok and t.role == TRIAL and t.fixes.batch_size is None]
    smallest = min(measured, key=lambda t: t.peak_mib or 0.0) if measured else None
    parts = memory_parts(smallest) if smallest is not None else None
    if smallest is not None and parts is not None and parts.rest_mib is not None:
        lines += [
            "",
            f"where the memory goes at the smallest peak, {smallest.fixes.name} "
            f"({size_text(parts.peak_mib)}):",
            f"  parameters           {size_text(parts.parameters_mib)}",
            f"  optimizer state      {size_text(parts.optimizer_mib)} on the device"
            + (f", {size_text(parts.host_mib)} on the host" if parts.host_mib else ""),
            f"  everything else      {size_text(parts.rest_mib)}: activations, gradients, "
            "temporaries"
            + (", the allocator's cache" if smallest.source.startswith("CUDA") else ""),
        ]
        stop = what_stops(parts, report.target_mib) if report.target_mib is not None else None
        if stop is not None:
            lines.append(f"  over the target by {size_text(parts.peak_mib - report.target_mib)}: "  # type: ignore[operator]
                         + STOPS[stop])  # fmt: skip
    if report.sites:
        peak = size_text(report.sites.get("peak_mib"))
        lines += [
            "",
            f"where the {report.sites.get('fixes')} run's memory was at its peak ({peak}):",
        ]
        for site in report.sites.get("sites", []):
            lines.append(f"  {site['mib']:>9,.0f} MiB  {site['allocations']:>5}×  {site['site']}")
    return lines


STOPS = {
    "parameters": "the parameters alone are over it: only sharding the model (FSDP) helps",
    "model state": "the parameters and the optimizer state alone are over it: keep the "
    "optimizer's state on the host (optimizer-offload) or shard it (ZeRO)",
    "the rest": "activations and the rest are over what the model state leaves: checkpoint "
    "more, compress, or a smaller batch",
}
"""What to do about each part `what_stops` names."""


def trial_dict(trial: Trial, report: MemoryReport) -> dict[str, Any]:
    fixes = trial.fixes
    return {
        "name": fixes.name,
        "role": trial.role,
        "fixes": {
            "precision": fixes.precision,
            "checkpoint_every": fixes.checkpoint_every,
            "selective_checkpoint": fixes.selective,
            "memory_budget": fixes.memory_budget,
            "compress": fixes.compress,
            "expandable_segments": fixes.expandable,
            "optimizer_in_backward": fixes.optimizer_in_backward,
            "offload_optimizer": fixes.offload_optimizer,
            "optimizer_8bit": fixes.optimizer_8bit,
            "micro_batches": fixes.micro_batches,
            "batch_size": fixes.batch_size,
        },
        "compiled": trial.compiled,
        "peak_mib": trial.peak_mib,
        "allocated_mib": trial.allocated_mib,
        "model_state_mib": trial.state_mib,
        "parameters_mib": trial.parameters_mib,
        "host_state_mib": trial.host_state_mib,
        "samples_per_s": trial.samples_per_s,
        "spread": trial.spread,
        "steps": trial.steps,
        "loss": trial.loss,
        "loss_drift": loss_drift(trial, report.trials),
        "unsound": trial.unsound,
        "fits": fits(trial, report.target_mib) if report.target_mib is not None else None,
        "error_kind": trial.error_kind,
        "error": trial.error,
    }


def report_dict(report: MemoryReport) -> dict[str, Any]:
    def name(trial: Trial | None) -> str | None:
        return trial.fixes.name if trial is not None else None

    return {
        "host": report.host,
        "recipe": report.recipe,
        "preset": report.preset,
        "batch_size": report.batch_size,
        "memory_source": next((t.source for t in report.trials if t.ok), None),
        "target_mib": report.target_mib,
        "trials": [trial_dict(t, report) for t in report.trials],
        "recommended": name(report.recommended),
        "recommended_flags": (
            report.recommended.fixes.arguments(report.batch_size or 1)
            if report.recommended
            else None
        ),
        "largest_batch": (
            (report.largest_batch.fixes.batch_size or report.batch_size)
            if report.largest_batch
            else None
        ),
        "sites": report.sites,
        "notes": report.notes,
    }


def diagnosis_text(diagnosis: OomDiagnosis) -> str:
    message = diagnosis.message
    figures = [
        f"asked {size_text(message.requested_mib)}",
        f"card {size_text(message.total_mib)}",
        f"free {size_text(message.free_mib)}",
        f"PyTorch allocated {size_text(message.allocated_mib)}",
        f"reserved {size_text(message.reserved_mib)}",
    ]
    if message.allowed_mib is not None:
        figures.append(f"allowed {size_text(message.allowed_mib)}")
    lines = [
        f"{diagnosis.cause}: {diagnosis.summary}",
        f"  GPU {message.gpu if message.gpu is not None else '?'}: " + ", ".join(figures)
        + f" (PyTorch {message.version} message)",
        "fixes, first to try first:",
    ]  # fmt: skip
    lines += [f"  {i}. {fix.title}: {fix.how}" for i, fix in enumerate(diagnosis.fixes, 1)]
    return "\n".join(lines)


def diagnosis_dict(diagnosis: OomDiagnosis) -> dict[str, Any]:
    message = diagnosis.message
    return {
        "cause": diagnosis.cause,
        "summary": diagnosis.summary,
        "gpu": message.gpu,
        "requested_mib": message.requested_mib,
        "total_mib": message.total_mib,
        "free_mib": message.free_mib,
        "allocated_mib": message.allocated_mib,
        "reserved_mib": message.reserved_mib,
        "unallocated_mib": message.unallocated_mib,
        "process_mib": message.process_mib,
        "allowed_mib": message.allowed_mib,
        "message_version": message.version,
        "other_processes": [
            {"pid": p.pid, "user": p.user, "command": p.command, "used_mib": p.used_memory_mib}
            for p in diagnosis.others
        ],
        "fixes": [{"title": f.title, "how": f.how} for f in diagnosis.fixes],
    }
