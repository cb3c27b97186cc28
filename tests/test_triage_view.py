"""The triage view: one row per problem (a finding with the alerts raised on it, or an alert
on no finding), worst first, then newest, each with what to do next from its own rule; Enter
opens the host at the GPU."""

from __future__ import annotations

import dataclasses
from typing import cast

from conftest import NOW
from hypothesis import given
from hypothesis import strategies as st
from test_app import tick

from gpuconsole.core.model import (
    Finding,
    GpuProcess,
    GpuState,
    HostSnapshot,
    Severity,
    SlurmJob,
    XidEvent,
)
from gpuconsole.fleet.alerts.defaults import BUILT_IN_RULES
from gpuconsole.fleet.alerts.engine import FIRING, PENDING, Alert
from gpuconsole.fleet.alerts.rules import rule_from_dict
from gpuconsole.fleet.record.episodes import ALERT, FINDING, finding_ident
from gpuconsole.fleet.store import FleetStore
from gpuconsole.fleet.triage_list import alert_next_step, triage_items, watched_codes
from gpuconsole.ui.screens.gpu import GpuScreen
from gpuconsole.ui.screens.triage import TriageScreen
from gpuconsole.ui.widgets.keyed_table import KeyedTable

RULES = {rule.name: rule for rule in BUILT_IN_RULES}


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


def test_worst_first_then_newest_with_alerts_folded_into_their_findings() -> None:
    store = store_with(hot("n1", 90.0), hot("n2", 86.0))
    onsets = {"n1/1/gpu-lost": NOW - 300, "n2/1/gpu-lost": NOW - 10, "n1/0/thermal-throttle": NOW}
    alerts = [
        alert("gpu-temperature-high", "n2", 0, NOW - 60),
        alert("gpu-memory-high", "n1", 0, NOW - 5, state=PENDING),  # on no finding: no row
        alert("gpu-utilization-high", "n2", None, NOW - 30),  # on no finding: its own row
    ]
    items = triage_items(store, alerts, onsets.get, BUILT_IN_RULES)
    assert [(i.severity, i.host, i.kind, i.code, i.since) for i in items] == [
        (Severity.CRITICAL, "n1", FINDING, "thermal-throttle", NOW),
        (Severity.CRITICAL, "n2", FINDING, "gpu-lost", NOW - 10),
        (Severity.CRITICAL, "n1", FINDING, "gpu-lost", NOW - 300),
        (Severity.WARNING, "n2", ALERT, "gpu-utilization-high", NOW - 30),
        (Severity.WARNING, "n2", FINDING, "temp-high", NOW - 60),  # since its alert's onset
    ]
    assert items[0].next_step.startswith("check airflow, fans and inlet temperature")
    assert items[1].next_step.startswith("reboot the node")  # the XID 79 catalog action
    assert [(a.rule, a.state, a.since) for a in items[4].alerts] == [
        ("gpu-temperature-high", FIRING, NOW - 60)
    ]
    assert "utilization_pct > 95" in items[3].next_step


def test_a_gpu_fallen_off_the_bus_is_one_row_with_its_xid_79_alert_folded_in() -> None:
    snapshot = HostSnapshot(
        "n1",
        NOW,
        (GpuState(0), GpuState(1, lost=True)),
        xid_events=(XidEvent(79, 1, NOW - 5), XidEvent(13, 0, NOW - 5)),
    )
    xid_rule = rule_from_dict(
        {"name": "xid-seen", "severity": "critical", "findings": ["xid"]}, "test"
    )
    alerts = [alert("xid-seen", "n1", 1, NOW - 5, severity=Severity.CRITICAL)]
    items = triage_items(store_with(snapshot), alerts, {}.get, [xid_rule])
    assert [(i.gpu, i.code) for i in items] == [(1, "gpu-lost"), (0, "xid")]
    assert [a.rule for a in items[0].alerts] == ["xid-seen"]


def test_an_alert_on_no_finding_says_what_to_do_from_its_own_rule() -> None:
    runbook = alert("gpu-hot", "n1", 0, NOW, labels=(("runbook", "https://wiki/gpu-hot"),))
    assert alert_next_step(runbook, None) == "https://wiki/gpu-hot"
    nothing = alert("gpu-utilization-high", "n1", None, NOW)
    assert alert_next_step(nothing, RULES["gpu-utilization-high"]) == (
        "open n1 and check the readings behind alert rule gpu-utilization-high "
        "(utilization_pct > 95)"
    )


def test_the_memory_alert_takes_the_memory_remedy_not_that_of_a_power_cap_beside_it() -> None:
    """The bug of the demo: the alert took the remedy of whichever finding of its GPU came first."""
    power = Finding(Severity.INFO, "power-cap", "at the cap", "expected under full load", "n1", 0)
    memory = Finding(Severity.INFO, "mem-pressure", "87 % used", "keep 20 % free", "n1", 0)
    items = triage_items(
        cast(FleetStore, _Findings({"n1": (power, memory)})),
        [alert("gpu-memory-high", "n1", 0, NOW - 400)],
        {}.get,
        BUILT_IN_RULES,
    )
    assert [(i.code, i.next_step, [a.rule for a in i.alerts]) for i in items] == [
        ("mem-pressure", "keep 20 % free", ["gpu-memory-high"]),
        ("power-cap", "expected under full load", []),
    ]


def test_the_codes_a_rule_watches() -> None:
    assert watched_codes(RULES["gpu-memory-high"]) == {"mem-pressure"}
    assert watched_codes(RULES["gpu-power-at-limit"]) == {"power-cap"}
    assert watched_codes(RULES["gpu-temperature-high"]) == {"thermal-throttle", "temp-high"}
    assert watched_codes(RULES["gpu-utilization-high"]) == set()
    assert watched_codes(RULES["gpu-xid"]) == {"xid", "gpu-lost"}
    table = {"name": "hot", "expr": "temperature_c > 70", "severity": "info", "message": "hot"}
    user = rule_from_dict(table, "test")
    assert watched_codes(user) == {"thermal-throttle", "temp-high"}


class _Findings:
    """A store's findings, as given."""

    def __init__(self, findings: dict[str, tuple[Finding, ...]]) -> None:
        self._findings = findings
        self.hosts = list(findings)

    def findings(self, host: str) -> tuple[Finding, ...]:
        return self._findings[host]

    def latest(self, host: str) -> None:
        return None  # no readings: the rows affect no one known


_CODES = ("mem-pressure", "power-cap", "temp-high", "thermal-throttle", "gpu-lost", "xid")
_REMEDIES = {code: f"remedy of {code}" for code in _CODES}
_finding = st.builds(
    lambda severity, code, host, gpu: Finding(
        severity, code, f"{code} on {host}", _REMEDIES[code], host, gpu
    ),
    st.sampled_from(Severity),
    st.sampled_from(_CODES),
    st.sampled_from(("n1", "n2")),
    st.sampled_from((None, 0, 1)),
)
_alert = st.builds(
    lambda rule, host, gpu, state, since, runbook: alert(
        rule,
        host,
        gpu,
        since,
        state=state,
        labels=(("runbook", f"runbook of {rule}"),) if runbook else (),
    ),
    st.sampled_from(sorted(RULES)),
    st.sampled_from(("n1", "n2", "n3")),  # n3: a host the store does not know
    st.sampled_from((None, 0, 1)),
    st.sampled_from((FIRING, PENDING)),
    st.floats(NOW - 3600, NOW),
    st.booleans(),
)


@given(st.lists(_finding, max_size=12), st.lists(_alert, max_size=12))
def test_one_row_per_problem_each_with_its_own_remedy(
    findings: list[Finding], alerts: list[Alert]
) -> None:
    by_host: dict[str, tuple[Finding, ...]] = {"n1": (), "n2": ()}
    seen: set[str] = set()
    for finding in findings:  # one finding per identity, as the health rules give
        if finding_ident(finding) not in seen:
            seen.add(finding_ident(finding))
            by_host[finding.host] += (finding,)
    unique = {a.key: a for a in alerts}  # the engine keeps one alert per key
    items = triage_items(
        cast(FleetStore, _Findings(by_host)), unique.values(), {}.get, BUILT_IN_RULES
    )

    keys = [i.key for i in items]
    assert len(keys) == len(set(keys))  # no problem twice
    assert {i.key for i in items if i.kind == FINDING} == seen  # every finding on its row
    for item in items:
        if item.kind == FINDING:
            assert item.next_step == _REMEDIES[item.code]  # its own finding's remedy
            for shown in item.alerts:  # only alerts whose rule watches the row's code
                assert item.code in watched_codes(RULES[shown.rule])
        else:
            (shown,) = item.alerts
            assert (shown.rule, shown.state) == (item.code, FIRING)
            labels = dict(unique[(item.code, item.host, item.gpu)].labels)
            assert item.next_step == labels.get("runbook", item.next_step)  # its own runbook
            assert item.next_step not in _REMEDIES.values()
    on_rows = [(a.rule, i.host, i.gpu) for i in items for a in i.alerts]
    assert len(on_rows) == len(set(on_rows))
    firing = {key for key, a in unique.items() if a.state == FIRING}
    assert firing <= set(on_rows)  # every firing alert on exactly one row


async def test_the_view_lists_the_demo_fleet_and_opens_a_rows_gpu(make_app, clock) -> None:
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
        findings = [f for h in app.fleet.store.hosts for f in app.fleet.store.findings(h)]
        lost = {(f.host, f.gpu) for f in findings if f.code == "gpu-lost"}
        xid_79 = [f for f in findings if (f.host, f.gpu) in lost and "XID 79" in f.message]
        assert xid_79  # h100-01's GPU 3: gpu-lost and its XID 79 are one row
        # every firing alert of the demo is on a finding's row
        assert len(items) == len(findings) - len(xid_79)
        firing = [a for a in app.fleet.alerts.active() if a.state == FIRING]
        folded = [(a.rule, i.host, i.gpu) for i in items for a in i.alerts if a.state == FIRING]
        assert firing and sorted(a.key for a in firing) == sorted(folded)
        assert all(i.next_step for i in items)
        table = screen.query_one("#triage", KeyedTable)
        needing = [i for i in items if i.severity > Severity.INFO]
        assert 0 < table.row_count == len(needing) < len(items)  # info folded away
        status = str(screen.query_one("#triage-status").render())
        assert f"{len(items) - len(needing)} info folded (i shows them)" in status
        await pilot.press("i")
        assert table.row_count == len(items)
        assert "folded" not in str(screen.query_one("#triage-status").render())
        lost = next(i for i in items if i.code == "gpu-lost")
        table.move_cursor(row=table.get_row_index(lost.key))
        await pilot.pause()
        detail = str(screen.query_one("#triage-detail").render())
        assert lost.where in detail and "next: reboot the node" in detail
        await pilot.press("enter")
        assert isinstance(app.screen, GpuScreen)
        assert (app.screen.host, app.screen.gpu) == (lost.host, lost.gpu)
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


async def test_the_demo_after_ten_minutes_pages_only_for_its_real_problems(make_app, clock) -> None:
    """Busy GPUs, memory past the reserve, power at the limit: advice (info rows, folded), no
    alert. The firing alerts are the demo's two faults: a100-01 GPU 2 throttling hot, and
    h100-01 GPU 3 fallen off the bus."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        tick(app, clock)
        tick(app, clock, 600.0)
        firing = {a.key for a in app.fleet.alerts.active() if a.state == FIRING}
        assert firing == {
            ("gpu-throttling", "a100-01", 2),
            ("gpu-temperature-high", "a100-01", 2),
            ("gpu-xid", "h100-01", 3),
        }
        assert all(a.severity > Severity.INFO for a in app.fleet.alerts.active())
        await pilot.press("T")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TriageScreen)
        shown = [(i.where, i.code) for i in screen.shown]
        assert shown == [("a100-01 GPU 2", "thermal-throttle"), ("h100-01 GPU 3", "gpu-lost")]
        advice = {i.code for i in screen.items if i.severity is Severity.INFO}
        assert advice == {"mem-pressure", "power-cap"}
        memory = next(i for i in screen.items if i.code == "mem-pressure")
        assert memory.alerts == () and memory.next_step.startswith("keep 20 % of GPU memory free")


def test_each_row_says_whose_work_it_affects() -> None:
    job = SlurmJob(41327, "llama-ft", "alice", "gpu", None, None, "RUNNING")
    snapshot = dataclasses.replace(
        hot("n1", 90.0),
        processes=(
            GpuProcess(11, 0, 100.0, "alice", "python train.py", job=job),
            GpuProcess(12, 0, 100.0, "alice", "python train.py", job=job),
            GpuProcess(13, 0, 100.0, "svc", "serve", container="docker:0123456789ab"),
            GpuProcess(14, 1, 100.0, "bob", "python other.py"),
        ),
    )
    items = triage_items(store_with(snapshot), [], {}.get, BUILT_IN_RULES)
    by_gpu = {i.gpu: i.affects for i in items}
    assert by_gpu[0] == ("job 41327 (alice, llama-ft)", "container docker:0123456789ab")
    assert by_gpu[1] == ()  # a process of no job or container: no owner to name


async def test_slash_filters_triage_and_alerts_by_whole_words_and_esc_clears_first(
    make_app, clock
) -> None:
    from gpuconsole.ui.screens.alerts import AlertsScreen
    from gpuconsole.ui.screens.fleet import FleetScreen

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        tick(app, clock)
        await pilot.press("T", "i", "slash", *"h100-02")
        screen = app.screen
        assert isinstance(screen, TriageScreen)
        table = screen.query_one("#triage", KeyedTable)
        mine = [i for i in screen.items if i.host == "h100-02"]
        assert mine and table.row_count == len(mine) < len(screen.items)
        await pilot.press("enter", "escape")  # the filter goes first
        assert isinstance(app.screen, TriageScreen) and table.row_count == len(screen.items)
        await pilot.press("slash", *"crit")
        assert {i.severity for i in screen.shown} == {Severity.CRITICAL}
        await pilot.press("enter", "escape", "escape")
        assert isinstance(app.screen, FleetScreen)

        await pilot.press("a", "slash", *"gpu-xid")
        alerts = app.screen
        assert isinstance(alerts, AlertsScreen)
        rows = alerts.query_one("#alerts", KeyedTable)
        assert rows.row_count == 1 and rows.cursor_key == "gpu-xid|h100-01|3"
        await pilot.press("enter", "escape")
        assert rows.row_count == len(app.fleet.alerts.active())
