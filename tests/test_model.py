"""Model types: topology ranking, link costs and GPU-state helpers."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuconsole.core.model import (
    SLOWDOWN_REASONS,
    THROTTLE_REASONS,
    Finding,
    GpuState,
    PcieLink,
    Report,
    Severity,
    TooManySets,
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


def test_h100_with_gpu_3_lost_never_offers_it() -> None:
    assert H100.best_sets(4, limit=2, leave_out={3}) == [
        ((4, 5, 6, 7), "NV18"),  # the one NUMA-local four left
        ((0, 1, 2, 4), "NV18"),
    ]
    assert H100.best_sets(7, leave_out={3}) == [((0, 1, 2, 4, 5, 6, 7), "NV18")]
    assert H100.best_sets(8, leave_out={3}) == []


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


def test_a100_each_four_carries_its_own_weakest_link() -> None:
    # Main printed one label, NODE, for all three; GPU0-GPU4 is SYS.
    assert A100.best_sets(4) == [
        ((0, 1, 2, 3), "NODE"),  # 0-3 and 1-2 cross host bridges; still better than SYS
        ((4, 5, 6, 7), "NODE"),
        ((0, 1, 2, 4), "SYS"),
    ]
    assert A100.link(0, 4) == "SYS"


def test_l40s_pairs_across_switches_are_node() -> None:
    best = L40S.best_sets(2)
    assert best == [((0, 1), "PIX"), ((2, 3), "PIX"), ((0, 2), "NODE")]
    assert L40S.link(0, 2) == "NODE"


@pytest.mark.parametrize(
    ("topology", "k"), [(H100, 0), (H100, 1), (H100, 9), (L40S, 5), (L40S, -1)]
)
def test_best_sets_out_of_range_is_empty(topology: Topology, k: int) -> None:
    assert topology.best_sets(k) == []


def test_best_sets_respects_limit() -> None:
    assert len(H100.best_sets(2)) == 3
    assert len(H100.best_sets(2, limit=10)) == 10
    assert len(L40S.best_sets(2, limit=100)) == 6  # 4 choose 2
    assert L40S.best_sets(2, limit=0) == []


def test_best_sets_without_numa_affinity() -> None:
    topo = Topology((("X", "SYS", "PIX"), ("SYS", "X", "SYS"), ("PIX", "SYS", "X")))
    assert topo.best_sets(2, limit=1) == [((0, 2), "PIX")]
    assert topo.best_sets(3) == [((0, 1, 2), "SYS")]


def all_nvlink(count: int) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple("X" if a == b else "NV4" for b in range(count)) for a in range(count))


def test_one_numa_node_beats_a_lower_index_at_an_equal_link() -> None:
    topo = Topology(all_nvlink(4), numa_affinity=(0, 1, 0, 1))
    assert topo.best_sets(2, limit=3) == [((0, 2), "NV4"), ((1, 3), "NV4"), ((0, 1), "NV4")]


def test_cpu_affinity_stands_in_for_an_unknown_numa_node() -> None:
    cpus = ("0-15", "16-31", "0-15", "16-31")
    topo = Topology(all_nvlink(4), cpu_affinity=cpus, numa_affinity=(None,) * 4)
    assert topo.best_sets(2, limit=2) == [((0, 2), "NV4"), ((1, 3), "NV4")]


def test_an_unknown_place_is_never_one_numa_node() -> None:
    topo = Topology(all_nvlink(3), numa_affinity=(None, 0, 0))
    assert topo.best_sets(2, limit=1) == [((1, 2), "NV4")]


def test_a_one_sided_cell_counts_as_the_worse_link() -> None:
    topo = Topology((("X", "NV4"), ("SYS", "X")))
    assert topo.best_sets(2) == [((0, 1), "SYS")]


def test_ranking_too_many_sets_is_refused_not_waited_on() -> None:
    topo = Topology(all_nvlink(32))
    assert len(topo.best_sets(4, limit=1)) == 1  # 35,960 sets of 6 pairs: ranked
    with pytest.raises(TooManySets, match="16 of 32 GPUs: 601,080,390 sets"):
        topo.best_sets(16)
    assert topo.best_sets(32) == [(tuple(range(32)), "NV4")]


# Every label `nvidia-smi topo -m` prints between two GPUs.
LINKS = ("NV1", "NV2", "NV4", "NV6", "NV8", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS")


def worst_pair(topology: Topology, gpus: tuple[int, ...]) -> str:
    pairs = [topology.link(a, b) for a, b in itertools.combinations(gpus, 2)]
    return max(pairs, key=lambda link: (link_cost(link), link))


def one_numa_node(topology: Topology, gpus: tuple[int, ...]) -> bool:
    """All on one NUMA node, by NUMA affinity where known, else by CPU affinity."""

    def place(i: int) -> object:
        numa = topology.numa_affinity[i] if i < len(topology.numa_affinity) else None
        cpus = topology.cpu_affinity[i] if i < len(topology.cpu_affinity) else None
        return ("numa", numa) if numa is not None else None if cpus is None else ("cpus", cpus)

    places = {place(i) for i in gpus}
    return len(places) == 1 and None not in places


def rank_key(topology: Topology, gpus: tuple[int, ...]) -> tuple[object, ...]:
    """The documented order: weakest link, one NUMA node first, total link cost, indices."""
    weakest = worst_pair(topology, gpus)
    total = math.fsum(link_cost(topology.link(a, b)) for a, b in itertools.combinations(gpus, 2))
    return (link_cost(weakest), weakest, not one_numa_node(topology, gpus), total, gpus)


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    """A symmetric matrix of real link labels, with NUMA and CPU affinity known, partly, or not."""
    count = draw(st.integers(1, 7))
    upper = {pair: draw(st.sampled_from(LINKS)) for pair in itertools.combinations(range(count), 2)}
    matrix = tuple(
        tuple("X" if a == b else upper[min(a, b), max(a, b)] for b in range(count))
        for a in range(count)
    )
    numa = draw(st.none() | st.lists(st.none() | st.integers(0, 2), min_size=count, max_size=count))
    cpus = draw(
        st.none()
        | st.lists(st.sampled_from([None, "0-31", "32-63"]), min_size=count, max_size=count)
    )
    return Topology(matrix, tuple(cpus or ()), tuple(numa or ()))


@settings(max_examples=300, deadline=None)
@given(topologies(), st.data())
def test_every_set_is_true_to_the_matrix(topology: Topology, data: st.DataObject) -> None:
    count = topology.gpu_count
    lost = data.draw(st.frozensets(st.integers(0, count - 1)), label="lost")
    k = data.draw(st.integers(0, count + 1), label="k")
    limit = data.draw(st.integers(1, 40), label="limit")
    left = [i for i in range(count) if i not in lost]
    every = topology.best_sets(k, limit=10_000, leave_out=lost)
    if not 2 <= k <= len(left):
        assert every == [] == topology.best_sets(k, limit=limit, leave_out=lost)
        return
    assert len(every) == math.comb(len(left), k)  # exhaustive
    assert len(set(every)) == len(every)
    for gpus, weakest in every:
        assert len(gpus) == len(set(gpus)) == k
        assert set(gpus) <= set(left)  # no lost GPU, nothing outside the matrix
        assert weakest == worst_pair(topology, gpus)
    keys = [rank_key(topology, gpus) for gpus, _ in every]
    assert keys == sorted(keys)
    assert topology.best_sets(k, limit=limit, leave_out=lost) == every[:limit]


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
