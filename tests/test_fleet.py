"""The fleet session: one polling round's home. Priming it with the hosts' recent past feeds the
onsets from the same readings as the alerts, so a finding, its alert and its episode begin at
one instant: the demo's GPU that fell off the bus is not new in triage while its alert (and its
XID) say it has been gone for minutes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from conftest import EPOCH, NOW

from gpuconsole.core.clock import ManualClock
from gpuconsole.fleet.alerts.defaults import DEFAULT_RULES
from gpuconsole.fleet.headless import record_fleet
from gpuconsole.fleet.poller import collect
from gpuconsole.fleet.record.reader import Recording
from gpuconsole.fleet.record.recorder import Recorder
from gpuconsole.fleet.record.when import clock
from gpuconsole.fleet.session import FleetSession
from gpuconsole.telemetry.sim import SimRack, SimSource
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.messages import FleetUpdated
from gpuconsole.ui.screens.alerts import AlertsScreen, row_key
from gpuconsole.ui.screens.triage import TriageScreen

HISTORY_S = 120
LOST = ("h100-01", 3)
"""The demo's GPU that falls off the bus (XID 79), 120 s after the epoch."""
FELL_OFF = EPOCH + 120.0


@pytest.mark.parametrize(
    ("started", "began"),
    [
        # The console starts a minute after the GPU fell off: the history holds the moment.
        (EPOCH + 180.0, FELL_OFF),
        # Long after: the history's first reading is the first the console knows it gone.
        (NOW, NOW - HISTORY_S + 1),
    ],
)
async def test_a_lost_gpu_its_alert_and_its_episode_begin_at_one_instant(
    rack: SimRack, started: float, began: float
) -> None:
    app = GpuConsoleApp(
        SimSource(rack, ManualClock(started)), auto_poll=False, background_start=False
    )
    host, gpu = LOST
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("T")
        await pilot.pause()
        assert isinstance(app.screen, TriageScreen)
        since = {(i.kind, i.code): i.since for i in app.screen.items if (i.host, i.gpu) == LOST}
        alert = next(a for a in app.fleet.alerts.active() if a.key == ("gpu-xid", host, gpu))
        assert alert.state == "firing"
        assert alert.since == began
        # the alert is folded onto the row of the finding it watches, with its own time
        folded = {
            a.rule: a.since for i in app.screen.items if (i.host, i.gpu) == LOST for a in i.alerts
        }
        assert folded["gpu-xid"] == began
        # One row: gpu-lost with its XID 79 folded in, dated by the driver's own event, which
        # may be older than the history.
        assert since == {("finding", "gpu-lost"): min(FELL_OFF, began)}
        # A bundle takes the same episodes.
        episodes = {
            e.code: e.since for e in app.fleet.onsets.open_episodes() if (e.host, e.gpu) == LOST
        }
        assert episodes == {"gpu-lost": began, "xid": FELL_OFF, "gpu-xid": began}
        # The alerts screen says the same.
        await pilot.press("escape", "a")
        await pilot.pause()
        assert isinstance(app.screen, AlertsScreen)
        shown = app.screen.table.get_cell(row_key(alert), "since")
        assert getattr(shown, "plain", shown) == clock(began)


def test_priming_leaves_the_episodes_a_console_watching_all_along_would_have(
    rack: SimRack,
) -> None:
    """A session primed at NOW, and one that took every second's readings up to NOW."""
    primed = FleetSession(rack.hosts, DEFAULT_RULES, history_seconds=HISTORY_S)
    primed.prime(SimSource(rack, ManualClock(NOW)), HISTORY_S)
    clock = ManualClock(NOW - HISTORY_S + 1)
    watching = FleetSession(rack.hosts, DEFAULT_RULES, history_seconds=HISTORY_S)
    source = SimSource(rack, clock)
    while True:
        watching.take(collect(source))
        if clock() == NOW:
            break
        clock.advance(1.0)
    primed.take(collect(SimSource(rack, ManualClock(NOW))))

    def opened(fleet: FleetSession) -> dict[str, float]:
        return {e.ident: e.since for e in fleet.onsets.open_episodes()}

    assert opened(primed) == opened(watching)
    assert [(a.key, a.state, a.since) for a in primed.alerts.active()] == [
        (a.key, a.state, a.since) for a in watching.alerts.active()
    ]
    lost = primed.onsets.since("h100-01/3/gpu-lost")
    assert lost == NOW - HISTORY_S + 1


def test_the_first_round_states_every_host_and_an_unchanged_one_none(rack: SimRack) -> None:
    fleet = FleetSession(rack.hosts, DEFAULT_RULES)
    source = SimSource(rack, ManualClock(NOW))
    fleet.prime(source, HISTORY_S)
    assert fleet.take(collect(source)).changed == set(rack.hosts)
    assert fleet.take(collect(source)).changed == set()  # no newer reading: nothing changed
    assert fleet.recording is None


def test_a_queued_update_gives_way_to_a_newer_one_that_names_its_hosts() -> None:
    older = FleetUpdated({"a100-01"})
    assert older.can_replace(FleetUpdated({"a100-01", "h100-01"}))
    assert older.can_replace(FleetUpdated(None))  # everything: the newer one covers it
    assert not older.can_replace(FleetUpdated({"h100-01"}))  # a100-01 would not be shown
    assert not FleetUpdated(None).can_replace(FleetUpdated({"a100-01"}))


def test_a_recording_of_the_console_dates_the_lost_gpu_as_the_console_does(
    rack: SimRack, tmp_path: Path
) -> None:
    """`replay --list` and replay's triage read the recording's episodes: the same instants."""
    clock = ManualClock(EPOCH + 180.0)
    recorder = Recorder(tmp_path / "lost.sqlite", audit_log=tmp_path / "audit")
    stop = threading.Event()

    def tick(rounds: int) -> None:
        clock.advance(1.0)
        if rounds >= 3:
            stop.set()

    try:
        record_fleet(SimSource(rack, clock), recorder, interval=0.0, stop=stop, on_round=tick)
    finally:
        recorder.close()
    recording = Recording(tmp_path / "lost.sqlite")
    try:
        episodes = {e.code: e.since for e in recording.episodes(host=LOST[0]) if e.gpu == LOST[1]}
    finally:
        recording.close()
    assert episodes == {"gpu-lost": FELL_OFF, "xid": FELL_OFF, "gpu-xid": FELL_OFF}
