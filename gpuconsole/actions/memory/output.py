"""The memory doctor's report and the OOM diagnosis, as text for a terminal and as JSON."""

from __future__ import annotations

from typing import Any

from gpuconsole.actions.memory.oom import OomDiagnosis, size_text
from gpuconsole.actions.memory.session import MemoryReport
from gpuconsole.actions.memory.trials import Trial, fits, loss_drift


def _change(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return ""
    return f"{(value - reference) / reference:+.0%}"


TRIAL_COLUMNS = (
    "trial", "peak", "allocated", "vs fp32", "samples/s", "vs mixed", "loss", "target",
)  # fmt: skip


def trial_cells(trial: Trial, report: MemoryReport) -> tuple[str, ...]:
    """One row of the trial table (`TRIAL_COLUMNS`): the peak (and the peak of live tensors
    within it) against the fp32 baseline, the speed against mixed precision alone, the loss
    (and its drift, for compression)."""
    if not trial.ok:
        return (trial.fixes.name, f"{trial.error_kind or 'failed'}: {trial.error}", *[""] * 6)
    baseline, mixed = _references(report)
    drift = loss_drift(trial, report.trials)
    target = report.target_mib
    loss = f"{trial.loss:.4f}" if trial.loss is not None else "N/A"
    return (
        trial.fixes.name,
        size_text(trial.peak_mib),
        size_text(trial.allocated_mib) if trial.allocated_mib is not None else "",
        _change(trial.peak_mib, baseline.peak_mib if baseline else None),
        f"{trial.samples_per_s or 0:,.1f}",
        _change(trial.samples_per_s, mixed.samples_per_s if mixed else None),
        loss + (f" ({drift:+.2%})" if drift is not None else ""),
        "" if target is None else ("fits" if fits(trial, target) else "over"),
    )


def _name_width(report: MemoryReport) -> int:
    return max([40, *(len(t.fixes.name) for t in report.trials)])


def trial_line(trial: Trial, report: MemoryReport) -> str:
    cells = trial_cells(trial, report)
    name = _name_width(report)
    if not trial.ok:
        return f"{cells[0]:<{name}} {cells[1]}"
    widths = (name, 10, 10, 5, 10, 5, 0, 0)
    return " ".join(
        f"{c:>{w}}" if i else f"{c:<{w}}"
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    ).rstrip()


def _references(report: MemoryReport) -> tuple[Trial | None, Trial | None]:
    """The fp32 baseline (memory) and mixed precision alone (throughput)."""
    plain = [t for t in report.trials if t.ok and t.fixes.count == 0 and not t.fixes.batch_size]
    mixed = [
        t
        for t in report.trials
        if t.ok and t.fixes.count == 1 and t.fixes.precision != "fp32" and not t.fixes.batch_size
    ]
    return (plain[0] if plain else None), (mixed[0] if mixed else None)


def report_text(report: MemoryReport) -> str:
    source = next((t.source for t in report.trials if t.ok), "nothing measured")
    lines = [
        f"{report.recipe} on {report.host}, batch {report.batch_size or 'N/A'}; memory: {source}",
        f"{'trial':<{_name_width(report)}} {'peak':>10} {'allocated':>10} {'fp32':>5} "
        f"{'samples/s':>10} {'mixed':>5} loss",
    ]
    lines += [trial_line(t, report) for t in report.trials]
    lines.append("")
    if report.target_mib is not None:
        lines.append(f"target: {size_text(report.target_mib)}")
    baseline, mixed = _references(report)
    if baseline is not None and baseline.state_mib:
        lines.append(
            f"model state (parameters and optimizer state): {size_text(baseline.state_mib)}, "
            "which no activation fix lowers"
        )
    if report.recommended is not None:
        best = report.recommended
        lines.append(f"recommended: {best.fixes.name} ({size_text(best.peak_mib)}, "
                     f"{best.samples_per_s or 0:,.1f} samples/s)")  # fmt: skip
        if baseline is not None and baseline.peak_mib:
            lines.append(f"  peak {1 - best.peak_mib / baseline.peak_mib:.0%} below fp32")  # type: ignore[operator]
        if mixed is not None and mixed.samples_per_s and best.samples_per_s:
            change = best.samples_per_s / mixed.samples_per_s - 1
            side = "below" if change < 0 else "above"
            lines.append(f"  throughput {abs(change):.0%} {side} mixed precision alone")
        lines.append(f"  flags: {' '.join(best.fixes.arguments(report.batch_size or 1))}")
    elif report.target_mib is not None:
        lines.append("recommended: nothing tried fits the target (shard the model: FSDP, ZeRO)")
    if report.largest_batch is not None:
        largest = report.largest_batch
        batch = largest.fixes.batch_size or report.batch_size
        lines.append(f"largest batch under the target: {batch} with {largest.fixes.name} "
                     f"({size_text(largest.peak_mib)})")  # fmt: skip
    if report.sites:
        peak = size_text(report.sites.get("peak_mib"))
        lines += [
            "",
            f"where the {report.sites.get('fixes')} run's memory was at its peak ({peak}):",
        ]
        for site in report.sites.get("sites", []):
            lines.append(f"  {site['mib']:>9,.0f} MiB  {site['allocations']:>5}×  {site['site']}")
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def trial_dict(trial: Trial, report: MemoryReport) -> dict[str, Any]:
    return {
        "name": trial.fixes.name,
        "fixes": {
            "precision": trial.fixes.precision,
            "checkpoint_every": trial.fixes.checkpoint_every,
            "compress": trial.fixes.compress,
            "expandable_segments": trial.fixes.expandable,
            "optimizer_in_backward": trial.fixes.optimizer_in_backward,
            "micro_batches": trial.fixes.micro_batches,
            "batch_size": trial.fixes.batch_size,
        },
        "peak_mib": trial.peak_mib,
        "allocated_mib": trial.allocated_mib,
        "samples_per_s": trial.samples_per_s,
        "loss": trial.loss,
        "loss_drift": loss_drift(trial, report.trials),
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
