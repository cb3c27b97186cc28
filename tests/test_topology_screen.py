"""The topology screen's advice: every label it prints is the worst pair of each set listed under
it, no lost GPU is offered, and every set size the host can offer is ranked."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.text import Text
from test_app import tick
from test_model import topologies, worst_pair
from textual.widgets import Static

from gpuconsole.core.model import Finding, GpuState, HostSnapshot, Severity, Topology, XidEvent
from gpuconsole.telemetry.sim import PROFILES
from gpuconsole.ui.screens.topology import (
    SETS_SHOWN,
    TopologyScreen,
    advice,
    left_out,
    offered_sizes,
)
from gpuconsole.ui.widgets.cells import Palette

PALETTE = Palette({})
_LINE = re.compile(r"best (\d+) GPUs: (.*)")


def ranked(text: str) -> dict[int, list[tuple[list[tuple[int, ...]], str]]]:
    """The advice's lines read back: per set size, each run of sets with the label after it."""
    lines = {}
    for line in text.splitlines():
        match = _LINE.fullmatch(line.strip())
        if match is None:
            continue
        runs = []
        for run in match[2].split(" · "):
            *sets, label = run.split(" ")
            runs.append(([tuple(map(int, s.strip("{}*").split(","))) for s in sets], label))
        lines[int(match[1])] = runs
    return lines


def assert_true_to(topology: Topology, text: str, lost: set[int]) -> None:
    for k, runs in ranked(text).items():
        for sets, label in runs:
            assert sets, f"best {k}: a label with no set under it"
            for gpus in sets:
                assert len(set(gpus)) == k
                assert not set(gpus) & lost, f"best {k}: {gpus} holds a lost GPU"
                assert label == worst_pair(topology, gpus), f"best {k}: {gpus} is not {label}"
    marked = re.findall(r"\{([\d,]+)\}(\*?)", text)
    for gpus, mark in marked:
        places = {where(topology, int(g)) for g in gpus.split(",")} - {None}
        assert (mark == "*") == (len(places) > 1), f"{{{gpus}}}{mark}"


def where(topology: Topology, gpu: int) -> object:
    """A GPU's NUMA node, else its CPU affinity (a VM hides the node), else None: unknown."""
    numa = topology.numa_affinity[gpu] if gpu < len(topology.numa_affinity) else None
    cpus = topology.cpu_affinity[gpu] if gpu < len(topology.cpu_affinity) else None
    return ("numa", numa) if numa is not None else (None if cpus is None else ("cpus", cpus))


# --- through the real screen, on the demo rack --------------------------------------------------


async def advice_on_screen(make_app, host: str) -> tuple[Topology, str]:
    """Filter the fleet to ``host``, press t, and read the advice the screen shows."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("slash", *host, "enter", "t")
        await pilot.pause()
        assert isinstance(app.screen, TopologyScreen) and app.screen.host == host
        body = app.screen.query_one("#topology", Static).content
        topology = app.fleet.store.latest(host).topology
        text = body.renderables[-1]
        assert isinstance(text, Text)
        return topology, text.plain


DEMO_ADVICE = {
    "a100-01": [  # GPU 2 runs hot enough to throttle: a critical finding
        "GPU 2 left out: critical finding thermal-throttle",
        "best 2 GPUs: {0,1} {4,5} {6,7} NV12 · {1,3} PIX",
        "best 4 GPUs: {4,5,6,7} NODE · {0,1,3,4}* {0,1,3,5}* {0,1,3,6}* SYS",
        "best 7 GPUs: {0,1,3,4,5,6,7}* SYS",
        "* spans NUMA nodes: host-side traffic crosses sockets",
    ],
    "l40s-01": [
        "best 2 GPUs: {0,1} {2,3} PIX · {0,2} {0,3} NODE",
        "best 4 GPUs: {0,1,2,3} NODE",
        "No NVLink on this host: GPU-to-GPU traffic crosses PCIe; prefer GPUs under one switch "
        "(PIX) or one NUMA node.",
    ],
    "h100-01": [  # GPU 3 fell off the bus two minutes in
        "GPU 3 left out: fallen off the bus",
        "best 2 GPUs: {0,1} {0,2} {1,2} {4,5} NV18",
        "best 4 GPUs: {4,5,6,7} {0,1,2,4}* {0,1,2,5}* {0,1,2,6}* NV18",
        "best 7 GPUs: {0,1,2,4,5,6,7}* NV18",
        "* spans NUMA nodes: host-side traffic crosses sockets",
    ],
}


@pytest.mark.parametrize("host", list(DEMO_ADVICE))
async def test_demo_hosts_advice_is_true_to_their_matrix(make_app, host: str) -> None:
    topology, text = await advice_on_screen(make_app, host)
    lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
    assert lines == DEMO_ADVICE[host]
    assert_true_to(topology, text, {3} if host == "h100-01" else set())


async def test_a_gpu_falling_off_the_bus_leaves_the_advice_at_once(make_app, rack, clock) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("slash", *"a100-01", "enter", "t")
        rack.set_fault("a100-01", "xid-79", gpu=1, since=clock.now + 1)
        tick(app, clock, 2.0)
        await pilot.pause()
        text = app.screen.query_one("#topology", Static).content.renderables[-1].plain
    assert "GPU 1 left out: fallen off the bus" in text
    assert "best 6 GPUs: {0,3,4,5,6,7}* SYS" in text  # GPU 2 throttles: critical
    assert "best 2 GPUs: {4,5} {6,7} NV12 · {4,6} {5,7} PIX" in text
    assert_true_to(PROFILES["a100-pcie-8"].topology, text, {1})


# --- the advice, for any matrix -----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(topologies(), st.data())
def test_every_printed_label_is_the_worst_pair_of_its_sets(
    topology: Topology, data: st.DataObject
) -> None:
    lost = data.draw(st.sets(st.integers(0, topology.gpu_count - 1)), label="lost")
    text = advice(topology, PALETTE, dict.fromkeys(sorted(lost), "fallen off the bus")).plain
    lines = ranked(text)
    assert sorted(lines) == offered_sizes(topology.gpu_count - len(lost))
    for k, runs in lines.items():
        listed = [gpus for sets, _ in runs for gpus in sets]
        assert listed == [s.gpus for s in topology.best_sets(k, SETS_SHOWN, leave_out=lost)]
        labels = [label for _, label in runs]
        assert len(labels) == len(set(labels))  # one run per distinct weakest link
    assert_true_to(topology, text, lost)


@pytest.mark.parametrize(
    ("available", "sizes"),
    [
        (0, []),
        (1, []),
        (2, [2]),
        (3, [2, 3]),
        (4, [2, 4]),
        (7, [2, 4, 7]),
        (8, [2, 4, 8]),
        (16, [2, 4, 8, 16]),
        (20, [2, 4, 8, 16, 20]),
    ],
)
def test_offered_sizes_are_powers_of_two_and_all(available: int, sizes: list[int]) -> None:
    assert offered_sizes(available) == sizes


def test_too_many_sets_to_rank_is_said_not_waited_on() -> None:
    links = tuple(tuple("X" if a == b else "NV4" for b in range(32)) for a in range(32))
    text = advice(Topology(links), PALETTE, {}).plain
    assert "best 4 GPUs: {0,1,2,3} {0,1,2,4} {0,1,2,5} {0,1,2,6} NV4" in text
    assert "best 16 GPUs: 16 of 32 GPUs: 601,080,390 sets, too many to rank" in text
    assert "best 32 GPUs: {" + ",".join(map(str, range(32))) + "} NV4" in text


def test_no_gpu_left_to_rank() -> None:
    topology = PROFILES["l40s-4"].topology
    text = advice(topology, PALETTE, dict.fromkeys(range(3), "fallen off the bus")).plain
    assert "Fewer than 2 GPUs answer: no sets to rank." in text
    assert "best" not in text


def test_a_gpu_with_a_critical_finding_is_left_out() -> None:
    topology = Topology(tuple(tuple("X" if a == b else "NV4" for b in range(3)) for a in range(3)))
    snapshot = HostSnapshot("h", 1.0, tuple(GpuState(i) for i in range(3)), topology=topology)
    findings = [
        Finding(Severity.WARNING, "temp-high", "", "", gpu=0),
        Finding(Severity.CRITICAL, "ecc-uncorrectable", "", "", gpu=1),
        Finding(Severity.CRITICAL, "xid", "", "", gpu=1),
        Finding(Severity.CRITICAL, "host-down", "", "", gpu=None),
        Finding(Severity.CRITICAL, "xid", "", "", gpu=7),
    ]
    assert left_out(snapshot, topology, findings) == {1: "critical finding ecc-uncorrectable"}


def test_left_out_are_the_lost_the_xid_79_and_the_missing() -> None:
    topology = Topology(tuple(tuple("X" if a == b else "NV4" for b in range(4)) for a in range(4)))
    snapshot = HostSnapshot(
        "h",
        1.0,
        (GpuState(0), GpuState(1, lost=True), GpuState(2)),
        topology=topology,
        xid_events=(XidEvent(79, 2, 0.5), XidEvent(48, 0, 0.5), XidEvent(79, None, 0.5)),
    )
    assert left_out(snapshot, topology) == {
        1: "fallen off the bus",
        2: "fallen off the bus",
        3: "not in the reading",
    }
