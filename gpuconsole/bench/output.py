"""Bench history as a text table for people and as JSON-ready dicts for `--json`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from gpuconsole.bench.history import BenchResult, Judgement, unit
from gpuconsole.rules.summary import short_model

HEADER = (
    "when",
    "host",
    "GPU",
    "recipe",
    "preset",
    "world",
    "throughput",
    "peak mem",
    "status",
    "flag",
)
RIGHT_ALIGNED = {"world", "throughput", "peak mem"}


def history_text(
    results: Sequence[BenchResult], judgements: Sequence[Judgement] | None = None
) -> str:
    """A table of runs (``judgements``, when given, in the same order), then one line per
    regression flagged and per failure, with its cause."""
    if not results:
        return "no benchmark runs recorded"
    verdicts: Sequence[Judgement | None] = judgements or [None] * len(results)
    rows = [row(result, verdict) for result, verdict in zip(results, verdicts, strict=True)]
    widths = [max(len(shown[i]) for shown in (HEADER, *rows)) for i in range(len(HEADER))]
    lines = [_line(shown, widths) for shown in (HEADER, *rows)]
    for result, verdict in zip(results, verdicts, strict=True):
        label = f"run {result.run_id}" if result.run_id is not None else result.host
        if result.status == "failed":
            lines.append(f"{label} failed: {result.message or 'no cause recorded'}")
        for comparison in verdict.comparisons if verdict else ():
            if comparison.flagged:
                lines.append(f"{label} regression: {comparison.message}")
    return "\n".join(lines)


def history_json(results: Sequence[BenchResult]) -> list[dict[str, Any]]:
    """Every field of each run (None stays null), plus the unit its samples are counted in."""
    return [{**dataclasses.asdict(r), "unit": unit(r.recipe)} for r in results]


def row(result: BenchResult, verdict: Judgement | None, *, utc: bool = False) -> tuple[str, ...]:
    """A run's cells under `HEADER`; its time in local time, or in UTC with ``utc``."""
    rate = result.samples_per_s
    peak = result.peak_memory_mib
    when = datetime.fromtimestamp(result.time, timezone.utc if utc else None)
    return (
        when.strftime("%Y-%m-%d %H:%M"),
        result.host,
        short_model(result.gpu_model) or "N/A",
        result.recipe,
        result.preset,
        str(result.world_size),
        "N/A" if rate is None else f"{rate:,.1f} {unit(result.recipe)}",
        "N/A" if peak is None else f"{peak:,.0f} MiB",
        result.status,
        "REGRESSION" if verdict and verdict.flagged else "",
    )


def _line(shown: tuple[str, ...], widths: list[int]) -> str:
    cells = (
        cell.rjust(width) if name in RIGHT_ALIGNED else cell.ljust(width)
        for name, cell, width in zip(HEADER, shown, widths, strict=True)
    )
    return "  ".join(cells).rstrip()
