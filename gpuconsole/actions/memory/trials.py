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
STEADY = 0.05
"""A trial's speed is steady when the first and the second half of its measured steps agree on
samples/s within this share (the recipe measures more rounds until they do, up to a cap)."""
FIRST_BUDGET = 0.5
"""The compiler's activation memory budget tried first; the doctor then estimates the budget for
the target from it and from the job without one (`budget_for_target`)."""
BUDGET_GRID = 0.05
"""Budgets are tried on this grid, never below it (the recipes refuse a budget of 0)."""
UNSOUND_BUDGET = (
    "under a memory budget torch's partitioner recomputes dropout with fresh randomness in "
    "backward: wrong gradients (pytorch/pytorch#190758)"
)
ADAMW_RECIPES = frozenset({"bert"})
"""The recipes whose optimizer is AdamW, whose moments torchao keeps in 8 bits (the others use
SGD with momentum); tests/test_memory_trials.py checks this against the recipes' sources."""
TRIAL, PROBE, REPEAT = "trial", "probe", "repeat"
"""What a run is for: a trial of a set of fixes; a probe of the batch search (a peak from two
steps, no speed); the second run of a trial, whose speed says how well two runs agree."""


@dataclass(frozen=True, slots=True)
class Fixes:
    """One set of memory fixes, as recipe flags."""

    precision: str = "fp32"
    checkpoint_every: int = 0
    selective: bool = False
    """The checkpointed blocks keep what matmuls and attention made (a selective checkpoint)."""
    memory_budget: float | None = None
    """torch.compile's activation memory budget (compiled jobs only)."""
    compress: str | None = None
    expandable: bool = False
    optimizer_in_backward: bool = False
    """The optimizer stepped block by block during backward, each gradient freed once used."""
    offload_optimizer: bool = False
    """The optimizer's state on the host, each block stepped there as backward completes it."""
    optimizer_8bit: bool = False
    """AdamW's two moments kept in 8 bits (torchao's AdamW8bit): a quarter of their memory,
    a change of arithmetic whose loss is compared with the same set's without it."""
    cuda_graphs: bool = False
    """The compiled graphs replayed as CUDA graphs (torch.compile's ``reduce-overhead`` mode):
    one launch per graph instead of one per kernel, for a step the host cannot keep up with
    (a checkpointed compiled step is one). A speed fix: it saves no memory, and its graphs'
    private memory pool may cost some."""
    micro_batches: int = 1
    """The batch split into this many micro-batches, gradients accumulated over them."""
    batch_size: int | None = None
    """A different batch (the largest-batch search); None: the job's own."""

    @property
    def name(self) -> str:
        parts = [self.precision]
        if self.checkpoint_every:
            word = "selective-checkpoint" if self.selective else "checkpoint"
            every = self.checkpoint_every
            parts.append(word if every == 1 else f"{word}/{every}")
        if self.memory_budget is not None:
            parts.append(f"memory-budget/{self.memory_budget:g}")
        if self.compress:
            parts.append(f"compress-{self.compress}")
        if self.expandable:
            parts.append("expandable")
        if self.optimizer_in_backward:
            parts.append("optimizer-in-backward")
        if self.offload_optimizer:
            parts.append("optimizer-offload")
        if self.optimizer_8bit:
            parts.append("optimizer-8bit")
        if self.cuda_graphs:
            parts.append("cuda-graphs")
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
                self.memory_budget is not None,
                self.compress is not None,
                self.expandable,
                self.optimizer_in_backward,
                self.offload_optimizer,
                self.optimizer_8bit,
                self.cuda_graphs,
                self.micro_batches > 1,
            )
        )

    def arguments(self, batch_size: int) -> list[str]:
        """The recipe flags, after the job's preset; ``batch_size`` is the job's batch, split when
        micro-batched. Compression runs eagerly (its hooks on saved tensors do not combine with
        torch.compile), so it turns compiling off; everything else runs as the preset does."""
        batch = self.batch_size or batch_size
        args = ["--precision", self.precision]
        args += ["--batch-size", str(max(1, batch // self.micro_batches))]
        args += ["--accumulate", str(self.micro_batches)]
        args += ["--checkpoint-every", str(self.checkpoint_every)]
        if self.selective:
            args.append("--selective-checkpoint")
        if self.memory_budget is not None:
            args += ["--activation-memory-budget", f"{self.memory_budget:g}"]
        if self.compress:
            args += ["--compress-activations", self.compress, "--no-compile"]
        args.append("--expandable-segments" if self.expandable else "--no-expandable-segments")
        if self.optimizer_in_backward:
            args.append("--optimizer-in-backward")
        if self.offload_optimizer:
            args.append("--offload-optimizer")
        if self.optimizer_8bit:
            args.append("--optimizer-8bit")
        if self.cuda_graphs:
            args += ["--compile-mode", "reduce-overhead"]
        return args


SWITCHES = {
    "expandable": "expandable",
    "optimizer-in-backward": "optimizer_in_backward",
    "optimizer-offload": "offload_optimizer",
    "optimizer-8bit": "optimizer_8bit",
    "cuda-graphs": "cuda_graphs",
}
"""The fixes that are on or off, by name: the field of `Fixes` each sets."""
FIX_WORDS = (
    "checkpoint, checkpoint/K, selective-checkpoint, selective-checkpoint/K, memory-budget/F, "
    "compress-bf16, compress-fp8, expandable, optimizer-in-backward, optimizer-offload, "
    "optimizer-8bit, cuda-graphs, micro-batch/N"
)


def parse_fixes(name: str) -> Fixes:
    """A set of fixes from its name as reports print it: ``bf16+checkpoint/2+expandable``."""
    precision, *parts = name.split("+")
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"{name!r}: starts with fp32, bf16 or fp16, not {precision!r}")
    fixes = Fixes(precision=precision)
    for part in parts:
        fixes = _with_fix(fixes, part, name)
    conflict = _conflict(fixes)
    if conflict:
        raise ValueError(f"{name!r}: {conflict}")
    return fixes


def _with_fix(fixes: Fixes, part: str, name: str) -> Fixes:
    word, _, number = part.partition("/")
    every = int(number) if number.isdigit() and int(number) > 0 else None
    if word in ("checkpoint", "selective-checkpoint") and (every or part == word):
        return replace(fixes, checkpoint_every=every or 1, selective=word != "checkpoint")
    if word == "memory-budget" and _budget(number) is not None:
        return replace(fixes, memory_budget=_budget(number))
    if part in ("compress-bf16", "compress-fp8"):
        return replace(fixes, compress=part.removeprefix("compress-"))
    if part in SWITCHES:
        return replace(fixes, **{SWITCHES[part]: True})
    if word == "micro-batch" and every is not None and every > 1:
        return replace(fixes, micro_batches=every)
    raise ValueError(f"{name!r}: unknown fix {part!r} ({FIX_WORDS})")


def _budget(text: str) -> float | None:
    """A memory budget written as a share above 0 and below 1 (1 is no budget at all)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 1 else None


def _conflict(fixes: Fixes) -> str | None:
    """Why the set cannot run, if it cannot."""
    stepping = "optimizer-offload" if fixes.offload_optimizer else "optimizer-in-backward"
    if (fixes.offload_optimizer or fixes.optimizer_in_backward) and fixes.micro_batches > 1:
        return (
            f"{stepping} steps at every backward, micro-batch/N accumulates over several: "
            "choose one"
        )
    if fixes.offload_optimizer and fixes.optimizer_8bit:
        return (
            "optimizer-offload keeps the state on the host, optimizer-8bit narrows it on the "
            "GPU: choose one"
        )
    if fixes.offload_optimizer and fixes.optimizer_in_backward:
        return "optimizer-offload already steps each block in backward, on the host: choose one"
    if fixes.memory_budget is not None and fixes.compress:
        return "memory-budget/F is the compiler's, compression runs eagerly: choose one"
    if fixes.cuda_graphs and fixes.compress:
        return "cuda-graphs replays compiled graphs, compression runs eagerly: choose one"
    return None


def parse_fix_list(text: str) -> tuple[Fixes, ...]:
    """Sets separated by commas: ``bf16,bf16+checkpoint``."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError(f"{text!r}: no set of fixes")
    return tuple(parse_fixes(name) for name in names)


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
    """Parameters and the optimizer state kept on the device: what no activation fix lowers."""
    parameters_mib: float | None = None
    host_state_mib: float | None = None
    """What the host holds for an offloaded optimizer (state and master parameters)."""
    compiled: bool | None = None
    """Whether the run was compiled (the job's preset, less compression's eager runs)."""
    spread: float | None = None
    """How far apart the two halves of the measured steps' samples/s were (`STEADY`)."""
    steps: int | None = None
    unsound: str | None = None
    """Why the run's gradients are not the job's: measured, never recommended."""
    role: str = TRIAL

    @property
    def ok(self) -> bool:
        return self.error is None and self.peak_mib is not None


def trial_from_summary(fixes: Fixes, summary: Mapping[str, Any]) -> Trial:
    """A trial's figures from the recipe's summary event. The loss is the one after warm-up and
    the asked steps, the same step in every run whatever more steps a steady figure took."""
    if "peak_reserved_mib" in summary:
        peak, source = summary["peak_reserved_mib"], "CUDA allocator: peak reserved"
        allocated = summary.get("peak_memory_mib")
    else:
        peak = summary.get("tensor_peak_mib")
        source = "tensor accounting (no CUDA): parameters, gradients, optimizer, saved activations"
        allocated = peak
    loss = summary.get("loss_after_steps")
    knobs = summary.get("knobs") or {}
    return Trial(
        fixes,
        peak,
        allocated,
        summary.get("samples_per_s"),
        summary.get("loss_last") if loss is None else loss,
        source,
        device_memory_mib=summary.get("device_memory_mib"),
        state_mib=summary.get("model_state_mib"),
        parameters_mib=summary.get("parameters_mib"),
        host_state_mib=summary.get("host_state_mib"),
        compiled=knobs.get("compile"),
        spread=summary.get("spread"),
        steps=summary.get("steps"),
        unsound=UNSOUND_BUDGET if knobs.get("budget_recomputes_dropout") else None,
    )


def first_trials(amp: str, compiled: bool = False, allocator: bool = True) -> list[Fixes]:
    """The trials every report has: the baseline, mixed precision alone (the job as it runs:
    compiled where its preset compiles), then each fix on top of it (compression also under
    fp32, where it narrows every activation), and checkpointing with expandable segments, the
    combination that later trials build on. The compiler's memory budget where the job compiles;
    expandable segments where there is a caching ``allocator`` (CUDA)."""
    mixed = Fixes(precision=amp)
    every = replace(mixed, checkpoint_every=1)
    budget = [replace(mixed, memory_budget=FIRST_BUDGET)] if compiled else []
    stepped = (
        [replace(mixed, optimizer_in_backward=True), replace(mixed, offload_optimizer=True)]
        if steps_in_backward(mixed)
        else []
    )
    expandable = [replace(mixed, expandable=True)] if allocator else []
    return [
        Fixes(),
        mixed,
        every,
        replace(every, selective=True),
        *budget,
        Fixes(compress="bf16"),
        replace(mixed, compress="fp8"),
        *expandable,
        *stepped,
        replace(mixed, micro_batches=2),
        *([replace(every, expandable=True)] if allocator else []),
    ]


def steps_in_backward(fixes: Fixes) -> bool:
    """Whether the optimizer can step in backward (on the device or the host): not with fp16's
    loss scaling."""
    return fixes.precision != "fp16"


def climb_base(trials: Sequence[Trial], amp: str) -> Trial | None:
    """Where the climb starts: of mixed precision with one activation fix (checkpointing, whole
    or selective, or a memory budget), the sound run with the smallest peak at the job's
    batch."""
    bases = [
        t
        for t in trials
        if t.ok
        and t.role == TRIAL
        and t.unsound is None
        and t.fixes.batch_size is None
        and t.fixes.precision == amp
        and t.fixes.count == 2
        and (t.fixes.checkpoint_every == 1 or t.fixes.memory_budget is not None)
    ]
    return min(bases, key=lambda t: t.peak_mib or 0.0) if bases else None


def combinations(base: Fixes, allocator: bool, adamw: bool = False) -> list[Fixes]:
    """``base`` with more fixes, added one at a time, least intrusive first: the allocator's
    expandable segments (where there is a caching ``allocator``: CUDA), AdamW's moments in 8
    bits on top (where the optimizer is ``adamw``: a quarter of its state, at the GPU's speed),
    then instead of those,
    the same arithmetic stepped in backward, the optimizer's state moved to the host (the same
    arithmetic again, on the host), then activations rounded to bf16, then to fp8 instead (not
    on a memory budget: compression runs eagerly). The doctor tries them in order until one
    fits."""
    ladder: list[Fixes] = []
    current = base
    if allocator:
        current = replace(current, expandable=True)
        ladder.append(current)
    if adamw:
        ladder.append(replace(current, optimizer_8bit=True))
    if steps_in_backward(base):
        current = replace(current, optimizer_in_backward=True)
        ladder.append(current)
        current = replace(current, optimizer_in_backward=False, offload_optimizer=True)
        ladder.append(current)
    if base.memory_budget is not None:
        return ladder
    return [*ladder, replace(current, compress="bf16"), replace(current, compress="fp8")]


def leaner(fitting: Fixes, base: Fixes) -> list[Fixes]:
    """``fitting`` less one of the fixes the climb added above ``base``: the optimizer on the
    host brought back to the device (stepped in backward there, then not), the step in backward,
    then expandable segments. A later rung may save enough on its own (fp8 compression more
    than the step in backward), and each added fix costs throughput, so the doctor tries these
    too before it recommends (those it already tried, it does not try again)."""
    sets = []
    if fitting.offload_optimizer and not base.offload_optimizer:
        on_device = replace(fitting, offload_optimizer=False)
        sets += [replace(on_device, optimizer_in_backward=True), on_device]
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


def budget_for_target(plain: Trial, budgeted: Trial, target_mib: float) -> float | None:
    """The compiler's activation memory budget whose estimated peak is under the target.

    The budget scales the activations the partitioner saves between those of the graph's inputs
    (0) and those it saves for speed (1, ``plain``: the same job without a budget), so the peak
    is taken as linear in it through ``budgeted``'s: the estimate for the target, rounded down to
    `BUDGET_GRID` and never below it. None when no budget is needed, the budget saved nothing, or
    the estimate is what ``budgeted`` already tried."""
    tried = budgeted.fixes.memory_budget
    if tried is None or not (plain.ok and budgeted.ok):
        return None
    top, low = plain.peak_mib, budgeted.peak_mib
    if top <= target_mib or low >= top:  # type: ignore[operator]
        return None
    share = tried + (target_mib - low) / (top - low) * (1 - tried)  # type: ignore[operator]
    budget = round(max(BUDGET_GRID, math.floor(share / BUDGET_GRID) * BUDGET_GRID), 2)
    return None if budget >= 1 or math.isclose(budget, tried) else budget


def loss_drift(trial: Trial, trials: Sequence[Trial]) -> float | None:
    """A trial that changes the arithmetic (compression, 8-bit moments): its loss against the
    same fixes without those, as a share."""
    fixes = trial.fixes
    if (fixes.compress is None and not fixes.optimizer_8bit) or trial.loss is None:
        return None
    plain = replace(fixes, compress=None, optimizer_8bit=False)
    reference = next((t for t in trials if t.fixes == plain and t.loss is not None), None)
    if reference is None or not reference.loss:
        return None
    return (trial.loss - reference.loss) / abs(reference.loss)


def fits(trial: Trial, target_mib: float) -> bool:
    return trial.ok and trial.peak_mib <= target_mib  # type: ignore[operator]


def recommend(trials: Sequence[Trial], target_mib: float) -> Trial | None:
    """The fastest trial under the target that keeps the job's arithmetic: the job's own batch,
    gradients that are the job's (not `Trial.unsound`) and, for compression and 8-bit moments,
    a loss within `LOSS_TOLERANCE`; near-equal speeds go to fewer fixes. None: nothing tried
    fits."""
    candidates = [
        t
        for t in trials
        if fits(t, target_mib)
        and t.role == TRIAL
        and t.unsound is None
        and t.fixes.batch_size is None
        and t.samples_per_s is not None
        and abs(loss_drift(t, trials) or 0.0) <= LOSS_TOLERANCE
    ]
    if not candidates:
        return None
    fastest = max(t.samples_per_s for t in candidates)  # type: ignore[type-var]
    near = [t for t in candidates if t.samples_per_s >= fastest * (1 - SAME_SPEED)]  # type: ignore[operator]
    return min(near, key=lambda t: (t.fixes.count, -(t.samples_per_s or 0.0)))


def batch_granule(batch: int) -> int:
    """The step of the batch search: multiples of 8 for a job whose batch is one (shapes the
    tensor cores like, and fewer distinct shapes for a compiler to build), else any batch."""
    return 8 if batch >= 8 and batch % 8 == 0 else 1


def next_batch(
    fitting: int, failing: int | None, last: Trial, target_mib: float, granule: int = 1
) -> int | None:
    """The next batch to try in the search for the largest that fits, or None when done.

    ``fitting`` is the largest batch known to fit (``last`` measured it when nothing failed yet),
    ``failing`` the smallest known not to. Until one fails, the guess scales the activations
    (peak less model state) linearly to the target, at least an eighth more each time; then
    bisection, to within a sixteenth or ``granule``. Every batch tried is a multiple of
    ``granule`` once the fitting batch is (below it, any batch)."""
    step = granule if fitting >= granule else 1
    if failing is not None:
        if failing - fitting <= max(step, fitting // 16):
            return None
        return max(fitting + step, (fitting + failing) // 2 // step * step)
    ahead = fitting + max(step, -(-fitting // 8 // step) * step)
    if not last.ok or last.state_mib is None:
        return max(ahead, fitting * 2)
    activations = last.peak_mib - last.state_mib  # type: ignore[operator]
    if activations <= 0:
        return max(ahead, fitting * 2)
    estimate = int(0.97 * fitting * (target_mib - last.state_mib) / activations)
    return max(ahead, estimate // step * step)


def peak_inversions(points: Sequence[tuple[int, float]]) -> list[tuple[int, int]]:
    """Where the peak fell as the batch grew: (smaller batch, larger batch) for each batch whose
    peak is below the highest peak of a smaller batch, that one named. Empty: the peaks rise
    with the batch, as the search assumes (a larger batch holds more activations); otherwise a
    batch above one that failed may still fit, so the largest batch found is not proven."""
    inversions = []
    highest: tuple[int, float] | None = None
    for batch, peak in sorted(points):
        if highest is not None and peak < highest[1] and batch > highest[0]:
            inversions.append((highest[0], batch))
        if highest is None or peak >= highest[1]:
            highest = (batch, peak)
    return inversions


def agreement(first: Trial, second: Trial) -> float | None:
    """How far apart two runs of one set are on samples/s, as a share of their mean."""
    a, b = first.samples_per_s, second.samples_per_s
    if not (a and b):
        return None
    return abs(a - b) / ((a + b) / 2)


@dataclass(frozen=True, slots=True)
class MemoryParts:
    """A peak taken apart: what the model state holds on the device, and everything else."""

    peak_mib: float
    parameters_mib: float | None
    optimizer_mib: float | None
    """The optimizer state on the device (None: not known apart from the parameters)."""
    host_mib: float | None
    rest_mib: float | None
    """Activations, gradients, temporaries and, on CUDA, the allocator's cache."""


def memory_parts(trial: Trial) -> MemoryParts | None:
    if not trial.ok:
        return None
    state, parameters = trial.state_mib, trial.parameters_mib
    optimizer = state - parameters if state is not None and parameters is not None else None
    rest = trial.peak_mib - state if state is not None else None  # type: ignore[operator]
    return MemoryParts(trial.peak_mib, parameters, optimizer, trial.host_state_mib, rest)  # type: ignore[arg-type]


def what_stops(parts: MemoryParts, target_mib: float) -> str | None:
    """What keeps a peak over the target: "parameters" when they alone exceed it (only sharding
    helps), "model state" when parameters and the optimizer state do (offload the optimizer or
    shard), "the rest" when activations and the others do; None when it fits."""
    if parts.peak_mib <= target_mib:
        return None
    if parts.parameters_mib is not None and parts.parameters_mib >= target_mib:
        return "parameters"
    state = (parts.parameters_mib or 0.0) + (parts.optimizer_mib or 0.0)
    if parts.optimizer_mib is not None and state >= target_mib:
        return "model state"
    return "the rest"
