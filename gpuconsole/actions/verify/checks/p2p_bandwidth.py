"""Can every pair of GPUs copy to each other directly (peer access), and does no pair copy far
slower than the others? The copies load the GPUs: the probe is `heavy`, run alone after the light
ones; its ``python3`` script uses torch when the host's Python has it."""

from __future__ import annotations

import statistics

from gpuconsole.actions.verify.judging import joined, script_unusable
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.actions.verify.probes import COPY_PRELUDE, python_command
from gpuconsole.hosts.targets import Context

_P2P_SCRIPT = (
    COPY_PRELUDE
    + """
SIZE, REPS = 64 << 20, 5

count = torch.cuda.device_count()
if count < 2:
    finish({"skip": "torch sees %d GPU: peer copies need two" % count})
labels = [index for index, _, _ in identities()]
sources = [torch.empty(SIZE, dtype=torch.uint8, device=d) for d in range(count)]
targets = [torch.empty(SIZE, dtype=torch.uint8, device=d) for d in range(count)]
pairs = []
for src in range(count):
    for dst in range(count):
        if src == dst:
            continue
        entry = {"src": labels[src], "dst": labels[dst],
                 "peer": bool(torch.cuda.can_device_access_peer(src, dst))}
        try:
            targets[dst].copy_(sources[src])
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            start = time.perf_counter()
            for _ in range(REPS):
                targets[dst].copy_(sources[src], non_blocking=True)
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            entry["gbs"] = gbs(SIZE, REPS, time.perf_counter() - start)
        except Exception as error:
            entry["error"] = "%s: %s" % (type(error).__name__, error)
        pairs.append(entry)
finish({"torch": torch.__version__, "pairs": pairs})
"""
)

P2P_BANDWIDTH = Probe(
    "p2p-bandwidth",
    "gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c .); "
    '[ "$gpus" -ge 2 ] || {'
    """ printf '{"skip": "nvidia-smi lists %s GPU: peer copies need two"}\\n' "$gpus";"""
    " exit 0; }; " + python_command(_P2P_SCRIPT),
    timeout=90.0,
    heavy=True,
)
"""Every ordered GPU pair: whether peer access is possible, and GB/s of 5 timed 64 MiB copies.
Prints {"torch", "pairs": [{"src", "dst", "peer", "gbs"}]} or {"skip": why}; on a host with
fewer than two GPUs it skips before torch's import (seconds)."""


P2P_FAR_BELOW = 0.5
"""A pair is far below the others when it copies at under half the median pair's GB/s."""


def _judge_p2p_bandwidth(evidence: Evidence, context: Context) -> Verdict:
    if context.expected_gpus is not None and context.expected_gpus < 2:
        return Verdict(Status.SKIP, "fewer than two GPUs expected: no peer copies")
    verdict, report = script_unusable(evidence[P2P_BANDWIDTH.name], "peer copy test")
    if verdict is not None:
        return verdict
    pairs = [p for p in report.get("pairs", []) if isinstance(p, dict)]  # type: ignore[union-attr]
    if not pairs:
        return Verdict(Status.SKIP, "the peer copy test measured no pair")
    measured = [float(p["gbs"]) for p in pairs if isinstance(p.get("gbs"), (int, float))]
    median = statistics.median(measured) if measured else 0.0
    lines, no_peer, slow, broken = [], [], [], []
    for pair in pairs:
        label = f"GPU {pair.get('src')}->{pair.get('dst')}"
        peer = "peer" if pair.get("peer") else "no peer access"
        if "error" in pair:
            broken.append(f"{label}: {pair['error']}")
            lines.append(f"{label}: {peer}, copy failed: {pair['error']}")
            continue
        lines.append(f"{label}: {pair.get('gbs')} GB/s, {peer}")
        if not pair.get("peer"):
            no_peer.append(label)
        gbs = pair.get("gbs")
        if isinstance(gbs, (int, float)) and gbs < P2P_FAR_BELOW * median:
            slow.append(f"{label} {gbs} GB/s")
    if broken:
        return Verdict(
            Status.FAIL,
            f"peer copies failed: {joined(broken)}",
            tuple(lines),
            "read xid-log for these GPUs; reset them (`nvidia-smi -r`) or reboot, then re-run",
        )
    problems = []
    if no_peer:
        problems.append(f"no peer access for {joined(no_peer)} (copies go through host memory)")
    if slow:
        problems.append(
            f"far below the median {median:.1f} GB/s (under {P2P_FAR_BELOW:.0%} of it): "
            + joined(slow)
        )
    if problems:
        return Verdict(
            Status.WARN,
            "; ".join(problems),
            tuple(lines),
            "`nvidia-smi topo -m` and `nvidia-smi topo -p2p r` show the path per pair; on "
            "bare metal disable PCIe ACS in the BIOS (it forces peer traffic through the root "
            "complex); in a VM peer access needs the hypervisor's support; a slow NVLink pair: "
            "see nvlink",
        )
    return Verdict(
        Status.PASS,
        f"{len(pairs)} GPU pairs with peer access; {min(measured):.1f}/{median:.1f}/"
        f"{max(measured):.1f} GB/s min/median/max",
        tuple(lines),
    )


CHECKS: tuple[Check, ...] = (
    Check("p2p-bandwidth", "GPU peer copies", (P2P_BANDWIDTH,), _judge_p2p_bandwidth),
)
