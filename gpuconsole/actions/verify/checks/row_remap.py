"""Has any GPU's memory a row remap pending or failed, or more rows remapped for uncorrectable
errors than fleets allow? The limits and NVML's recovery actions are shared/reference/gpu-facts.md's
("Health-check thresholds used by fleets", "Driver failure modes")."""

from __future__ import annotations

from collections.abc import Iterable

from gpuconsole.actions.verify.judging import csv_cells, smi_int, smi_unusable
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.actions.verify.probes import SMI_QUERY, gpu_rows, smi_command
from gpuconsole.hosts.targets import Context
from gpuconsole.telemetry.kernel_log import pci_address

REMAPPED_ROWS = Probe(
    "remapped-rows",
    smi_command(
        "--query-remapped-rows=gpu_bus_id,remapped_rows.correctable,"
        "remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure"
        " --format=csv,noheader"
    ),
)
"""Per GPU (Ampere and later): rows remapped for correctable and uncorrectable errors, whether a
remap waits for a reset, whether one failed."""


def _index_by_bus(rows: Iterable[dict[str, str]]) -> dict[tuple[int, int, int], str]:
    """PCI address (domain, bus, device) -> nvidia-smi index, to name GPUs in bus-id outputs."""
    found = {}
    for row in rows:
        address = pci_address(row.get("pci.bus_id", ""))
        if address is not None:
            found[address] = row.get("index", "?")
    return found


def _gpu_label(bus_id: str, by_bus: dict[tuple[int, int, int], str]) -> str:
    index = by_bus.get(pci_address(bus_id) or (-1, -1, -1))
    return f"GPU {index} ({bus_id})" if index is not None else f"GPU {bus_id}"


ROW_REMAP_UNCORRECTABLE_LIMIT = 512
"""More rows remapped for uncorrectable errors than this fails a fleet's node check."""


def _yes(text: str) -> bool:
    return text.strip().casefold() in {"yes", "1", "true"}


def _judge_row_remap(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[REMAPPED_ROWS.name]
    if "not supported" in (output.stdout + output.stderr).casefold():
        return Verdict(
            Status.SKIP,
            "these GPUs do not remap rows (an Ampere-and-later feature; older GPUs retire pages)",
            output.lines(2),
        )
    if trouble := smi_unusable(output, "remapped-rows query"):
        return trouble
    rows = [row for row in csv_cells(output.stdout) if len(row) == 5]
    if not rows:
        return Verdict(Status.SKIP, "nvidia-smi listed no GPU's remapped rows", output.lines(2))
    if all(smi_int(r[1]) is None and smi_int(r[2]) is None for r in rows):
        return Verdict(Status.SKIP, "these GPUs report no row remapping", output.lines(2))
    by_bus = _index_by_bus(gpu_rows(evidence))
    lines, problems, remedies = [], [], []
    for bus_id, correctable, uncorrectable, pending, failure in rows:
        gpu = _gpu_label(bus_id, by_bus)
        lines.append(
            f"{gpu}: remapped rows {correctable} correctable, {uncorrectable} uncorrectable; "
            f"pending {pending}; failure {failure}"
        )
        if _yes(failure):
            problems.append(f"{gpu}: a row remap failed")
            remedies.append(
                f"{gpu}: reset it (`nvidia-smi -r -i <gpu>`); if the failure stays, it has run out "
                "of spare rows: drain it and contact NVIDIA support (RMA)"
            )
        if _yes(pending):
            problems.append(f"{gpu}: a row remap is pending")
            remedies.append(
                f"{gpu}: reset it when idle (`nvidia-smi -r -i <gpu>`) or reboot the node: "
                "NVML's recovery action for a pending remap is a reset"
            )
        if (smi_int(uncorrectable) or 0) > ROW_REMAP_UNCORRECTABLE_LIMIT:
            problems.append(
                f"{gpu}: {uncorrectable} rows remapped for uncorrectable errors "
                f"(> {ROW_REMAP_UNCORRECTABLE_LIMIT})"
            )
            remedies.append(f"{gpu}: drain it and replace it (RMA): its memory is wearing out")
    if problems:
        return Verdict(Status.FAIL, "; ".join(problems), tuple(lines), "; ".join(remedies))
    total = sum(smi_int(r[2]) or 0 for r in rows)
    return Verdict(
        Status.PASS,
        f"no remap pending or failed on {len(rows)} GPU(s); {total} row(s) remapped for "
        f"uncorrectable errors (limit {ROW_REMAP_UNCORRECTABLE_LIMIT} per GPU)",
        tuple(lines),
    )


CHECKS: tuple[Check, ...] = (
    Check("row-remap", "Memory row remapping", (REMAPPED_ROWS, SMI_QUERY), _judge_row_remap),
)
