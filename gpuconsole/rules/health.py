"""Health rules: readings in, findings out, each with a stable code and what to do next.

Rules never guess: a reading that is ``None`` (not supported, not reported) triggers nothing, and a
lost GPU yields ``gpu-lost`` alone (its XIDs are still reported) rather than a finding per missing
field. Thresholds come from ``shared/reference/gpu-server-guide.zh.txt`` §4.2 (85 °C, keep 20 %
of memory in reserve) and ``shared/reference/gpu-facts.md``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gpuconsole.core import xid as xids
from gpuconsole.core.fields import gib
from gpuconsole.core.model import (
    Finding,
    GpuProcess,
    GpuState,
    HostSnapshot,
    HostState,
    Severity,
)
from gpuconsole.rules.limits import MEMORY_FULL_FRACTION, MEMORY_RESERVE_FRACTION, TEMP_HIGH_C


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The tunable limits of the rules; the defaults are the guide's."""

    temp_high_c: float = TEMP_HIGH_C
    memory_full_fraction: float = MEMORY_FULL_FRACTION
    memory_reserve_fraction: float = MEMORY_RESERVE_FRACTION


DEFAULT_THRESHOLDS = Thresholds()
BUSY_UTILIZATION_PCT = 20.0
"""An idle GPU legitimately trains its PCIe link down a generation; a busy one should not."""
IDLE_UTILIZATION_PCT = 2.0
IDLE_MEMORY_SECONDS = 60.0
"""How long a GPU must sit idle while processes hold its memory before that is worth a finding."""


def _pct(fraction: float) -> str:
    """A fraction as the console writes percentages: ``0.97`` -> ``97 %``."""
    return f"{fraction * 100:.0f} %"


RULES: dict[str, str] = {
    "gpu-lost": "the GPU stopped answering (fallen off the bus)",
    "xid": "the driver reported an XID error for the GPU",
    "thermal-throttle": "the GPU slows its clocks because it is too hot",
    "temp-high": f"the GPU is at or above the alert temperature ({TEMP_HIGH_C:g} °C), not yet "
    "slowing down",
    "power-brake": "an external power brake (PSU or board) slows the GPU down",
    "hw-slowdown": "hardware slowdown engaged without a more specific reason",
    "ecc-uncorrectable": "uncorrectable ECC errors since the driver loaded",
    "row-remap-pending": "an HBM row remap waits for a GPU reset",
    "row-remap-failure": "the GPU failed to remap a faulty HBM row",
    "retired-pages-pending": "a page retirement waits for a GPU reset or reboot to take effect",
    "pcie-degraded": "the PCIe link trained below its width, or below its generation under load",
    "mem-pressure": f"more than {_pct(MEMORY_RESERVE_FRACTION)} of GPU memory used (the guide's "
    f"{_pct(1 - MEMORY_RESERVE_FRACTION)} reserve); {_pct(MEMORY_FULL_FRACTION)} warns",
    "recovery-action": "the driver asks for a GPU reset, a node reboot or a drain",
    "persistence-off": "persistence mode is off: the driver re-initialises the GPU per process",
    "idle-memory-held": f"processes hold memory on a GPU idle for {IDLE_MEMORY_SECONDS:.0f} s",
    "power-cap": "the GPU runs at its software power limit",
    "host-stale": "the host's readings stopped arriving",
    "host-down": "the host cannot be reached",
    "host-auth-failed": "SSH authentication to the host failed",
    "host-key-mismatch": "the host's SSH key does not match known_hosts",
    "host-key-unknown": "the host's SSH key is in no known_hosts file ssh reads for it",
    "host-key-revoked": "the host's SSH key, or its certificate's CA, is marked @revoked",
    "host-ssh-refused": "the host's ssh config asks for what the console does not do",
    "host-no-driver": "the console logs in, but the host's GPUs cannot be read",
    "host-agent-error": "the console logs in, but the agent's lines cannot be read",
    "bad-value-from-host": "the host sent values no GPU can report; they show as N/A",
}


class _Issue(NamedTuple):
    """A finding before it is stamped with its host and GPU."""

    severity: Severity
    code: str
    message: str
    remediation: str


GpuRule = Callable[[GpuState], _Issue | None]


def evaluate(
    snapshot: HostSnapshot,
    previous: Sequence[HostSnapshot] = (),
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> list[Finding]:
    """Every finding in ``snapshot``, worst first, then by GPU (host-wide ones first).

    ``previous`` holds earlier snapshots of the same host, oldest first, for duration rules.
    """
    findings = [
        _stamp(issue, snapshot.host, gpu.index)
        for gpu in snapshot.gpus
        for issue in _gpu_issues(gpu, snapshot, previous, thresholds)
    ]
    findings += _xid_findings(snapshot)
    if snapshot.bad_values:
        findings.append(_bad_values(snapshot))
    return sorted(findings, key=lambda f: (-f.severity, -1 if f.gpu is None else f.gpu))


_HOST_STATES: dict[HostState, tuple[Severity, str, str, str]] = {
    HostState.STALE: (
        Severity.WARNING,
        "host-stale",
        "readings stopped arriving",
        "check the host's load and network (ssh {host} uptime); the console keeps retrying",
    ),
    HostState.DOWN: (
        Severity.CRITICAL,
        "host-down",
        "cannot be reached",
        "check that {host} is powered and on the network (ping, BMC console)",
    ),
    HostState.AUTH_FAILED: (
        Severity.CRITICAL,
        "host-auth-failed",
        "SSH authentication failed",
        "check the user and key for {host} in the inventory or ~/.ssh/config; try ssh {host}",
    ),
    HostState.HOST_KEY_MISMATCH: (
        Severity.CRITICAL,
        "host-key-mismatch",
        "SSH host key does not match known_hosts",
        "confirm with {host}'s admin that it was reinstalled before ssh-keygen -R {host}",
    ),
    HostState.HOST_KEY_UNKNOWN: (
        Severity.CRITICAL,
        "host-key-unknown",
        "SSH host key is not known",
        "check the key's fingerprint with {host}'s admin, then add it (ssh {host} asks once)",
    ),
    HostState.HOST_KEY_REVOKED: (
        Severity.CRITICAL,
        "host-key-revoked",
        "SSH host key is revoked",
        "{host} must get a new host key; find out why the old one was revoked",
    ),
    HostState.REFUSED: (
        Severity.CRITICAL,
        "host-ssh-refused",
        "refused by its ssh config",
        "the reason names the keyword and the line that set it: unset it for {host}",
    ),
    HostState.NO_DRIVER: (
        Severity.CRITICAL,
        "host-no-driver",
        "logged in, but no GPU can be read",
        "gpuconsole verify {host} says what is missing; gpuconsole repair {host} mends a driver",
    ),
    HostState.AGENT_ERROR: (
        Severity.CRITICAL,
        "host-agent-error",
        "logged in, but the agent's lines cannot be read",
        "something on {host} answers in the agent's place (a ForceCommand, a command= key "
        "option, a python3 that is not Python): the reason quotes its first line",
    ),
}


def host_state_finding(host: str, state: HostState, reason: str | None) -> Finding | None:
    """The finding for a host whose reading stream is not live, or None when it is (or soon is)."""
    texts = _HOST_STATES.get(state)
    if texts is None:
        return None
    severity, code, what, remediation = texts
    if reason:
        reason = reason.removeprefix(f"{host}: ")  # sources name the host; say it once
    message = f"{host}: {what}" + (f" ({reason})" if reason else "")
    return Finding(severity, code, message, remediation.format(host=host), host=host)


def _stamp(issue: _Issue, host: str, gpu: int | None) -> Finding:
    return Finding(issue.severity, issue.code, issue.message, issue.remediation, host, gpu)


def _gpu_issues(
    gpu: GpuState,
    snapshot: HostSnapshot,
    previous: Sequence[HostSnapshot],
    thresholds: Thresholds,
) -> list[_Issue]:
    if gpu.lost:
        return [_lost(gpu)]
    issues = [rule(gpu) for rule in _GPU_RULES]
    issues.append(_thermal(gpu, thresholds))
    issues.append(_memory(gpu, thresholds))
    issues.append(_idle_memory_held(gpu, snapshot, previous))
    return [issue for issue in issues if issue is not None]


def _lost(gpu: GpuState) -> _Issue:
    where = f" ({gpu.pci_bus_id})" if gpu.pci_bus_id else ""
    fallen = xids.describe(xids.FALLEN_OFF_THE_BUS)
    return _Issue(
        Severity.CRITICAL,
        "gpu-lost",
        f"GPU {gpu.index}{where} stopped answering ({fallen.meaning})",
        fallen.action,
    )


def _bad_values(snapshot: HostSnapshot) -> Finding:
    """A note, never an alarm: an impossible value says the telemetry is broken, not the GPU."""
    count = snapshot.bad_values
    notes = "; ".join(snapshot.bad_value_notes)
    more = (
        f"; {count - len(snapshot.bad_value_notes)} more"
        if count > len(snapshot.bad_value_notes)
        else ""
    )
    return Finding(
        Severity.INFO,
        "bad-value-from-host",
        f"{count} value{'s' if count != 1 else ''} from the host shown as N/A: {notes}{more}",
        f"compare with nvidia-smi -q on {snapshot.host}: values no GPU can report come from a "
        "broken driver, agent or dump, not from the GPU",
        host=snapshot.host,
    )


def _xid_findings(snapshot: HostSnapshot) -> list[Finding]:
    """One finding per distinct (XID, GPU), counting repeats rather than listing them."""
    counts = Counter((event.xid, event.gpu) for event in snapshot.xid_events)
    return [
        _stamp(_xid_issue(code, gpu, count), snapshot.host, gpu)
        for (code, gpu), count in counts.items()
    ]


def _xid_issue(code: int, gpu: int | None, count: int) -> _Issue:
    info = xids.describe(code)
    where = "" if gpu is None else f" on GPU {gpu}"
    repeats = f" ({count} times)" if count > 1 else ""
    message = f"XID {code}{where}: {info.meaning}{repeats}"
    action = info.action if gpu is None else info.action.replace("<gpu>", str(gpu))
    return _Issue(xids.severity(code), "xid", message, action)


def _thermal(gpu: GpuState, thresholds: Thresholds) -> _Issue | None:
    """``thermal-throttle`` when the GPU slows for heat, else ``temp-high`` above 85 °C."""
    reasons = [r for r in ("hw-thermal", "sw-thermal") if r in (gpu.throttle_reasons or ())]
    temp, limit = gpu.temperature_c, gpu.slowdown_temperature_c
    over_limit = temp is not None and limit is not None and temp >= limit
    if reasons or over_limit:
        return _Issue(
            Severity.CRITICAL,
            "thermal-throttle",
            _thermal_message(gpu, reasons),
            "check airflow, fans and inlet temperature; lower the power limit "
            f"(nvidia-smi -i {gpu.index} -pl <watts>) until it cools",
        )
    if temp is not None and temp >= thresholds.temp_high_c:
        return _Issue(
            Severity.WARNING,
            "temp-high",
            f"GPU {gpu.index} at {temp:.0f} °C (alert at {thresholds.temp_high_c:.0f} °C)",
            "check airflow, fans and inlet temperature before it reaches its slowdown temperature",
        )
    return None


def _thermal_message(gpu: GpuState, reasons: list[str]) -> str:
    parts = [f"GPU {gpu.index}"]
    if gpu.temperature_c is not None:
        parts.append(f" at {gpu.temperature_c:.0f} °C")
    if gpu.slowdown_temperature_c is not None:
        parts.append(f", slowdown at {gpu.slowdown_temperature_c:.0f} °C")
    if reasons:
        parts.append(f" ({', '.join(reasons)} active)")
    return "".join(parts)


def _power_brake(gpu: GpuState) -> _Issue | None:
    if "hw-power-brake" not in (gpu.throttle_reasons or ()):
        return None
    return _Issue(
        Severity.WARNING,
        "power-brake",
        f"GPU {gpu.index} slowed by a hardware power brake",
        "check the PSUs and the chassis power budget in the BMC event log (ipmitool sel list)",
    )


def _hw_slowdown(gpu: GpuState) -> _Issue | None:
    """``hw-slowdown`` only when no more specific hardware reason explains it.

    NVML reports the generic hardware slowdown alongside a thermal slowdown or a power brake;
    those already have their own finding.
    """
    reasons = gpu.throttle_reasons or ()
    if "hw-slowdown" not in reasons or {"hw-thermal", "hw-power-brake"} & set(reasons):
        return None
    return _Issue(
        Severity.WARNING,
        "hw-slowdown",
        f"GPU {gpu.index} in hardware slowdown (clocks halved or lower)",
        "check the BMC event log (ipmitool sel list) for PSU or thermal events, then the cables",
    )


def _power_cap(gpu: GpuState) -> _Issue | None:
    if "sw-power-cap" not in (gpu.throttle_reasons or ()):
        return None
    figures = ""
    if gpu.power_w is not None and gpu.power_limit_w is not None:
        figures = f": {gpu.power_w:.0f} W of {gpu.power_limit_w:.0f} W"
    return _Issue(
        Severity.INFO,
        "power-cap",
        f"GPU {gpu.index} held at its power limit{figures}",
        "expected under full load; raise it (nvidia-smi -pl) only if power and cooling allow",
    )


def _ecc(gpu: GpuState) -> _Issue | None:
    count = gpu.ecc.volatile_uncorrected if gpu.ecc else None
    if not count:
        return None
    return _Issue(
        Severity.CRITICAL,
        "ecc-uncorrectable",
        f"GPU {gpu.index}: {count} uncorrectable ECC error{'s' if count > 1 else ''} "
        "since the driver loaded",
        _recovery(gpu, f"drain the GPU's jobs, then reset it (nvidia-smi -r -i {gpu.index})"),
    )


def _remap_pending(gpu: GpuState) -> _Issue | None:
    if not (gpu.remap and gpu.remap.pending):
        return None
    return _Issue(
        Severity.CRITICAL,
        "row-remap-pending",
        f"GPU {gpu.index}: an HBM row remap is pending until the GPU is reset",
        _recovery(gpu, f"reset the GPU when no process runs on it (nvidia-smi -r -i {gpu.index})"),
    )


def _remap_failure(gpu: GpuState) -> _Issue | None:
    if not (gpu.remap and gpu.remap.failure):
        return None
    uncorrectable = gpu.remap.uncorrectable
    rows = f" ({uncorrectable} rows remapped for uncorrectable errors)" if uncorrectable else ""
    return _Issue(
        Severity.CRITICAL,
        "row-remap-failure",
        f"GPU {gpu.index} failed to remap a faulty HBM row{rows}",
        "drain the GPU and contact NVIDIA support: it has run out of spare rows",
    )


def _retired_pages_pending(gpu: GpuState) -> _Issue | None:
    if not gpu.retired_pages_pending:
        return None
    return _Issue(
        Severity.WARNING,
        "retired-pages-pending",
        f"GPU {gpu.index}: a memory page retirement is pending until the GPU is reset",
        _recovery(
            gpu,
            f"reset the GPU when no process runs on it (nvidia-smi -r -i {gpu.index}), "
            "or reboot the node",
        ),
    )


_RECOVERY_ACTIONS: dict[str, str] = {
    "gpu-reset": "reset the GPU when no process runs on it (nvidia-smi -r -i {gpu})",
    "node-reboot": "drain the node and reboot it",
    "drain-p2p": "drain peer-to-peer jobs from the GPU, then reset it (nvidia-smi -r -i {gpu})",
    "drain-and-reset": "drain the GPU's jobs, then reset it (nvidia-smi -r -i {gpu})",
}
_RECOVERY_SPELLINGS = {"reset": "gpu-reset", "reboot": "node-reboot"}


def _recovery_key(action: str | None) -> str | None:
    if not action:
        return None
    key = action.strip().lower().replace("_", "-").replace(" ", "-")
    return _RECOVERY_SPELLINGS.get(key, key)


def _recovery(gpu: GpuState, default: str) -> str:
    """The remediation NVML's recovery action asks for, or ``default`` when it asks for none.

    Accepts NVML's names in any case with ``_``, ``-`` or spaces (``GPU_RESET``, "Drain P2P").
    """
    key = _recovery_key(gpu.recovery_action)
    if key is None or key == "none":
        return default
    template = _RECOVERY_ACTIONS.get(key)
    if template is None:
        return f"driver recovery action {gpu.recovery_action!r}: {default}"
    return template.format(gpu=gpu.index)


def _pcie(gpu: GpuState) -> _Issue | None:
    """Width below its maximum is always a fault; a lower generation only under load."""
    link = gpu.pcie
    if link is None:
        return None
    busy = gpu.utilization_pct is not None and gpu.utilization_pct >= BUSY_UTILIZATION_PCT
    if not (link.degraded_width or (link.degraded_gen and busy)):
        return None
    load = f" at {gpu.utilization_pct:.0f} % load" if link.degraded_gen and busy else ""
    return _Issue(
        Severity.WARNING,
        "pcie-degraded",
        f"GPU {gpu.index} PCIe {_link(link.gen, link.width)}{load}, "
        f"capable of {_link(link.max_gen, link.max_width)}",
        "reseat the GPU or its riser, check the slot's PCIe settings in the BIOS, then reboot",
    )


def _link(gen: int | None, width: int | None) -> str:
    parts = [f"Gen{gen}" if gen is not None else "", f"x{width}" if width is not None else ""]
    return " ".join(p for p in parts if p) or "N/A"


def _memory(gpu: GpuState, thresholds: Thresholds) -> _Issue | None:
    """``mem-pressure``: WARNING when nearly full, INFO when the 20 % reserve is gone."""
    fraction = gpu.memory_fraction
    if fraction is None or fraction < thresholds.memory_reserve_fraction:
        return None
    message = (
        f"GPU {gpu.index} memory {_pct(fraction)} used "
        f"({gib(gpu.memory_used_mib)} of {gib(gpu.memory_total_mib)} GiB)"
    )
    if fraction >= thresholds.memory_full_fraction:
        return _Issue(
            Severity.WARNING,
            "mem-pressure",
            message,
            "expect out-of-memory errors: lower the batch size or enable activation checkpointing",
        )
    reserve = _pct(1 - thresholds.memory_reserve_fraction)
    return _Issue(
        Severity.INFO,
        "mem-pressure",
        f"{message}, less than the {reserve} reserve left",
        f"keep {reserve} of GPU memory free for allocation spikes: trim the batch or the model",
    )


def _recovery_action(gpu: GpuState) -> _Issue | None:
    """The driver's own verdict (NVML's recovery action), when it asks for something."""
    key = _recovery_key(gpu.recovery_action)
    if key is None or key == "none":
        return None
    return _Issue(
        Severity.CRITICAL,
        "recovery-action",
        f"GPU {gpu.index}: the driver's recovery action is {gpu.recovery_action}",
        _recovery(gpu, "follow the driver's recovery action"),
    )


def _persistence(gpu: GpuState) -> _Issue | None:
    if gpu.persistence_mode is not False:
        return None
    return _Issue(
        Severity.WARNING,
        "persistence-off",
        f"GPU {gpu.index}: persistence mode is off (slow job starts, state lost between jobs)",
        "run the nvidia-persistenced daemon (systemctl enable --now nvidia-persistenced); "
        "nvidia-smi -pm 1 is deprecated",
    )


_GPU_RULES: tuple[GpuRule, ...] = (
    _power_brake,
    _hw_slowdown,
    _ecc,
    _remap_pending,
    _remap_failure,
    _retired_pages_pending,
    _pcie,
    _recovery_action,
    _persistence,
    _power_cap,
)


def _idle_memory_held(
    gpu: GpuState, snapshot: HostSnapshot, previous: Sequence[HostSnapshot]
) -> _Issue | None:
    """Processes hold memory on a GPU that has been idle for at least ``IDLE_MEMORY_SECONDS``."""
    holders = [p for p in snapshot.processes_on(gpu.index) if p.used_memory_mib]
    if not holders or not _is_idle(gpu):
        return None
    idle_for = _idle_seconds(gpu.index, snapshot, previous)
    if idle_for < IDLE_MEMORY_SECONDS:
        return None
    biggest = max(holders, key=lambda p: p.used_memory_mib or 0.0)
    return _Issue(
        Severity.WARNING,
        "idle-memory-held",
        f"GPU {gpu.index} idle for {idle_for:.0f} s while {len(holders)} "
        f"process{'es hold' if len(holders) > 1 else ' holds'} memory; "
        f"{'biggest: ' if len(holders) > 1 else ''}{_holder(biggest)}",
        f"ask {biggest.user or 'the owner'} whether pid {biggest.pid} is still needed; "
        "ending it frees the GPU",
    )


def _holder(process: GpuProcess) -> str:
    user = f" ({process.user})" if process.user else ""
    return f"pid {process.pid}{user}, {gib(process.used_memory_mib)} GiB"


def _is_idle(gpu: GpuState | None) -> bool:
    return (
        gpu is not None
        and gpu.utilization_pct is not None
        and gpu.utilization_pct <= IDLE_UTILIZATION_PCT
    )


def _idle_seconds(index: int, snapshot: HostSnapshot, previous: Sequence[HostSnapshot]) -> float:
    """How long GPU ``index`` has been idle without a break, judged from the recent snapshots.

    The streak ends at the newest earlier snapshot where the GPU was busy, missing or unread.
    """
    start = snapshot.time
    for earlier in reversed(previous):
        if not _is_idle(earlier.gpu(index)):
            break
        start = earlier.time
    return snapshot.time - start
