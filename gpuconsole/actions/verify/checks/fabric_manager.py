"""On an NVSwitch system (HGX, DGX), is Fabric Manager running and the fabric initialised? Without
it CUDA fails with error 802 (shared/reference/gpu-facts.md, "Driver failure modes")."""

from __future__ import annotations

from gpuconsole.actions.verify.judging import joined
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.actions.verify.probes import (
    FABRIC_STATES,
    NVSWITCHES,
    SMI_DETAILS,
    SMI_QUERY,
    fabric_states,
    gpu_rows,
    nvswitch_signals,
)
from gpuconsole.hosts.targets import Context

FABRIC_MANAGER = Probe(
    "fabric-manager-service",
    "command -v systemctl >/dev/null 2>&1 || exit 127; systemctl is-active nvidia-fabricmanager",
)
_FABRIC_FINE = {"success", "n/a", ""}
"""The fabric statuses that say nothing is wrong once a GPU's fabric state is Completed."""


def _judge_fabric_manager(evidence: Evidence, context: Context) -> Verdict:
    signals = nvswitch_signals(evidence)
    if not signals:
        return Verdict(
            Status.SKIP,
            "not an NVSwitch system (no NVSwitch device, no GPU reports a fabric state): "
            "no Fabric Manager needed",
        )
    states = fabric_states(evidence[SMI_DETAILS.name])
    service = evidence[FABRIC_MANAGER.name]
    active = service.stdout.strip().splitlines()[:1] == ["active"]
    lines = [*signals[:4], *(f"GPU {b}: fabric state {s}, status {st}" for b, s, st in states)]
    lines.append(
        "systemctl is-active nvidia-fabricmanager: "
        + ("systemctl not found" if service.missing else service.stdout.strip() or "(nothing)")
    )
    unfinished = [
        f"GPU {bus}: {state}, status {status}"
        for bus, state, status in states
        if state.casefold() in FABRIC_STATES
        and (state.casefold() != "completed" or status.casefold() not in _FABRIC_FINE)
    ]
    problems = []
    if not service.missing and not active:
        problems.append(f"nvidia-fabricmanager is {service.stdout.strip() or 'not running'}")
    if unfinished:
        problems.append(f"fabric not initialised ({joined(unfinished)})")
    if problems:
        driver = next((r.get("driver_version") for r in gpu_rows(evidence)), None) or "<driver>"
        return Verdict(
            Status.FAIL,
            "; ".join(problems) + ": CUDA fails with error 802 (system not yet initialized)",
            tuple(lines),
            f"install nvidia-fabricmanager at exactly the driver's version {driver} (e.g. "
            f"`apt install nvidia-fabricmanager-{driver.split('.')[0]}={driver}-1`), then "
            "`systemctl enable --now nvidia-fabricmanager`; `journalctl -u nvidia-fabricmanager` "
            "says why it stopped",
        )
    initialised = [s for s in states if s[1].casefold() == "completed"]
    if not active and not initialised:
        return Verdict(
            Status.WARN,
            "NVSwitch system, but neither the service nor the GPUs say whether the fabric is up",
            tuple(lines),
            "check by hand: `nvidia-smi -q | grep -A 2 Fabric`, and Fabric Manager's log "
            "(/var/log/fabricmanager.log); a CUDA program failing with error 802 means it is down",
        )
    done = f"fabric initialised on {len(initialised)} GPU(s)" if initialised else ""
    running = "nvidia-fabricmanager active" if active else ""
    return Verdict(
        Status.PASS, "NVSwitch system: " + joined(filter(None, (running, done))), tuple(lines)
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "fabric-manager",
        "Fabric Manager (NVSwitch systems)",
        (NVSWITCHES, SMI_DETAILS, FABRIC_MANAGER, SMI_QUERY),
        _judge_fabric_manager,
    ),
)
