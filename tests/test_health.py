"""Health rules and the XID catalog, on snapshots built by hand."""

from __future__ import annotations

import dataclasses

import pytest

from gpuconsole.core import xid
from gpuconsole.core.model import (
    EccCounts,
    Finding,
    GpuProcess,
    GpuState,
    HostSnapshot,
    HostState,
    PcieLink,
    RowRemap,
    Severity,
    XidEvent,
)
from gpuconsole.core.untrusted import vetted
from gpuconsole.rules.health import RULES, evaluate, host_state_finding

HOST = "node1"


def healthy(index: int = 0, **changes: object) -> GpuState:
    """An H200 at work and in good health; ``changes`` override single fields."""
    gpu = GpuState(
        index=index,
        name="NVIDIA H200",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        utilization_pct=97.0,
        memory_used_mib=70_000.0,
        memory_total_mib=143_771.0,
        temperature_c=62.0,
        slowdown_temperature_c=87.0,
        power_w=610.0,
        power_limit_w=700.0,
        throttle_reasons=(),
        ecc=EccCounts(0, 0, 0, 0),
        remap=RowRemap(0, 0, False, False),
        recovery_action="None",
        pcie=PcieLink(gen=5, width=16, max_gen=5, max_width=16),
    )
    return dataclasses.replace(gpu, **changes)


def snap(*gpus: GpuState, time: float = 1000.0, **fields: object) -> HostSnapshot:
    return HostSnapshot(host=HOST, time=time, gpus=gpus or (healthy(),), **fields)


def codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


def only(findings: list[Finding], code: str) -> Finding:
    matching = [f for f in findings if f.code == code]
    assert len(matching) == 1, findings
    return matching[0]


# --- healthy and missing readings -----------------------------------------------------------


def test_healthy_gpus_have_no_findings() -> None:
    assert evaluate(snap(healthy(0), healthy(1))) == []


def test_none_fields_trigger_nothing() -> None:
    bare = GpuState(index=0)
    assert evaluate(snap(bare)) == []


def test_partially_known_readings_trigger_nothing() -> None:
    gpu = healthy(
        temperature_c=None,
        memory_used_mib=None,
        ecc=EccCounts(volatile_uncorrected=None),
        remap=RowRemap(pending=None, failure=None),
        pcie=PcieLink(gen=None, width=8, max_gen=5, max_width=None),
        throttle_reasons=None,
    )
    assert evaluate(snap(gpu)) == []


# --- lost GPU and XIDs ------------------------------------------------------------------------


def test_lost_gpu_yields_only_gpu_lost_and_its_xid() -> None:
    lost = GpuState(index=2, pci_bus_id="00000000:3B:00.0", lost=True)
    events = (XidEvent(79, 2, 990.0), XidEvent(79, 2, 995.0))
    findings = evaluate(snap(healthy(0), lost, xid_events=events))
    assert sorted(codes(findings)) == ["gpu-lost", "xid"]
    gone = only(findings, "gpu-lost")
    assert gone.severity is Severity.CRITICAL
    assert gone.gpu == 2
    assert gone.host == HOST
    assert "3B:00.0" in gone.message
    assert gone.remediation == xid.describe(79).action
    assert "reboot" in gone.remediation


def test_xid_finding_per_distinct_xid_and_gpu() -> None:
    events = (
        XidEvent(79, 2, 1.0),
        XidEvent(13, 0, 2.0),
        XidEvent(13, 0, 3.0),
        XidEvent(13, 1, 4.0),
    )
    findings = evaluate(snap(healthy(0), healthy(1), healthy(2), xid_events=events))
    assert [(f.code, f.gpu, f.severity) for f in findings] == [
        ("xid", 2, Severity.CRITICAL),
        ("xid", 0, Severity.WARNING),
        ("xid", 1, Severity.WARNING),
    ]
    assert findings[0].message == "XID 79 on GPU 2: GPU has fallen off the bus"
    assert findings[1].message == "XID 13 on GPU 0: Graphics engine exception (2 times)"
    assert findings[0].remediation.startswith("reboot the node")


def test_xid_remediation_names_the_gpu() -> None:
    finding = only(evaluate(snap(xid_events=(XidEvent(48, 5, 1.0),))), "xid")
    assert "nvidia-smi -r -i 5" in finding.remediation
    assert "<gpu>" not in finding.remediation


def test_xid_without_gpu_is_host_wide() -> None:
    finding = only(evaluate(snap(xid_events=(XidEvent(154, None, 1.0),))), "xid")
    assert finding.gpu is None
    assert finding.message == "XID 154: GPU recovery action changed"
    assert finding.severity is Severity.INFO


def test_unknown_xid_in_snapshot() -> None:
    finding = only(evaluate(snap(xid_events=(XidEvent(999, 0, 1.0),))), "xid")
    assert finding.message == "XID 999 on GPU 0: unlisted XID 999"
    assert "Xid catalog" in finding.remediation


def test_describe_known_and_unknown() -> None:
    info = xid.describe(79)
    assert "fallen off the bus" in info.meaning
    assert info.fleet_flags and not info.app_error
    unknown = xid.describe(4242)
    assert unknown.xid == 4242
    assert unknown.meaning == "unlisted XID 4242"
    assert unknown.action == "look it up in NVIDIA's Xid catalog"
    assert not unknown.fleet_flags and not unknown.app_error


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_app_error_xids_are_warnings(code: int) -> None:
    assert xid.describe(code).app_error
    assert xid.severity(code) is Severity.WARNING


@pytest.mark.parametrize("code", [48, 62, 64, 68, 74, 79, 95, 109, 119, 120, 136, 140, 143])
def test_fleet_flag_and_reset_xids_are_critical(code: int) -> None:
    assert xid.severity(code) is Severity.CRITICAL


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (63, Severity.WARNING),
        (92, Severity.WARNING),
        (154, Severity.INFO),
        (32, Severity.WARNING),
        (94, Severity.WARNING),
        (4242, Severity.WARNING),
    ],
)
def test_informational_and_other_xid_severities(code: int, expected: Severity) -> None:
    assert xid.severity(code) is expected


def test_catalog_flags_match_the_sources() -> None:
    app_errors = {13, 31, 43, 45, 68, 109}
    fleet = {48, 62, 63, 64, 68, 74, 79, 92, 119, 120}
    listed = [13, 31, 32, 43, 45, 48, 62, 63, 64, 68, 74, 79, 92, 94, 95, 109]
    listed += [119, 120, 136, 140, 143, 154]
    for code in listed:
        info = xid.describe(code)
        assert not info.meaning.startswith("unlisted"), code
        assert info.app_error == (code in app_errors), code
        assert info.fleet_flags == (code in fleet), code


# --- thermal and throttling -------------------------------------------------------------------


def test_thermal_slowdown_from_temperature() -> None:
    finding = only(evaluate(snap(healthy(3, temperature_c=91.0))), "thermal-throttle")
    assert finding.severity is Severity.CRITICAL
    assert finding.gpu == 3
    assert finding.message == "GPU 3 at 91 °C, slowdown at 87 °C"


@pytest.mark.parametrize("reason", ["hw-thermal", "sw-thermal"])
def test_thermal_slowdown_from_reason(reason: str) -> None:
    gpu = healthy(1, temperature_c=80.0, throttle_reasons=(reason,))
    findings = evaluate(snap(gpu))
    assert codes(findings) == ["thermal-throttle"]
    assert reason in findings[0].message
    assert "80 °C" in findings[0].message


def test_temperature_high_below_slowdown() -> None:
    finding = only(evaluate(snap(healthy(0, temperature_c=85.0))), "temp-high")
    assert finding.severity is Severity.WARNING
    assert "85 °C" in finding.message
    assert "thermal-throttle" not in codes(evaluate(snap(healthy(0, temperature_c=85.0))))


def test_temperature_just_below_threshold_is_fine() -> None:
    assert evaluate(snap(healthy(0, temperature_c=84.0))) == []


def test_slowdown_without_known_limit_uses_guide_threshold() -> None:
    gpu = healthy(0, temperature_c=95.0, slowdown_temperature_c=None)
    assert codes(evaluate(snap(gpu))) == ["temp-high"]


def test_power_brake() -> None:
    gpu = healthy(2, throttle_reasons=("hw-slowdown", "hw-power-brake"))
    findings = evaluate(snap(gpu))
    assert codes(findings) == ["power-brake"]
    assert findings[0].severity is Severity.WARNING
    assert findings[0].gpu == 2


def test_hw_slowdown_alone() -> None:
    finding = only(evaluate(snap(healthy(0, throttle_reasons=("hw-slowdown",)))), "hw-slowdown")
    assert finding.severity is Severity.WARNING


def test_hw_slowdown_with_hw_thermal_reports_thermal_only() -> None:
    gpu = healthy(0, throttle_reasons=("hw-slowdown", "hw-thermal"))
    assert codes(evaluate(snap(gpu))) == ["thermal-throttle"]


def test_power_cap_is_info_with_figures() -> None:
    gpu = healthy(0, power_w=699.0, throttle_reasons=("sw-power-cap",))
    finding = only(evaluate(snap(gpu)), "power-cap")
    assert finding.severity is Severity.INFO
    assert "699 W of 700 W" in finding.message


def test_harmless_reasons_are_ignored() -> None:
    gpu = healthy(0, throttle_reasons=("gpu-idle", "applications-clocks", "sync-boost"))
    assert evaluate(snap(gpu)) == []


# --- memory errors ----------------------------------------------------------------------------


def test_ecc_uncorrectable() -> None:
    finding = only(evaluate(snap(healthy(4, ecc=EccCounts(5, 3, 5, 3)))), "ecc-uncorrectable")
    assert finding.severity is Severity.CRITICAL
    assert finding.gpu == 4
    assert "3 uncorrectable" in finding.message


def test_corrected_ecc_alone_is_fine() -> None:
    assert evaluate(snap(healthy(0, ecc=EccCounts(12, 0, 40, 0)))) == []


def test_row_remap_pending_follows_recovery_action() -> None:
    gpu = healthy(1, remap=RowRemap(0, 1, True, False), recovery_action="GPU_RESET")
    finding = only(evaluate(snap(gpu)), "row-remap-pending")
    assert finding.severity is Severity.CRITICAL
    assert "nvidia-smi -r -i 1" in finding.remediation
    assert "no process" in finding.remediation


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("Node Reboot", "reboot"),
        ("drain_p2p", "peer-to-peer"),
        ("DRAIN_AND_RESET", "drain the GPU's jobs"),
        (None, "reset the GPU when no process runs"),
        ("Something New", "'Something New'"),
    ],
)
def test_row_remap_pending_recovery_spellings(action: str | None, expected: str) -> None:
    gpu = healthy(0, remap=RowRemap(pending=True), recovery_action=action)
    assert expected in only(evaluate(snap(gpu)), "row-remap-pending").remediation


def test_row_remap_failure() -> None:
    gpu = healthy(6, remap=RowRemap(0, 512, False, True))
    finding = only(evaluate(snap(gpu)), "row-remap-failure")
    assert finding.severity is Severity.CRITICAL
    assert finding.gpu == 6
    assert "512" in finding.message


# --- PCIe -------------------------------------------------------------------------------------


def test_pcie_width_degraded_even_when_idle() -> None:
    gpu = healthy(3, utilization_pct=0.0, pcie=PcieLink(3, 8, 5, 16))
    finding = only(evaluate(snap(gpu)), "pcie-degraded")
    assert finding.severity is Severity.WARNING
    assert finding.gpu == 3
    assert "PCIe Gen3 x8" in finding.message
    assert "capable of Gen5 x16" in finding.message


def test_pcie_gen_degraded_under_load() -> None:
    gpu = healthy(0, utilization_pct=85.0, pcie=PcieLink(3, 16, 5, 16))
    finding = only(evaluate(snap(gpu)), "pcie-degraded")
    assert finding.message == "GPU 0 PCIe Gen3 x16 at 85 % load, capable of Gen5 x16"


@pytest.mark.parametrize("utilization", [0.0, 19.0, None])
def test_pcie_low_gen_on_idle_or_unread_gpu_is_fine(utilization: float | None) -> None:
    gpu = healthy(0, utilization_pct=utilization, pcie=PcieLink(1, 16, 5, 16))
    assert "pcie-degraded" not in codes(evaluate(snap(gpu)))


# --- memory use -------------------------------------------------------------------------------


def test_memory_nearly_full_is_the_only_memory_finding() -> None:
    gpu = healthy(2, memory_used_mib=140_000.0)
    findings = evaluate(snap(gpu))
    assert codes(findings) == ["mem-pressure"]
    assert findings[0].severity is Severity.WARNING
    assert "97 %" in findings[0].message
    assert "137 of 140 GiB" in findings[0].message


def test_memory_reserve_low_is_info() -> None:
    gpu = healthy(0, memory_used_mib=120_000.0)
    finding = only(evaluate(snap(gpu)), "mem-pressure")
    assert finding.severity is Severity.INFO
    assert "83 %" in finding.message


def test_memory_without_total_is_fine() -> None:
    assert evaluate(snap(healthy(0, memory_used_mib=140_000.0, memory_total_mib=None))) == []


# --- idle memory held -------------------------------------------------------------------------


def idle_history(seconds: float, step: float = 10.0, now: float = 1000.0) -> list[HostSnapshot]:
    """Snapshots of an idle GPU 0, one every ``step`` seconds, the oldest ``seconds`` ago."""
    times = []
    t = now - seconds
    while t < now:
        times.append(t)
        t += step
    return [snap(healthy(0, utilization_pct=0.0), time=t) for t in times]


HOLDERS = (
    GpuProcess(pid=4242, gpu=0, used_memory_mib=30_000.0, user="alice", command="python"),
    GpuProcess(pid=5151, gpu=0, used_memory_mib=2_000.0, user="bob"),
    GpuProcess(pid=6161, gpu=1, used_memory_mib=90_000.0, user="carol"),
)


def idle_now(processes: tuple[GpuProcess, ...] = HOLDERS) -> HostSnapshot:
    return snap(healthy(0, utilization_pct=1.0), healthy(1), processes=processes)


def test_idle_memory_held_after_a_minute() -> None:
    finding = only(evaluate(idle_now(), idle_history(60.0)), "idle-memory-held")
    assert finding.severity is Severity.WARNING
    assert finding.gpu == 0
    assert "idle for 60 s" in finding.message
    assert "2 processes" in finding.message
    assert "pid 4242 (alice), 29 GiB" in finding.message
    assert "alice" in finding.remediation and "4242" in finding.remediation


def test_idle_memory_held_not_after_30_seconds() -> None:
    assert "idle-memory-held" not in codes(evaluate(idle_now(), idle_history(30.0)))


def test_idle_memory_held_needs_history() -> None:
    assert "idle-memory-held" not in codes(evaluate(idle_now()))


def test_idle_memory_held_not_without_holders() -> None:
    history = idle_history(120.0)
    assert "idle-memory-held" not in codes(evaluate(idle_now(()), history))
    unknown = (GpuProcess(pid=1, gpu=0, used_memory_mib=None),)
    assert "idle-memory-held" not in codes(evaluate(idle_now(unknown), history))


def test_idle_memory_held_streak_broken_by_busy_snapshot() -> None:
    history = idle_history(120.0)
    history[-3] = snap(healthy(0, utilization_pct=50.0), time=history[-3].time)
    assert "idle-memory-held" not in codes(evaluate(idle_now(), history))


def test_idle_memory_held_counts_only_the_trailing_streak() -> None:
    busy_long_ago = [snap(healthy(0), time=800.0)]
    finding = only(evaluate(idle_now(), busy_long_ago + idle_history(90.0)), "idle-memory-held")
    assert "idle for 90 s" in finding.message


def test_busy_gpu_holding_memory_is_fine() -> None:
    history = [snap(healthy(0), time=t) for t in (900.0, 950.0)]
    assert evaluate(snap(healthy(0), processes=HOLDERS), history) == []


# --- ordering and rule table ------------------------------------------------------------------


def test_findings_sorted_worst_first_then_by_gpu() -> None:
    gpus = (
        healthy(0, temperature_c=86.0),
        healthy(1, ecc=EccCounts(0, 1, 0, 1)),
        healthy(2, throttle_reasons=("sw-power-cap",)),
        healthy(3, temperature_c=99.0),
    )
    findings = evaluate(snap(*gpus, xid_events=(XidEvent(13, None, 1.0),)))
    assert [(f.severity, f.gpu, f.code) for f in findings] == [
        (Severity.CRITICAL, 1, "ecc-uncorrectable"),
        (Severity.CRITICAL, 3, "thermal-throttle"),
        (Severity.WARNING, None, "xid"),
        (Severity.WARNING, 0, "temp-high"),
        (Severity.INFO, 2, "power-cap"),
    ]
    assert all(f.host == HOST for f in findings)


def every_fault() -> tuple[HostSnapshot, list[HostSnapshot]]:
    gpus = (
        GpuState(index=0, lost=True),
        healthy(1, temperature_c=90.0),
        healthy(2, temperature_c=86.0, throttle_reasons=("hw-power-brake", "sw-power-cap")),
        healthy(3, throttle_reasons=("hw-slowdown",), ecc=EccCounts(0, 2, 0, 2)),
        healthy(
            4,
            remap=RowRemap(pending=True, failure=True),
            retired_pages_pending=True,
            pcie=PcieLink(4, 8, 5, 16),
        ),
        healthy(5, memory_used_mib=142_000.0, fan_pct=-1.0),  # no fan turns backwards
        healthy(6, memory_used_mib=125_000.0),
        healthy(7, utilization_pct=0.0, recovery_action="gpu-reset", persistence_mode=False),
    )
    holder = (GpuProcess(pid=7, gpu=7, used_memory_mib=1_000.0),)
    now = vetted(snap(*gpus, processes=holder, xid_events=(XidEvent(79, 0, 1.0),)))
    history = [dataclasses.replace(now, time=t) for t in (900.0, 940.0)]
    return now, history


def test_every_emitted_code_is_in_rules() -> None:
    now, history = every_fault()
    emitted = set(codes(evaluate(now, history)))
    states = [host_state_finding(HOST, state, None) for state in HostState]
    emitted |= {f.code for f in states if f is not None}
    assert emitted == set(RULES)


def test_rules_are_kebab_case_one_liners() -> None:
    for code, description in RULES.items():
        assert code == code.lower() and " " not in code and "_" not in code
        assert description and "\n" not in description


def test_messages_and_remediations_are_one_line() -> None:
    now, history = every_fault()
    for finding in evaluate(now, history):
        assert finding.message and "\n" not in finding.message
        assert finding.remediation and "\n" not in finding.remediation


# --- host state -------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [HostState.LIVE, HostState.CONNECTING])
def test_live_and_connecting_hosts_have_no_finding(state: HostState) -> None:
    assert host_state_finding(HOST, state, None) is None


@pytest.mark.parametrize(
    ("state", "code", "severity"),
    [
        (HostState.STALE, "host-stale", Severity.WARNING),
        (HostState.DOWN, "host-down", Severity.CRITICAL),
        (HostState.AUTH_FAILED, "host-auth-failed", Severity.CRITICAL),
        (HostState.HOST_KEY_MISMATCH, "host-key-mismatch", Severity.CRITICAL),
        (HostState.REFUSED, "host-ssh-refused", Severity.CRITICAL),
        (HostState.AGENT_ERROR, "host-agent-error", Severity.CRITICAL),
    ],
)
def test_host_state_findings(state: HostState, code: str, severity: Severity) -> None:
    finding = host_state_finding(HOST, state, "connection refused")
    assert finding is not None
    assert (finding.code, finding.severity, finding.host, finding.gpu) == (
        code,
        severity,
        HOST,
        None,
    )
    assert "connection refused" in finding.message
    assert HOST in finding.remediation


def test_host_state_finding_without_reason() -> None:
    finding = host_state_finding(HOST, HostState.DOWN, None)
    assert finding is not None
    assert finding.message == "node1: cannot be reached"


# --- thresholds, recovery action, persistence ---------------------------------------------------


def test_temp_high_threshold_is_configurable() -> None:
    from gpuconsole.rules.health import Thresholds

    gpu = healthy(0, temperature_c=80.0)
    assert "temp-high" not in codes(evaluate(snap(gpu)))
    finding = only(evaluate(snap(gpu), thresholds=Thresholds(temp_high_c=78.0)), "temp-high")
    assert "alert at 78 °C" in finding.message


@pytest.mark.parametrize(
    ("action", "expected"),
    [("gpu-reset", "nvidia-smi -r -i 1"), ("NODE_REBOOT", "reboot"), ("Drain P2P", "peer")],
)
def test_recovery_action_asks_for_what_the_driver_wants(action: str, expected: str) -> None:
    finding = only(evaluate(snap(healthy(1, recovery_action=action))), "recovery-action")
    assert finding.severity is Severity.CRITICAL
    assert finding.gpu == 1
    assert expected in finding.remediation


def test_recovery_action_none_is_no_finding() -> None:
    assert "recovery-action" not in codes(evaluate(snap(healthy(0, recovery_action="none"))))


def test_persistence_off_warns_and_unknown_does_not() -> None:
    finding = only(evaluate(snap(healthy(0, persistence_mode=False))), "persistence-off")
    assert finding.severity is Severity.WARNING
    assert "nvidia-persistenced" in finding.remediation
    assert "persistence-off" not in codes(evaluate(snap(healthy(0, persistence_mode=None))))


def test_a_bad_value_is_a_note_never_an_alarm() -> None:
    reading = vetted(snap(healthy(0, temperature_c=1e308, ecc=EccCounts(volatile_uncorrected=-5))))
    findings = evaluate(reading)
    assert codes(findings) == ["bad-value-from-host"]
    (note,) = findings
    assert note.severity is Severity.INFO
    assert note.message.startswith("2 values from the host shown as N/A")
    assert "temperature_c 1e+308 out of range" in note.message
    assert "volatile_uncorrected -5 out of range" in note.message
