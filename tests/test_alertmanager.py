"""Alerts that reach people, judged by a real Alertmanager (`tests/amserver.py`) and amtool: a
fault of the simulated rack fires there with its labels and resolves when it clears; a silence
made in the console shows in `amtool silence query`; a restarted Alertmanager gets every firing
alert back; a console and a recorder make one alert of each problem; hostile texts are taken.

The rack runs on a manual clock set to now: Alertmanager compares ``endsAt`` with its own clock.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from amserver import Alertmanager, require_alertmanager
from cli_runner import start_gpuconsole
from notices import Notice, notices
from promserver import free_port

from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import Severity
from gpuconsole.fleet.alerts.alertmanager import (
    AlertmanagerSender,
    AlertmanagerSettings,
    posted,
    rfc3339,
)
from gpuconsole.fleet.alerts.defaults import BUILT_IN_RULES, DEFAULT_RULES
from gpuconsole.fleet.alerts.engine import FIRING, Alert
from gpuconsole.fleet.poller import collect
from gpuconsole.fleet.session import FleetSession
from gpuconsole.telemetry.sim import SimRack, SimSource
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.alerts import AlertsScreen, SilenceScreen, row_key
from gpuconsole.ui.screens.confirm import ConfirmScreen
from gpuconsole.ui.widgets.keyed_table import KeyedTable

HOST, GPU = "h100-01", 6


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    require_alertmanager()
    server = Alertmanager(tmp_path / "alertmanager").start()
    yield server
    server.kill()


def faulty_rack() -> tuple[SimSource, SimRack, ManualClock]:
    """One H100 host read at the wall clock's now, its GPU 6 with an uncorrectable ECC error
    (the gpu-ecc and gpu-xid rules fire at once)."""
    now = time.time()
    rack = SimRack({HOST: "h100-sxm-8"}, seed=7, epoch=now - 600)
    rack.set_fault(HOST, "ecc-uncorrectable", GPU, since=now - 30)
    clock = ManualClock(now)
    return SimSource(rack, clock), rack, clock


def sender_to(alertmanager: Alertmanager, resend: float = 60.0) -> AlertmanagerSender:
    return AlertmanagerSender(AlertmanagerSettings((alertmanager.url,), resend=resend))


def named(alertname: str) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """The alerts of amtool's or the API's answer with this alert name."""
    return lambda alerts: [a for a in alerts if a["labels"]["alertname"] == alertname]


def test_a_fault_fires_with_its_labels_and_resolves_when_it_clears(
    alertmanager: Alertmanager,
) -> None:
    source, rack, clock = faulty_rack()
    sender = sender_to(alertmanager)
    try:
        # the capacity rules on too: they leave alerts pending (memory, power) at the first round
        fleet = FleetSession(source.hosts, BUILT_IN_RULES, alertmanager=sender)
        fleet.take(collect(source))
        ecc = next(a for a in fleet.alerts.active() if a.rule == "gpu-ecc")
        assert ecc.state == FIRING
        uuid = fleet.store.latest(HOST).gpu(GPU).uuid
        (shown,) = alertmanager.wait_for(
            lambda: alertmanager.alerts("alertname=GpuEcc"), lambda alerts: len(alerts) == 1
        )
        assert shown["labels"] == {
            "alertname": "GpuEcc",
            "rule": "gpu-ecc",
            "severity": "critical",
            "Hostname": HOST,
            "gpu": str(GPU),
            "UUID": uuid,
        }
        assert shown["annotations"] == {"summary": ecc.message, "description": ecc.remedy}
        assert shown["startsAt"] == rfc3339(ecc.since)
        assert "generatorURL" not in shown or not shown["generatorURL"]
        # only firing alerts go: the pending ones (memory, power) stay in the console
        pending = {a.rule for a in fleet.alerts.active() if a.state != FIRING}
        assert pending
        held = {a["labels"]["rule"] for a in alertmanager.every_alert()}
        assert held == {a.rule for a in fleet.alerts.active() if a.state == FIRING}
        assert held.isdisjoint(pending)

        rack.clear_fault(HOST, "ecc-uncorrectable", GPU)
        clock.advance(1)
        fleet.take(collect(source))
        assert not [a for a in fleet.alerts.active() if a.rule == "gpu-ecc"]
        # Gone within seconds though sent to last 240 s: the resolution itself ended it.
        alertmanager.wait_for(
            lambda: alertmanager.alerts("alertname=GpuEcc"), lambda alerts: alerts == [], 20
        )
        assert alertmanager.received("resolved") >= 1
    finally:
        sender.close()


class Rounds:
    """A polling loop in a thread, as the recorder runs one: a round every ``every`` seconds,
    the rack's clock moved along with the wall's."""

    def __init__(self, fleet: FleetSession, source: SimSource, clock: ManualClock) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fleet, source, clock))

    def _run(self, fleet: FleetSession, source: SimSource, clock: ManualClock) -> None:
        while not self._stop.wait(0.2):
            clock.advance(0.2)
            fleet.take(collect(source))

    def __enter__(self) -> Rounds:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_alertmanager_killed_and_restarted_loses_no_firing_alert(
    alertmanager: Alertmanager,
) -> None:
    source, _rack, clock = faulty_rack()
    sender = sender_to(alertmanager, resend=1.0)
    fleet = FleetSession(source.hosts, DEFAULT_RULES, alertmanager=sender)
    fleet.take(collect(source))
    firing = sorted(a.rule for a in fleet.alerts.active() if a.state == FIRING)
    try:
        with Rounds(fleet, source, clock):
            before = alertmanager.wait_for(
                alertmanager.every_alert, lambda alerts: len(alerts) == len(firing)
            )
            alertmanager.kill()
            deadline = time.monotonic() + 10
            while not sender.problems():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            (problem,) = sender.problems()
            assert problem.startswith(
                f"alerts are not being delivered to {alertmanager.url}: connection refused (since "
            )
            alertmanager.start()  # the same port and storage; no alert survives in memory
            after = alertmanager.wait_for(
                alertmanager.every_alert, lambda alerts: len(alerts) == len(firing), 10
            )
            assert sorted(a["labels"]["rule"] for a in after) == firing
            assert {a["fingerprint"]: a["startsAt"] for a in after} == {
                a["fingerprint"]: a["startsAt"] for a in before
            }
            assert sender.problems() == []
    finally:
        sender.close()


def test_a_console_and_a_recorder_make_one_alert_of_each_problem(
    alertmanager: Alertmanager,
) -> None:
    """Alertmanager knows an alert by its label set alone: two sessions watching one fleet,
    started apart (so their alerts began at different times for each), make one alert each,
    dated from the earlier."""
    source, _rack, clock = faulty_rack()
    console = sender_to(alertmanager)
    recorder = sender_to(alertmanager)
    try:
        first = FleetSession(source.hosts, DEFAULT_RULES, alertmanager=console)
        first.take(collect(source))
        firing = [a for a in first.alerts.active() if a.state == FIRING]
        alertmanager.wait_for(alertmanager.every_alert, lambda alerts: len(alerts) == len(firing))
        clock.advance(5)
        second = FleetSession(source.hosts, DEFAULT_RULES, alertmanager=recorder)
        second.take(collect(source))
        assert {a.since for a in second.alerts.active()} != {a.since for a in firing}
        deadline = time.monotonic() + 10
        while alertmanager.received("firing") < 2 * len(firing):  # both have been taken
            assert time.monotonic() < deadline
            time.sleep(0.05)
        held = alertmanager.every_alert()
        assert len(held) == len(firing)
        assert {a["labels"]["rule"]: a["startsAt"] for a in held} == {
            a.rule: rfc3339(a.since) for a in firing
        }
    finally:
        console.close()
        recorder.close()


HOSTILE = (
    Alert("gpu-ecc", "gpu\x1b]52;c;cm0gLXJmIH4=\x07", 0, Severity.CRITICAL, FIRING, 0.0, "m"),
    Alert(
        "gpu-xid",
        "h\ud800ost",
        1,
        Severity.WARNING,
        FIRING,
        time.time() + 3600,  # a host whose clock runs an hour ahead
        "\x1b[2J\x1b[H" + "x" * 100_000,
        (("team", "ops\u202eevil"), ("runbook_url", "https://wiki/\x07")),
        "\x85" * 10_000,
    ),
    Alert("gpu-hot-while-idle", "é" * 5000, None, Severity.INFO, FIRING, -1.0, "\ud800"),
)


def test_hostile_texts_are_taken_as_bounded_visible_text(alertmanager: Alertmanager) -> None:
    sender = sender_to(alertmanager)
    try:
        sender.update(HOSTILE)
        held = alertmanager.wait_for(
            alertmanager.every_alert, lambda alerts: len(alerts) == len(HOSTILE)
        )
        assert sender.problems() == []  # no 400: Alertmanager took every one
        expected = {tuple(sorted(posted(a).labels)) for a in HOSTILE}
        assert {tuple(sorted(a["labels"].items())) for a in held} == expected
        for alert in held:
            assert all("\x1b" not in v and "\x07" not in v for v in alert["labels"].values())
            assert alert["startsAt"] <= alert["endsAt"]
    finally:
        sender.close()


# --- the console's alerts screen ------------------------------------------------------------------


async def wait_async(what: Callable[[], object], timeout: float = 20.0) -> None:
    """Wait for ``what`` (asked in a thread: amtool is a process) to be true."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(what):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_a_silence_made_in_the_console_shows_in_amtool(alertmanager: Alertmanager) -> None:
    source, _rack, _clock = faulty_rack()
    sender = sender_to(alertmanager)
    app = GpuConsoleApp(source, auto_poll=False, background_start=False, alertmanager=sender)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("a")
            screen = app.screen
            assert isinstance(screen, AlertsScreen)
            line = screen.query_one("#alerts-delivery")
            assert str(line.render()) == f"firing alerts go to Alertmanager at {alertmanager.url}"
            await wait_async(lambda: named("GpuEcc")(alertmanager.alerts()))
            ecc = next(a for a in app.fleet.alerts.active() if a.rule == "gpu-ecc")
            table = screen.query_one("#alerts", KeyedTable)

            table.move_cursor(row=table.get_row_index(row_key(ecc)))
            await pilot.press("s", "enter")  # 15 minutes
            assert isinstance(app.screen, ConfirmScreen)
            assert "alertname=GpuEcc, Hostname=h100-01, gpu=6" in app.screen.detail
            await pilot.press("n")  # the console's own silence only
            assert app.screen is screen
            assert app.fleet.alerts.silenced_until(ecc.key) is not None
            assert alertmanager.silences() == []

            table.move_cursor(row=table.get_row_index(row_key(ecc)))
            await pilot.press("s", "enter", "y")
            await app.workers.wait_for_complete()
            (silence,) = alertmanager.silences()
            matchers = {(m["name"], m["value"], m["isRegex"]) for m in silence["matchers"]}
            assert matchers == {
                ("alertname", "GpuEcc", False),
                ("Hostname", HOST, False),
                ("gpu", str(GPU), False),
            }
            assert silence["createdBy"].endswith(" (gpuconsole)")
            assert silence["comment"] == f"from gpuconsole: {ecc.message}"
            assert silence["status"]["state"] == "active"
            # amtool's alert query leaves silenced alerts out; the API says who silenced it
            await wait_async(lambda: not named("GpuEcc")(alertmanager.alerts()))
            (held,) = named("GpuEcc")(alertmanager.every_alert())
            assert held["status"]["silencedBy"] == [silence["id"]]
            assert named("GpuXid")(alertmanager.alerts())  # its neighbour still notifies
    finally:
        sender.close()


async def test_without_alertmanager_a_silence_asks_nothing_more(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("a", "s")
        assert isinstance(app.screen, SilenceScreen)
        await pilot.press("enter")
        assert isinstance(app.screen, AlertsScreen)
        assert not app.screen.query_one("#alerts-delivery").display


async def test_the_alerts_screen_says_when_alerts_are_not_delivered(make_app) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    sender = AlertmanagerSender(AlertmanagerSettings((url,)))
    app = make_app(alertmanager=sender)
    try:
        async with app.run_test(size=(160, 40), notifications=True) as pilot:
            await pilot.press("a")
            screen = app.screen
            await wait_async(sender.problems)
            screen.refresh_view(None)
            await pilot.pause()
            line = str(screen.query_one("#alerts-delivery").render())
            assert line.startswith(f"alerts are not being delivered to {url}: connection refused")
            await pilot.press("s", "enter", "y")
            await app.workers.wait_for_complete()
            await pilot.pause()
            said = f"Alertmanager did not take the silence: {url}: connection refused"
            assert Notice(said, "error") in await notices(pilot)
    finally:
        sender.close()


# --- the commands, end to end ---------------------------------------------------------------------


def test_record_sends_the_demo_racks_alerts_from_the_alerts_file(
    alertmanager: Alertmanager, tmp_path: Path
) -> None:
    """`[alertmanager]` in the alerts file; the recorder stops, its alerts stay firing (nothing
    resolves an alert the console merely stopped watching)."""
    alerts = tmp_path / "alerts.toml"
    alerts.write_text(f'[alertmanager]\nurls = ["{alertmanager.url}"]\n')
    record = start_gpuconsole(
        "--alerts",
        str(alerts),
        "record",
        "--demo",
        "--record",
        str(tmp_path / "rec.sqlite"),
        "--duration",
        "3s",
    )
    _out, err = record.communicate(timeout=300)
    assert record.returncode == 0, err
    assert f"gpuconsole: firing alerts go to Alertmanager at {alertmanager.url}\n" in err
    held = alertmanager.alerts("Hostname=a100-01", "gpu=2")  # the demo's throttled GPU
    assert {a["labels"]["alertname"] for a in held} >= {"GpuThrottling"}


def test_the_exporter_sends_alerts_when_given_alertmanager(alertmanager: Alertmanager) -> None:
    exporter = start_gpuconsole(
        "exporter", "--demo", "--port", "0", "--alertmanager", alertmanager.url, "--refresh", "1"
    )
    try:
        alertmanager.wait_for(
            lambda: alertmanager.alerts("alertname=GpuXid"), lambda alerts: len(alerts) >= 1, 120
        )
    finally:
        exporter.send_signal(signal.SIGTERM)
        _out, err = exporter.communicate(timeout=60)
    assert exporter.returncode == 0, err
    assert f"firing alerts go to Alertmanager at {alertmanager.url}" in err
