"""Has the host local NVMe to stage data sets on?"""

from __future__ import annotations

from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

NVME = Probe(
    "nvme-namespaces",
    "for block in /sys/block/nvme*; do"
    ' [ -e "$block" ] || continue; name=${block##*/};'
    " case $name in *c*) continue ;; esac;"
    ' sectors=$(cat "$block/size" 2>/dev/null || echo 0);'
    ' transport=$(cat "$block/device/transport" 2>/dev/null || echo unknown);'
    ' model=$(cat "$block/device/model" 2>/dev/null);'
    ' echo "$name $transport $((sectors * 512)) $model";'
    " done",
)
"""One line per NVMe namespace: name, transport (pcie = local), bytes, model. Multipath's hidden
per-controller paths (nvme0c0n1) are left out."""


def _judge_nvme(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[NVME.name]
    namespaces = []
    for line in output.stdout.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) >= 3 and parts[2].isdigit():
            name, transport, size = parts[:3]
            model = parts[3].strip() if len(parts) == 4 else ""
            namespaces.append((name, transport, int(size), model))
    local = [n for n in namespaces if n[1] not in {"tcp", "rdma", "fc", "loop"}]
    lines = tuple(
        f"{name}: {size / 1e12:.2f} TB, {transport}, {model or 'model unknown'}"
        for name, transport, size, model in namespaces
    )
    if not local:
        remote = f" ({len(namespaces)} over a network)" if namespaces else ""
        return Verdict(
            Status.SKIP,
            f"no local NVMe{remote}: not every node has it; jobs stage data elsewhere",
            lines,
        )
    total = sum(n[2] for n in local) / 1e12
    return Verdict(
        Status.PASS, f"{len(local)} local NVMe namespace(s), {total:.2f} TB in all", lines
    )


CHECKS: tuple[Check, ...] = (Check("nvme", "Local NVMe", (NVME,), _judge_nvme),)
