"""The alerts view: opened with `a`, acknowledge, silence, open the GPU; and its snapshot."""

from __future__ import annotations

from textual.widgets import Static

from gpuconsole.fleet.alerts.engine import FIRING
from gpuconsole.fleet.alerts.rules import rule_from_dict
from gpuconsole.ui.screens.alerts import AlertsScreen, SilenceScreen, age, row_key
from gpuconsole.ui.screens.fleet import FleetScreen
from gpuconsole.ui.screens.gpu import GpuScreen
from gpuconsole.ui.screens.help import bindings_table
from gpuconsole.ui.widgets.keyed_table import KeyedTable


def rows(screen: AlertsScreen) -> list[str]:
    table = screen.query_one("#alerts", KeyedTable)
    return [table.coordinate_to_cell_key((r, 0)).row_key.value for r in range(table.row_count)]


def cell(screen: AlertsScreen, row: str, column: str) -> str:
    return screen.query_one("#alerts", KeyedTable).get_cell(row, column).plain


def test_age() -> None:
    assert age(0) == "0s"
    assert age(45) == "45s"
    assert age(723) == "12m 03s"
    assert age(3 * 3600 + 5 * 60) == "3h 05m"
    assert age(2 * 86400 + 4 * 3600) == "2d 04h"


async def test_a_opens_the_alerts_firing_first(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        assert isinstance(app.screen, FleetScreen)
        await pilot.press("a")
        screen = app.screen
        assert isinstance(screen, AlertsScreen)
        active = app.fleet.alerts.active()
        assert rows(screen) == [row_key(a) for a in active]
        firing = [a for a in active if a.state == FIRING]
        assert firing and rows(screen)[: len(firing)] == [row_key(a) for a in firing]
        first = firing[0]
        assert cell(screen, row_key(first), "state") == "FIRING"
        assert cell(screen, row_key(first), "where") == first.where
        assert f"{len(firing)} firing" in screen.where()
        await pilot.press("a")  # already there: stays
        assert app.screen is screen
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)


async def test_acknowledge_silence_and_unsilence(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("a")
        screen = app.screen
        top = app.fleet.alerts.active()[0]
        await pilot.press("space")
        assert app.fleet.alerts.acknowledged(top.key)
        assert cell(screen, row_key(top), "state") == "FIRING ack"
        await pilot.press("space")
        assert not app.fleet.alerts.acknowledged(top.key)
        await pilot.press("s")
        assert isinstance(app.screen, SilenceScreen)
        await pilot.press("down", "enter")  # the second choice: 1 hour
        assert app.screen is screen
        assert app.fleet.alerts.silenced_until(top.key) == app.fleet.alerts.now + 3600
        assert rows(screen)[-1] == row_key(top)  # silenced alerts sink to the bottom
        assert cell(screen, row_key(top), "state").endswith("muted")
        assert cell(screen, row_key(top), "message").startswith("(silenced 1h 00m more)")
        await pilot.press("s", "escape")  # asked again, cancelled: nothing changes
        assert app.fleet.alerts.silenced_until(top.key) == app.fleet.alerts.now + 3600
        table = screen.query_one("#alerts", KeyedTable)
        table.move_cursor(row=table.get_row_index(row_key(top)))
        await pilot.press("u")
        assert app.fleet.alerts.silenced_until(top.key) is None
        assert rows(screen)[0] == row_key(top)


async def test_enter_opens_the_alerts_gpu(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("a")
        top = app.fleet.alerts.active()[0]
        await pilot.press("enter")
        assert isinstance(app.screen, GpuScreen)
        assert (app.screen.host, app.screen.gpu) == (top.host, top.gpu)


async def test_no_alerts_says_so(make_app) -> None:
    never = rule_from_dict(
        {"name": "never", "expr": "temperature_c > 1000", "severity": "info", "message": "m"},
        "test",
    )
    app = make_app(alert_rules=[never])
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("a")
        assert rows(app.screen) == []
        assert app.screen.query_one("#alerts-empty", Static).display
        await pilot.press("space", "s", "u", "enter")  # nothing under the cursor: no-ops
        assert isinstance(app.screen, AlertsScreen)


def test_help_lists_the_alerts_keys() -> None:
    from gpuconsole.ui.app import GpuConsoleApp

    table = bindings_table(GpuConsoleApp)
    rendered = [str(cell) for column in table.columns for cell in column._cells]
    assert "Alerts" in rendered
    assert any("firing and pending alerts" in text for text in rendered)
    assert any("silence the alert" in text for text in rendered)


def test_alerts_120x40(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), press=["a"])
