"""Bench history as a text table for people and as JSON-ready dicts for `--json`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gpuconsole.bench.history import BenchResult, Judgement, unit
from gpuconsole.summary import short_model

_HEADER = (
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
_RIGHT_ALIGNED = {"world", "throughput", "peak mem"}


def history_text(
    results: Sequence[BenchResult], judgements: Sequence[Judgement] | None = None
) -> str:
    """A table of runs (``judgements``, when given, in the same order), then one line per
    regression flagged and per failure, with its cause."""
    if not results:
        return "no benchmark runs recorded"
    verdicts: Sequence[Judgement | None] = judgements or [None] * len(results)
    rows = [_row(result, verdict) for result, verdict in zip(results, verdicts, strict=True)]
    widths = [max(len(row[i]) for row in (_HEADER, *rows)) for i in range(len(_HEADER))]
    lines = [_line(row, widths) for row in (_HEADER, *rows)]
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


def _row(result: BenchResult, verdict: Judgement | None) -> tuple[str, ...]:
    rate = result.samples_per_s
    peak = result.peak_memory_mib
    return (
        datetime.fromtimestamp(result.time).strftime("%Y-%m-%d %H:%M"),
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


def _line(row: tuple[str, ...], widths: list[int]) -> str:
    cells = (
        cell.rjust(width) if name in _RIGHT_ALIGNED else cell.ljust(width)
        for name, cell, width in zip(_HEADER, row, widths, strict=True)
    )
    return "  ".join(cells).rstrip()
