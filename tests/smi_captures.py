"""The real nvidia-smi outputs of an H200 under fixtures/nvidia-smi, and what the tests must know
to read them."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"

NOHEADER_FIELDS = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks_event_reasons.active",
)
"""The fields the header-less capture (h200-query-gpu-loaded-noheader-nounits.csv) has, in order:
its values line up with them (the SM clock and the power reading agree with the -q text taken
alongside)."""


def fixture(name: str) -> str:
    """A capture's text."""
    return (FIXTURES / name).read_text(encoding="utf-8")
