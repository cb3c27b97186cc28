"""The GPU screen: Enter on a GPU opens it (host screen, triage, alerts), `r` changes the plotted
span, an hour of the demo's thermal GPU shows its throttle episodes marked where the health rules
begin and end them, replay plots the recording up to the cursor; snapshots at 80×24 and 160×48.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import EPOCH
from test_nvml_fake import HOST as NVML_HOST
from test_nvml_fake import FakeNvml
from test_record import START, record_incident
from textual.pilot import Pilot

from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import GpuState, HostSnapshot
from gpuconsole.core.untrusted import vetted
from gpuconsole.fleet.alerts.defaults import BUILT_IN_RULES
from gpuconsole.fleet.record.reader import Recording
from gpuconsole.fleet.record.when import clock
from gpuconsole.fleet.store import HISTORY_READINGS
from gpuconsole.rules import health
from gpuconsole.telemetry.nvml import NvmlSource
from gpuconsole.telemetry.sim import SimRack, SimSource, demo_rack
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.replay_app import ReplayApp
from gpuconsole.ui.screens.gpu import RANGES_S, GpuScreen, _traffic
from gpuconsole.ui.screens.host import HostScreen
from gpuconsole.ui.widgets.keyed_table import KeyedTable
from gpuconsole.ui.widgets.time_plot import TimePlot

THERMAL = ("a100-01", 2)
"""The demo's GPU whose cooling fails: it throttles on heat whenever a job drives it."""
HOUR_AT = EPOCH + 3900.0
"""Where the hour test reads: an hour of readings, after the rack's first five minutes."""


def gpu_screen(app: GpuConsoleApp) -> GpuScreen:
    screen = app.screen
    assert isinstance(screen, GpuScreen), f"{type(screen).__name__} on top, not the GPU screen"
    return screen


def plot(app: GpuConsoleApp, key: str) -> TimePlot:
    return gpu_screen(app).query_one(f"#plot-{key}", TimePlot)


def text_of(app: GpuConsoleApp, selector: str) -> str:
    return str(gpu_screen(app).query_one(selector).render())


async def open_thermal(pilot: Pilot[None]) -> None:
    pilot.app.show_gpu(*THERMAL)  # type: ignore[attr-defined]
    await pilot.pause()


# --- Enter opens the GPU ---------------------------------------------------------------------


async def test_enter_on_a_gpu_of_the_host_screen_opens_that_gpu(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HostScreen("a100-01"))
        await pilot.pause()
        await pilot.press("home", "down", "down", "enter")
        await pilot.pause()
        assert (gpu_screen(app).host, gpu_screen(app).gpu) == THERMAL
        assert "a100-01 GPU 2" in text_of(app, "#gpu-head")
        await pilot.press("escape")
        assert isinstance(app.screen, HostScreen)


async def test_enter_on_a_triage_row_opens_its_gpu(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("T")
        await pilot.pause()
        rows = app.screen.query_one("#triage", KeyedTable)
        assert rows.cursor_key == "a100-01/2/thermal-throttle"  # worst first
        await pilot.press("enter")
        await pilot.pause()
        assert (gpu_screen(app).host, gpu_screen(app).gpu) == THERMAL
        await pilot.press("escape", "down", "enter")
        await pilot.pause()
        assert (gpu_screen(app).host, gpu_screen(app).gpu) == ("h100-01", 3)


async def test_enter_on_an_alert_opens_its_gpu_or_its_host(make_app) -> None:
    app = make_app(alert_rules=BUILT_IN_RULES)  # the capacity rules on: a host-wide one fires
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("a")
        await pilot.pause()
        rows = app.screen.query_one("#alerts", KeyedTable)
        assert rows.cursor_key == "gpu-xid|h100-01|3"
        await pilot.press("enter")
        await pilot.pause()
        assert (gpu_screen(app).host, gpu_screen(app).gpu) == ("h100-01", 3)
        assert "XID 79" in text_of(app, "#gpu-details")
        assert "GPU has fallen off the bus" in text_of(app, "#gpu-details")
        await pilot.press("escape")
        await pilot.pause()
        rows.move_cursor(row=rows.get_row_index("gpu-utilization-high|h100-03|"))
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, HostScreen)  # a host-wide alert: its host
        assert app.screen.host == "h100-03"


# --- the plots -----------------------------------------------------------------------------------


async def test_r_steps_the_plotted_span_through_5_15_and_60_minutes(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await open_thermal(pilot)
        spans = []
        for _ in RANGES_S:
            series = plot(app, "temp").series
            assert series is not None
            spans.append(series.end - series.start)
            assert all(series.start <= t <= series.end for t, _ in series.points)
            await pilot.press("r")
            await pilot.pause()
        assert spans == [300.0, 900.0, 3600.0]
        assert plot(app, "temp").series.end - plot(app, "temp").series.start == 300.0
        # The console keeps two minutes: the line above the plots says so.
        assert "held: 1 min 59 s, the last 120 readings" in text_of(app, "#gpu-span")


async def test_brackets_step_through_the_hosts_gpus(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await open_thermal(pilot)
        await pilot.press("right_square_bracket")
        assert gpu_screen(app).gpu == 3
        await pilot.press("left_square_bracket", "left_square_bracket", "left_square_bracket")
        assert gpu_screen(app).gpu == 0
        await pilot.press("left_square_bracket")  # round to the last
        assert gpu_screen(app).gpu == 7
        assert "a100-01 GPU 7" in text_of(app, "#gpu-head")


@pytest.fixture
def hour_app() -> Callable[[], GpuConsoleApp]:
    """The demo rack's first two hosts (h100-01, a100-01) with an hour of their readings in
    the store, as a console keeping an hour (`history_seconds`) primes it at its start."""

    def make() -> GpuConsoleApp:
        rack = demo_rack(hosts=2, seed=7, epoch=EPOCH)
        return GpuConsoleApp(
            SimSource(rack, ManualClock(HOUR_AT)),
            auto_poll=False,
            background_start=False,
            history_seconds=3600,
        )

    return make


async def test_an_hour_of_the_thermal_gpu_with_its_throttle_episodes_marked(hour_app) -> None:
    app = hour_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await open_thermal(pilot)
        await pilot.press("r", "r")
        await pilot.pause()
        temp = plot(app, "temp").series
        assert temp is not None
        assert (temp.start, temp.end) == (HOUR_AT - 3600, HOUR_AT)
        assert len(temp.points) == 3600 and temp.points[0][0] == HOUR_AT - 3599
        assert [level.value for level in temp.levels] == [89.0]  # the slowdown temperature

        held = app.fleet.store.history("a100-01")
        by_time = {s.time: s for s in held}
        throttling = {
            t
            for t, s in by_time.items()
            if any(f.code == "thermal-throttle" and f.gpu == 2 for f in health.evaluate(s))
        }
        marks = sorted(mark.time for mark in temp.marks)
        assert len(marks) >= 5, "the hour holds several throttle episodes, begun and ended"
        began = [t for t in marks if t in throttling and t - 1 not in throttling]
        ended = [t for t in marks if t not in throttling and t - 1 in throttling]
        assert sorted(began + ended) == marks  # each mark where the finding came or went
        assert all(plot(app, key).series.marks == temp.marks for key in ("util", "power"))

        # Still open: it began where triage says it began.
        ident = "a100-01/2/thermal-throttle"
        assert app.fleet.onsets.since(ident) == max(began)
        marked = text_of(app, "#gpu-marks")
        assert f"thermal-throttle ×{len(began)} (marked)" in marked
        assert f"{clock(max(began))}–now" in marked
        assert "temp-high" in marked  # the warning on the way up: listed, not marked


# --- identity: serial and VBIOS ------------------------------------------------------------------


async def test_the_details_name_the_board_its_vbios_and_its_counters(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await open_thermal(pilot)
        gpu = app.fleet.store.latest("a100-01").gpu(2)
        details = text_of(app, "#gpu-details")
        for label, value in (
            ("UUID", gpu.uuid),
            ("Serial", gpu.serial),
            ("VBIOS", "92.00.45.00.06"),
            ("Row remaps", "0 correctable · 0 uncorrectable"),
            ("XIDs", "none reported"),
        ):
            assert f"{label:<15}{value}" in details.splitlines(), label
        assert "pod " in text_of(app, "#gpu-processes")  # whose work it is


# --- limits and PCIe traffic ----------------------------------------------------------------------


async def test_the_details_show_the_limits_and_the_pcie_traffic(make_app) -> None:
    """The A100 80GB PCIe of the demo: its power range, application clocks and shutdown
    temperature beside the maximum and slowdown, and what crosses its PCIe link now."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await open_thermal(pilot)
        gpu = app.fleet.store.latest("a100-01").gpu(2)
        assert gpu.pcie_tx_kib_s is not None and gpu.pcie_rx_kib_s is not None
        details = text_of(app, "#gpu-details").splitlines()
        for label, value in (
            ("Power limit", "enforced 300 · default 300 W"),
            ("Power range", "150–300 W"),
            ("SM clock", "max 1410 · application 1095 MHz"),
            ("Mem clock", "max 1512 · application 1512 MHz"),
            ("Temp limits", "slowdown 89 · shutdown 92 °C"),
        ):
            assert f"{label:<15}{value}" in details, label
        (traffic,) = [line for line in details if line.startswith("PCIe traffic")]
        assert re.fullmatch(
            r"PCIe traffic   TX \d+(\.\d)? [KMG]iB/s · RX \d+(\.\d)? [KMG]iB/s", traffic
        )


@pytest.mark.parametrize(
    ("kib_s", "shown"),
    [(None, "N/A"), (740.0, "740 KiB/s"), (15_974.0, "15.6 MiB/s"), (1_258_291.0, "1.2 GiB/s")],
)
def test_pcie_traffic_in_binary_units(kib_s: float | None, shown: str) -> None:
    gpu = GpuState(0, pcie_tx_kib_s=kib_s, pcie_rx_kib_s=512.0 * 1024)
    assert _traffic(gpu).plain == f"TX {shown} · RX 512 MiB/s"


async def test_limits_not_known_read_na(make_app) -> None:
    """A GPU that gives none of the new limits (an older driver, a consumer card) says so in
    place, beside what it does give."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await open_thermal(pilot)
        screen = gpu_screen(app)
        gpu = GpuState(2, power_limit_w=300.0, sm_clock_max_mhz=1410.0)
        rows = [line.plain for line in screen._limits(gpu)]
        assert rows[:3] == [
            "Power limit    enforced 300 · default N/A W",
            "Power range    N/A–N/A W",
            "SM clock       max 1410 · application N/A MHz",
        ]
        assert "PCIe traffic   TX N/A · RX N/A" in [line.plain for line in screen._readings(gpu)]


def test_impossible_limits_and_traffic_become_none() -> None:
    """Negative, NaN, infinite or past-any-hardware values from a host are refused and counted,
    shown as N/A, never judged."""
    bad = {
        "power_limit_min_w": -200.0,
        "power_limit_max_w": math.nan,
        "power_limit_default_w": 1e308,
        "sm_clock_application_mhz": math.inf,
        "memory_clock_application_mhz": -1.0,
        "shutdown_temperature_c": 10_000.0,
        "pcie_tx_kib_s": -7712.0,
        "pcie_rx_kib_s": float(1 << 40),
    }
    snapshot = vetted(HostSnapshot("evil", 1000.0, (GpuState(0, **bad),)))  # type: ignore[arg-type]
    gpu = snapshot.gpus[0]
    assert all(getattr(gpu, name) is None for name in bad)
    assert snapshot.bad_values == len(bad)
    fine = GpuState(0, power_limit_min_w=200.0, pcie_rx_kib_s=59_257_743.0)  # H200, H2D copy
    assert vetted(HostSnapshot("h", 1000.0, (fine,))).gpus[0] == fine


def test_nvml_reads_the_serial_and_the_vbios_once(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(monkeypatch, count=1)
    nvml.gpus[0] |= {
        "nvmlDeviceGetSerial": "1654922001234",
        "nvmlDeviceGetVbiosVersion": "96.00.A5.00.01",
    }
    source = NvmlSource(host=NVML_HOST, clock=lambda: 1000.0, kernel_log=lambda _: [])
    try:
        first = source.read(NVML_HOST).gpus[0]
        again = source.read(NVML_HOST).gpus[0]
    finally:
        source.close()
    assert (first.serial, first.vbios_version) == ("1654922001234", "96.00.A5.00.01")
    assert (again.serial, again.vbios_version) == (first.serial, first.vbios_version)
    assert nvml.asked["nvmlDeviceGetSerial"] == nvml.asked["nvmlDeviceGetVbiosVersion"] == 1


def test_a_hostile_serial_or_vbios_is_shown_not_obeyed() -> None:
    gpu = GpuState(0, serial="\x1b]52;c;cm0gLXJmIH4=\x07", vbios_version="96\x1b[2J")
    vetted_gpu = vetted(HostSnapshot("evil", 1000.0, (gpu,))).gpus[0]
    for text in (vetted_gpu.serial, vetted_gpu.vbios_version):
        assert text is not None and "\x1b" not in text and "\x07" not in text


# --- replay --------------------------------------------------------------------------------------


@pytest.fixture
def recorded(tmp_path: Path, rack: SimRack, audit_log: Path) -> tuple[Path, float]:
    """60 s of the demo rack, XID 79 on l40s-01's GPU 1 from second 30."""
    path = tmp_path / "incident.sqlite"
    fault_time, _ = record_incident(path, rack, seconds=60, fault_at=30)
    return path, fault_time


async def test_in_replay_the_plots_come_from_the_recording_up_to_the_cursor(
    recorded: tuple[Path, float],
) -> None:
    path, fault_time = recorded
    recording = Recording(path)
    app = ReplayApp(recording, at=fault_time + 10)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await app.workers.wait_for_complete()
            app.show_gpu("l40s-01", 1)
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            util = plot(app, "util").series
            assert util is not None and util.end == fault_time + 10
            times = [t for t, _ in util.points]
            assert times[0] == START and max(times) < fault_time  # lost from the fault on
            assert "from the recording" in text_of(app, "#gpu-span")
            assert f"gpu-lost (marked): {clock(fault_time)}–now" in text_of(app, "#gpu-marks")
            assert {m.time for m in util.marks} == {fault_time}  # gpu-lost and its XID
            assert f"since {clock(fault_time)}" in text_of(app, "#gpu-head")  # as recorded
    finally:
        recording.close()


# --- snapshots ------------------------------------------------------------------------------------


def test_gpu_80x24(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=open_thermal)


def test_gpu_an_hour_160x48(snap_compare, hour_app) -> None:
    async def an_hour(pilot: Pilot[None]) -> None:
        await open_thermal(pilot)
        await pilot.press("r", "r")
        await pilot.pause()

    assert snap_compare(hour_app(), terminal_size=(160, 48), run_before=an_hour)


# --- live, with the console recording ------------------------------------------------------------


async def test_live_the_span_the_store_no_longer_holds_comes_from_the_consoles_recording(
    tmp_path: Path, rack: SimRack, audit_log: Path
) -> None:
    """Five minutes recorded, two held in memory: the plot's five minutes are whole, the older
    three read from the recording the console writes; without a recording, two minutes."""
    from gpuconsole.fleet.record.recorder import Recorder

    path = tmp_path / "console.sqlite"
    record_incident(path, rack, seconds=300, fault_at=290)
    end = START + 300

    async def first_reading(recorder: Recorder | None) -> tuple[float, str]:
        app = GpuConsoleApp(
            SimSource(rack, ManualClock(end)),
            auto_poll=False,
            background_start=False,
            recorder=recorder,
        )
        async with app.run_test(size=(120, 40)) as pilot:
            app.show_gpu("l40s-01", 0)
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            util = plot(app, "util").series
            assert util is not None and util.end == end
            return util.points[0][0], text_of(app, "#gpu-span")

    first, span = await first_reading(None)
    assert first >= end - HISTORY_READINGS and "recording" not in span
    recorder = Recorder(path, label="console")
    try:
        first, span = await first_reading(recorder)
    finally:
        recorder.close()
    assert first == end - 300 == START  # the span's start, which only the recording holds
    assert "older readings from the recording" in span
