"""One story per problem and per host: the fleet, the title line, the host screen, the GPU screen
and the triage view say the same state, severity and start, whatever the rack and the moment."""

from __future__ import annotations

import asyncio

from conftest import EPOCH, NOW
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import Severity
from gpuconsole.fleet.alerts.engine import FIRING
from gpuconsole.fleet.host_state import state_word
from gpuconsole.fleet.poller import collect
from gpuconsole.fleet.record.when import clock as clock_text
from gpuconsole.fleet.triage_list import TriageItem
from gpuconsole.telemetry.sim import SimSource, demo_rack
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.alerts import AlertsScreen
from gpuconsole.ui.screens.fleet import FleetScreen
from gpuconsole.ui.screens.gpu import GpuScreen
from gpuconsole.ui.screens.host import HostScreen
from gpuconsole.ui.screens.triage import TriageScreen
from gpuconsole.ui.widgets.cells import SEVERITY_BADGES
from gpuconsole.ui.widgets.keyed_table import KeyedTable


def words(text: str) -> str:
    """The text with its wrapping undone: one blank between words."""
    return " ".join(text.split())


def told(problem: TriageItem) -> str:
    """How a problem's line begins on the host and GPU screens."""
    since = f" since {clock_text(problem.since)}:" if problem.since is not None else ""
    return words(f"{SEVERITY_BADGES[problem.severity]}{since} {problem.what}")[:40]


def shown(app: GpuConsoleApp, selector: str) -> str:
    return words(str(app.screen.query_one(selector).render()))


def worst_by_host(problems: list[TriageItem]) -> dict[str, TriageItem]:
    """Each host's worst problem: the first of its rows (worst first, then newest)."""
    found: dict[str, TriageItem] = {}
    for problem in problems:
        found.setdefault(problem.host, problem)
    return found


async def check_the_story(app: GpuConsoleApp, size: tuple[int, int]) -> None:
    async with app.run_test(size=size) as pilot:
        app.apply_readings(collect(app.source))
        await pilot.pause()
        problems = app.problems()
        worst = worst_by_host(problems)
        store = app.fleet.store

        # the fleet: each host's state word and worst problem; the title's counts; the detail
        # under the hosts tells the cursor host's worst problem as the host screen does
        assert isinstance(app.screen, FleetScreen)
        cursor = app.screen.query_one("#fleet", KeyedTable).cursor_key
        if cursor in worst:
            assert told(worst[cursor]) in shown(app, "#fleet-detail")
        table = app.screen.query_one("#fleet", KeyedTable)
        for host in store.hosts:
            state = state_word(store.status(host).state, store.latest(host), short=True)
            assert table.get_cell(host, "state").plain == state
            problem = table.get_cell(host, "problem").plain
            top = worst.get(host)
            if top is None or top.severity is Severity.INFO:
                assert problem.startswith("ok"), (host, problem)
            else:
                assert problem.startswith(SEVERITY_BADGES[top.severity]), (host, problem)
        critical = sum(1 for p in worst.values() if p.severity is Severity.CRITICAL)
        title = shown(app, "#title-bar")
        assert (f"{critical} critical" in title) == bool(critical), title

        # the worst host's screen: its state word, its problems, the cursor on its worst GPU
        host = next(iter(worst), store.hosts[0])
        app.push_screen(HostScreen(host))
        await pilot.pause()
        info = shown(app, "#host-info")
        assert info.split()[1] == state_word(store.status(host).state, store.latest(host))
        mine = [p for p in problems if p.host == host]
        findings = shown(app, "#findings")
        if mine:
            assert findings.startswith(told(mine[0])), (findings, told(mine[0]))
        worst_gpu = next(
            (p.gpu for p in mine if p.gpu is not None and p.severity > Severity.INFO), None
        )
        if worst_gpu is not None:
            assert app.screen.selected_gpu == worst_gpu

        # its worst GPU's screen: the same problems, the same words
        gpu = worst_gpu if worst_gpu is not None else app.screen.selected_gpu
        if gpu is not None:
            app.show_gpu(host, gpu)
            await pilot.pause()
            assert isinstance(app.screen, GpuScreen)
            head = shown(app, "#gpu-head")
            for problem in [p for p in mine if p.gpu == gpu][:2]:
                assert told(problem) in head, (told(problem), head)
            await pilot.press("escape")
        await pilot.press("escape")

        # triage: every problem needing a person, with the same severity and start
        await pilot.press("T")
        await pilot.pause()
        assert isinstance(app.screen, TriageScreen)
        rows = app.screen.query_one("#triage", KeyedTable)
        needing = [p for p in problems if p.severity > Severity.INFO]
        assert rows.row_count == len(needing)
        for problem in needing:
            assert rows.get_cell(problem.key, "severity").plain == SEVERITY_BADGES[problem.severity]
            since = "N/A" if problem.since is None else clock_text(problem.since)
            assert rows.get_cell(problem.key, "since").plain == since

        # alerts: a firing alert is never worse than the problem it is folded into
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, AlertsScreen)
        for problem in problems:
            for alert in problem.alerts:
                if alert.state == FIRING:
                    assert alert.severity <= problem.severity


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 40),
    hosts=st.integers(1, 10),
    minutes=st.integers(0, 12),
    size=st.sampled_from([(80, 24), (160, 48)]),
)
def test_every_screen_tells_one_story_of_each_problem_and_host(
    seed: int, hosts: int, minutes: int, size: tuple[int, int]
) -> None:
    clock = ManualClock(NOW + 60 * minutes)
    rack = demo_rack(hosts=hosts, seed=seed, epoch=EPOCH)
    app = GpuConsoleApp(SimSource(rack, clock), auto_poll=False, background_start=False)
    asyncio.run(check_the_story(app, size))


async def test_the_on_calls_first_minute_on_the_demo(make_app, clock) -> None:
    """Fleet, the worst host, its worst GPU, triage, alerts, back: h100-01 is drain on every
    screen, its GPU 3 is lost since one moment, CRIT everywhere."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.apply_readings(collect(app.source))
        await pilot.pause()
        lost = next(p for p in app.problems() if p.code == "gpu-lost")
        since = clock_text(lost.since)
        fleet = app.screen.query_one("#fleet", KeyedTable)
        assert fleet.cursor_key == "h100-01"  # worst first
        assert fleet.get_cell("h100-01", "state").plain == "drain"
        assert "5 live, 1 drain" in shown(app, "#title-bar")
        detail = shown(app, "#fleet-detail")  # under the hosts: the cursor host's problems, whole
        assert detail.startswith("h100-01 · drain · ")
        assert words(f"CRIT since {since}: {lost.what} → {lost.next_step}") in detail
        await pilot.press("enter")
        assert isinstance(app.screen, HostScreen)
        assert shown(app, "#host-info").startswith("h100-01 drain")
        assert app.screen.selected_gpu == 3
        assert f"CRIT since {since}: GPU 3" in shown(app, "#findings")
        await pilot.press("enter")
        assert isinstance(app.screen, GpuScreen)
        head = shown(app, "#gpu-head")
        assert "· LOST" in head and "· live" not in head
        assert f"CRIT since {since}: GPU 3" in head and "XID 79 on GPU 3" not in head
        await pilot.press("T")
        assert isinstance(app.screen, TriageScreen)
        rows = app.screen.query_one("#triage", KeyedTable)
        assert rows.get_cell(lost.key, "since").plain == since
        await pilot.press("a")
        assert isinstance(app.screen, AlertsScreen)
        alerts = app.screen.query_one("#alerts", KeyedTable)
        assert alerts.cursor_key == "gpu-xid|h100-01|3"
        for screen in (TriageScreen, GpuScreen, HostScreen, FleetScreen):
            await pilot.press("escape")
            assert isinstance(app.screen, screen)
