"""The memory fixes as trials, what each measured, and the choice among them.

A trial is one short run of the recipe with a set of fixes. What it measured is read from the
recipe's summary: on CUDA the allocator's peak reserved memory (what the job takes from the
card, its cache and fragmentation included) and peak allocated; without CUDA the recipe's tensor
accounting (parameters, gradients, optimizer state and the peak of activations saved for
backward), because a CPU process's RSS is mostly the torch library. Every report says which.

Pure functions only: the runs are `session.py`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

RESERVE = 0.20
"""The guide's rule: leave a fifth of the card free (section 6.2)."""
LOSS_TOLERANCE = 0.01
"""A compressed run whose loss after the same steps differs by more than this share from the
uncompressed run's is reported, and not recommended."""
SAME_SPEED = 0.02
"""Throughputs within this share count as equal; the set with fewer fixes wins."""


@dataclass(frozen=True, slots=True)
class Fixes:
    """One set of memory fixes, as recipe flags."""

    precision: str = "fp32"
    checkpoint_every: int = 0
    compress: str | None = None
    expandable: bool = False
    optimizer_in_backward: bool = False
    """The optimizer stepped block by block during backward, each gradient freed once used."""
    micro_batches: int = 1
    """The batch split into this many micro-batches, gradients accumulated over them."""
    batch_size: int | None = None
    """A different batch (the largest-batch search); None: the job's own."""

    @property
    def name(self) -> str:
        parts = [self.precision]
        if self.checkpoint_every == 1:
            parts.append("checkpoint")
        elif self.checkpoint_every > 1:
            parts.append(f"checkpoint/{self.checkpoint_every}")
        if self.compress:
            parts.append(f"compress-{self.compress}")
        if self.expandable:
            parts.append("expandable")
        if self.optimizer_in_backward:
            parts.append("optimizer-in-backward")
        if self.micro_batches > 1:
            parts.append(f"micro-batch/{self.micro_batches}")
        if self.batch_size is not None:
            parts.append(f"batch {self.batch_size}")
        return "+".join(parts)

    @property
    def count(self) -> int:
        """How many fixes the set applies (fp32 and the job's batch are none)."""
        return sum(
            (
                self.precision != "fp32",
                self.checkpoint_every > 0,
                self.compress is not None,
                self.expandable,
                self.optimizer_in_backward,
                self.micro_batches > 1,
            )
        )

    def arguments(self, batch_size: int) -> list[str]:
        """The recipe flags; ``batch_size`` is the job's batch, split when micro-batched."""
        batch = self.batch_size or batch_size
        args = ["--no-compile", "--precision", self.precision]
        args += ["--batch-size", str(max(1, batch // self.micro_batches))]
        args += ["--accumulate", str(self.micro_batches)]
        args += ["--checkpoint-every", str(self.checkpoint_every)]
        if self.compress:
            args += ["--compress-activations", self.compress]
        args.append("--expandable-segments" if self.expandable else "--no-expandable-segments")
        if self.optimizer_in_backward:
            args.append("--optimizer-in-backward")
        return args


def parse_fixes(name: str) -> Fixes:
    """A set of fixes from its name as reports print it: ``bf16+checkpoint/2+expandable``."""
    precision, *parts = name.split("+")
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"{name!r}: starts with fp32, bf16 or fp16, not {precision!r}")
    fixes = Fixes(precision=precision)
    for part in parts:
        word, _, number = part.partition("/")
        if part == "checkpoint":
            fixes = replace(fixes, checkpoint_every=1)
        elif word == "checkpoint" and number.isdigit() and int(number) > 0:
            fixes = replace(fixes, checkpoint_every=int(number))
        elif part in ("compress-bf16", "compress-fp8"):
            fixes = replace(fixes, compress=part.removeprefix("compress-"))
        elif part == "expandable":
            fixes = replace(fixes, expandable=True)
        elif part == "optimizer-in-backward":
            fixes = replace(fixes, optimizer_in_backward=True)
        elif word == "micro-batch" and number.isdigit() and int(number) > 1:
            fixes = replace(fixes, micro_batches=int(number))
        else:
            raise ValueError(
                f"{name!r}: unknown fix {part!r} (checkpoint, checkpoint/K, compress-bf16, "
                "compress-fp8, expandable, optimizer-in-backward, micro-batch/N)"
            )
    if fixes.optimizer_in_backward and fixes.micro_batches > 1:
        raise ValueError(
            f"{name!r}: optimizer-in-backward steps at every backward, micro-batch/N "
            "accumulates over several: choose one"
        )
    return fixes


@dataclass(frozen=True, slots=True)
class Trial:
    """What one set of fixes measured; ``error`` when the run failed (an OOM is a result)."""

    fixes: Fixes
    peak_mib: float | None = None
    """The figure judged against the target: peak reserved on CUDA, tensor accounting without."""
    allocated_mib: float | None = None
    samples_per_s: float | None = None
    loss: float | None = None
    source: str = ""
    error_kind: str | None = None
    error: str | None = None
    device_memory_mib: float | None = None
    state_mib: float | None = None
    """Parameters, gradients and optimizer state: what no activation fix lowers."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.peak_mib is not None


def trial_from_summary(fixes: Fixes, summary: Mapping[str, Any]) -> Trial:
    """A trial's figures from the recipe's summary event."""
    if "peak_reserved_mib" in summary:
        peak, source = summary["peak_reserved_mib"], "CUDA allocator: peak reserved"
        allocated = summary.get("peak_memory_mib")
    else:
        peak = summary.get("tensor_peak_mib")
        source = "tensor accounting (no CUDA): parameters, gradients, optimizer, saved activations"
        allocated = peak
    return Trial(
        fixes,
        peak,
        allocated,
        summary.get("samples_per_s"),
        summary.get("loss_last"),
        source,
        device_memory_mib=summary.get("device_memory_mib"),
        state_mib=summary.get("model_state_mib"),
    )


def first_trials(amp: str) -> list[Fixes]:
    """The trials every report has: the baseline, mixed precision alone, then each fix on top of
    it (compression also under fp32, where it narrows every activation), and checkpointing with
    expandable segments, the combination that later trials build on."""
    mixed = Fixes(precision=amp)
    stepped = [replace(mixed, optimizer_in_backward=True)] if steps_in_backward(mixed) else []
    return [
        Fixes(),
        mixed,
        replace(mixed, checkpoint_every=1),
        Fixes(compress="bf16"),
        replace(mixed, compress="fp8"),
        replace(mixed, expandable=True),
        *stepped,
        replace(mixed, micro_batches=2),
        replace(mixed, checkpoint_every=1, expandable=True),
    ]


def steps_in_backward(fixes: Fixes) -> bool:
    """Whether the optimizer can step in backward: not with fp16's loss scaling."""
    return fixes.precision != "fp16"


def combinations(base: Fixes, allocator: bool) -> list[Fixes]:
    """``base`` with more fixes, added one at a time, least intrusive first: the allocator's
    expandable segments (where there is a caching ``allocator``: CUDA), the same arithmetic
    stepped in backward, then activations rounded to bf16, then to fp8 instead. The doctor tries
    them in order until one fits."""
    ladder: list[Fixes] = []
    current = base
    if allocator:
        current = replace(current, expandable=True)
        ladder.append(current)
    if steps_in_backward(base):
        current = replace(current, optimizer_in_backward=True)
        ladder.append(current)
    return [*ladder, replace(current, compress="bf16"), replace(current, compress="fp8")]


def leaner(fitting: Fixes, base: Fixes) -> list[Fixes]:
    """``fitting`` less one of the fixes the climb added above ``base`` before its last rung:
    the step in backward, then expandable segments. A later rung may save enough on its own
    (fp8 compression more than the step in backward), and each added fix costs throughput, so
    the doctor tries these too before it recommends."""
    sets = []
    if fitting.optimizer_in_backward and not base.optimizer_in_backward:
        sets.append(replace(fitting, optimizer_in_backward=False))
    if fitting.expandable and not base.expandable:
        sets.append(replace(fitting, expandable=False))
    return sets


def default_target_mib(trials: Sequence[Trial]) -> float | None:
    """The card's memory less the guide's reserve; None without a card (no CUDA)."""
    card = next((t.device_memory_mib for t in trials if t.device_memory_mib), None)
    return card * (1 - RESERVE) if card else None


def checkpoint_interval(none: Trial, every: Trial, target_mib: float) -> int | None:
    """The sparsest checkpointing (every k-th block) whose estimated peak is under the target.

    Estimated from the same precision's peaks without checkpointing and with every block
    checkpointed, activations taken to scale with the share of blocks not checkpointed
    (1 - 1/k). None when no checkpointing is needed, or none would be enough, or the two
    peaks say nothing (the first is not above the second)."""
    if not (none.ok and every.ok) or none.peak_mib <= every.peak_mib:  # type: ignore[operator]
        return None
    if none.peak_mib <= target_mib or every.peak_mib > target_mib:  # type: ignore[operator]
        return None
    share = (target_mib - every.peak_mib) / (none.peak_mib - every.peak_mib)  # type: ignore[operator]
    k = math.floor(1 / (1 - share)) if share < 1 else None
    return k if k is not None and k >= 2 else None


def loss_drift(trial: Trial, trials: Sequence[Trial]) -> float | None:
    """A compressed trial's loss against the same fixes without compression, as a share."""
    if trial.fixes.compress is None or trial.loss is None:
        return None
    plain = replace(trial.fixes, compress=None)
    reference = next((t for t in trials if t.fixes == plain and t.loss is not None), None)
    if reference is None or not reference.loss:
        return None
    return (trial.loss - reference.loss) / abs(reference.loss)


def fits(trial: Trial, target_mib: float) -> bool:
    return trial.ok and trial.peak_mib <= target_mib  # type: ignore[operator]


def recommend(trials: Sequence[Trial], target_mib: float) -> Trial | None:
    """The fastest trial under the target that keeps the job's arithmetic: the job's own batch
    and, for compression, a loss within `LOSS_TOLERANCE`; near-equal speeds go to fewer fixes.
    None: nothing tried fits."""
    candidates = [
        t
        for t in trials
        if fits(t, target_mib)
        and t.fixes.batch_size is None
        and t.samples_per_s is not None
        and abs(loss_drift(t, trials) or 0.0) <= LOSS_TOLERANCE
    ]
    if not candidates:
        return None
    fastest = max(t.samples_per_s for t in candidates)  # type: ignore[type-var]
    near = [t for t in candidates if t.samples_per_s >= fastest * (1 - SAME_SPEED)]  # type: ignore[operator]
    return min(near, key=lambda t: (t.fixes.count, -(t.samples_per_s or 0.0)))


def next_batch(fitting: int, failing: int | None, last: Trial, target_mib: float) -> int | None:
    """The next batch to try in the search for the largest that fits, or None when done.

    ``fitting`` is the largest batch known to fit (``last`` measured it when nothing failed yet),
    ``failing`` the smallest known not to. Until one fails, the guess scales the activations
    (peak less model state) linearly to the target, at least an eighth more each time; then
    bisection, to within a sixteenth."""
    if failing is not None:
        if failing - fitting <= max(1, fitting // 16):
            return None
        return (fitting + failing) // 2
    step = fitting + max(1, fitting // 8)
    if not last.ok or last.state_mib is None:
        return max(step, fitting * 2)
    activations = last.peak_mib - last.state_mib  # type: ignore[operator]
    if activations <= 0:
        return fitting * 2
    estimate = int(0.97 * fitting * (target_mib - last.state_mib) / activations)
    return max(step, estimate)
