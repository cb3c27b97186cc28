"""What keeps the console cheap and quick: a first frame that waits for nothing, pausing, and
repainting only what changed."""

from __future__ import annotations

import threading

from rich.text import Text

from gpuconsole.core.model import HostSnapshot
from gpuconsole.fleet.alerts.defaults import DEFAULT_RULES
from gpuconsole.fleet.alerts.engine import AlertEngine
from gpuconsole.fleet.poller import collect
from gpuconsole.telemetry.sim import SimSource
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.fleet import FleetScreen
from gpuconsole.ui.screens.help import HelpScreen
from gpuconsole.ui.screens.host import HostScreen
from gpuconsole.ui.widgets.keyed_table import KeyedTable
from gpuconsole.ui.widgets.steady import Steady


def tick(app, clock, seconds: float = 1.0) -> None:
    clock.advance(seconds)
    app.apply_readings(collect(app.source))


def util_of(screen, gpu: str) -> str:
    return screen.query_one("#gpus", KeyedTable).get_cell(gpu, "util").plain


async def test_pause_freezes_the_screen_but_not_the_readings(make_app, clock) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, HostScreen)
        host = screen.host
        await pilot.press("p")
        title = str(screen.query_one("#title-bar").render())
        assert "paused since" in title and "p resumes" in title
        shown = [util_of(screen, str(g)) for g in range(8)]
        before = app.fleet.store.latest(host).time
        for _ in range(5):
            tick(app, clock)
        await pilot.pause()
        assert app.fleet.store.latest(host).time == before + 5  # still read and kept
        assert [util_of(screen, str(g)) for g in range(8)] == shown
        await pilot.press("p")
        assert "paused" not in str(screen.query_one("#title-bar").render())
        latest = app.fleet.store.latest(host)
        assert util_of(screen, "0").endswith(f"{latest.gpus[0].utilization_pct:.0f}%")


class _CountingSteady(Steady):
    updates = 0

    def update(self, content="", *, layout: bool = True) -> None:  # type: ignore[no-untyped-def]
        type(self).updates += 1
        super().update(content, layout=layout)


async def test_a_steady_widget_repaints_only_on_change() -> None:
    from textual.app import App

    class One(App[None]):
        def compose(self):  # type: ignore[no-untyped-def]
            yield _CountingSteady(id="s")

    async with One().run_test() as pilot:
        widget = pilot.app.query_one(_CountingSteady)
        widget.show(Text("GPU 0 util 90%", style="green"))
        widget.show(Text("GPU 0 util 90%", style="green"))
        assert _CountingSteady.updates == 1
        widget.show(Text("GPU 0 util 90%", style="red"))  # recoloured: shown again
        widget.show("plain")
        widget.show("plain")
        assert _CountingSteady.updates == 3


class _LayoutSteady(Steady):
    """Records whether each update asked for a new layout of the screen."""

    def __init__(self, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.layouts: list[bool] = []

    def update(self, content="", *, layout: bool = True) -> None:  # type: ignore[no-untyped-def]
        self.layouts.append(layout)
        super().update(content, layout=layout)


async def test_a_steady_widget_asks_for_a_layout_only_when_its_size_can_change() -> None:
    from textual.app import App

    class Two(App[None]):
        CSS = "#fixed { height: 1; } #lines { height: auto; text-wrap: nowrap; }"

        def compose(self):  # type: ignore[no-untyped-def]
            yield _LayoutSteady(id="fixed")
            yield _LayoutSteady(id="lines")

    async with Two().run_test() as pilot:
        fixed = pilot.app.query_one("#fixed", _LayoutSteady)
        for value in ("1%", "2%", "3%"):
            fixed.show(value)
        assert fixed.layouts == [True, False, False]  # the first show sizes it
        lines = pilot.app.query_one("#lines", _LayoutSteady)
        lines.show("a\nb")
        lines.show("c\nd")  # as many lines: no layout
        lines.show("c\nd\ne")  # one more line: the screen lays out again
        assert lines.layouts == [True, False, True]
        await pilot.pause()
        assert lines.size.height == 3


class _SlowPast(SimSource):
    """The demo rack, with its recent past held back until the test lets it through."""

    def __init__(self, rack, clock) -> None:  # type: ignore[no-untyped-def]
        super().__init__(rack, clock)
        self.release = threading.Event()

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        assert self.release.wait(10), "the test never released the past"
        return super().backfill(host, seconds)


async def test_the_first_frame_does_not_wait_for_the_hosts_past(rack, clock) -> None:
    source = _SlowPast(rack, clock)
    app = GpuConsoleApp(source, auto_poll=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        title = str(app.screen.query_one("#title-bar").render())
        assert "6 connecting" in title and "reading the hosts' recent past" in title
        await pilot.press("?")  # the console answers keys meanwhile
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        source.release.set()
        await app.workers.wait_for_complete()
        await pilot.pause()
        title = str(app.screen.query_one("#title-bar").render())
        assert "5 live, 1 drain" in title and "recent past" not in title
        assert len(app.fleet.store.history("a100-01")) == 120
        # The same alerts as a console that read the past before its first frame.
        expected = AlertEngine(DEFAULT_RULES).replay(
            s for host in app.fleet.store.hosts for s in app.fleet.store.history(host)
        )
        assert [a.key for a in app.fleet.alerts.active()] == [a.key for a in expected]
        assert any(a.key == ("gpu-throttling", "a100-01", 2) for a in expected)
