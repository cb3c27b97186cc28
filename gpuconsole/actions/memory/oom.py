"""PyTorch's "CUDA out of memory" message, read and explained.

The message's wording changed with PyTorch's versions; each is parsed from its documented
format (the caching allocator's message, c10/cuda/CUDACachingAllocator.cpp):

- up to 2.0: ``Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already
  allocated; 3.44 MiB free; 14.61 GiB reserved in total by PyTorch)``; before 1.5 the last
  field read ``... MiB cached``;
- 2.1 (with its typo ``capacty``) and later: ``Tried to allocate 1.00 GiB. GPU 0 has a total
  capacity of 79.14 GiB of which 517.88 MiB is free. Process 4242 has 40.00 GiB memory in use.
  Including non-PyTorch memory, this process has 38.62 GiB memory in use. Of the allocated memory
  36.52 GiB is allocated by PyTorch, and 1.58 GiB is reserved by PyTorch but unallocated.``

The cause is one of: the request alone exceeds the card; fragmentation (the reserved but
unallocated memory could have held the request had it been contiguous); other processes hold the
memory; or the job is simply too big. Each gets its fixes, cheapest first.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from gpuconsole.model import GpuProcess

# Bounded digits: a longer number is no allocator's message (and int() refuses 4300 digits).
_SIZE = r"(\d{1,15}(?:\.\d{1,6})?)\s*(bytes|KiB|MiB|GiB|TiB)"
_UNITS_MIB = {"bytes": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0, "TiB": 1024.0**2}
_MARKER = re.compile(r"CUDA out of memory\. Tried to allocate " + _SIZE)
_OLD = re.compile(
    r"\(GPU (\d{1,4}); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; "
    r"" + _SIZE + r" free; " + _SIZE + r" (?:reserved in total by PyTorch|cached)"
)
_NEW_TOTAL = re.compile(
    r"GPU (\d{1,4}) has a total (?:capacity|capacty) of "
    + _SIZE
    + r" of which "
    + _SIZE
    + " is free"
)
_NEW_PROCESS = re.compile(r"Process (\d{1,10}) has " + _SIZE + r" memory in use")
_NEW_SELF = re.compile(r"this process has " + _SIZE + r" memory in use")
_NEW_SPLIT = re.compile(
    r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, and " + _SIZE
    + r" is reserved by PyTorch but unallocated"
)  # fmt: skip

FRAGMENTATION_SHARE = 0.10
"""Reserved-but-unallocated memory is fragmentation worth naming when it could have held the
request and is this share of what PyTorch reserved (a sliver of a full card's cache is not the
cause), or when it is this share of the card and, with the free memory, would have held it."""
OTHERS_SHARE = 0.10
"""Other processes holding more than this share of the card (and more than the request) are the
cause: their memory alone would have served it."""
CONTEXT_MIB = 512.0
"""What a CUDA context takes outside PyTorch's allocator, roughly: not counted as another's."""


class OomParseError(ValueError):
    """The text holds no CUDA out-of-memory message."""


@dataclass(frozen=True, slots=True)
class OomMessage:
    """The figures of one out-of-memory message, in MiB; None where that version omits them."""

    requested_mib: float
    gpu: int | None
    total_mib: float | None
    free_mib: float | None
    allocated_mib: float | None
    """By PyTorch's allocator: live tensors."""
    reserved_mib: float | None
    """By PyTorch's allocator in all: live tensors plus its cache."""
    process_mib: float | None = None
    """This process on the card, PyTorch's and everything else (CUDA context, NCCL, cuBLAS)."""
    others: tuple[tuple[int, float], ...] = ()
    """(pid, MiB) of other processes the message names."""
    version: str = "2.1+"

    @property
    def unallocated_mib(self) -> float | None:
        """Reserved but not allocated: the allocator's cache, fragmentation where it is split."""
        if self.reserved_mib is None or self.allocated_mib is None:
            return None
        return max(0.0, self.reserved_mib - self.allocated_mib)


@dataclass(frozen=True, slots=True)
class Fix:
    title: str
    how: str


@dataclass(frozen=True, slots=True)
class OomDiagnosis:
    """The cause, in words and as a stable code, with the fixes ranked for it."""

    cause: str
    """request-exceeds-card, fragmentation, other-processes or too-big."""
    summary: str
    message: OomMessage
    fixes: tuple[Fix, ...]
    others: tuple[GpuProcess, ...] = field(default=())


MAX_LOG_BYTES = 16 << 20
"""How much of a log is read: its last 16 MiB, where the newest out-of-memory message is."""
MAX_STREAM_BYTES = 1 << 30
"""The most read from a pipe (which cannot seek to its end) before giving up."""


def read_log(log: BinaryIO) -> str:
    """The last `MAX_LOG_BYTES` of a log: a file is read from there, a pipe to its end (at most
    `MAX_STREAM_BYTES`) keeping only its tail. OomParseError past that bound."""
    status = os.fstat(log.fileno())
    if stat.S_ISREG(status.st_mode):
        log.seek(max(0, status.st_size - MAX_LOG_BYTES))
        return log.read(MAX_LOG_BYTES).decode("utf-8", errors="replace")
    tail, total = b"", 0
    while chunk := log.read(1 << 20):
        total += len(chunk)
        if total > MAX_STREAM_BYTES:
            raise OomParseError(f"more than {MAX_STREAM_BYTES >> 30} GiB without an end")
        tail = (tail + chunk)[-MAX_LOG_BYTES:]
    return tail.decode("utf-8", errors="replace")


def _mib(number: str, unit: str) -> float:
    return float(number) * _UNITS_MIB[unit]


def parse_oom(text: str) -> OomMessage:
    """The last out-of-memory message in ``text`` (a log, a traceback, a pasted line)."""
    markers = list(_MARKER.finditer(text))
    if not markers:
        raise OomParseError("no 'CUDA out of memory. Tried to allocate …' message found")
    marker = markers[-1]
    requested = _mib(marker.group(1), marker.group(2))
    rest = text[marker.end() : marker.end() + 2000]
    old = _OLD.search(rest)
    if old is not None and old.start() < 5:
        g = old.groups()
        version = "1.5-2.0" if "reserved" in old.group(0) else "up to 1.4"
        return OomMessage(
            requested,
            int(g[0]),
            _mib(g[1], g[2]),
            _mib(g[5], g[6]),
            _mib(g[3], g[4]),
            _mib(g[7], g[8]),
            version=version,
        )
    total = _NEW_TOTAL.search(rest)
    own = _NEW_SELF.search(rest)
    split = _NEW_SPLIT.search(rest)
    others = tuple(
        (int(m.group(1)), _mib(m.group(2), m.group(3))) for m in _NEW_PROCESS.finditer(rest)
    )
    allocated = reserved = None
    if split is not None:
        allocated = _mib(split.group(1), split.group(2))
        reserved = allocated + _mib(split.group(3), split.group(4))
    return OomMessage(
        requested,
        int(total.group(1)) if total else None,
        _mib(total.group(2), total.group(3)) if total else None,
        _mib(total.group(4), total.group(5)) if total else None,
        allocated,
        reserved,
        _mib(own.group(1), own.group(2)) if own else None,
        others,
        version="2.1 (capacty)" if total and "capacty" in total.group(0) else "2.1+",
    )


_EXPANDABLE = Fix(
    "expandable segments",
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the allocator grows segments instead of "
    "caching fixed blocks, so freed memory can be reused for other sizes",
)
_SPLIT = Fix(
    "max_split_size_mb",
    "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 keeps large cached blocks from being split "
    "(an older remedy; expandable segments supersede it)",
)
_EMPTY_CACHE = Fix(
    "torch.cuda.empty_cache() between phases",
    "returns cached blocks to the driver, which helps another process or a later phase of a "
    "different shape; it does not lower a running step's peak",
)
_MIXED = Fix(
    "mixed precision",
    "torch.autocast with bf16 (fp16 with a GradScaler before Ampere): activations at half size",
)
_CHECKPOINT = Fix(
    "activation checkpointing",
    "torch.utils.checkpoint on every block (or every k-th): recompute in backward instead of "
    "keeping activations, about a third more compute",
)
_MICRO = Fix(
    "micro-batches with gradient accumulation",
    "half the batch per step, gradients accumulated over two: the same effective batch, about "
    "half the activation memory",
)
_COMPRESS = Fix(
    "activation compression",
    "saved-tensor hooks that keep activations in bf16 or fp8 (check the loss against a plain run)",
)
_SHARD = Fix(
    "shard the model state",
    "FSDP or ZeRO spreads weights, gradients and optimizer state across GPUs when they alone "
    "fill the card",
)
_MEASURE = Fix(
    "measure the fixes",
    "`gpuconsole memory RECIPE --target GiB` runs short trials of each fix and recommends the "
    "cheapest set that fits",
)


def diagnose(message: OomMessage, processes: Sequence[GpuProcess] = ()) -> OomDiagnosis:
    """Why it ran out, from the message and (when known) the GPU's processes now.

    ``processes`` are that GPU's processes from the console's own reading of the host; the job
    that failed has usually exited, so every process listed is another one."""
    total = message.total_mib
    others = tuple(p for p in processes if message.gpu is None or p.gpu == message.gpu)
    others_mib = sum(p.used_memory_mib or 0.0 for p in others) or sum(m for _, m in message.others)
    unallocated = message.unallocated_mib or 0.0
    requested = message.requested_mib
    if total is not None and requested > total:
        summary = (
            f"one allocation of {size_text(requested)} is larger than the whole card "
            f"({size_text(total)}): a shape or batch is wrong, not the memory settings"
        )
        fixes = (
            Fix(
                "find the tensor",
                "the traceback's last frame of your code allocates it: check its shape",
            ),
            _MICRO,
            _CHECKPOINT,
            _SHARD,
        )
        return OomDiagnosis("request-exceeds-card", summary, message, fixes, others)
    card = total or 0.0
    if not others_mib and card and message.free_mib is not None:
        own = message.process_mib or message.reserved_mib or 0.0
        others_mib = max(0.0, card - message.free_mib - own - CONTEXT_MIB)  # not PyTorch's
    if card and others_mib >= max(OTHERS_SHARE * card, requested):
        who = ", ".join(
            f"pid {p.pid} ({p.user or '?'}: {p.command or '?'}) {size_text(p.used_memory_mib or 0)}"
            for p in others
        ) or ", ".join(f"pid {pid} {size_text(mib)}" for pid, mib in message.others)
        who = who or "not named in the message; `gpuconsole snapshot` lists the card's processes"
        summary = (
            f"other processes hold {size_text(others_mib)} of the card's {size_text(card)}: {who}"
        )
        fixes = (
            Fix(
                "free the card",
                "stop those processes (k on the host screen), or move the job to an idle GPU "
                "with CUDA_VISIBLE_DEVICES",
            ),
            Fix(
                "partition the card",
                "MIG instances or MPS with a memory limit per client keep jobs off each other",
            ),
            _MIXED,
            _CHECKPOINT,
        )
        return OomDiagnosis("other-processes", summary, message, fixes, others)
    reserved = message.reserved_mib or 0.0
    would_fit = unallocated + (message.free_mib or 0.0) >= requested
    if (unallocated >= requested and unallocated >= FRAGMENTATION_SHARE * reserved) or (
        would_fit and card and unallocated >= FRAGMENTATION_SHARE * card
    ):
        summary = (
            f"PyTorch held {size_text(unallocated)} reserved but unallocated, "
            f"{'more than' if unallocated >= requested else 'with the free memory, enough for'} "
            f"the {size_text(requested)} it asked for, in pieces too small to use"
        )
        fixes = (_EXPANDABLE, _SPLIT, _MIXED, _CHECKPOINT, _EMPTY_CACHE)
        return OomDiagnosis("fragmentation", summary, message, fixes, others)
    held = message.process_mib or message.reserved_mib
    summary = (
        f"the job is too big for the card: it held {size_text(held)} and asked for "
        f"{size_text(requested)} more"
        if held is not None
        else f"the job asked for {size_text(requested)} more than the card had free"
    )
    fixes = (_MIXED, _CHECKPOINT, _MICRO, _COMPRESS, _SHARD, _MEASURE)
    return OomDiagnosis("too-big", summary, message, fixes, others)


def size_text(mib: float | None) -> str:
    """MiB under a GiB, else GiB with two decimals."""
    if mib is None:
        return "N/A"
    return f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib:.1f} MiB"
