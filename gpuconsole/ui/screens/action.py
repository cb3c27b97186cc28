"""What every screen that acts on hosts shares: the action on a worker thread with an event loop
of its own (the host's commands never stall the UI), a stop that cancels it there, the way back
to the UI thread, questions asked on the UI thread, and the log its output lines go to."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from textual.widgets import RichLog

from gpuconsole.ui.screens.base import ConsoleScreen
from gpuconsole.ui.screens.confirm import ConfirmScreen

_T = TypeVar("_T")


class ActionScreen(ConsoleScreen):
    """A console screen that runs one action at a time (`act`). A screen with a stop key binds
    it to `action_stop`; one that shows output lines names its RichLog in ``OUTPUT``."""

    OUTPUT = ""
    """The id of the RichLog that `output` writes to."""

    def __init__(self) -> None:
        super().__init__()
        self._action_loop: asyncio.AbstractEventLoop | None = None
        self._action_task: asyncio.Task[Any] | None = None
        self._action_questions: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = set()

    @property
    def acting(self) -> bool:
        """An action was started and has not ended."""
        return self._action_task is not None and not self._action_task.done()

    def act(
        self, action: Callable[[], Awaitable[_T]], done: Callable[[_T], object], group: str
    ) -> None:
        """Run ``action`` on a worker thread, in an event loop of its own, as the one action
        of ``group`` (a new one replaces it); ``done`` gets what it returns, on the UI thread,
        once it has ended. It reports on its way through `from_thread`; when stopped, it sees
        `asyncio.CancelledError` where it awaits."""

        async def run() -> None:
            self._action_loop = asyncio.get_running_loop()
            self._action_task = asyncio.current_task()
            result = await action()
            self.from_thread(self._action_ended, done, result)

        self.run_worker(run, thread=True, exclusive=True, exit_on_error=False, group=group)

    def _action_ended(self, done: Callable[[_T], object], result: _T) -> None:
        self._action_task = None
        done(result)

    def action_stop(self) -> None:
        """Stop the action: its commands on the host are killed."""
        loop, task = self._action_loop, self._action_task
        if loop is None or task is None or task.done():
            return
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # it ended, and its loop closed, just now
            return
        self.stopping()

    def stopping(self) -> None:
        """Say that a stop is under way (on the UI thread)."""

    def from_thread(self, callback: Callable[..., object], *args: object) -> bool:
        """From the worker: run ``callback`` on the UI thread and wait for it; dropped (False)
        once this screen is closed or the app is closing."""

        def call() -> bool:
            if not self.is_attached:
                return False
            callback(*args)
            return True

        with contextlib.suppress(RuntimeError):  # the app is not running, or this screen left it
            return bool(self.app.call_from_thread(call))
        return False

    async def confirm(self, question: str, detail: str) -> bool:
        """From the action's loop: ask on the UI thread and wait for the answer; No when the
        screen closes first."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()
        question_key = (loop, answer)

        def answered(yes: bool | None) -> None:
            self._action_questions.discard(question_key)
            _answer(loop, answer, bool(yes))

        def ask() -> None:
            self._action_questions.add(question_key)
            self.app.push_screen(ConfirmScreen(question, detail), answered)

        if not self.from_thread(ask):
            return False
        return await answer

    def on_unmount(self) -> None:
        for loop, answer in tuple(self._action_questions):
            _answer(loop, answer, False)
        self._action_questions.clear()

    def output(self, line: str) -> None:
        """One line into the screen's log (on the UI thread)."""
        self.query_one(f"#{self.OUTPUT}", RichLog).write(line)

    def output_from_thread(self, line: str) -> None:
        """From the worker: one line into the screen's log (an action's line sink)."""
        self.from_thread(self.output, line)


def _answer(loop: asyncio.AbstractEventLoop, answer: asyncio.Future[bool], yes: bool) -> None:
    def settle() -> None:
        if not answer.done():
            answer.set_result(yes)

    with contextlib.suppress(RuntimeError):  # the action's loop has closed
        loop.call_soon_threadsafe(settle)
