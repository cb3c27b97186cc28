"""What every recipe shares: the command line and presets, the runtime (device, precision,
DistributedDataParallel under torchrun), the training loop and its JSON lines, and errors.

The console writes this file beside the recipe on the host (`_recipe_harness.py`); a recipe run
as `python3 recipe.py` or under torchrun finds it in its own directory. Standard library and torch
only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import gc
import inspect
import itertools
import json
import math
import os
import platform
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.optim.adamw import adamw
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )
except ImportError as missing:  # the host has no usable torch: say so the way every failure is said
    print(json.dumps({"event": "error", "kind": "dependency", "message": str(missing)}), flush=True)
    sys.exit(1)


EXIT_FAILURE = 1
EXIT_USAGE = 2
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPRESSED_TYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
COMPRESS_MIN_ELEMENTS = 4096  # smaller saved tensors are not worth a conversion
MEMORY_HISTORY_ENTRIES = 200_000
COMPILE_BACKENDS = ("inductor", "aot_eager_decomp_partition")
MEMORY_DEFAULTS: dict[str, Any] = {
    "checkpoint_every": 0,
    "selective_checkpoint": False,
    "activation_memory_budget": None,
    "compress_activations": None,
    "expandable_segments": False,
    "optimizer_in_backward": False,
    "offload_optimizer": False,
    "optimizer_8bit": False,
    "compile_backend": "inductor",
    "steady_within": None,
    "max_steps": None,
}
"""Every recipe's memory and measurement knobs, off: the recipe's defaults and preset come after."""


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


def share(text: str) -> float:
    """A share above 0, at most 1: a --steady-within of 0 could never be met, and a memory budget
    of 0 is the partitioner's shortcut that saves the graph's inputs alone, skipping even the
    search that bans recomputing random operations (pytorch/pytorch#190717)."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a share above 0 and at most 1")
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
    parser.add_argument(
        "--checkpoint-every",
        type=non_negative_int,
        metavar="K",
        help="recompute every K-th block in backward instead of keeping its activations "
        "(1: every block, 0: none)",
    )
    parser.add_argument(
        "--selective-checkpoint",
        action=on_off,
        help="in the checkpointed blocks, keep what matmuls, convolutions and attention made and "
        "recompute only the cheap operations between them",
    )
    parser.add_argument(
        "--activation-memory-budget",
        type=share,
        metavar="SHARE",
        help="torch.compile's partitioner saves at most this share of the activations it would "
        "save for speed and recomputes the cheapest of the rest (needs --compile)",
    )
    parser.add_argument(
        "--compress-activations",
        choices=tuple(COMPRESSED_TYPES),
        help="keep the activations saved for backward in a narrower type",
    )
    parser.add_argument(
        "--optimizer-in-backward",
        action=on_off,
        help="step the optimizer during backward, a block at a time, and free each gradient "
        "as soon as it is used: the whole model's gradients never exist at once",
    )
    parser.add_argument(
        "--offload-optimizer",
        action=on_off,
        help="keep the optimizer's state and a master copy of the parameters in the host's "
        "memory: each block's gradients go to the host as backward completes them, the host steps "
        "them while the GPU works, and the new parameters come back before the next forward",
    )
    parser.add_argument(
        "--optimizer-8bit",
        action=on_off,
        help="keep AdamW's two moments in 8 bits, block-wise quantized (torchao's AdamW8bit): "
        "a quarter of their memory; needs torchao",
    )
    parser.add_argument(
        "--expandable-segments",
        action=on_off,
        help="PyTorch's allocator grows segments instead of caching fixed blocks (CUDA)",
    )
    parser.add_argument(
        "--memory-history",
        action="store_true",
        help="record every allocation (CUDA) and print the sites that held most at the peak",
    )
    parser.add_argument(
        "--workers", type=non_negative_int, help="DataLoader workers, where there is one"
    )
    parser.add_argument(
        "--steps", type=non_negative_int, help="measured micro-batches after warm-up"
    )
    parser.add_argument("--warmup-steps", type=non_negative_int, help="micro-batches not measured")
    parser.add_argument(
        "--steady-within",
        type=share,
        metavar="SHARE",
        help="after --steps, measure more rounds of --steps until the first and the second half "
        "of the measured steps agree on samples/s within this share (up to --max-steps)",
    )
    parser.add_argument(
        "--max-steps", type=positive_int, help="measured steps at most (default 4 × --steps)"
    )
    parser.add_argument(
        "--compile-backend",
        choices=COMPILE_BACKENDS,
        help="torch.compile's backend: inductor (the default), or aot_eager_decomp_partition, "
        "the same partitioner without generating code (for tests)",
    )
    parser.add_argument("--log-every", type=positive_int)
    parser.add_argument("--device", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, for CPU tests")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def resolve_knobs(
    args: argparse.Namespace, presets: dict[str, dict[str, Any]], defaults: dict[str, Any]
) -> dict[str, Any]:
    """Recipe defaults, then the preset, then every flag given explicitly."""
    knobs = {**MEMORY_DEFAULTS, **defaults, **presets[args.preset]}
    knobs.update({name: value for name, value in vars(args).items() if value is not None})
    if knobs.get("device") is None:
        knobs["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    if knobs["precision"] == "fp16" and knobs["device"] == "cpu":
        raise RecipeError("usage", "fp16 needs --device cuda (GradScaler); use bf16 on a CPU")
    if not knobs["compile"]:
        if args.compile_mode is not None:  # asked for, it would be dropped without a word
            raise RecipeError("usage", "--compile-mode is torch.compile's: add --compile")
        knobs["compile_mode"] = None
    _check_memory_knobs(knobs)
    knobs["tf32"] = knobs["device"] == "cuda" and knobs["precision"] != "fp32"
    return knobs


def _check_memory_knobs(knobs: dict[str, Any]) -> None:
    """The memory fixes that cannot be combined, or need something else, refused by name."""
    if knobs["compress_activations"] and knobs["compile"]:
        raise RecipeError(
            "usage", "--compress-activations works eagerly: add --no-compile (hooks on saved "
            "tensors do not combine with torch.compile)"
        )  # fmt: skip
    if knobs["activation_memory_budget"] is not None and not knobs["compile"]:
        raise RecipeError(
            "usage", "--activation-memory-budget is torch.compile's partitioner: add --compile"
        )  # fmt: skip
    if knobs["selective_checkpoint"] and not knobs["checkpoint_every"]:
        raise RecipeError(
            "usage", "--selective-checkpoint chooses what checkpointed blocks keep: add "
            "--checkpoint-every K"
        )  # fmt: skip
    if knobs["optimizer_8bit"] and knobs["offload_optimizer"]:
        raise RecipeError(
            "usage", "--offload-optimizer keeps the state on the host, --optimizer-8bit narrows "
            "it on the GPU: choose one"
        )  # fmt: skip
    if knobs["optimizer_in_backward"] and knobs["offload_optimizer"]:
        raise RecipeError(
            "usage", "--offload-optimizer already steps each block in backward, on the host: "
            "drop --optimizer-in-backward"
        )  # fmt: skip
    for flag in ("optimizer_in_backward", "offload_optimizer"):
        if knobs[flag]:
            _check_step_in_backward(knobs, "--" + flag.replace("_", "-"))


def _check_step_in_backward(knobs: dict[str, Any], flag: str) -> None:
    """A step inside backward needs each backward to end a whole step, on unscaled gradients
    that no other process still has to average."""
    if knobs["accumulate"] > 1:
        raise RecipeError("usage", f"{flag} steps on every backward: drop --accumulate")
    if knobs["precision"] == "fp16":
        raise RecipeError("usage", f"{flag} cannot unscale fp16 gradients: use bf16")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RecipeError(
            "usage", f"{flag} runs on one process: gradients are stepped before "
            "DistributedDataParallel averages them"
        )  # fmt: skip


def start_runtime(knobs: dict[str, Any]) -> Runtime:
    """Pick the device and, under torchrun (WORLD_SIZE > 1), join the process group."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if knobs.get("expandable_segments"):  # read when the allocator starts: before any CUDA call
        settings = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(
            filter(None, (settings, "expandable_segments:True"))
        )
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


REENTRANT_WHERE_POSSIBLE = True
"""Checkpoint with the reentrant kind where it is correct (see `recompute`); False: always the
non-reentrant kind (benchmarks/checkpoint_step_cost.py compares the two)."""


KEPT_BY_SELECTIVE_CHECKPOINT = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)
"""The aten operations whose outputs a selective checkpoint keeps: the matmuls, convolutions and
attention, where the time goes; everything between them (casts, norms, GELU, dropout, additions)
is recomputed. The same list as torchtitan's op-level selective checkpointing, with convolution
for the vision recipes; the names this torch lacks are left out."""


def _kept_operations() -> frozenset[Any]:
    found = (getattr(torch.ops.aten, name, None) for name in KEPT_BY_SELECTIVE_CHECKPOINT)
    return frozenset(packet.default for packet in found if packet is not None)


KEPT_OPERATIONS = _kept_operations()


def keep_matmuls(context: Any, operation: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """The selective checkpoint's policy (`torch.utils.checkpoint.create_selective_checkpoint_
    contexts`, PyTorch's "Selective Activation Checkpoint"): MUST_SAVE for `KEPT_OPERATIONS`,
    PREFER_RECOMPUTE for the rest. Under torch.compile the partitioner reads the same decision
    off each node. Where tensors are counted (no CUDA) and this torch hands the policy the
    operation's output (``op_output``), what is kept is counted until the end of backward."""
    if operation not in KEPT_OPERATIONS:
        return CheckpointPolicy.PREFER_RECOMPUTE
    meter = SavedActivations.active
    if meter is not None and not context.is_recompute:
        meter.hold_until_backward(getattr(context, "op_output", None))
    return CheckpointPolicy.MUST_SAVE


SELECTIVE = functools.partial(create_selective_checkpoint_contexts, keep_matmuls)


def recompute(function: Callable[..., Any], *args: Any, selective: bool = False) -> Any:
    """``function(*args)``, its activations recomputed in backward instead of kept (``selective``:
    all but what `keep_matmuls` keeps); for a block whose parameters no other call uses (under
    DistributedDataParallel a reentrant backward marks them ready, and a parameter may be marked
    once a step).

    The reentrant kind where an argument needs a gradient, eagerly and without a policy: it runs
    the forward without autograd and recomputes inside a nested backward, which costs the host
    fewer Python calls than the non-reentrant kind's hooks on every saved tensor, and a
    checkpointed step is bound by the host (on an H200, bert at batch 32 took 50.9 instead of
    57.8 ms to enqueue a step, and the GPU finished 4 ms after). Elsewhere the non-reentrant kind:
    with no such argument the reentrant kind would give the block's parameters no gradient; a
    policy (``context_fn``) needs it; and torch.compile traces it into its graph, where the
    partitioner recomputes the block (PyTorch's docs of torch.utils.checkpoint: "use_reentrant=
    False" is the kind torch.compile supports). The non-reentrant kind keeps its inputs itself,
    not through saved-tensor hooks, so where tensors are counted they are counted here."""
    compiling = torch.compiler.is_compiling()
    reentrant = (
        REENTRANT_WHERE_POSSIBLE
        and not (selective or compiling)
        and any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args)
    )
    if reentrant:
        return checkpoint(function, *args, use_reentrant=True)
    meter = None if compiling else SavedActivations.active
    if meter is not None:
        for arg in args:
            meter.hold_until_backward(arg)
    if selective:
        return checkpoint(function, *args, use_reentrant=False, context_fn=SELECTIVE)
    return checkpoint(function, *args, use_reentrant=False)


class Checkpointed(nn.Module):
    """Recomputes the wrapped block in backward instead of keeping its activations (``selective``:
    keeps what `keep_matmuls` names, recomputes the rest).

    The checkpoint keeps the block's input: where `SavedActivations` hooks are active they count
    it, and narrow it when compressing (the reentrant kind saves it for backward like any
    activation; `recompute` counts what the non-reentrant kind keeps)."""

    def __init__(self, inner: nn.Module, selective: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.selective = selective

    def forward(self, *args: Any) -> Any:
        return recompute(self.inner, *args, selective=self.selective)


def checkpoint_blocks(
    slots: Sequence[tuple[Any, int | str]], every: int, selective: bool = False
) -> int:
    """Wrap every ``every``-th block (the first, then each k-th after it) in `Checkpointed`.

    ``slots`` are the model's blocks in forward order as (container, key): a ModuleList or
    Sequential indexed by position, or a module and an attribute name. Returns how many were
    wrapped; ``every`` 0 wraps none."""
    wrapped = 0
    for position, (container, key) in enumerate(slots):
        if every < 1 or position % every:
            continue
        if isinstance(key, str):
            setattr(container, key, Checkpointed(getattr(container, key), selective))
        else:
            container[key] = Checkpointed(container[key], selective)
        wrapped += 1
    return wrapped


class SavedActivations(torch.autograd.graph.saved_tensors_hooks):
    """Hooks on the tensors autograd saves for backward: optionally keeps them in a narrower type
    (bf16, or fp8 with a per-tensor scale), and counts the bytes held, live, and their peak.

    Parameters and views of them are left alone and not counted (autograd saves a reference, not
    a copy); autocast's copies of them are counted but not narrowed; small or non-float tensors
    are kept as they are. Inside a checkpointed block the checkpoint's own hooks apply instead:
    what it recomputes is not saved, so it is neither compressed nor counted. What a checkpoint
    keeps by other means (a non-reentrant checkpoint's inputs, a selective checkpoint's kept
    outputs) is counted through `hold_until_backward` while the hooks are active (`active`).

    Under torch.compile the compiled graph's saved tensors pass through the same hooks: the count
    is then of what the partitioner chose to save."""

    active: SavedActivations | None = None
    """The meter whose hooks are on now (forward), for what checkpoints keep outside them."""

    def __init__(self, compress: str | None) -> None:
        self.dtype = COMPRESSED_TYPES[compress] if compress else None
        self.live_bytes = 0
        self.peak_bytes = 0
        self._storages: dict[int, list[int]] = {}  # data pointer: [saved tensors on it, bytes]
        self._until_backward: list[int] = []
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> None:
        SavedActivations.active = self
        super().__enter__()

    def __exit__(self, *exc: object) -> None:
        SavedActivations.active = None
        super().__exit__(*exc)

    def hold_until_backward(self, value: Any) -> None:
        """Count the tensors in ``value`` (a tensor or a tuple of them) until `release_held`,
        which the training loop calls after backward. Parameters are references, not copies,
        and tensors of a tracing compiler are not memory: neither is counted."""
        tensors = value if isinstance(value, (tuple, list)) else (value,)
        for tensor in tensors:
            if type(tensor) is torch.Tensor and not _is_parameter(tensor):
                storage = tensor.untyped_storage()
                self.hold(storage)
                self._until_backward.append(storage.data_ptr())

    def release_held(self) -> None:
        for key in self._until_backward:
            self.release(key)
        self._until_backward.clear()

    def _pack(self, tensor: torch.Tensor) -> Any:
        narrow = (
            self.dtype is not None
            and tensor.is_floating_point()
            and tensor.element_size() > self.dtype.itemsize
            and tensor.numel() >= COMPRESS_MIN_ELEMENTS
            and not _is_weight(tensor)
        )
        if not narrow:
            return _Held(self, tensor, tensor, None, None)
        if self.dtype == torch.float8_e4m3fn:
            largest = torch.linalg.vector_norm(tensor.detach(), math.inf, dtype=torch.float32)
            scale = largest.clamp(min=1e-12) / FP8_MAX
            stored = (tensor.detach() / scale).to(self.dtype)
        else:
            scale, stored = None, tensor.detach().to(self.dtype)
        return _Held(self, stored, None, tensor.dtype, scale)

    @staticmethod
    def _unpack(held: _Held) -> torch.Tensor:
        if held.original is not None:
            return held.original
        restored = held.stored.to(held.dtype)
        return restored * held.scale if held.scale is not None else restored

    def hold(self, storage: torch.UntypedStorage) -> None:
        """Count a storage once however many saved tensors view it."""
        key = storage.data_ptr()
        entry = self._storages.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            self.live_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        entry[0] += 1

    def release(self, storage_key: int) -> None:
        entry = self._storages[storage_key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self._storages[storage_key]


def _is_parameter(tensor: torch.Tensor) -> bool:
    """A parameter or a view of one (Linear saves its weight transposed)."""
    base = tensor._base if tensor._base is not None else tensor
    return base.is_leaf and base.requires_grad


def _is_weight(tensor: torch.Tensor) -> bool:
    """A parameter, a view of one, or autocast's lower-precision copy of one: a weight, which
    compression leaves alone (it narrows activations; a weight rounded to fp8 would skew every
    gradient computed through it)."""
    if _is_parameter(tensor):
        return True
    base = tensor._base if tensor._base is not None else tensor
    cast = base.grad_fn
    if cast is None or type(cast).__name__ != "ToCopyBackward0":
        return False
    source = cast.next_functions[0][0]
    return type(source).__name__ == "AccumulateGrad"  # a copy of a leaf that takes a gradient


class _Held:
    """One saved tensor, as kept; its storage leaves the count when autograd lets go of it."""

    __slots__ = ("dtype", "key", "meter", "original", "scale", "stored")

    def __init__(
        self,
        meter: SavedActivations,
        stored: torch.Tensor,
        original: torch.Tensor | None,
        dtype: torch.dtype | None,
        scale: torch.Tensor | None,
    ) -> None:
        self.meter, self.stored, self.original = meter, stored, original
        self.dtype, self.scale = dtype, scale
        self.key = None
        if not _is_parameter(stored):  # a reference to a parameter, not a copy
            storage = stored.untyped_storage()
            meter.hold(storage)
            self.key = storage.data_ptr()

    def __del__(self) -> None:
        if self.key is not None:
            self.meter.release(self.key)


def prepare_model(model: nn.Module, knobs: dict[str, Any], rt: Runtime) -> nn.Module:
    """Move to the device, then DistributedDataParallel, then torch.compile (in that order)."""
    model = model.to(rt.device)
    if knobs.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    if rt.world_size > 1:
        device_ids = [rt.device.index] if rt.device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    if knobs["compile"]:
        model = compiled(model, knobs)
    return model


def compiled(model: nn.Module, knobs: dict[str, Any]) -> nn.Module:
    """torch.compile with the job's mode, backend and shapes, and the partitioner's activation
    memory budget when one is set.

    ``torch._functorch.config.activation_memory_budget`` (PyTorch's functorch config, and its
    test/functorch/test_ac.py): 1 saves what the min-cut partitioner saves for speed, 0 only the
    graph's inputs (refused: see `share`), a share between makes it solve a knapsack for the
    least recomputation that saves at most that share of the difference. The min-cut partitioner
    is inductor's and aot_eager_decomp_partition's (plain aot_eager partitions without it).
    Checkpointed regions stay recomputed whatever the budget.

    A budget below 1 lets the partitioner recompute random operations in backward with fresh
    randomness: dropout's mask in backward is then not forward's, and the gradients are wrong
    (pytorch/pytorch#190758, open; measured here too, on a CPU with torch 2.13). Such a run still
    measures what the budget saves and costs, so it runs, and says so in its knobs
    (``budget_recomputes_dropout``) for the doctor to keep it out of any recommendation."""
    budget = knobs.get("activation_memory_budget")
    if budget is not None:
        import torch._functorch.config as functorch_config

        functorch_config.activation_memory_budget = budget
        knobs["budget_recomputes_dropout"] = budget < 1 and has_dropout(model)
    if knobs.get("selective_checkpoint") and hasattr(
        torch._dynamo.config, "_experimental_support_context_fn_in_torch_utils_checkpoint"
    ):  # the torch releases that still ask for it (2.4); later ones trace a policy by default
        torch._dynamo.config._experimental_support_context_fn_in_torch_utils_checkpoint = True
    dynamic = knobs.get("compile_dynamic")  # None: recompile as dynamic on a new shape
    backend = knobs.get("compile_backend") or "inductor"
    if backend != "inductor":  # compile modes are inductor's
        return torch.compile(model, backend=backend, dynamic=dynamic)
    return torch.compile(model, mode=knobs["compile_mode"], dynamic=dynamic)


def has_dropout(model: nn.Module) -> bool:
    """Whether the model drops anything in training (a dropout module with p above 0)."""
    return any(
        isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0
        for module in model.modules()
    )


def make_optimizer(
    optimizer_class: type[torch.optim.Optimizer], model: nn.Module, knobs: dict[str, Any], **kw: Any
) -> torch.optim.Optimizer | StepInBackward:
    """Fused (one kernel for all parameters) when asked and this torch offers it; stepped inside
    backward (`StepInBackward`) when ``optimizer_in_backward`` is on, on the host (`HostOffload`)
    when ``offload_optimizer`` is."""
    if knobs.get("optimizer_8bit"):
        optimizer_class = eight_bit(optimizer_class)
    fused = knobs["fused_optimizer"] and "fused" in inspect.signature(optimizer_class).parameters
    knobs["fused_optimizer"] = fused
    extra = {"fused": True} if fused else {}
    if knobs.get("offload_optimizer"):
        return HostOffload(optimizer_class, parameter_groups(model), {**kw, **extra})
    if knobs.get("optimizer_in_backward"):
        groups = parameter_groups(model)
        return StepInBackward(groups, [optimizer_class(group, **kw, **extra) for group in groups])
    return optimizer_class(model.parameters(), **kw, **extra)


def eight_bit(optimizer_class: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """torchao's AdamW8bit for AdamW: both moments block-wise quantized to 8 bits (blocks of 256
    with a scale each; tensors under 4,096 elements stay in fp32), the update in fp32 as
    AdamW's. RecipeError for another optimizer, or without torchao."""
    if optimizer_class is not torch.optim.AdamW:
        raise RecipeError(
            "usage", f"--optimizer-8bit narrows AdamW's moments; this recipe steps "
            f"{optimizer_class.__name__}"
        )  # fmt: skip
    try:
        from torchao.optim import AdamW8bit
    except ImportError as error:
        raise RecipeError(
            "dependency", f"--optimizer-8bit needs torchao (pip install torchao): {error}"
        ) from None  # fmt: skip
    update = getattr(sys.modules[AdamW8bit.__module__], "single_param_adam", None)
    if update is None or not hasattr(AdamW8bit, "_new_buffer"):
        return AdamW8bit  # a torchao laid out otherwise than 0.18: its own loop, slower
    return _compiled_once(AdamW8bit, update)


def _compiled_once(
    low_bit: type[torch.optim.Optimizer], update: Callable[..., None]
) -> type[torch.optim.Optimizer]:
    """torchao's low-bit AdamW whose per-parameter ``update`` is wrapped by torch.compile once,
    and whose unquantized tensors are stepped together by torch's multi-tensor AdamW.

    torchao's own step calls ``torch.compile(update, ...)`` anew for every parameter at every
    step, and building that wrapper (torch's trace rules look up the function's file each time)
    costs more than the update: 0.7 ms a parameter on a 2-core host, 140 ms a step for 198
    tensors, against 37 ms with the wrapper built once; for BERT's 153 parameters on an H100
    host, 38 ms of the step's host time against 4.5 (docs/benchmarks.md), and the compiled job's
    step waited on it. The state, its quantization, the arithmetic and the compiled code of the
    quantized tensors are torchao's; only the loop is this one, as torchao's without distributed
    tensors (the recipes train on one device).

    torchao quantizes only tensors of at least 4,096 elements in whole blocks; the others (102 of
    BERT's 153: biases and norms) keep fp32 moments, which are AdamW's own, so one call of
    torch's multi-tensor AdamW (the arithmetic of ``torch.optim.AdamW(foreach=True)``) steps
    them all instead of a compiled call each."""
    compiled = torch.compile(update, fullgraph=True, dynamic=False)

    class CompiledOnce(low_bit):  # type: ignore[misc,valid-type]
        @torch.no_grad()
        def step(self, closure: Callable[[], Any] | None = None) -> Any:
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            # one compiled variant per distinct (shape, dtype, state kind): a fixed number for a
            # model, so no cache limit (as torchao's step)
            with torch._dynamo.utils.disable_cache_limit():
                for group in self.param_groups:
                    unquantized = []
                    for parameter in group["params"]:
                        if parameter.grad is None:
                            continue
                        if self._adamws_own(parameter, group):
                            unquantized.append(parameter)
                        else:
                            self._update(parameter, group)
                    if unquantized:
                        self._update_together(unquantized, group)
            return loss

        def _state(self, parameter: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
            state = self.state[parameter]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = self._new_buffer(parameter, True)
                state["exp_avg_sq"] = self._new_buffer(parameter, False)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = self._new_buffer(parameter, False)
            return state

        def _adamws_own(self, parameter: torch.Tensor, group: dict[str, Any]) -> bool:
            """Whether torch's AdamW steps ``parameter`` as torchao would: fp32, its moments
            not quantized, the decay decoupled."""
            plain = type(self._state(parameter, group)["exp_avg"]) is torch.Tensor
            return plain and self.is_adamw and parameter.dtype is torch.float32

        def _update(self, parameter: torch.Tensor, group: dict[str, Any]) -> None:
            state = self._state(parameter, group)
            state["step"] += 1
            beta1, beta2 = group["betas"]
            compiled(
                parameter.detach(),
                parameter.grad,
                state["step"],
                state["exp_avg"],
                state["exp_avg_sq"],
                state.get("max_exp_avg_sq"),
                group["lr"],
                beta1,
                beta2,
                group["weight_decay"],
                group["eps"],
                self.is_adamw,
                self.bf16_stochastic_round and parameter.dtype is torch.bfloat16,
            )

        def _update_together(self, parameters: list[torch.Tensor], group: dict[str, Any]) -> None:
            states = [self.state[parameter] for parameter in parameters]
            beta1, beta2 = group["betas"]
            adamw(
                parameters,
                [parameter.grad for parameter in parameters],
                [state["exp_avg"] for state in states],
                [state["exp_avg_sq"] for state in states],
                [state["max_exp_avg_sq"] for state in states] if group["amsgrad"] else [],
                [state["step"] for state in states],  # counted on by adamw itself
                foreach=True,
                amsgrad=group["amsgrad"],
                beta1=beta1,
                beta2=beta2,
                lr=float(group["lr"]),  # torchao's is a tensor on the host
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
            )

    CompiledOnce.__name__ = CompiledOnce.__qualname__ = f"{low_bit.__name__}CompiledOnce"
    return CompiledOnce


def parameter_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """The parameters by block: each element of a top-level ModuleList or Sequential is one group,
    each other top-level module one, the model's own parameters one. A parameter shared between
    blocks belongs to the first."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    blocks: list[nn.Module] = []
    for child in model.children():
        sequence = isinstance(child, (nn.ModuleList, nn.Sequential))
        blocks += list(child.children()) if sequence else [child]
    seen: set[int] = set()
    groups: list[list[nn.Parameter]] = []
    for parameters in [*(b.parameters() for b in blocks), model.parameters(recurse=False)]:
        group = [p for p in parameters if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in group)
        if group:
            groups.append(group)
    return groups


class StepInBackward:
    """One optimizer per parameter group, each stepped during backward as soon as the last of its
    group's gradients is complete, which are then freed: at most a few blocks' gradients exist
    at once instead of the whole model's (PyTorch's tutorial "How to save memory by fusing the
    optimizer step into the backward pass"). Steps are per block rather than per parameter
    because each optimizer step costs a fixed overhead in Python.

    Stands in for the optimizer in the training loop: `step` only finishes groups whose
    parameters got no gradient this time, and `zero_grad` has nothing left to clear. Counts the
    bytes of complete gradients alive at once, and their peak."""

    def __init__(self, groups: list[list[nn.Parameter]], optimizers: list[Any]) -> None:
        self.groups = groups
        self.optimizers = optimizers
        self.live_gradient_bytes = 0
        self.peak_gradient_bytes = 0
        self._ready: list[dict[int, int]] = [{} for _ in groups]  # id: gradient bytes
        for index, group in enumerate(groups):
            for parameter in group:
                parameter.register_post_accumulate_grad_hook(self._hook(index))

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def gradient_complete(parameter: torch.Tensor) -> None:
            size = tensor_bytes(parameter.grad)
            self._ready[index][id(parameter)] = size
            self.live_gradient_bytes += size
            self.peak_gradient_bytes = max(self.peak_gradient_bytes, self.live_gradient_bytes)
            if len(self._ready[index]) == len(self.groups[index]):
                self._finish(index)

        return gradient_complete

    def _finish(self, index: int) -> None:
        """Step group ``index`` on its gradients, then let go of them."""
        self._step(index)
        for parameter in self.groups[index]:
            parameter.grad = None
        self.live_gradient_bytes -= sum(self._ready[index].values())
        self._ready[index].clear()

    def _step(self, index: int) -> None:
        self.optimizers[index].step()

    @property
    def state(self) -> dict[Any, Any]:
        """The optimizer state held on the device, by parameter."""
        return {k: v for optimizer in self.optimizers for k, v in optimizer.state.items()}

    def step(self) -> None:
        for index, ready in enumerate(self._ready):
            if ready:
                self._finish(index)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)


class HostOffload(StepInBackward):
    """The optimizer on the host: its state (AdamW's two moments) and a master copy of each
    parameter live in the host's memory, so the device holds the parameters alone.

    As backward completes a block's gradients (the hooks of `StepInBackward`), they are copied to
    pinned host buffers on a stream of their own and freed on the device; a worker thread steps
    that block on the host (fused where this torch offers it on a CPU) while the device goes on
    with backward, and copies the new parameters back on the same stream; `step` (the training
    loop's) waits for every block and makes the next forward wait for the copies. The
    arithmetic is the optimizer's own, on the same fp32 values: only where it runs changes.
    DeepSpeed's ZeRO-Offload does the same with its own CPU Adam; PyTorch's pieces are
    `register_post_accumulate_grad_hook`, pinned memory and ``non_blocking`` copies (its tutorial
    "A guide on good usage of non_blocking and pin_memory() in PyTorch"). Under torch.compile a
    compiled backward completes every gradient at its end, so there the host steps while the
    copies of the other blocks run, not during backward."""

    def __init__(
        self,
        optimizer_class: type[torch.optim.Optimizer],
        groups: list[list[nn.Parameter]],
        kw: dict[str, Any],
    ) -> None:
        device = groups[0][0].device
        self.cuda = device.type == "cuda"
        self.masters = [[self._host_copy(p) for p in group] for group in groups]
        self.host_gradients = [[self._host_copy(p) for p in group] for group in groups]
        optimizers = [_host_optimizer(optimizer_class, m, kw) for m in self.masters]
        super().__init__(groups, optimizers)
        self.device = device
        self.copies = torch.cuda.Stream(device) if self.cuda else None
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="host-step")
        self.pending: list[concurrent.futures.Future[None]] = []

    def _host_copy(self, parameter: nn.Parameter) -> torch.Tensor:
        """A host tensor like ``parameter``, pinned where copies to and from CUDA overlap."""
        host = torch.empty(parameter.shape, dtype=parameter.dtype, pin_memory=self.cuda)
        return host.copy_(parameter.detach())

    def _step(self, index: int) -> None:
        copied = None
        if self.cuda:
            self.copies.wait_stream(torch.cuda.current_stream(self.device))
            copied = torch.cuda.Event()
        with torch.cuda.stream(self.copies) if self.cuda else contextlib.nullcontext():
            for parameter, master, host in self._members(index):
                gradient = parameter.grad
                master.grad = None if gradient is None else host
                if gradient is not None:
                    host.copy_(gradient, non_blocking=self.cuda)
                    if self.cuda:  # the allocator must not reuse it before the copy is done
                        gradient.record_stream(self.copies)
            if copied is not None:
                copied.record()
        self.pending.append(self.worker.submit(self._step_on_host, index, copied))

    def _members(self, index: int) -> Iterator[tuple[nn.Parameter, torch.Tensor, torch.Tensor]]:
        return zip(self.groups[index], self.masters[index], self.host_gradients[index], strict=True)

    def _step_on_host(self, index: int, copied: Any) -> None:
        """In the worker: once the gradients are on the host, step, then send the parameters."""
        if copied is not None:
            copied.synchronize()
        self.optimizers[index].step()
        with torch.no_grad():
            if not self.cuda:
                for parameter, master, _ in self._members(index):
                    parameter.copy_(master)
                return
            with torch.cuda.device(self.device), torch.cuda.stream(self.copies):
                for parameter, master, _ in self._members(index):
                    parameter.copy_(master, non_blocking=True)

    @property
    def state(self) -> dict[Any, Any]:
        return {}  # all of it is on the host

    @property
    def host_bytes(self) -> int:
        """What the host holds for the device: master parameters, gradient buffers, state."""
        tensors = [t for group in (*self.masters, *self.host_gradients) for t in group]
        tensors += [
            value
            for optimizer in self.optimizers
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor)
        ]
        return sum(tensor_bytes(t) for t in tensors)

    def step(self) -> None:
        super().step()
        for future in self.pending:
            future.result()  # a failure on the host is the step's
        self.pending.clear()
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.copies)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.groups:
            for parameter in group:
                parameter.grad = None


def _host_optimizer(
    optimizer_class: type[torch.optim.Optimizer], masters: list[torch.Tensor], kw: dict[str, Any]
) -> torch.optim.Optimizer:
    """The optimizer over host tensors: fused where this torch has a fused kernel for a CPU
    (AdamW and SGD since 2.4; on a 2-core machine 0.22 s against 1.37 s a step for 112 M
    parameters), else its default."""
    try:
        return optimizer_class(masters, **kw)
    except RuntimeError:
        if not kw.get("fused"):
            raise
        return optimizer_class(masters, **{**kw, "fused": False})


def tensor_bytes(tensor: torch.Tensor | None) -> int:
    """What ``tensor`` holds; for a tensor subclass that keeps its data in inner tensors (a
    quantized optimizer state shows fp32's dtype over 8-bit codes), what those hold."""
    if tensor is None:
        return 0
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None:
        names, _context = flatten()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


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


def memory_fields(
    rt: Runtime,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | StepInBackward,
    saved: SavedActivations | None,
    gradient_peak_bytes: int,
) -> dict[str, Any]:
    """What the memory doctor reads beside the peak: on CUDA the allocator's peak reserved and the
    card's size; everywhere, the model state on the device (parameters, and the optimizer state
    kept there), what the host holds for an offloaded optimizer and, when saved activations were
    counted, the tensor accounting: model state, the gradients' peak and the saved activations'
    peak, summed (an upper bound: the two peaks need not coincide)."""
    fields: dict[str, Any] = {}
    if rt.device.type == "cuda":
        fields["peak_reserved_mib"] = torch.cuda.max_memory_reserved(rt.device) / 2**20
        total = torch.cuda.get_device_properties(rt.device).total_memory
        fields["device_memory_mib"] = total / 2**20
    parameter_bytes = sum(tensor_bytes(p) for p in model.parameters())
    optimizer_bytes = sum(
        tensor_bytes(value)
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )
    state_bytes = parameter_bytes + optimizer_bytes
    fields["model_state_mib"] = state_bytes / 2**20
    fields["parameters_mib"] = parameter_bytes / 2**20
    if isinstance(optimizer, HostOffload):
        fields["host_state_mib"] = optimizer.host_bytes / 2**20
    if saved is not None:
        gradients = max(gradient_peak_bytes, getattr(optimizer, "peak_gradient_bytes", 0))
        fields["gradient_peak_mib"] = gradients / 2**20
        fields["saved_activations_peak_mib"] = saved.peak_bytes / 2**20
        fields["tensor_peak_mib"] = (state_bytes + gradients + saved.peak_bytes) / 2**20
    return fields


def start_memory_history(knobs: dict[str, Any], rt: Runtime) -> bool:
    """Record allocations with their Python stacks (CUDA only: the CPU has no such recorder)."""
    if not knobs.get("memory_history"):
        return False
    if rt.device.type != "cuda":
        emit({"event": "memory_sites", "sites": [], "note": "memory history needs CUDA"}, rt)
        return False
    torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES, stacks="python")
    return True


def allocation_sites(snapshot: dict[str, Any], limit: int = 8) -> dict[str, Any]:
    """Where the memory live at the recorded peak was allocated: the trace of a
    `torch.cuda.memory._snapshot()` replayed (alloc adds, free_completed removes), the live set
    at its largest grouped by the first frame outside torch, largest first."""
    traces = snapshot.get("device_traces") or [[]]
    events = max(traces, key=len)
    live: dict[int, int] = {}
    total = peak = peak_index = 0
    for index, event in enumerate(events):
        if event.get("action") == "alloc":
            live[event["addr"]] = event["size"]
            total += event["size"]
        elif event.get("action") == "free_completed":
            total -= live.pop(event["addr"], 0)
        if total > peak:
            peak, peak_index = total, index
    held: dict[int, dict[str, Any]] = {}
    for event in events[: peak_index + 1]:
        if event.get("action") == "alloc":
            held[event["addr"]] = event
        elif event.get("action") == "free_completed":
            held.pop(event["addr"], None)
    sites: dict[str, list[int]] = {}
    for event in held.values():
        site = sites.setdefault(_site(event.get("frames") or []), [0, 0])
        site[0] += event["size"]
        site[1] += 1
    ranked = sorted(sites.items(), key=lambda item: -item[1][0])[:limit]
    return {
        "peak_mib": peak / 2**20,
        "sites": [
            {"site": name, "mib": size / 2**20, "allocations": count}
            for name, (size, count) in ranked
        ],
    }


def _site(frames: list[dict[str, Any]]) -> str:
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if "/torch/" in filename or filename.endswith("_recipe_harness.py"):
            continue
        return f"{os.path.basename(filename)}:{frame.get('line')} {frame.get('name')}"
    if frames:
        return "inside torch (no recipe frame)"
    return "autograd's backward (no Python frame)"


def finish_memory_history(rt: Runtime) -> None:
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    emit({"event": "memory_sites", **allocation_sites(snapshot)}, rt)


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


class StepClock:
    """When each measured step ended, without making the host wait for the device: on CUDA events
    recorded in stream order and read once a round is over, on a CPU the host's clock."""

    def __init__(self, rt: Runtime) -> None:
        self.cuda = rt.device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Each step's seconds, from one mark to the next."""
        if not self.cuda:
            return [end - start for start, end in itertools.pairwise(self.marks)]
        if self.marks:
            self.marks[-1].synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in itertools.pairwise(self.marks)]


def halves_spread(seconds: Sequence[float], samples: Sequence[float]) -> float | None:
    """How far apart the samples/s of the first and the second half of the measured steps are,
    as a share of their mean: |a - b| / ((a + b) / 2). An odd step in the middle is left out.
    None under two steps. A trial whose halves agree within 5 % is the doctor's steady figure:
    a second run of it is then expected to agree about as well."""
    count = min(len(seconds), len(samples)) // 2
    if count < 1:
        return None
    first = sum(samples[:count]) / sum(seconds[:count])
    second = sum(samples[-count:]) / sum(seconds[-count:])
    return abs(first - second) / ((first + second) / 2)


def more_steps(knobs: dict[str, Any], measured: int, spread: float | None) -> int:
    """How many steps to measure after ``measured`` with halves ``spread`` apart: another round of
    --steps while --steady-within is set and not met, up to --max-steps (4 × --steps)."""
    within = knobs.get("steady_within")
    if within is None or (spread is not None and spread <= within):
        return 0
    cap = knobs.get("max_steps") or 4 * knobs["steps"]
    return max(0, min(knobs["steps"], cap - measured))


def train(
    recipe: str,
    knobs: dict[str, Any],
    rt: Runtime,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | StepInBackward,
    batches: Iterator[Batch],
    loss_of: Callable[[nn.Module, Any], torch.Tensor],
) -> dict[str, Any]:
    """Warm-up, then measured micro-batches (in rounds, with --steady-within); returns the
    summary's measured fields.

    Every log step synchronizes, and the end of each round; between them the host never waits
    for the device. Samples/s are global: each window's counts are summed over ranks; the spread
    between the halves of the measured steps is the largest of any rank's.
    """
    scaler = grad_scaler(knobs, rt)
    # Saved tensors are counted where no CUDA allocator can say what they hold, and compressed
    # when asked; on CUDA without compression no hook runs (it would cost Python per tensor).
    needs_hooks = knobs.get("compress_activations") or rt.device.type != "cuda"
    saved = SavedActivations(knobs.get("compress_activations")) if needs_hooks else None
    hooks = saved if saved is not None else contextlib.nullcontext()
    recording = start_memory_history(knobs, rt)
    accumulate, warmup = knobs["accumulate"], knobs["warmup_steps"]
    planned = warmup + knobs["steps"]
    optimizer.zero_grad(set_to_none=True)
    optimizer_steps = 0
    gradient_peak = 0
    parameters = list(model.parameters())
    logged_losses: list[float] = []
    measured = {"samples": 0.0, "tokens": 0.0, "seconds": 0.0}
    window_samples = window_tokens = 0
    clock, step_samples = StepClock(rt), []
    spread = loss_after_steps = None
    synchronize(rt)
    no_sync = getattr(model, "no_sync", None)  # DistributedDataParallel's
    window_start = time.perf_counter()
    if warmup == 0:
        clock.mark()
    step = 0
    while step < planned:
        step += 1
        batch = next(batches)
        optimizer_due = step % accumulate == 0
        skip_sync = no_sync() if no_sync and not optimizer_due else contextlib.nullcontext()
        with skip_sync:
            with hooks, autocast(knobs, rt):
                loss = loss_of(model, batch.data)
            scaler.scale(loss / accumulate).backward()
        if saved is not None:
            saved.release_held()
        if optimizer_due:
            if saved is not None:  # counting: the gradients are all there before the step
                gradient_peak = max(gradient_peak, sum(tensor_bytes(p.grad) for p in parameters))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            optimizer_steps += 1
        window_samples += batch.samples
        window_tokens += batch.tokens
        if step >= warmup:
            clock.mark()
        if step > warmup:
            step_samples.append(batch.samples)
        if step == warmup + knobs["steps"]:  # the same step in every run, however long
            loss_after_steps = global_sum([loss.detach().float().item()], rt)[0] / rt.world_size
        if step == planned:
            spread = halves_spread(clock.seconds(), step_samples)
            spread = None if spread is None else global_max(spread, rt)
            planned += more_steps(knobs, step - warmup, spread)
        final = step == planned
        if step % knobs["log_every"] and step not in (1, warmup) and not final:
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
    if recording:
        finish_memory_history(rt)
    mib, source = peak_memory(rt)
    seconds = measured["seconds"]
    result = {
        "samples_per_s": measured["samples"] / seconds if seconds else None,
        "peak_memory_mib": global_max(mib, rt),
        "memory_source": source,
        "steps": len(step_samples),
        "warmup_steps": warmup,
        "spread": spread,
        "optimizer_steps": optimizer_steps,
        "measured_seconds": seconds,
        "loss_first": logged_losses[0] if logged_losses else None,
        "loss_last": logged_losses[-1] if logged_losses else None,
        "loss_after_steps": loss_after_steps,
        **memory_fields(rt, model, optimizer, saved, gradient_peak),
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
            # The model, its DistributedDataParallel reducer and their gloo work can sit in
            # reference cycles (checkpointed blocks' closures); left to the interpreter's
            # shutdown they were torn down with the process group gone, and one run in ten of
            # two CPU ranks aborted there ("terminate called without an active exception")
            # after its summary. Collected first, none did in 50.
            gc.collect()
            dist.destroy_process_group()
