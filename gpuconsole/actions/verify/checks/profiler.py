"""Is there a profiler for this GPU: Nsight Compute, or nvprof where the GPU is older than compute
capability 8.0, which nvprof does not support (shared/reference/gpu-facts.md, "Compatibility")?"""

from __future__ import annotations

from gpuconsole.actions.verify import compat, probes
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

PROFILERS = Probe(
    "profilers",
    "for tool in ncu nvprof; do "
    'if command -v "$tool" >/dev/null 2>&1; then echo "$tool $(command -v "$tool")"; '
    'elif [ -x "/usr/local/cuda/bin/$tool" ]; then echo "$tool /usr/local/cuda/bin/$tool"; fi; '
    "done",
)
"""One line per profiler found: "ncu /usr/local/cuda/bin/ncu"."""


def _compute_capability(evidence: Evidence) -> str | None:
    rows = probes.gpu_rows(evidence)
    caps = [row.get("compute_cap", "") for row in rows]
    found = next((cap for cap in caps if compat.version(cap)), None)
    return found or (probes.torch_info(evidence) or {}).get("capability")


def _judge_profiler(evidence: Evidence, context: Context) -> Verdict:
    found = dict(
        line.split(" ", 1) for line in evidence[PROFILERS.name].stdout.splitlines() if " " in line
    )
    capability = _compute_capability(evidence)
    on = f" (compute capability {capability})" if capability else ""
    if "ncu" in found:
        return Verdict(Status.PASS, f"Nsight Compute: {found['ncu']}{on}", (f"ncu {found['ncu']}",))
    if "nvprof" not in found:
        return Verdict(Status.SKIP, "no GPU profiler: neither ncu nor nvprof is installed")
    lines = (f"nvprof {found['nvprof']}", f"compute capability {capability or 'unknown'}")
    if (compat.version(capability) or ()) >= (8, 0):
        return Verdict(
            Status.WARN,
            f"only nvprof, which does not support compute capability {capability}",
            lines,
            "Install Nsight Compute (`ncu`, in the CUDA toolkit); nvprof metrics map to its "
            "sections, e.g. gld_efficiency -> "
            "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct.",
        )
    return Verdict(Status.PASS, f"nvprof: {found['nvprof']}{on}", lines)


CHECKS: tuple[Check, ...] = (
    Check(
        "profiler",
        "A profiler for this GPU",
        (PROFILERS, probes.SMI_QUERY, probes.TORCH),
        _judge_profiler,
    ),
)
