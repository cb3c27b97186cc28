"""The shared test helpers check what they say: `notices` reads what the toasts show and refuses
an app that shows none; `gpuconsole` runs the command line as a user does."""

from __future__ import annotations

import pytest
from cli_runner import gpuconsole
from notices import Notice, notice_texts, notices
from textual.app import App


async def test_notices_are_what_the_toasts_show() -> None:
    app: App[None] = App()
    async with app.run_test(notifications=True) as pilot:
        assert await notices(pilot) == []
        app.notify("plain [b]text[/b]", markup=False)
        app.notify("late", title="recording damaged", severity="error")
        assert await notices(pilot) == [
            Notice("plain [b]text[/b]", "information"),
            Notice("recording damaged\nlate", "error"),
        ]
        app.clear_notifications()
        assert await notice_texts(pilot) == []


async def test_notices_refuse_an_app_run_without_toasts() -> None:
    """Else a test that a notice is absent would pass whatever the app said."""
    app: App[None] = App()
    async with app.run_test() as pilot:
        app.notify("said")
        with pytest.raises(AssertionError, match="notifications=True"):
            await notices(pilot)


def test_gpuconsole_returns_a_refusal_and_reads_its_input() -> None:
    refused = gpuconsole("--refresh", "0")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.rstrip().splitlines()[-1].startswith("gpuconsole: ")
    piped = gpuconsole("oom", "-", input="not an out-of-memory message\n")
    assert (piped.returncode, piped.stderr) == (
        3,
        "gpuconsole: stdin: no 'CUDA out of memory. Tried to allocate …' message found\n",
    )
