"""The thresholds the console judges GPUs by, each once: the health rules, the alert rules, the
screens' colour bands and the verification checks all read them here.

The health thresholds are the guide's (``shared/reference/gpu-server-guide.zh.txt`` §4.2): alarm
at 85 °C, keep 20 % of GPU memory in reserve; above 95 % used a job's next allocation likely
fails. The verification floors are shares of a figure the host itself gives (its PCIe link's
theoretical rate, its peers' median), never a fixed number that a healthy host can sit on.
"""

from __future__ import annotations

TEMP_HIGH_C = 85.0
"""The alert temperature; slowdown itself starts at the GPU's own slowdown temperature."""
TEMP_WARM_BELOW_C = 10.0
"""A GPU within this many degrees below its hot line (`hot_line_c`) is warm: what the screens
colour as a warning of heat to come, not a working card at 60-70 °C with 15 to 25 degrees of
headroom on an H100 (slowdown 87 °C)."""


def hot_line_c(slowdown_c: float | None) -> float:
    """Where a GPU is hot: the alert temperature, or its own slowdown temperature where that is
    lower (a card that slows down before 85 °C is hot before it)."""
    return TEMP_HIGH_C if slowdown_c is None else min(TEMP_HIGH_C, slowdown_c)


MEMORY_RESERVE_FRACTION = 0.80
"""The guide keeps 20 % of GPU memory free as a buffer: more used is memory pressure."""
MEMORY_FULL_FRACTION = 0.95
"""Above this a job's next allocation likely fails with out-of-memory."""

LINK_PASS_FRACTION = 0.70
"""A pinned host<->device copy passes at this share of its PCIe link's theoretical rate or more.

Healthy links measure well above it, and the margin is wide against their run-to-run spread. An
H200 on Gen5 x16 (63.0 GB/s theoretical per direction) measured 54.6 and 55.1 GB/s H2D on two
runs of one day: 86.6 % and 87.4 %, 16 points clear, where the two runs differed by under one
point. The fleet floors of azurehpc-health-checks (shared/reference/gpu-facts.md, "Health-check
thresholds used by fleets"), read as shares of their links, are 55 GB/s (H200, Gen5 x16) =
87 %, 52 (H100, Gen5 x16) = 83 % and 23 (A100, Gen4 x16 = 31.5 GB/s) = 73 %: a GPU at any of
those healthy-node floors still passes here. Packet headers and flow control keep even a
perfect link below ~90 %, so a share is read against ~87 %, not 100 %."""
LINK_FAIL_FRACTION = 0.55
"""Below this share of the link's theoretical rate a copy fails; between it and
`LINK_PASS_FRACTION` it warns (a GPU on the wrong NUMA node, the IOMMU translating, another job
copying: lost bandwidth on a link that trained right).

A link running at half its rate (x8 of x16, or Gen4 of Gen5) carries at most 50 % of the full
link's theoretical rate, and measures ~43 % (87 % of its half), so it always fails, with five
points to spare even if it reached its own theoretical maximum."""

PEER_WARN_FRACTION = 0.90
"""A figure under this share of its peers' median (the same GPU model on the same link, on the
other hosts verified together) warns, even above the link floor. SuperBench flags a node more
than 5-10 % below its baseline (gpu-facts.md); the looser 10 % is used, because healthy hosts
spread by about 1 % (the H200's 54.6 and 55.1 GB/s)."""
PEER_FAIL_FRACTION = 0.75
"""Under this share of its peers' median a figure fails: a quarter of the bandwidth gone, where
hosts of the same model on the same link agree to within a few per cent."""
PEERS_NEEDED = 2
"""Other hosts needed before their median is a baseline: with one, a single slow peer would
make every healthy host look fast, or one healthy host look slow."""
