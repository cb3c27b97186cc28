"""The OOM causes follow from the figures as PyTorch defines them, for any figures.

Random but consistent states of a card (this process's PyTorch memory, its other memory, other
processes, what is left free, a cap now and then) are written as the caching allocator writes
them (c10/cuda/CUDACachingAllocator.cpp, sizes by c10's ``format_size``), in each era's wording,
then read back and diagnosed. The cause must be the first rule of
gpuconsole/actions/memory/oom.py's docstring that holds, computed here on the figures as read,
and ``expandable_segments`` must lead the fixes exactly when the cause is fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuconsole.actions.memory.oom import (
    CONTEXT_MIB,
    DRIVER_MARGIN_MIB,
    OTHERS_SHARE,
    OomMessage,
    diagnose,
    parse_oom,
)

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
_UNIT_MIB = {"bytes": 1 / MIB, "KiB": 1 / KIB, "MiB": 1.0, "GiB": 1024.0}


def format_size(size: int) -> str:
    """c10's ``format_size`` (c10/core/Allocator.h): two decimals, the unit by the size."""
    if size <= KIB:
        return f"{size} bytes"
    if size <= MIB:
        return f"{size / KIB:.2f} KiB"
    if size <= GIB:
        return f"{size / MIB:.2f} MiB"
    return f"{size / GIB:.2f} GiB"


def shown_mib(size: int) -> float:
    """The figure as the message shows it, in MiB."""
    number, unit = format_size(size).split()
    return float(number) * _UNIT_MIB[unit]


@dataclass(frozen=True)
class Card:
    """One failed allocation's figures, in bytes."""

    requested: int
    total: int
    free: int
    process: int
    allocated: int
    unallocated: int
    others: int
    allowed: int | None
    era: str  # "2.1+", "1.5-2.0", "up to 1.4"
    nvml: bool  # 2.1+: the process lines (NVML) are there

    def message(self) -> str:
        asked = f"CUDA out of memory. Tried to allocate {format_size(self.requested)}"
        allowed = f"{format_size(self.allowed)} allowed; " if self.allowed is not None else ""
        if self.era == "up to 1.4":
            return (
                f"RuntimeError: {asked} (GPU 0; {format_size(self.total)} total capacity; "
                f"{format_size(self.allocated)} already allocated; {format_size(self.free)} free; "
                f"{format_size(self.unallocated)} cached)"
            )
        if self.era == "1.5-2.0":
            reserved = self.allocated + self.unallocated
            return (
                f"RuntimeError: {asked} (GPU 0; {format_size(self.total)} total capacity; "
                f"{format_size(self.allocated)} already allocated; {format_size(self.free)} free; "
                f"{allowed}{format_size(reserved)} reserved in total by PyTorch) If reserved "
                "memory is >> allocated memory try setting max_split_size_mb to avoid "
                "fragmentation."
            )
        processes = ""
        if self.nvml:
            processes = (
                f"Including non-PyTorch memory, this process has {format_size(self.process)} "
            )
            processes += "memory in use. "
            if self.others:
                processes += f"Process 4242 has {format_size(self.others)} memory in use. "
        return (
            f"torch.OutOfMemoryError: {asked}. GPU 0 has a total capacity of "
            f"{format_size(self.total)} of which {format_size(self.free)} is free. {processes}"
            f"{allowed}Of the allocated memory {format_size(self.allocated)} is allocated by "
            f"PyTorch, and {format_size(self.unallocated)} is reserved by PyTorch but unallocated. "
            "If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        )


shares = st.floats(min_value=0.0, max_value=1.0)


@st.composite
def cards(draw: st.DrawFn) -> Card:
    def part(of: int) -> int:
        return int(draw(shares) * of)

    total = draw(st.integers(min_value=2 * GIB, max_value=200 * GIB))
    context = part(min(2 * GIB, total // 4))
    reserved = part(total - context)
    unallocated = part(reserved)
    process = context + reserved
    others = part(total - process)
    free = max(0, total - process - others - part(8 * MIB))
    # an OOM asks for more than the allocator could get: past the free memory by some share of
    # what decides the cause (the fragments, the others' memory, the card); now and then the
    # figures say otherwise (memory freed in between), or it asks for more than the card
    span = draw(st.sampled_from([unallocated, unallocated, others, total // 2]))
    past = int(draw(st.floats(min_value=0.0, max_value=1.5)) * span)
    requested = draw(
        st.one_of(
            st.integers(min_value=1, max_value=8 * MIB).map(lambda step: free - 4 * MIB + step),
            st.just(free + past),
            st.just(free + past),
            st.just(free + past),
            st.integers(min_value=1, max_value=free + 1),
            st.integers(min_value=total, max_value=2 * total),
        )
    )
    requested = max(1, requested)
    era = draw(st.sampled_from(["2.1+", "2.1+", "2.1+", "1.5-2.0", "up to 1.4"]))
    allowed = None
    if era != "up to 1.4" and draw(st.booleans()):
        allowed = reserved + part(total - reserved)
    return Card(
        requested,
        total,
        free,
        process,
        reserved - unallocated,
        unallocated,
        others,
        allowed,
        era,
        era == "2.1+" and draw(st.integers(min_value=0, max_value=3)) > 0,
    )


def headroom(message: OomMessage) -> float:
    """What the allocator could still have had: free less the driver's margin, within the cap."""
    room = max(0.0, (message.free_mib or 0.0) - DRIVER_MARGIN_MIB)
    if message.allowed_mib is not None:
        room = min(room, max(0.0, message.allowed_mib - (message.reserved_mib or 0.0)))
    return room


def expected_cause(message: OomMessage) -> str:
    """The module docstring's rules, in their order, on the figures as read."""
    asked, total, free = message.requested_mib, message.total_mib, message.free_mib
    assert total is not None and free is not None
    unallocated = message.unallocated_mib or 0.0
    reserved = message.reserved_mib or 0.0
    used = total - free
    if message.process_mib is not None:
        others = used - message.process_mib
    else:
        others = used - reserved - CONTEXT_MIB
    others = max(others, sum(mib for _, mib in message.others), 0.0)
    if asked > total:
        return "request-exceeds-card"
    if headroom(message) >= asked:
        return "unexplained"
    if unallocated >= asked:
        return "fragmentation"
    if free - DRIVER_MARGIN_MIB < asked and others >= max(OTHERS_SHARE * total, asked):
        return "other-processes"
    if headroom(message) + unallocated >= asked:
        return "fragmentation"
    return "too-big"


@PROPERTY
@given(cards())
def test_the_cause_follows_pytorchs_figures(card: Card) -> None:
    message = parse_oom(card.message())
    # read back as PyTorch wrote them
    assert message.requested_mib == pytest.approx(shown_mib(card.requested))
    assert message.total_mib == pytest.approx(shown_mib(card.total))
    assert message.free_mib == pytest.approx(shown_mib(card.free))
    assert message.allocated_mib == pytest.approx(shown_mib(card.allocated))
    if card.era != "1.5-2.0":  # that era shows the total, not this part of it
        assert message.unallocated_mib == pytest.approx(shown_mib(card.unallocated), abs=1e-6)
    if card.allowed is not None:
        assert message.allowed_mib == pytest.approx(shown_mib(card.allowed))
    diagnosis = diagnose(message)
    event(diagnosis.cause)
    assert diagnosis.cause == expected_cause(message)
    # expandable segments lead exactly for fragmentation
    leads = diagnosis.fixes[0].title == "expandable segments"
    assert leads == (diagnosis.cause == "fragmentation")
    # too big only when even the free memory and the reserved-but-unallocated cannot hold it
    unallocated = message.unallocated_mib or 0.0
    if diagnosis.cause == "too-big":
        assert headroom(message) + unallocated < message.requested_mib
    # whenever PyTorch's own fragments could hold the request and the free memory could not
    short = (message.free_mib or 0.0) - DRIVER_MARGIN_MIB < message.requested_mib
    if short and message.requested_mib <= unallocated:
        assert diagnosis.cause == "fragmentation"
