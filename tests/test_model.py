"""Model types: topology ranking, link costs and GPU-state helpers."""

from __future__ import annotations

import pytest

from gpuconsole.model import (
    SLOWDOWN_REASONS,
    THROTTLE_REASONS,
    Finding,
    GpuState,
    PcieLink,
    Report,
    Severity,
    Topology,
    link_cost,
    nvlink_count,
    worst,
)
from gpuconsole.telemetry.sim import PROFILES

H100 = PROFILES["h100-sxm-8"].topology
A100 = PROFILES["a100-pcie-8"].topology
L40S = PROFILES["l40s-4"].topology


# --- best_sets ------------------------------------------------------------------------------------


def test_h100_best_four_stay_on_one_numa_node() -> None:
    best = H100.best_sets(4, limit=2)
    assert best == [((0, 1, 2, 3), "NV18"), ((4, 5, 6, 7), "NV18")]


def test_h100_third_best_four_spans_numa_nodes() -> None:
    (_, _, (third, link)) = H100.best_sets(4)
    assert link == "NV18"
    assert {H100.numa_affinity[i] for i in third} == {0, 1}


def test_h100_all_eight_is_one_set() -> None:
    assert H100.best_sets(8) == [((0, 1, 2, 3, 4, 5, 6, 7), "NV18")]


def test_a100_best_pair_is_nvlink_bridged() -> None:
    (best, link), *_ = A100.best_sets(2)
    assert link == "NV12"
    assert A100.link(*best) == "NV12"
    assert best == (0, 1)
    bridged = A100.best_sets(2, limit=4)
    assert [pair for pair, _ in bridged] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert all(link == "NV12" for _, link in bridged)
    fifth = A100.best_sets(2, limit=5)[4]
    assert fifth[1] == "PIX"


def test_a100_best_four_is_one_socket_with_node_weakest() -> None:
    (best, link), *_ = A100.best_sets(4)
    assert best == (0, 1, 2, 3)
    assert link == "NODE"  # 0-3 and 1-2 cross host bridges; still better than SYS


def test_l40s_best_pair_is_pix() -> None:
    best = L40S.best_sets(2)
    assert best[:2] == [((0, 1), "PIX"), ((2, 3), "PIX")]
    assert best[2][1] == "NODE"


@pytest.mark.parametrize(
    ("topology", "k"), [(H100, 0), (H100, 1), (H100, 9), (L40S, 5), (L40S, -1)]
)
def test_best_sets_out_of_range_is_empty(topology: Topology, k: int) -> None:
    assert topology.best_sets(k) == []


def test_best_sets_respects_limit() -> None:
    assert len(H100.best_sets(2)) == 3
    assert len(H100.best_sets(2, limit=10)) == 10
    assert len(L40S.best_sets(2, limit=100)) == 6  # 4 choose 2


def test_best_sets_without_numa_affinity() -> None:
    topo = Topology((("X", "SYS", "PIX"), ("SYS", "X", "SYS"), ("PIX", "SYS", "X")))
    assert topo.best_sets(2, limit=1) == [((0, 2), "PIX")]
    assert topo.best_sets(3) == [((0, 1, 2), "SYS")]


# --- link costs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("link", "count"),
    [("NV18", 18), ("NV12", 12), ("NV4", 4), ("PIX", 0), ("SYS", 0), ("NV", 0), ("NVx", 0)],
)
def test_nvlink_count(link: str, count: int) -> None:
    assert nvlink_count(link) == count


def test_link_cost_ordering() -> None:
    order = ["NV18", "NV12", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS"]
    costs = [link_cost(link) for link in order]
    assert costs == sorted(costs)
    assert len(set(costs)) == len(costs)  # strictly better, no ties
    assert link_cost("NV1") < link_cost("PIX")  # any NVLink beats any PCIe path


# --- GpuState -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "total", "fraction"),
    [
        (40.0, 80.0, 0.5),
        (0.0, 80.0, 0.0),
        (40.0, None, None),
        (40.0, 0.0, None),
        (None, 80.0, None),
    ],
)
def test_memory_fraction(used: float | None, total: float | None, fraction: float | None) -> None:
    gpu = GpuState(index=0, memory_used_mib=used, memory_total_mib=total)
    assert gpu.memory_fraction == fraction


def test_slowdowns_filters_to_slowdown_reasons_in_order() -> None:
    gpu = GpuState(
        index=0,
        throttle_reasons=("gpu-idle", "sw-thermal", "sw-power-cap", "hw-power-brake", "hw-thermal"),
    )
    assert gpu.slowdowns == ("sw-thermal", "hw-power-brake", "hw-thermal")
    assert GpuState(index=0, throttle_reasons=None).slowdowns == ()
    assert GpuState(index=0, throttle_reasons=("sw-power-cap", "gpu-idle")).slowdowns == ()
    assert set(SLOWDOWN_REASONS) <= set(THROTTLE_REASONS)


def test_pcie_link_degradation() -> None:
    assert PcieLink(5, 8, 5, 16).degraded_width
    assert not PcieLink(5, 8, 5, 16).degraded_gen
    assert PcieLink(1, 16, 5, 16).degraded_gen
    assert not PcieLink(5, 16, 5, 16).degraded_width
    assert not PcieLink(None, None, 5, 16).degraded_width
    assert not PcieLink(5, 8, None, None).degraded_width


# --- findings -------------------------------------------------------------------------------------


def finding(severity: Severity, code: str, gpu: int | None = None) -> Finding:
    return Finding(severity, code, f"{code} message", "fix it", host="n1", gpu=gpu)


def test_worst_is_the_most_severe_first_of_equals() -> None:
    assert worst([]) is None
    findings = [
        finding(Severity.INFO, "a"),
        finding(Severity.CRITICAL, "b"),
        finding(Severity.WARNING, "c"),
        finding(Severity.CRITICAL, "d"),
    ]
    assert worst(findings).code == "b"
    assert worst(iter(findings)).code == "b"
    assert worst([finding(Severity.INFO, "x"), finding(Severity.INFO, "y")]).code == "x"


def test_severity_order_and_labels() -> None:
    assert Severity.INFO < Severity.WARNING < Severity.CRITICAL
    assert [s.label for s in Severity] == ["info", "warning", "critical"]


def test_finding_where_and_report_severity() -> None:
    assert finding(Severity.INFO, "a").where == "n1"
    assert finding(Severity.INFO, "a", gpu=3).where == "n1 GPU 3"
    assert Report("n1", "t").severity is Severity.INFO
    report = Report("n1", "t", (finding(Severity.WARNING, "a"), finding(Severity.INFO, "b")))
    assert report.severity is Severity.WARNING
