"""Is ECC on for every GPU, and has any GPU had an uncorrectable memory error since the driver
loaded? Fleets fail a node on those (shared/reference/gpu-facts.md, "Health-check thresholds used by
fleets")."""

from __future__ import annotations

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.verify.judging import csv_cells, joined, smi_int, smi_unusable
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.actions.verify.probes import SMI_QUERY, smi_command, smi_rows
from gpuconsole.hosts.targets import Context

ECC_COUNTS = Probe(
    "ecc-counts",
    smi_command(
        "--query-gpu=index,ecc.errors.uncorrected.volatile.total,"
        "ecc.errors.uncorrected.aggregate.total,ecc.errors.corrected.volatile.total"
        " --format=csv,noheader,nounits"
    ),
)
"""Per GPU: uncorrectable errors since the driver loaded, over the GPU's life, correctable ones."""


def _ecc_counts(output: CommandOutput) -> dict[str, tuple[int | None, int | None, int | None]]:
    """index -> (uncorrectable since the driver loaded, uncorrectable lifetime, correctable since
    the driver loaded)."""
    if not output.ok:
        return {}
    return {
        row[0]: (smi_int(row[1]), smi_int(row[2]), smi_int(row[3]))
        for row in csv_cells(output.stdout)
        if len(row) == 4
    }


def _judge_ecc(evidence: Evidence, context: Context) -> Verdict:
    query = evidence[SMI_QUERY.name]
    if trouble := smi_unusable(query, "GPU query"):
        return trouble
    rows = smi_rows(query)
    if not rows:
        return Verdict(Status.SKIP, "nvidia-smi listed no GPU")
    counts = _ecc_counts(evidence[ECC_COUNTS.name])
    lines, failing, disabled, unsupported, lifetime = [], [], [], [], 0
    for row in rows:
        index, mode = row.get("index", "?"), row.get("ecc.mode.current", "")
        volatile, aggregate, corrected = counts.get(index, (None, None, None))
        lines.append(
            f"GPU {index}: ECC {mode}; uncorrectable {volatile} since driver load, {aggregate} "
            f"lifetime; correctable {corrected} since driver load"
        )
        if volatile:
            failing.append(f"GPU {index}: {volatile} uncorrectable")
        if mode == "Disabled":
            disabled.append(index)
        elif mode != "Enabled":
            unsupported.append(index)
        lifetime += aggregate or 0
    if not counts:
        lines.append(f"error counts unavailable: {joined(evidence[ECC_COUNTS.name].lines(2))}")
    if failing:
        return Verdict(
            Status.FAIL,
            f"uncorrectable ECC errors since the driver loaded: {joined(failing)}",
            tuple(lines),
            "drain the GPU's jobs (their results may be corrupt), read row-remap and xid-log, "
            "then reset it (`nvidia-smi -r -i <gpu>`); if errors return, replace the GPU (RMA)",
        )
    if disabled:
        return Verdict(
            Status.WARN,
            f"ECC is off on GPU {joined(disabled)}: memory errors would go unnoticed",
            tuple(lines),
            f"`nvidia-smi -i {disabled[0]} -e 1` for each such GPU (as root), then reboot: "
            "the mode changes at the next reset",
        )
    summary = f"ECC enabled on {len(rows) - len(unsupported)} GPU(s), no uncorrectable error"
    if unsupported:
        summary += f"; GPU {joined(unsupported)} has no ECC (a GPU model without it)"
    if lifetime:
        summary += f"; {lifetime} uncorrectable over the GPUs' lives (row-remap judges those)"
    return Verdict(Status.PASS, summary, tuple(lines))


CHECKS: tuple[Check, ...] = (
    Check("ecc", "ECC mode and errors", (SMI_QUERY, ECC_COUNTS), _judge_ecc),
)
