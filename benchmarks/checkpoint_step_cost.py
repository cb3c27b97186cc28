"""Whether a checkpointed bert step is bound by the host or by the GPU, and what each memory fix
costs on either side. CUDA only.

    python benchmarks/checkpoint_step_cost.py [--steps 30] [--warmup 10] [--profile] [--compile]
                                              [--eight-bit]

For each set of recipe flags (BERT-base, sequence 512 fixed, batch 32, bf16; eager, or with
--compile as the tuned preset runs it: compiled, fused AdamW), it builds the recipe's model as
`bert.py` does and times every step three ways: the host's time to enqueue it (no
synchronization), the wall time to its end (synchronized), and the GPU's time between two
events; and the step's peak allocated memory. Enqueue close to wall means the host is the
bottleneck. Eager checkpointed sets run twice: with the reentrant checkpoints `recompute` picks,
and with the non-reentrant kind everywhere (compiled, checkpoints are always non-reentrant).
--eight-bit (compiled) compares AdamW's moments in 8 bits stepped by the harness's loop, which
compiles torchao's update once, with torchao's own loop, which wraps it anew per parameter.
Prints the medians, one line per run; with --profile also, for three more steps of each run,
the host calls that took longest (torch.profiler) and how many waited for the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch._functorch.config as functorch_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpuconsole" / "recipes"))
import _recipe_harness as harness

import bert

CHECKPOINT = ("--checkpoint-every", "1")
SELECTIVE = (*CHECKPOINT, "--selective-checkpoint")
OFFLOAD = ("--offload-optimizer",)
FLAG_SETS = (
    (),
    CHECKPOINT,
    SELECTIVE,
    OFFLOAD,
    (*CHECKPOINT, "--optimizer-in-backward"),
    (*CHECKPOINT, *OFFLOAD),
    (*CHECKPOINT, "--compress-activations", "fp8"),
    (*CHECKPOINT, "--optimizer-in-backward", "--compress-activations", "fp8"),
)
COMPILED_SETS = (
    (),
    CHECKPOINT,
    SELECTIVE,
    ("--activation-memory-budget", "0.5"),
    OFFLOAD,
    (*CHECKPOINT, "--optimizer-in-backward"),
    (*CHECKPOINT, *OFFLOAD),
)
"""Compiled, compression is left out: it runs eagerly."""
EIGHT_BIT_SETS = ((), (*CHECKPOINT, "--optimizer-8bit"))
"""With --eight-bit (compiled): the job alone, and checkpointed with AdamW's moments in 8 bits,
twice: stepped by the harness's loop and by torchao's own."""


WAITS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def step_times(
    flags: tuple[str, ...], steps: int, warmup: int, profile: bool, compiled: bool
) -> tuple[float, float, float, float]:
    """Median enqueue, wall and GPU milliseconds of a step, and the peak allocated GiB."""
    preset = ("--preset", "tuned") if compiled else ("--no-compile",)
    knobs = bert.parse_knobs([*preset, "--padding", "fixed", "--precision", "bf16", *flags])
    runtime = harness.start_runtime(knobs)
    harness.configure_math(knobs)
    torch.manual_seed(0)
    model = bert.MaskedLanguageModel(knobs, loss_rows=bert.loss_rows(knobs))
    blocks = [(model.layers, index) for index in range(len(model.layers))]
    harness.checkpoint_blocks(blocks, knobs["checkpoint_every"], knobs["selective_checkpoint"])
    model = harness.prepare_model(model, knobs, runtime)
    optimizer = harness.make_optimizer(torch.optim.AdamW, model, knobs, lr=1e-4)
    batches = bert.token_batches(knobs, runtime, [])
    compress = knobs["compress_activations"]
    hooks = harness.SavedActivations(compress) if compress else contextlib.nullcontext()
    enqueue, wall, gpu = [], [], []

    def one_step(data: tuple[torch.Tensor, ...]) -> None:
        with hooks, harness.autocast(knobs, runtime):
            loss = bert.masked_lm_loss(model, data)
        loss.backward()
        if compress:
            hooks.release_held()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for step in range(warmup + steps):
        if step == warmup:
            torch.cuda.reset_peak_memory_stats()
        batch = next(batches)  # drawn before the clock starts
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began = time.perf_counter()
        start.record()
        one_step(batch.data)
        end.record()
        enqueued = time.perf_counter()
        torch.cuda.synchronize()
        if step >= warmup:
            enqueue.append((enqueued - began) * 1e3)
            wall.append((time.perf_counter() - began) * 1e3)
            gpu.append(start.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated() / 2**30
    if profile:
        print_profile(lambda: one_step(next(batches).data))
    medians = (statistics.median(enqueue), statistics.median(wall), statistics.median(gpu))
    return (*medians, peak)


def print_profile(one_step: Callable[[], None], steps: int = 3) -> None:
    """The host calls that took longest over ``steps`` steps, and the waits for the GPU."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(steps):
            one_step()
        torch.cuda.synchronize()
    averages = profiler.key_averages()
    waits = {e.key: e.count for e in averages if e.key.startswith(WAITS)}
    print(f"  waits for the GPU over {steps} steps: {waits or 'none'}")
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    for event in top:
        host_ms = event.self_cpu_time_total / 1e3 / steps
        print(f"  {host_ms:7.2f} ms a step  {event.count // steps:5d}×  {event.key}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="and where the host's time goes")
    parser.add_argument(
        "--compile", action="store_true", help="as the tuned preset runs: compiled, fused AdamW"
    )
    parser.add_argument(
        "--eight-bit",
        action="store_true",
        help="compiled: 8-bit moments, the harness's loop against torchao's own",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("checkpoint_step_cost: needs CUDA", file=sys.stderr)
        return 2
    compiled = args.compile or args.eight_bit
    sets = EIGHT_BIT_SETS if args.eight_bit else COMPILED_SETS if compiled else FLAG_SETS
    compiled_once = harness._compiled_once
    for flags in sets:
        eager_checkpoints = CHECKPOINT[0] in flags and not compiled
        eight_bit = "--optimizer-8bit" in flags
        for variant in (True, False) if eager_checkpoints or eight_bit else (True,):
            harness.REENTRANT_WHERE_POSSIBLE = variant or not eager_checkpoints
            harness._compiled_once = compiled_once if variant else lambda low_bit, _: low_bit
            times = step_times(flags, args.steps, args.warmup, args.profile, compiled)
            enqueue, wall, gpu, peak = times
            torch._dynamo.reset()  # each set compiles its own graph
            functorch_config.activation_memory_budget = 1.0
            name = " ".join(flags) or "(bf16 alone)"
            if eight_bit:
                kind = "harness's 8-bit loop" if variant else "torchao's 8-bit loop"
            elif compiled:
                kind = "compiled"
            else:
                kind = "reentrant where possible" if variant else "non-reentrant"
            print(
                f"{name:72} {kind:24} enqueue {enqueue:5.1f} ms  wall {wall:5.1f} ms  "
                f"GPU {gpu:5.1f} ms  {32_000 / wall:6.1f} samples/s  peak {peak:5.2f} GiB",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
