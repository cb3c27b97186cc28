"""PyTorch's "CUDA out of memory" message, read and explained.

The message is written by the caching allocator, ``DeviceCachingAllocator::malloc`` in
c10/cuda/CUDACachingAllocator.cpp (read in pytorch/pytorch at 001074d2, torch 2.x; sizes through
``format_size``, torch/include/c10/core/Allocator.h of the torch 2.13.0 wheel: two decimals, in
bytes up to 1 KiB, KiB up to 1 MiB, MiB up to 1 GiB, else GiB). Its wording changed with the
versions; each is parsed:

- up to 1.4: ``Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; 8.57 MiB already
  allocated; 9.28 GiB free; 4.68 MiB cached)``, where "cached" is ``amount_cached -
  amount_allocated`` (that era's THCCachingAllocator): reserved but unallocated, not the total;
- 1.5 to 2.0: ``... 3.44 MiB free; 14.61 GiB reserved in total by PyTorch)``, the total;
  ``N allowed;`` before it when ``torch.cuda.set_per_process_memory_fraction`` caps the process;
- 2.1 (with its typo ``capacty``) and later: ``Tried to allocate X. GPU 0 has a total capacity of
  T of which F is free. [Process N has M memory in use.] Including non-PyTorch memory, this
  process has P memory in use. [C allowed; ]Of the allocated memory A is allocated by PyTorch,
  [with G allocated in private pools (e.g., CUDA Graphs), ]and R is reserved by PyTorch but
  unallocated.`` The process lines come from NVML, one a process on the card, and are missing
  where NVML is.

What the figures are, in the allocator's words: X is the block it asked the driver for; T and F
are ``cudaMemGetInfo``'s; P is this process on the card (its CUDA context, NCCL, cuBLAS too), so
T - F - P is everyone else's; A is ``allocated_bytes`` and R is ``reserved_bytes - allocated_bytes``
("reserved_bytes: bytes reserved by this memory allocator (both free and used)",
c10/core/CachingDeviceAllocator.h). And by the time the message is written, "free_cached_blocks
has already returned all possible 'cached' memory to the driver. The only remaining 'cached'
memory is split from a larger block that is partially in-use": R is fragments, memory that only
``expandable_segments`` (segments that grow, whose free pages are unmapped and mapped again where
needed) makes usable. A real message from torch 2.11 on an H200 (tests/test_memory_oom.py) asked
for 3.50 GiB with 2.30 GiB free and 7.40 GiB reserved but unallocated, another with 2.30 GiB
free and 1.50 GiB unallocated; the same programs with ``expandable_segments:True`` did not fail.

The cause, decided from those figures in this order (MiB; H, the headroom, is F less
`DRIVER_MARGIN_MIB`, or under a cap the smaller of that and C - (A + R), the allocator's own check;
the others' memory O is the console's reading of the card's processes when given, else T - F - P,
or T - F - (A + R) - `CONTEXT_MIB` where the message has no P):

1. request-exceeds-card: X > T; no setting helps, a shape or batch is wrong.
2. unexplained: H >= X; the memory was there when PyTorch looked (freed in between, or a limit
   the message does not show). The others are named when O is as large as in rule 4.
3. fragmentation: R >= X; PyTorch's own reserved, unallocated memory could have held the request.
4. other-processes: F - `DRIVER_MARGIN_MIB` < X, and O is at least X and `OTHERS_SHARE` of the
   card: their memory alone would have served it.
5. fragmentation: H + R >= X; the free memory and the fragments together would have.
6. too-big: H + R < X; the job does not fit the card, or (when F would have served it) the share
   it is allowed, and then raising that share is the first fix.

Each gets its fixes, cheapest first; ``expandable_segments`` leads for fragmentation alone.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from gpuconsole.core.model import GpuProcess

# Bounded digits: a longer number is no allocator's message (and int() refuses 4300 digits).
_SIZE = r"(\d{1,15}(?:\.\d{1,6})?)\s*(bytes|KiB|MiB|GiB|TiB)"
_UNITS_MIB = {"bytes": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0, "TiB": 1024.0**2}
_MARKER = re.compile(r"CUDA out of memory\. Tried to allocate " + _SIZE)
_OLD = re.compile(
    r"\(GPU (\d{1,4}); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; "
    r"" + _SIZE + r" free; (?:" + _SIZE + r" allowed; )?" + _SIZE
    + r" (reserved in total by PyTorch|cached)"
)  # fmt: skip
_NEW_TOTAL = re.compile(
    r"GPU (\d{1,4}) has a total (?:capacity|capacty) of "
    + _SIZE
    + r" of which "
    + _SIZE
    + " is free"
)
_NEW_PROCESS = re.compile(r"Process (\d{1,10}) has " + _SIZE + r" memory in use")
_NEW_SELF = re.compile(r"this process has " + _SIZE + r" memory in use")
_NEW_ALLOWED = re.compile(_SIZE + r" allowed; Of the allocated memory")
_NEW_SPLIT = re.compile(
    r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, (?:with " + _SIZE
    + r" allocated in private pools \(e\.g\., CUDA Graphs\), )?and " + _SIZE
    + r" is reserved by PyTorch but unallocated"
)  # fmt: skip

OTHERS_SHARE = 0.10
"""Other processes holding more than this share of the card (and more than the request) are the
cause: their memory alone would have served it."""
DRIVER_MARGIN_MIB = 4.0
"""How close to ``cudaMemGetInfo``'s free memory one allocation gets: on an H200 (driver 580,
torch 2.11) the largest that worked was the free memory less 2 to 4 MiB, at 63 MiB, 299 MiB and
2 GiB free alike."""
CONTEXT_MIB = 512.0
"""What a CUDA context takes outside PyTorch's allocator, roughly (518 MiB for torch 2.11 on an
H200): not counted as another's where the message does not say what this process holds."""


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
    """By PyTorch's allocator: live tensors (and, since 2.x, CUDA graphs' private pools)."""
    reserved_mib: float | None
    """By PyTorch's allocator in all: live tensors plus its cache."""
    process_mib: float | None = None
    """This process on the card, PyTorch's and everything else (CUDA context, NCCL, cuBLAS)."""
    others: tuple[tuple[int, float], ...] = ()
    """(pid, MiB) of other processes the message names."""
    version: str = "2.1+"
    allowed_mib: float | None = None
    """The cap `torch.cuda.set_per_process_memory_fraction` puts on this process, if any."""

    @property
    def unallocated_mib(self) -> float | None:
        """Reserved but not allocated: at the message, pieces of partly used segments."""
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
    """request-exceeds-card, unexplained, fragmentation, other-processes or too-big."""
    summary: str
    message: OomMessage
    fixes: tuple[Fix, ...]
    others: tuple[GpuProcess, ...] = field(default=())


MAX_LOG_BYTES = 16 << 20
"""How much of a log is read: its last 16 MiB, where the newest out-of-memory message is."""
MAX_STREAM_BYTES = 1 << 30
"""The most read from a pipe (which cannot seek to its end) before giving up."""


def read_log(log: BinaryIO) -> str:
    """The last `MAX_LOG_BYTES` of a log: a file is read from there, a pipe or a terminal to its
    end (at most `MAX_STREAM_BYTES`) keeping only its tail. OomParseError past that bound."""
    status = os.fstat(log.fileno())
    if stat.S_ISREG(status.st_mode):
        log.seek(max(0, status.st_size - MAX_LOG_BYTES))
        return log.read(MAX_LOG_BYTES).decode("utf-8", errors="replace")
    tail, total = b"", 0
    # read1: what one read gives, so that a terminal's Ctrl-D (one empty read) ends the paste
    # where read() would wait for a second one
    read = getattr(log, "read1", log.read)
    while chunk := read(1 << 20):
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
        allocated = _mib(g[3], g[4])
        last = _mib(g[9], g[10])  # "cached" is what is reserved beyond the allocated
        return OomMessage(
            requested,
            int(g[0]),
            _mib(g[1], g[2]),
            _mib(g[5], g[6]),
            allocated,
            last if g[11].startswith("reserved") else allocated + last,
            version="1.5-2.0" if g[11].startswith("reserved") else "up to 1.4",
            allowed_mib=_mib(g[7], g[8]) if g[7] is not None else None,
        )
    total = _NEW_TOTAL.search(rest)
    own = _NEW_SELF.search(rest)
    allowed = _NEW_ALLOWED.search(rest)
    split = _NEW_SPLIT.search(rest)
    others = tuple(
        (int(m.group(1)), _mib(m.group(2), m.group(3))) for m in _NEW_PROCESS.finditer(rest)
    )
    allocated = reserved = None
    if split is not None:
        allocated = _mib(split.group(1), split.group(2))
        reserved = allocated + _mib(split.group(5), split.group(6))
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
        allowed_mib=_mib(allowed.group(1), allowed.group(2)) if allowed else None,
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


_FRACTION = Fix(
    "raise the memory fraction",
    "the message's 'allowed' is the cap torch.cuda.set_per_process_memory_fraction puts on this "
    "process, and the card had the room: raise the fraction (or drop the call)",
)
_OWN_CARD = Fix(
    "give the job a card of its own",
    "CUDA_VISIBLE_DEVICES to an idle GPU, or MIG instances or MPS with a memory limit per client",
)
_WATCH = Fix(
    "watch the card as the job runs",
    "`gpuconsole snapshot` (or nvidia-smi) while it starts: a process that takes memory and gives "
    "it back shows there",
)


def _headroom(message: OomMessage) -> float | None:
    """What the allocator could still have had: the free memory less `DRIVER_MARGIN_MIB`, or
    under a cap the cap less what PyTorch reserved, whichever is less."""
    free = None if message.free_mib is None else max(0.0, message.free_mib - DRIVER_MARGIN_MIB)
    if message.allowed_mib is None or message.reserved_mib is None:
        return free
    under_cap = max(0.0, message.allowed_mib - message.reserved_mib)
    return under_cap if free is None else min(free, under_cap)


def _others_mib(message: OomMessage, others: Sequence[GpuProcess]) -> float:
    """What other processes held: the console's reading of them when it has one, else the card's
    used memory less this process's (NVML's figure, or PyTorch's reserve and a context)."""
    console = sum(p.used_memory_mib or 0.0 for p in others)
    if console:
        return console
    named = sum(mib for _, mib in message.others)
    if message.total_mib is None or message.free_mib is None:
        return named
    used = message.total_mib - message.free_mib
    if message.process_mib is not None:
        return max(named, used - message.process_mib)
    return max(named, used - (message.reserved_mib or 0.0) - CONTEXT_MIB, 0.0)


def diagnose(message: OomMessage, processes: Sequence[GpuProcess] = ()) -> OomDiagnosis:
    """Why it ran out, from the message and (when known) the GPU's processes now, by the rules of
    this module's docstring.

    ``processes`` are that GPU's processes from the console's own reading of the host; the job
    that failed has usually exited, so every process listed is another one."""
    total = message.total_mib
    others = tuple(p for p in processes if message.gpu is None or p.gpu == message.gpu)
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
    headroom = _headroom(message)
    card = total or 0.0
    others_mib = _others_mib(message, others)
    crowded = bool(card) and others_mib >= max(OTHERS_SHARE * card, requested)
    if headroom is not None and headroom >= requested:
        summary = (
            f"the card had {size_text(message.free_mib)} free when PyTorch looked, enough for the "
            f"{size_text(requested)} it asked for: the figures do not explain the failure (memory "
            "freed between it and the message, or a limit the message does not show)"
            + (f"; other processes held {size_text(others_mib)} of the card" if crowded else "")
        )
        return OomDiagnosis("unexplained", summary, message, (_WATCH, _OWN_CARD), others)
    if unallocated >= requested:
        return _fragmented(message, unallocated, others)
    free = message.free_mib
    short = free is None or free - DRIVER_MARGIN_MIB < requested
    if crowded and short:
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
    if (headroom or 0.0) + unallocated >= requested:
        return _fragmented(message, unallocated, others)
    held = message.process_mib or message.reserved_mib
    room = (message.free_mib or 0.0) - DRIVER_MARGIN_MIB + unallocated >= requested
    capped = message.allowed_mib is not None and room  # the card had it, the cap did not
    limit = (
        f"the {size_text(message.allowed_mib)} this process is allowed" if capped else "the card"
    )
    summary = (
        f"the job is too big for {limit}: it held {size_text(held)} and asked for "
        f"{size_text(requested)} more"
        if held is not None
        else f"the job asked for {size_text(requested)} more than {limit} had free"
    )
    fixes = (_MIXED, _CHECKPOINT, _MICRO, _COMPRESS, _SHARD, _MEASURE)
    return OomDiagnosis(
        "too-big", summary, message, (_FRACTION, *fixes) if capped else fixes, others
    )


def _fragmented(
    message: OomMessage, unallocated: float, others: tuple[GpuProcess, ...]
) -> OomDiagnosis:
    requested = message.requested_mib
    summary = (
        f"PyTorch held {size_text(unallocated)} reserved but unallocated, "
        f"{'more than' if unallocated >= requested else 'with the free memory, enough for'} "
        f"the {size_text(requested)} it asked for, in pieces too small to use"
    )
    fixes = (_EXPANDABLE, _SPLIT, _MIXED, _CHECKPOINT, _EMPTY_CACHE)
    return OomDiagnosis("fragmentation", summary, message, fixes, others)


def size_text(mib: float | None) -> str:
    """MiB under a GiB, else GiB with two decimals."""
    if mib is None:
        return "N/A"
    return f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib:.1f} MiB"
