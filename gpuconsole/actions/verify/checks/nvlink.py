"""Are the GPUs' NVLink links up, all at the same speed? On an NVSwitch board every link is wired;
between PCIe cards only the links a bridge connects."""

from __future__ import annotations

import re
from collections import Counter

from gpuconsole.actions.verify.judging import joined, smi_unusable
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.actions.verify.probes import NVSWITCHES, SMI_DETAILS, nvswitch_signals, smi_command
from gpuconsole.hosts.targets import Context

NVLINK_STATUS = Probe("nvlink-status", smi_command("nvlink -s"))
"""Per GPU a header, then ``Link N: 26.562 GB/s`` or ``Link N: <inactive>``; nothing at all on GPUs
without NVLink."""


_GPU_HEADER = re.compile(r"^GPU (?P<index>\d+): (?P<rest>.*)$")
_LINK_LINE = re.compile(r"^\s*Link (?P<link>\d+): (?P<state>.+?)\s*$")
_SPEED = re.compile(r"^(?P<speed>[\d.]+) GB/s$")


def _nvlinks(text: str) -> dict[str, dict[int, str]]:
    """GPU index -> {link number: "26.562 GB/s" | "<inactive>" | other state}."""
    gpus: dict[str, dict[int, str]] = {}
    current: dict[int, str] | None = None
    for line in text.splitlines():
        if header := _GPU_HEADER.match(line.strip()):
            current = gpus.setdefault(header["index"], {})
        elif (link := _LINK_LINE.match(line)) and current is not None:
            current[int(link["link"])] = link["state"]
    return gpus


def _judge_nvlink(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[NVLINK_STATUS.name]
    if trouble := smi_unusable(output, "NVLink status"):
        return trouble
    gpus = _nvlinks(output.stdout)
    links = {(gpu, n): state for gpu, states in gpus.items() for n, state in states.items()}
    if not links:
        return Verdict(
            Status.SKIP, "these GPUs have no NVLink (nvidia-smi nvlink -s lists no link)"
        )
    active = {key: m["speed"] for key, state in links.items() if (m := _SPEED.match(state))}
    down = sorted(key for key in links if key not in active)
    lines = []
    for gpu, states in gpus.items():
        off = [str(n) for n in states if (gpu, n) in down]
        line = f"GPU {gpu}: {len(states) - len(off)} of {len(states)} links active"
        lines.append(line + (f"; inactive: {joined(off)}" if off else ""))
    problems = []
    nvswitch = nvswitch_signals(evidence)
    if down and (nvswitch or active):
        # On an NVSwitch board every link is wired. Elsewhere (NVLink bridges on PCIe cards) a
        # link may be unwired on every GPU alike; one down where the same link works on another
        # GPU is a bridge or a link that failed.
        working = {n for _, n in active}
        suspect = [(g, n) for g, n in down if nvswitch or n in working]
        if suspect:
            problems.append(f"link(s) down: {joined(f'GPU {g} link {n}' for g, n in suspect)}")
    if active:
        usual, _ = Counter(active.values()).most_common(1)[0]
        odd = [
            f"GPU {g} link {n} at {s} GB/s" for (g, n), s in sorted(active.items()) if s != usual
        ]
        if odd:
            problems.append(f"link speed differs from the others' {usual} GB/s: {joined(odd)}")
        lines.append(f"active links run at {usual} GB/s" + (" (others differ)" if odd else ""))
    if problems:
        return Verdict(
            Status.FAIL,
            "; ".join(problems),
            tuple(lines + nvswitch[:3]),
            "`nvidia-smi nvlink -e` for the links' error counters; reset the GPUs "
            "(`nvidia-smi -r`) or reboot; on a bridged PCIe pair, reseat the NVLink bridge; "
            "if a link stays down, run NVIDIA's NVLink troubleshooting (`dcgmi diag -r 2`) and "
            "contact the vendor",
        )
    if not active:
        return Verdict(
            Status.SKIP,
            f"no NVLink connected: all {len(links)} link(s) inactive (no bridge fitted)",
            tuple(lines),
        )
    unwired = f"; {len(down)} link(s) unwired on every GPU alike" if down else ""
    return Verdict(
        Status.PASS,
        f"{len(active)} NVLink link(s) active at {usual} GB/s on {len(gpus)} GPU(s){unwired}",
        tuple(lines),
    )


CHECKS: tuple[Check, ...] = (
    Check("nvlink", "NVLink links", (NVLINK_STATUS, SMI_DETAILS, NVSWITCHES), _judge_nvlink),
)
