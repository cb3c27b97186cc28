"""Key flows of the console, driven with Pilot as a user would drive them."""

from __future__ import annotations

from gpuconsole.core import paths
from gpuconsole.core.model import HostState, Severity
from gpuconsole.fleet.poller import collect
from gpuconsole.ui.screens.console import Console
from gpuconsole.ui.screens.fleet import FleetScreen, gpu_row_key
from gpuconsole.ui.screens.help import HelpScreen
from gpuconsole.ui.screens.host import HostScreen
from gpuconsole.ui.screens.topology import TopologyScreen
from gpuconsole.ui.widgets.keyed_table import KeyedTable
from gpuconsole.ui.widgets.trend_line import TrendLine


def row_keys(screen, table_id: str) -> list[str]:
    table = screen.query_one(f"#{table_id}", KeyedTable)
    return [table.coordinate_to_cell_key((row, 0)).row_key.value for row in range(table.row_count)]


def cell_text(screen, table_id: str, row: str, column: str) -> str:
    cell = screen.query_one(f"#{table_id}", KeyedTable).get_cell(row, column)
    return getattr(cell, "plain", str(cell))


def tick(app, clock, seconds: float = 1.0) -> None:
    """Advance the simulation and take one polling round, as the timer chain would."""
    clock.advance(seconds)
    app.apply_readings(collect(app.source))


def test_the_app_is_the_console_its_screens_read(make_app) -> None:
    """Every member of `Console` is the app's (replay's too: it is one); the check can fail."""
    app = make_app()
    assert isinstance(app, Console)

    class Lacking:
        def __init__(self, missing: str) -> None:
            self.missing = missing

        def __getattr__(self, name: str) -> object:
            if name == self.missing:
                raise AttributeError(name)
            return getattr(app, name)

    assert isinstance(Lacking(""), Console)
    assert not isinstance(Lacking("began"), Console)


async def test_navigation_fleet_host_topology_and_back(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        assert isinstance(app.screen, FleetScreen)
        first = row_keys(app.screen, "fleet")[0]
        await pilot.press("enter")
        assert isinstance(app.screen, HostScreen)
        assert app.screen.host == first
        await pilot.press("t")
        assert isinstance(app.screen, TopologyScreen)
        assert app.screen.host == first
        await pilot.press("escape")
        assert isinstance(app.screen, HostScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)


async def test_worst_host_first_then_sort_by_name(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        keys = row_keys(app.screen, "fleet")
        severities = [app.fleet.store.severity(h) for h in keys]
        # Info findings rank with no findings (they come and go with the load).
        ranks = [-1 if s is None or s < Severity.WARNING else int(s) for s in severities]
        assert ranks == sorted(ranks, reverse=True)
        assert ranks[0] == 2  # the demo has a critical host, shown first
        await pilot.press("s")
        assert app.screen.sort_key == "name"
        assert row_keys(app.screen, "fleet") == sorted(keys)


async def test_expand_host_shows_its_gpus_and_collapse(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        host = row_keys(app.screen, "fleet")[0]
        gpus = len(app.fleet.store.latest(host).gpus)
        await pilot.press("space")
        keys = row_keys(app.screen, "fleet")
        assert keys[1 : 1 + gpus] == [gpu_row_key(host, i) for i in range(gpus)]
        await pilot.press("space")
        assert gpu_row_key(host, 0) not in row_keys(app.screen, "fleet")


async def test_enter_on_gpu_row_opens_host_at_that_gpu(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        host = row_keys(app.screen, "fleet")[0]
        await pilot.press("space", "down", "down", "down", "enter")
        assert isinstance(app.screen, HostScreen)
        assert app.screen.host == host
        assert app.screen.selected_gpu == 2


async def test_filter_keeps_matching_hosts_and_escape_clears(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("slash", *"a100")
        keys = row_keys(app.screen, "fleet")
        assert keys and all(k.startswith("a100") for k in keys)
        await pilot.press("enter", "escape")
        assert len(row_keys(app.screen, "fleet")) == len(app.fleet.store.hosts)


async def test_fault_appearing_while_the_screen_is_open(make_app, rack, clock) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("s")  # by name: h100-02 keeps its place while it turns critical
        assert (
            app.fleet.store.severity("h100-02") is None or app.fleet.store.severity("h100-02") < 2
        )
        rack.set_fault("h100-02", "xid-79", gpu=5, since=clock.now + 1)
        tick(app, clock)
        await pilot.pause()
        problem = cell_text(app.screen, "fleet", "h100-02", "problem")
        assert problem.startswith("CRIT")
        assert "GPU 5" in problem
        app.push_screen(HostScreen("h100-02"))
        await pilot.pause()
        assert cell_text(app.screen, "gpus", "5", "util") == "LOST"


async def test_host_that_stops_answering_goes_stale_then_down(make_app, rack, clock) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        rack.set_fault("l40s-01", "host-unresponsive", since=clock.now)
        for _ in range(3):
            tick(app, clock)
        assert app.fleet.store.status("l40s-01").state is HostState.STALE
        await pilot.pause()
        assert cell_text(app.screen, "fleet", "l40s-01", "state") == "stale"
        for _ in range(7):
            tick(app, clock)
        await pilot.pause()
        assert app.fleet.store.status("l40s-01").state is HostState.DOWN
        assert cell_text(app.screen, "fleet", "l40s-01", "state") == "down"
        assert cell_text(app.screen, "fleet", "l40s-01", "problem") == "CRIT host-down"
        assert row_keys(app.screen, "fleet")[0] == "l40s-01"


async def test_host_screen_trend_follows_the_cursor(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HostScreen("h100-02"))
        await pilot.pause()
        trend = app.screen.query_one("#trend-util", TrendLine)
        assert trend.plain.startswith("GPU 0 util ")
        await pilot.press("down")
        assert trend.plain.startswith("GPU 1 util ")


async def test_next_host_key_moves_through_the_fleet_as_it_is_listed(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        hosts = row_keys(app.screen, "fleet")  # worst first
        await pilot.press("enter")
        assert app.screen.host == hosts[0]
        await pilot.press("right_square_bracket")
        assert app.screen.host == hosts[1]
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert app.screen.host == hosts[-1]
        await pilot.press("escape", "s")  # by name
        by_name = row_keys(app.screen, "fleet")
        assert by_name == sorted(hosts)
        await pilot.press("enter", "right_square_bracket")
        assert app.screen.host == by_name[1]


async def test_help_lists_every_binding(make_app) -> None:
    from gpuconsole.ui.app import GpuConsoleApp
    from gpuconsole.ui.screens.help import bindings_table, key_label

    table = bindings_table(GpuConsoleApp)
    keys = list(table.columns[0]._cells)
    meanings = list(table.columns[1]._cells)
    for screen_type in (FleetScreen, HostScreen, TopologyScreen):
        for binding in screen_type.BINDINGS:
            row = next(i for i, text in enumerate(meanings) if text.startswith(binding.description))
            assert binding.tooltip in meanings[row]
            assert keys[row] == key_label(binding.key)


async def test_theme_switch_recolours_cells(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.screen.query_one("#fleet", KeyedTable)
        host = row_keys(app.screen, "fleet")[0]
        before = table.get_cell(host, "state").style
        app.theme = "gpuconsole-light"
        await pilot.pause()
        await pilot.pause()
        after = table.get_cell(host, "state").style
        assert before != after


async def test_command_palette_offers_hosts(make_app) -> None:
    from gpuconsole.ui.screens.commands import ConsoleCommands

    app = make_app()
    async with app.run_test(size=(120, 40)):
        provider = ConsoleCommands(app.screen)
        names = [name for name, _, _ in provider._commands()]
        assert "Fleet" in names
        assert all(
            f"Host {h}" in names and f"Topology of {h}" in names for h in app.fleet.store.hosts
        )


async def test_mig_instances_show_under_their_gpu_with_utilization_na() -> None:
    from static_source import StaticSource

    from gpuconsole.core.model import GpuState, HostSnapshot, MigInstance
    from gpuconsole.ui.app import GpuConsoleApp

    migs = (
        MigInstance(1, 0, "3g.71gb", 72_000.0, 30_000.0),
        MigInstance(2, 0, "3g.71gb", 72_000.0, 0.0),
    )
    gpu = GpuState(index=0, name="NVIDIA H200", mig_mode=True, mig_instances=migs)
    app = GpuConsoleApp(
        StaticSource(HostSnapshot("mig-host", 1000.0, (gpu,))),
        auto_poll=False,
        background_start=False,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(HostScreen("mig-host"))
        await pilot.pause()
        assert row_keys(app.screen, "gpus") == ["0", "0/mig1", "0/mig2"]
        assert cell_text(app.screen, "gpus", "0/mig1", "util") == "N/A"
        assert cell_text(app.screen, "gpus", "0/mig1", "throttle") == "MIG 3g.71gb"
        assert "29/70 GiB" in cell_text(app.screen, "gpus", "0/mig1", "memory")
        await pilot.press("down")
        assert app.screen.selected_gpu == 0


def test_help_lists_every_full_screen_with_keys_and_the_running_apps_keys() -> None:
    """The help screen finds its sections: a screen with keys of its own (not a dialog) that has
    no heading fails here, and replay's keys show where replay runs, not in the console."""
    from textual.screen import ModalScreen

    from gpuconsole.ui.app import GpuConsoleApp
    from gpuconsole.ui.replay_app import ReplayApp
    from gpuconsole.ui.screens.help import bindings_table, screen_classes

    def rendered(app_type: type) -> list[str]:
        return [str(cell) for column in bindings_table(app_type).columns for cell in column._cells]

    console = rendered(GpuConsoleApp)
    screens = [c for c in screen_classes() if vars(c).get("BINDINGS")]
    assert len(screens) >= 10
    for screen in screens:
        if issubclass(screen, ModalScreen):
            continue
        assert vars(screen).get("HELP_TITLE") in console, f"{screen.__name__} has no heading"
        for binding in screen.BINDINGS:
            assert any(text.startswith(binding.description) for text in console), binding
    assert "Replay (gpuconsole replay FILE)" not in console
    replay = rendered(ReplayApp)
    assert replay.index("Everywhere") < replay.index("Fleet")
    assert replay.index("Fleet") < replay.index("Replay (gpuconsole replay FILE)")
    assert any(text.startswith("Next finding") for text in replay)


async def test_a_polling_round_is_taken_in_and_one_that_fails_says_so() -> None:
    """`poll_now` reads every host on the loop's threads and takes the round in; a round that
    raises (not one host: `collect` reports those) is said once as an error notice."""
    import asyncio

    from notices import notices
    from static_source import StaticSource

    from gpuconsole.core.model import GpuState, HostSnapshot
    from gpuconsole.ui.app import GpuConsoleApp

    class Breaking(StaticSource):
        broken = False

        @property
        def hosts(self) -> tuple[str, ...]:
            if self.broken:
                raise RuntimeError("the inventory vanished")
            return super().hosts

    source = Breaking(HostSnapshot("node1", 1000.0, (GpuState(index=0),)))
    app = GpuConsoleApp(source, auto_poll=False, background_start=False)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        source.snapshot = HostSnapshot("node1", 1001.0, (GpuState(index=0),))
        await asyncio.wait([app.poll_now()])
        assert app.store.latest("node1").time == 1001.0
        source.broken = True
        await asyncio.wait([app.poll_now()])
        shown = await notices(pilot)
    assert [(n.text, n.severity) for n in shown] == [
        ("reading failed: the inventory vanished", "error")
    ]


async def test_help_leads_with_the_keys_of_the_screen_it_was_asked_on(make_app) -> None:
    """? on the host screen: the host's keys first, then everywhere's; and the colours' legend."""
    from rich.table import Table
    from textual.widgets import Static

    from gpuconsole.ui.screens.host import HostScreen

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("enter")
        assert isinstance(app.screen, HostScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.query_one("#help-keys", Static).content
        assert isinstance(table, Table)
        keys = [str(cell) for cell in table.columns[0]._cells]
        meanings = [str(cell) for cell in table.columns[1]._cells]
        assert keys[0] == HostScreen.HELP_TITLE
        assert keys.index("Everywhere") > min(
            i for i, m in enumerate(meanings) if m.startswith("Terminate")
        )
        legend = str(app.screen.query_one("#help-legend", Static).content)
        assert "warm" in legend and "slowdown temperature" in legend


async def test_the_palettes_screenshot_is_saved_in_its_folder_or_says_why_not(
    make_app, tmp_path, monkeypatch
) -> None:
    from notices import notice_texts

    folder = tmp_path / "shots"
    monkeypatch.setenv(paths.SCREENSHOTS.variable, str(folder))
    app = make_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.deliver_screenshot()
        (saved,) = folder.iterdir()
        assert saved.suffix == ".svg" and "demo rack" in saved.read_text().replace("&#160;", " ")
        said = "".join(await notice_texts(pilot)).replace("\n", "")
        assert said.startswith("screenshot saved:") and said.endswith(str(saved))
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        monkeypatch.setenv(paths.SCREENSHOTS.variable, str(blocker / "shots"))
        app.deliver_screenshot()
        said = " ".join(await notice_texts(pilot)).replace("\n", " ")
        assert "screenshot not saved to" in said and said.endswith("Not a directory")
        assert "a-file" in said
