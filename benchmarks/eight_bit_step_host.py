"""What one step of AdamW with 8-bit moments costs the host, by the loop that drives it. CPU or
CUDA.

    python benchmarks/eight_bit_step_host.py [--steps 20] [--warmup 5] [--device cpu]

The tensors are BERT-base's as the bert recipe builds it, in number and kind: each parameter that
torchao quantizes (4,096 elements or more, in whole blocks of 256) becomes one of 4,096 elements,
each other keeps its own size, so the arithmetic is small and the time is the loop's. Three
loops step them: torchao's own (a torch.compile wrapper built per parameter per step), the
harness's with torchao's update compiled once for every parameter, and the harness's as it
runs (compiled once for the quantized tensors, torch's multi-tensor AdamW for the rest). Prints
the median milliseconds of a step, synchronized, and the parameters of each kind.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpuconsole" / "recipes"))
import _recipe_harness as harness

import bert

QUANTIZED_SIZE = 4096


def bert_shaped_parameters(device: torch.device) -> list[torch.nn.Parameter]:
    """BERT-base's parameters in number and kind, the quantized ones cut to 4,096 elements."""
    knobs = bert.parse_knobs(["--preset", "tuned", "--padding", "fixed"])
    with torch.device("meta"):
        model = bert.MaskedLanguageModel(knobs)
    sizes = [
        QUANTIZED_SIZE if p.numel() >= QUANTIZED_SIZE and p.numel() % 256 == 0 else p.numel()
        for p in model.parameters()
    ]
    return [torch.nn.Parameter(torch.randn(size, device=device)) for size in sizes]


def step_ms(optimizer: torch.optim.Optimizer, parameters: list, steps: int, warmup: int) -> float:
    """Median milliseconds of one synchronized step, on fresh gradients each time."""
    times = []
    for step in range(warmup + steps):
        for parameter in parameters:
            parameter.grad = torch.randn_like(parameter)
        if parameters[0].is_cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        optimizer.step()
        if parameters[0].is_cuda:
            torch.cuda.synchronize()
        if step >= warmup:
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    from torchao.optim import AdamW8bit

    device = torch.device(args.device)
    compiled_once = harness.eight_bit(torch.optim.AdamW)
    loops = {
        "torchao's own loop": lambda ps: AdamW8bit(ps, lr=1e-4),
        "compiled once, every tensor": lambda ps: _every_tensor_compiled(compiled_once)(
            ps, lr=1e-4
        ),
        "compiled once + multi-tensor AdamW": lambda ps: compiled_once(ps, lr=1e-4),
    }
    for name, make in loops.items():
        parameters = bert_shaped_parameters(device)
        optimizer = make(parameters)
        ms = step_ms(optimizer, parameters, args.steps, args.warmup)
        torch._dynamo.reset()
        quantized = sum(p.numel() == QUANTIZED_SIZE for p in parameters)
        print(
            f"{name:36} {ms:7.2f} ms a step  ({len(parameters)} parameters, {quantized} "
            f"quantized; {args.device})",
            flush=True,
        )
    return 0


def _every_tensor_compiled(compiled_once: type) -> type:
    """The harness's loop as it was before the unquantized tensors went to torch's AdamW."""

    class EveryTensorCompiled(compiled_once):
        def _adamws_own(self, parameter: torch.Tensor, group: dict) -> bool:
            return False

    return EveryTensorCompiled


if __name__ == "__main__":
    sys.exit(main())
