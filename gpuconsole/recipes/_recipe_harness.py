"""What every recipe shares: the command line and presets, the runtime (device, precision,
DistributedDataParallel under torchrun), the training loop and its JSON lines, and errors.

The console writes this file beside the recipe on the host (`_recipe_harness.py`); a recipe run
as `python3 recipe.py` or under torchrun finds it in its own directory. Standard library and torch
only.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import itertools
import json
import os
import platform
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.checkpoint import checkpoint
except ImportError as missing:  # the host has no usable torch: say so the way every failure is said
    print(json.dumps({"event": "error", "kind": "dependency", "message": str(missing)}), flush=True)
    sys.exit(1)


EXIT_FAILURE = 1
EXIT_USAGE = 2
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class RecipeError(Exception):
    """A failure with a kind the console can act on: usage, dependency, no-cuda, oom, nccl."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class JsonArgumentParser(argparse.ArgumentParser):
    """Argument errors become error events, so every failure reads the same to the console."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise RecipeError("usage", message)


@dataclass
class Runtime:
    device: torch.device
    rank: int
    local_rank: int
    world_size: int


@dataclass
class Batch:
    data: Any
    samples: int
    tokens: int = 0


def emit(event: dict[str, Any], rt: Runtime | None = None) -> None:
    """Print one JSON line; under torchrun only rank 0 speaks."""
    if rt is None or rt.rank == 0:
        print(json.dumps(event), flush=True)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def common_parser(description: str, presets: dict[str, dict[str, Any]]) -> JsonArgumentParser:
    """The flags every recipe shares; a flag left out (None) takes the preset's value."""
    parser = JsonArgumentParser(description=description)
    on_off = argparse.BooleanOptionalAction
    parser.add_argument("--preset", choices=sorted(presets), default="tuned")
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16", "fp16"))
    parser.add_argument("--channels-last", action=on_off)
    parser.add_argument("--compile", action=on_off)
    parser.add_argument("--compile-mode", choices=COMPILE_MODES)
    parser.add_argument("--cudnn-benchmark", action=on_off)
    parser.add_argument("--fused-optimizer", action=on_off)
    parser.add_argument("--batch-size", type=positive_int, help="per process")
    parser.add_argument("--accumulate", type=positive_int, help="micro-batches per optimizer step")
    parser.add_argument("--checkpoint-activations", action=on_off)
    parser.add_argument(
        "--workers", type=non_negative_int, help="DataLoader workers, where there is one"
    )
    parser.add_argument(
        "--steps", type=non_negative_int, help="measured micro-batches after warm-up"
    )
    parser.add_argument("--warmup-steps", type=non_negative_int, help="micro-batches not measured")
    parser.add_argument("--log-every", type=positive_int)
    parser.add_argument("--device", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, for CPU tests")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def resolve_knobs(
    args: argparse.Namespace, presets: dict[str, dict[str, Any]], defaults: dict[str, Any]
) -> dict[str, Any]:
    """Recipe defaults, then the preset, then every flag given explicitly."""
    knobs = {**defaults, **presets[args.preset]}
    knobs.update({name: value for name, value in vars(args).items() if value is not None})
    if knobs.get("device") is None:
        knobs["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    if knobs["precision"] == "fp16" and knobs["device"] == "cpu":
        raise RecipeError("usage", "fp16 needs --device cuda (GradScaler); use bf16 on a CPU")
    if not knobs["compile"]:
        knobs["compile_mode"] = None
    knobs["tf32"] = knobs["device"] == "cuda" and knobs["precision"] != "fp32"
    return knobs


def start_runtime(knobs: dict[str, Any]) -> Runtime:
    """Pick the device and, under torchrun (WORLD_SIZE > 1), join the process group."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if knobs["device"] == "cuda":
        if not torch.cuda.is_available():
            raise RecipeError("no-cuda", "--device cuda, but torch.cuda.is_available() is False")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.manual_seed(knobs["seed"] + rank)
    return Runtime(device, rank, local_rank, world_size)


def configure_math(knobs: dict[str, Any]) -> None:
    """cuDNN autotuning, and TF32 for fp32 matmuls and convolutions unless precision is fp32."""
    torch.backends.cudnn.benchmark = knobs["cudnn_benchmark"]
    mode = "tf32" if knobs["tf32"] else "ieee"
    if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9 names precision per backend
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
    else:
        torch.backends.cuda.matmul.allow_tf32 = knobs["tf32"]
        torch.backends.cudnn.allow_tf32 = knobs["tf32"]


def autocast(knobs: dict[str, Any], rt: Runtime) -> contextlib.AbstractContextManager:
    dtype = AMP_DTYPES.get(knobs["precision"])
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(rt.device.type, dtype=dtype)


def grad_scaler(knobs: dict[str, Any], rt: Runtime) -> Any:
    """Loss scaling for fp16 only; a disabled scaler passes losses and steps straight through."""
    enabled = knobs["precision"] == "fp16"
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(rt.device.type, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


class Checkpointed(nn.Module):
    """Recomputes the wrapped block in backward instead of keeping its activations."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        return checkpoint(self.inner, *args, use_reentrant=False)


def prepare_model(model: nn.Module, knobs: dict[str, Any], rt: Runtime) -> nn.Module:
    """Move to the device, then DistributedDataParallel, then torch.compile (in that order)."""
    model = model.to(rt.device)
    if knobs.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    if rt.world_size > 1:
        device_ids = [rt.device.index] if rt.device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    if knobs["compile"]:
        dynamic = knobs.get("compile_dynamic")  # None: recompile as dynamic on a new shape
        model = torch.compile(model, mode=knobs["compile_mode"], dynamic=dynamic)
    return model


def make_optimizer(
    optimizer_class: type[torch.optim.Optimizer], model: nn.Module, knobs: dict[str, Any], **kw: Any
) -> torch.optim.Optimizer:
    """Fused (one kernel for all parameters) when asked and this torch offers it."""
    fused = knobs["fused_optimizer"] and "fused" in inspect.signature(optimizer_class).parameters
    knobs["fused_optimizer"] = fused
    extra = {"fused": True} if fused else {}
    return optimizer_class(model.parameters(), **kw, **extra)


def loader_batches(
    dataset: torch.utils.data.Dataset,
    knobs: dict[str, Any],
    rt: Runtime,
    to_batch: Callable[[Any], Batch],
) -> Iterator[Batch]:
    """Endless batches from a DataLoader with workers and pinned memory; under torchrun a
    DistributedSampler gives each rank its own share of every epoch."""
    sampler: torch.utils.data.Sampler
    if rt.world_size > 1:
        sampler = torch.utils.data.DistributedSampler(dataset, seed=knobs["seed"], drop_last=True)
    else:
        sampler = torch.utils.data.RandomSampler(dataset)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=knobs["batch_size"],
        sampler=sampler,
        num_workers=knobs["workers"],
        pin_memory=rt.device.type == "cuda",
        drop_last=True,
        persistent_workers=knobs["workers"] > 0,
    )
    if len(loader) == 0:
        raise RecipeError("usage", f"fewer samples than one batch of {knobs['batch_size']}")
    return (to_batch(item) for epoch in itertools.count() for item in epoch_of(loader, epoch))


def epoch_of(loader: torch.utils.data.DataLoader, epoch: int) -> torch.utils.data.DataLoader:
    if isinstance(loader.sampler, torch.utils.data.DistributedSampler):
        loader.sampler.set_epoch(epoch)
    return loader


def synchronize(rt: Runtime) -> None:
    if rt.device.type == "cuda":
        torch.cuda.synchronize(rt.device)


def peak_memory(rt: Runtime) -> tuple[float, str]:
    """Peak memory in MiB and where it was read: the CUDA allocator, or the process's RSS."""
    if rt.device.type == "cuda":
        return torch.cuda.max_memory_allocated(rt.device) / 2**20, "cuda-max-memory-allocated"
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 1024, "process-rss-high-water"


def global_sum(values: list[float], rt: Runtime) -> list[float]:
    if rt.world_size == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=rt.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def global_max(value: float, rt: Runtime) -> float:
    if rt.world_size == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=rt.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.item()


def train(
    recipe: str,
    knobs: dict[str, Any],
    rt: Runtime,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[Batch],
    loss_of: Callable[[nn.Module, Any], torch.Tensor],
) -> dict[str, Any]:
    """Warm-up, then measured micro-batches; returns the summary's measured fields.

    Every log step synchronizes; between them the host never waits for the device. Samples/s
    are global: each window's counts are summed over ranks.
    """
    scaler = grad_scaler(knobs, rt)
    accumulate, warmup = knobs["accumulate"], knobs["warmup_steps"]
    total = warmup + knobs["steps"]
    optimizer.zero_grad(set_to_none=True)
    optimizer_steps = 0
    logged_losses: list[float] = []
    measured = {"samples": 0.0, "tokens": 0.0, "seconds": 0.0}
    window_samples = window_tokens = 0
    synchronize(rt)
    no_sync = getattr(model, "no_sync", None)  # DistributedDataParallel's
    window_start = time.perf_counter()
    for step in range(1, total + 1):
        batch = next(batches)
        optimizer_due = step % accumulate == 0
        skip_sync = no_sync() if no_sync and not optimizer_due else contextlib.nullcontext()
        with skip_sync:
            with autocast(knobs, rt):
                loss = loss_of(model, batch.data)
            scaler.scale(loss / accumulate).backward()
        if optimizer_due:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            optimizer_steps += 1
        window_samples += batch.samples
        window_tokens += batch.tokens
        if step % knobs["log_every"] and step not in (1, warmup, total):
            continue
        samples, tokens, loss_sum = global_sum(
            [window_samples, window_tokens, loss.detach().float().item()], rt
        )
        seconds = time.perf_counter() - window_start
        logged_losses.append(loss_sum / rt.world_size)
        if step > warmup:
            measured["samples"] += samples
            measured["tokens"] += tokens
            measured["seconds"] += seconds
        mib, _ = peak_memory(rt)
        event = {
            "event": "step",
            "recipe": recipe,
            "step": step,
            "phase": "warmup" if step <= warmup else "measured",
            "samples_per_s": samples / seconds,
            "loss": logged_losses[-1],
            "peak_memory_mib": mib,
        }
        if tokens:
            event["tokens_per_s"] = tokens / seconds
        emit(event, rt)
        window_samples = window_tokens = 0
        window_start = time.perf_counter()
    mib, source = peak_memory(rt)
    seconds = measured["seconds"]
    result = {
        "samples_per_s": measured["samples"] / seconds if seconds else None,
        "peak_memory_mib": global_max(mib, rt),
        "memory_source": source,
        "steps": knobs["steps"],
        "warmup_steps": warmup,
        "optimizer_steps": optimizer_steps,
        "measured_seconds": seconds,
        "loss_first": logged_losses[0] if logged_losses else None,
        "loss_last": logged_losses[-1] if logged_losses else None,
    }
    if measured["tokens"]:
        result["tokens_per_s"] = measured["tokens"] / seconds
    return result


def summary(
    recipe: str, knobs: dict[str, Any], rt: Runtime, result: dict[str, Any]
) -> dict[str, Any]:
    if rt.device.type == "cuda":
        device_name = torch.cuda.get_device_name(rt.device)
    else:
        device_name = f"cpu ({platform.machine()})"
    knobs["global_batch"] = knobs["batch_size"] * rt.world_size
    knobs["samples_per_optimizer_step"] = knobs["global_batch"] * knobs["accumulate"]
    return {
        "event": "summary",
        "recipe": recipe,
        "preset": knobs["preset"],
        "knobs": knobs,
        "world_size": rt.world_size,
        "device_name": device_name,
        "torch": torch.__version__,
        **result,
    }


def error_kind(exc: BaseException) -> str:
    if isinstance(exc, RecipeError):
        return exc.kind
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "CUDA out of memory" in str(exc):
        return "oom"
    backend_error = getattr(dist, "DistBackendError", ())
    if isinstance(exc, backend_error) or "nccl" in str(exc).lower():
        return "nccl"
    return "other"


def run(main: Callable[[list[str]], None], argv: list[str]) -> int:
    """Run a recipe's main; any failure becomes one error event and a non-zero status."""
    try:
        main(argv)
        return 0
    except Exception as exc:
        kind = error_kind(exc)
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        message = "\n".join(lines[:3]) if kind == "oom" else "\n".join(lines)
        if kind == "other":
            message = f"{type(exc).__name__}: {message}"
            traceback.print_exc(file=sys.stderr)
        event = {"event": "error", "kind": kind, "message": message}
        event["rank"] = int(os.environ.get("RANK", "0"))
        print(json.dumps(event), flush=True)
        return EXIT_USAGE if kind == "usage" else EXIT_FAILURE
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
