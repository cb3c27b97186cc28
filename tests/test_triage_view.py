"""The triage view: every finding and firing alert, worst first, then newest, each with what to
do next; Enter opens the host at the GPU."""

from __future__ import annotations

from conftest import NOW
from test_app import tick

from gpuconsole.alerts.engine import FIRING, PENDING, Alert
from gpuconsole.model import Finding, GpuState, HostSnapshot, Severity
from gpuconsole.screens.host import HostScreen
from gpuconsole.screens.triage import TriageScreen
from gpuconsole.store import FleetStore
from gpuconsole.triage_view import alert_next_step, triage_items
from gpuconsole.widgets.keyed_table import KeyedTable


def store_with(*snapshots: HostSnapshot) -> FleetStore:
    store = FleetStore([s.host for s in snapshots])
    for snapshot in snapshots:
        store.record(snapshot)
    return store


def hot(host: str, temperature: float) -> HostSnapshot:
    gpu = GpuState(index=0, temperature_c=temperature, slowdown_temperature_c=87.0)
    return HostSnapshot(host=host, time=NOW, gpus=(gpu, GpuState(index=1, lost=True)))


def alert(rule: str, host: str, gpu: int | None, since: float, **changes: object) -> Alert:
    fields = {
        "rule": rule,
        "host": host,
        "gpu": gpu,
        "severity": Severity.WARNING,
        "state": FIRING,
        "since": since,
        "message": f"{rule} on {host}",
        "labels": (),
        **changes,
    }
    return Alert(**fields)  # type: ignore[arg-type]


def test_worst_first_then_newest_and_pending_alerts_left_out() -> None:
    store = store_with(hot("n1", 90.0), hot("n2", 86.0))
    onsets = {"n1/1/gpu-lost": NOW - 300, "n2/1/gpu-lost": NOW - 10, "n1/0/thermal-throttle": NOW}
    alerts = [
        alert("gpu-temperature-high", "n2", 0, NOW - 60),
        alert("gpu-memory-high", "n1", 0, NOW - 5, state=PENDING),
    ]
    items = triage_items(store, alerts, onsets.get)
    assert [(i.severity, i.host, i.code, i.since) for i in items] == [
        (Severity.CRITICAL, "n1", "thermal-throttle", NOW),
        (Severity.CRITICAL, "n2", "gpu-lost", NOW - 10),
        (Severity.CRITICAL, "n1", "gpu-lost", NOW - 300),
        (Severity.WARNING, "n2", "gpu-temperature-high", NOW - 60),
        (Severity.WARNING, "n2", "temp-high", None),  # no onset known: after the known ones
    ]
    assert items[0].next_step.startswith("check airflow, fans and inlet temperature")
    assert items[1].next_step.startswith("reboot the node")  # the XID 79 catalog action


def test_an_alert_says_what_to_do_from_its_runbook_else_from_the_finding_it_fires_on() -> None:
    findings = [
        Finding(Severity.INFO, "power-cap", "at the cap", "expected under full load", "n1", 0),
        Finding(Severity.CRITICAL, "thermal-throttle", "too hot", "check airflow", "n1", 0),
        Finding(Severity.CRITICAL, "gpu-lost", "gone", "reboot the node", "n1", 1),
    ]
    runbook = alert("gpu-hot", "n1", 0, NOW, labels=(("runbook", "https://wiki/gpu-hot"),))
    assert alert_next_step(runbook, findings, ()) == "https://wiki/gpu-hot"
    fires_on = alert("gpu-throttling", "n1", 0, NOW)
    assert alert_next_step(fires_on, findings, ("power-cap",)) == "expected under full load"
    assert alert_next_step(fires_on, findings, ()) == "check airflow"  # the worst on its GPU
    nothing = alert("gpu-utilization-high", "n1", None, NOW)
    assert "alert rule gpu-utilization-high" in alert_next_step(nothing, findings, ())


async def test_the_view_lists_the_demo_fleet_and_opens_a_host_at_its_gpu(make_app, clock) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        tick(app, clock)
        await pilot.press("T")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TriageScreen)
        items = screen.items
        ranks = [-int(i.severity) for i in items]
        assert ranks == sorted(ranks)
        findings = sum(len(app.fleet.store.findings(h)) for h in app.fleet.store.hosts)
        firing = [a for a in app.fleet.alerts.active() if a.state == FIRING]
        assert len(items) == findings + len(firing)
        assert firing and {("alert", a.rule) for a in firing} <= {(i.kind, i.code) for i in items}
        assert all(i.next_step for i in items)
        table = screen.query_one("#triage", KeyedTable)
        assert table.row_count == len(items)
        lost = next(i for i in items if i.code == "gpu-lost")
        table.move_cursor(row=table.get_row_index(lost.key))
        await pilot.pause()
        detail = str(screen.query_one("#triage-detail").render())
        assert lost.where in detail and "next: reboot the node" in detail
        await pilot.press("enter")
        assert isinstance(app.screen, HostScreen)
        assert (app.screen.host, app.screen.selected_gpu) == (lost.host, lost.gpu)
        await pilot.press("escape")
        assert isinstance(app.screen, TriageScreen)
        await pilot.press("escape")
        await pilot.press("T")
        assert isinstance(app.screen, TriageScreen)


async def test_a_finding_that_appears_is_newest_among_its_severity(make_app, clock, rack) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        rack.set_fault("a100-02", "pcie-degraded", 5, since=clock() + 1)
        tick(app, clock)
        await pilot.press("T")
        await pilot.pause()
        warnings = [i for i in app.screen.items if i.severity is Severity.WARNING]
        assert (warnings[0].host, warnings[0].code, warnings[0].since) == (
            "a100-02",
            "pcie-degraded",
            clock(),
        )
