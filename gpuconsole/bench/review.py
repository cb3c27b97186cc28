"""Stored runs judged as they were when they were kept, and one host's runs with its peers'.

A run was judged, when `launch` kept it, against the runs stored before it (its host's median,
its peers' median, the references). Judging each run against the runs with a smaller `run_id`
gives the same verdict again, so a regression stays flagged however many runs follow it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpuconsole.bench.history import BenchHistory, BenchResult, Judgement, judge

REVIEW_LIMIT = 1000
"""Runs read (newest first) to judge by: older ones' medians are taken over what is read."""


@dataclass(frozen=True, slots=True)
class JudgedRun:
    """A stored run, its verdict, and whether it is a peer's (another host's) run."""

    run: BenchResult
    judgement: Judgement
    peer: bool


def judged(shown: Sequence[BenchResult], stored: Sequence[BenchResult]) -> list[Judgement]:
    """Each run of ``shown`` judged against those of ``stored`` kept before it."""
    alike: dict[tuple[str, str, int], list[BenchResult]] = defaultdict(list)
    for run in stored:
        alike[(run.recipe, run.preset, run.world_size)].append(run)
    return [
        judge(run, _before(run, alike[(run.recipe, run.preset, run.world_size)])) for run in shown
    ]


def host_review(
    history: BenchHistory, host: str, gpu_models: Collection[str] = (), limit: int = REVIEW_LIMIT
) -> list[JudgedRun]:
    """``host``'s runs and its peers' (other hosts with one of its GPU models: ``gpu_models``,
    and those its own runs recorded), newest first. Raises `HistoryError` as reading does."""
    stored = history.runs(limit=limit)
    own = [r.gpu_model for r in stored if r.host == host]
    models = {m for m in (*gpu_models, *own) if m}
    shown = [r for r in stored if r.host == host or r.gpu_model in models]
    verdicts = judged(shown, stored)
    return [JudgedRun(r, v, r.host != host) for r, v in zip(shown, verdicts, strict=True)]


def _before(run: BenchResult, candidates: list[BenchResult]) -> list[BenchResult]:
    """The runs stored before ``run`` (a smaller run_id; without ids, an earlier time)."""
    if run.run_id is None:
        return [c for c in candidates if c.time < run.time]
    return [c for c in candidates if c.run_id is not None and c.run_id < run.run_id]
