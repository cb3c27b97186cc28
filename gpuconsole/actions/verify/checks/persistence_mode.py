"""Is persistence mode on for every GPU, through the nvidia-persistenced daemon
(shared/reference/gpu-facts.md, "Driver failure modes")?"""

from __future__ import annotations

from gpuconsole.actions.verify.judging import joined, smi_unusable
from gpuconsole.actions.verify.model import Check, Evidence, Status, Verdict
from gpuconsole.actions.verify.probes import SMI_QUERY, smi_rows
from gpuconsole.hosts.targets import Context


def _judge_persistence(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[SMI_QUERY.name]
    if trouble := smi_unusable(output, "GPU query"):
        return trouble
    rows = smi_rows(output)
    if not rows:
        return Verdict(Status.SKIP, "nvidia-smi listed no GPU")
    lines = tuple(
        f"GPU {row.get('index')} ({row.get('pci.bus_id')}): "
        f"persistence mode {row.get('persistence_mode')}"
        for row in rows
    )
    off = [r.get("index", "?") for r in rows if r.get("persistence_mode") == "Disabled"]
    if off:
        return Verdict(
            Status.WARN,
            f"persistence mode is off on GPU {joined(off)} of {len(rows)}: each CUDA start "
            "re-initialises the GPU (seconds), and its state is lost between jobs",
            lines,
            "enable and start the nvidia-persistenced daemon "
            "(`systemctl enable --now nvidia-persistenced`); `nvidia-smi -pm 1` is deprecated",
        )
    return Verdict(Status.PASS, f"persistence mode is on for all {len(rows)} GPU(s)", lines)


CHECKS: tuple[Check, ...] = (
    Check("persistence-mode", "Persistence mode", (SMI_QUERY,), _judge_persistence),
)
