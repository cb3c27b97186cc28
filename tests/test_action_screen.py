"""The base of the screens that act on hosts: the action on a worker's own loop, the stop key,
questions asked on the UI thread, and what reaches a screen after it closed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from pilot_wait import until
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import RichLog

from gpuconsole.ui.screens.action import ActionScreen
from gpuconsole.ui.screens.confirm import ConfirmScreen

Script = Callable[["Probe"], Awaitable[str]]


class Probe(ActionScreen):
    """Runs ``script`` on mount; `s` stops it."""

    BINDINGS = [Binding("s", "stop", "Stop", id="probe.stop")]
    OUTPUT = "probe-log"

    def __init__(self, script: Script) -> None:
        super().__init__()
        self.script = script
        self.done: list[str] = []
        self.stops = 0

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield RichLog(id="probe-log")

    def on_mount(self) -> None:
        super().on_mount()
        self.act(lambda: self.script(self), self.done.append, group="probe")

    def stopping(self) -> None:
        self.stops += 1


def logged(screen: Probe) -> list[str]:
    return [str(line.text) for line in screen.query_one("#probe-log", RichLog).lines]


async def test_the_action_runs_off_the_ui_thread_and_ends_on_it(make_app) -> None:
    threads: list[int] = []

    async def script(screen: Probe) -> str:
        threads.append(threading.get_ident())
        screen.output_from_thread("from the worker")
        return "done"

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = Probe(script)
        app.push_screen(screen)
        await until(pilot, lambda: screen.done == ["done"], timeout=10)
        assert threads != [threading.get_ident()]
        assert logged(screen) == ["from the worker"]
        assert not screen.acting


async def test_the_stop_key_cancels_the_action(make_app) -> None:
    async def forever(_screen: Probe) -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "stopped"
        return "slept"

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = Probe(forever)
        app.push_screen(screen)
        await until(pilot, lambda: screen.acting, timeout=10)
        await pilot.press("s")
        await until(pilot, lambda: screen.done == ["stopped"], timeout=10)
        assert screen.stops == 1
        await pilot.press("s")  # nothing runs: nothing to stop
        assert screen.stops == 1


async def test_a_question_is_answered_on_the_ui_thread(make_app) -> None:
    async def ask(screen: Probe) -> str:
        return f"answer {await screen.confirm('Run it?', '$ true')}"

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = Probe(ask)
        app.push_screen(screen)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=10)
        assert app.screen.question == "Run it?" and app.screen.detail == "$ true"
        await pilot.press("y")
        await until(pilot, lambda: screen.done == ["answer True"], timeout=10)


async def test_after_the_screen_closed_a_question_is_a_no_and_nothing_reaches_it(make_app) -> None:
    closed = threading.Event()
    seen: list[object] = []

    async def outlive(screen: Probe) -> str:
        seen.append(await screen.confirm("Run it?", "$ true"))
        await asyncio.to_thread(closed.wait, 10)
        seen.append(screen.from_thread(screen.output, "too late"))
        seen.append(await screen.confirm("Again?", "$ true"))
        return "ended"

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = Probe(outlive)
        app.push_screen(screen)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=10)
        app.pop_screen()  # the question, unanswered
        app.pop_screen()  # the screen that asked it
        await until(pilot, lambda: seen == [False], timeout=10)
        closed.set()
        await until(pilot, lambda: len(seen) == 3, timeout=10)
        assert seen == [False, False, False]
        assert screen.done == []
