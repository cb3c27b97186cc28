"""A recipe run as text and JSON: its live steps and its result against references and history."""

from __future__ import annotations

from typing import Any

from gpuconsole.actions.launch.run import Event, RunResult
from gpuconsole.actions.launch.session import Launch
from gpuconsole.bench.history import BenchResult, Judgement


def _number(value: object, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else "N/A"


def step_text(event: Event) -> str:
    return (
        f"  step {event.get('step')}: {_number(event.get('samples_per_s'))} samples/s, "
        f"loss {_number(event.get('loss'), 3)}, peak {_number(event.get('peak_memory_mib'))} MiB"
    )


def result_text(result: RunResult, judgement: Judgement | None) -> str:
    if not result.ok:
        lines = [
            f"{result.host}: {result.spec.recipe} failed ({result.error_kind}): {result.error}"
        ]
        lines.extend(f"  | {line}" for line in result.tail[-5:])
        return "\n".join(lines)
    summary = result.summary or {}
    rate, peak = _number(summary.get("samples_per_s")), _number(summary.get("peak_memory_mib"))
    loss = f"{_number(summary.get('loss_first'), 3)} -> {_number(summary.get('loss_last'), 3)}"
    lines = [
        f"{result.host}: {result.spec.recipe} {result.spec.preset}: {rate} samples/s on "
        f"{summary.get('world_size')} GPU(s) ({summary.get('device_name')}), peak {peak} MiB, "
        f"loss {loss}"
    ]
    if judgement is not None:
        for comparison in judgement.comparisons:
            mark = "FLAG" if comparison.flagged else "    "
            lines.append(f"  {mark} {comparison.message}")
    return "\n".join(lines)


def result_dict(
    plan: Launch, result: RunResult, stored: BenchResult | None, judgement: Judgement | None
) -> dict[str, Any]:
    return {
        "host": result.host,
        "recipe": result.spec.recipe,
        "preset": result.spec.preset,
        "engine": plan.engine,
        "gpus": list(plan.gpus),
        "commands": plan.commands,
        "ok": result.ok,
        "error": None if result.ok else {"kind": result.error_kind, "message": result.error},
        "summary": result.summary,
        "steps": list(result.steps),
        "run_id": stored.run_id if stored else None,
        "flagged": bool(judgement and judgement.flagged),
        "comparisons": []
        if judgement is None
        else [
            {
                "kind": c.kind,
                "baseline": c.baseline,
                "ratio": c.ratio,
                "flagged": c.flagged,
                "message": c.message,
            }
            for c in judgement.comparisons
        ],
    }
