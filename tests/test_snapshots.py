"""Snapshot tests of every screen on the simulated rack (fixed seed, fixed clock, fixed size), at
80×24 (what every screen is laid out for first) and 160×48.

The panels that act on a host (verify, repair, run, memory trials) are shown with canned results:
what they render, not what a host answered. Accept a deliberate change with
`pytest --snapshot-update` after looking at snapshot_report.html.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_history_screen import RUNS
from test_record import START, record_incident
from test_repair_plans import UBUNTU, plan
from test_verify_screen import CHECKS, REPORTS, TARGETS, canned
from textual.pilot import Pilot

from gpuconsole.actions.memory.session import MemoryReport
from gpuconsole.actions.memory.trials import Fixes, Trial
from gpuconsole.actions.repair.model import Cause, Diagnosis, Walked
from gpuconsole.actions.repair.session import RepairReport
from gpuconsole.bench.history import BenchHistory
from gpuconsole.core import paths
from gpuconsole.fleet.record.reader import Recording
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.telemetry.sim import SimRack
from gpuconsole.ui.replay_app import ReplayApp
from gpuconsole.ui.screens.history import HistoryScreen
from gpuconsole.ui.screens.memory import MemoryScreen
from gpuconsole.ui.screens.repair import RepairScreen
from gpuconsole.ui.screens.run import RunScreen
from gpuconsole.ui.screens.verify import VerifyScreen

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]
HERE = Target("gpu-a", None, Context("gpu-a"))


def opened(make: Callable[[], Any]) -> Callable[[Pilot[None]], Any]:
    """A `run_before` that pushes the screen ``make`` builds, then lets its workers finish."""

    async def run_before(pilot: Pilot[None]) -> None:
        pilot.app.push_screen(make())
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    return run_before


def test_fleet_120x40(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40))


@pytest.mark.parametrize("size", SIZES)
def test_fleet(snap_compare, make_app, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size)


def test_fleet_expanded_160x48(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(160, 48), press=["space"])


def test_host_120x40(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), press=["enter"])


@pytest.mark.parametrize("size", SIZES)
def test_host(snap_compare, make_app, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, press=["enter"])


@pytest.mark.parametrize("size", SIZES)
def test_host_with_its_hot_gpu(snap_compare, make_app, size: tuple[int, int]) -> None:
    """The A100 host: its throttled GPU's reasons in full, and its nine findings."""
    assert snap_compare(make_app(), terminal_size=size, press=["down", "enter"])


def test_topology_a100_120x40(snap_compare, make_app) -> None:
    # The second host, worst first, is the A100 PCIe host with its thermal fault.
    assert snap_compare(make_app(), terminal_size=(120, 40), press=["down", "t"])


@pytest.mark.parametrize("size", SIZES)
def test_topology(snap_compare, make_app, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, press=["down", "t"])


@pytest.mark.parametrize("size", SIZES)
def test_alerts(snap_compare, make_app, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, press=["a"])


def test_triage_120x40(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), press=["T"])


@pytest.mark.parametrize("size", SIZES)
def test_triage(snap_compare, make_app, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, press=["T"])


def test_help_120x40(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), press=["question_mark"])


@pytest.mark.parametrize("size", SIZES)
def test_help(snap_compare, make_app, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, press=["question_mark"])


def test_light_theme_host_120x40(snap_compare, make_app) -> None:
    assert snap_compare(
        make_app(theme="gpuconsole-light"), terminal_size=(120, 40), press=["enter"]
    )


# --- the panels, with canned results --------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_verify(snap_compare, make_app, size: tuple[int, int]) -> None:
    make = opened(lambda: VerifyScreen(TARGETS, CHECKS, canned(REPORTS)))
    assert snap_compare(make_app(), terminal_size=size, run_before=make, press=["down"])


class _CannedRepair(RepairScreen):
    """The panel as it shows a diagnosis of a host whose driver is not installed."""

    def _run_repair(self, dry_run: bool) -> None:
        cause = Cause(
            "no-driver-installed",
            "no NVIDIA driver is installed",
            "no nvidia kernel module is installed for the running kernel, and no driver package is",
            ("$ modinfo nvidia: modinfo: ERROR: Module nvidia not found.",),
        )
        walk = (Walked("driver-not-loaded", "Is the driver loaded?", True, cause.evidence),)
        diagnosis = Diagnosis("gpu-a", UBUNTU, walk, (cause,))
        self._show(RepairReport("gpu-a", diagnosis, (plan("no-driver-installed", UBUNTU),)), True)


@pytest.mark.parametrize("size", SIZES)
def test_repair(snap_compare, make_app, size: tuple[int, int]) -> None:
    make = opened(lambda: _CannedRepair(HERE))
    assert snap_compare(make_app(), terminal_size=size, run_before=make)


class _CannedRun(RunScreen):
    """The panel halfway through a run: its steps so far and its log."""

    def _run(self) -> None:
        self._status(f"running on {self.target.name} with torchrun, GPUs 0, 1, 2, 3; s stops")
        self.output("gpu-a: $ torchrun --standalone --nproc-per-node 4 resnet50.py --preset tuned")
        for step in range(1, 41):
            rate = 9_000.0 + 40.0 * min(step, 20)
            loss = 6.9 - 0.05 * step
            self._event({"event": "step", "step": step, "samples_per_s": rate, "loss": loss})
        self.output("step 40: 9,800 samples/s, loss 4.900")


@pytest.mark.parametrize("size", SIZES)
def test_run(snap_compare, make_app, size: tuple[int, int]) -> None:
    make = opened(lambda: _CannedRun(HERE))
    assert snap_compare(make_app(), terminal_size=size, run_before=make)


_TRIALS = (
    Trial(Fixes(), peak_mib=71_300.0, samples_per_s=410.0, loss=7.1, source="cuda"),
    Trial(Fixes("bf16"), peak_mib=48_100.0, samples_per_s=880.0, loss=7.1, source="cuda"),
    Trial(
        Fixes("bf16", checkpoint_every=1),
        peak_mib=21_400.0,
        samples_per_s=690.0,
        loss=7.1,
        source="cuda",
    ),
)


class _CannedMemory(MemoryScreen):
    """The panel once its three trials finished, the cheapest that fits recommended."""

    def _trials(self) -> None:
        for trial in _TRIALS:
            self._add_trial(trial)
        report = MemoryReport(
            "gpu-a",
            "bert",
            batch_size=32,
            target_mib=65_536.0,
            trials=list(_TRIALS),
            recommended=_TRIALS[1],
        )
        self._done(report)


@pytest.mark.parametrize("size", SIZES)
def test_memory(snap_compare, make_app, size: tuple[int, int]) -> None:
    make = opened(lambda: _CannedMemory(HERE))
    assert snap_compare(make_app(), terminal_size=size, run_before=make)


@pytest.mark.parametrize("size", SIZES)
def test_history(snap_compare, make_app, size: tuple[int, int]) -> None:
    stored = BenchHistory(paths.BENCH_DB.path())
    for result in RUNS:
        stored.record(result)
    make = opened(lambda: HistoryScreen("h100-01", stored))
    assert snap_compare(make_app(), terminal_size=size, run_before=make, press=["down"])


# --- replay -------------------------------------------------------------------------------------


@pytest.fixture
def recording(tmp_path: Path, rack: SimRack, audit_log: Path) -> Iterator[Recording]:
    """60 s of the demo rack with XID 79 on l40s-01's GPU 1 from second 30."""
    path = tmp_path / "incident.sqlite"
    record_incident(path, rack, seconds=60, fault_at=30)
    opened_recording = Recording(path)
    yield opened_recording
    opened_recording.close()


async def _settled(pilot: Pilot[None]) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES)
def test_replay(snap_compare, recording: Recording, size: tuple[int, int]) -> None:
    app = ReplayApp(recording, at=START + 40)
    assert snap_compare(app, terminal_size=size, run_before=_settled)
