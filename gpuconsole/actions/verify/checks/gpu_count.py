"""Are as many GPUs visible as the inventory expects for the host (its `gpus = N`)?"""

from __future__ import annotations

import re

from gpuconsole.actions.verify import probes
from gpuconsole.actions.verify.model import Check, Evidence, Status, Verdict
from gpuconsole.hosts.targets import Context

_SMI_TABLE_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s+(\S+)")


def _gpus(evidence: Evidence) -> list[str]:
    """One line per GPU nvidia-smi lists: the query's rows, or the default table's GPU rows
    when the query failed (drivers older than 510 do not know its compute_cap field)."""
    rows = probes.gpu_rows(evidence)
    if rows:
        return [f"GPU {r.get('index')}: {r.get('name')} ({r.get('pci.bus_id')})" for r in rows]
    smi = evidence[probes.SMI.name]
    table = smi.stdout.split("Processes:")[0] if smi.ok else ""
    matches = (_SMI_TABLE_GPU.match(line) for line in table.splitlines())
    return [f"GPU {m.group(1)}: {m.group(2)} ({m.group(3)})" for m in matches if m]


def _judge_gpu_count(evidence: Evidence, context: Context) -> Verdict:
    gpus, expected = _gpus(evidence), context.expected_gpus
    found = len(gpus)
    if expected is None:
        return Verdict(
            Status.SKIP,
            f"{found} GPU(s) visible; no expected count for this host "
            "(set `gpus = N` for it in the inventory)",
            tuple(gpus),
        )
    if found == expected:
        return Verdict(Status.PASS, f"{found} of {expected} GPUs visible", tuple(gpus))
    if found > expected:
        return Verdict(
            Status.WARN,
            f"{found} GPUs visible, the inventory expects {expected}",
            tuple(gpus),
            f"Set `gpus = {found}` for this host in the inventory if the extra GPUs are meant.",
        )
    smi_said = () if gpus else evidence[probes.SMI_QUERY.name].lines(3)
    return Verdict(
        Status.FAIL,
        f"{found} of {expected} expected GPUs visible",
        (*gpus, *smi_said),
        "Find the missing GPU: `sudo dmesg | grep -i xid` (XID 79: fallen off the bus), "
        "`nvidia-smi -q` for the GPUs that remain, `lspci -d 10de:` for what the PCIe bus still "
        "sees. Reboot the node; if the GPU stays missing, reseat it and check its power cables.",
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "gpu-count",
        "Expected GPUs visible",
        (probes.SMI_QUERY, probes.SMI),
        _judge_gpu_count,
    ),
)
