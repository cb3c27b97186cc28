"""A finished run into the benchmark history, judged against the runs before it."""

from __future__ import annotations

import time

from gpuconsole.actions.launch.run import RunResult
from gpuconsole.bench.history import BenchHistory, BenchResult, Judgement, judge


def record_run(
    history: BenchHistory, result: RunResult, driver: str | None
) -> tuple[BenchResult, Judgement]:
    """Keep the run (a failed one too, with its cause: it never enters the medians) and judge
    it against the earlier runs of the same recipe and preset."""
    earlier = history.runs(recipe=result.spec.recipe, preset=result.spec.preset)
    if result.summary is not None and result.ok:
        run = BenchResult.from_summary(
            result.summary, host=result.host, driver=driver, time=time.time()
        )
    else:
        run = BenchResult(
            time=time.time(),
            host=result.host,
            gpu_model=None,
            driver=driver,
            torch=None,
            recipe=result.spec.recipe,
            preset=result.spec.preset,
            knobs={},
            samples_per_s=None,
            peak_memory_mib=None,
            world_size=0,
            status="failed",
            message=f"{result.error_kind}: {result.error}",
        )
    stored = history.record(run)
    return stored, judge(stored, earlier)
