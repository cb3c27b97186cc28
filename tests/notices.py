"""The console's notices as its user sees them: the toasts on the current screen, read through
Textual's public face (a type selector, a widget's `render`, the toast's severity class), not the
app's private ``_notifications``.

Textual's test runs leave toasts out unless asked: run the app with
``app.run_test(..., notifications=True)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.pilot import Pilot

SEVERITIES = ("information", "warning", "error")
"""Textual's severities; a toast carries its own as a class (``-warning``)."""


@dataclass(frozen=True)
class Notice:
    """One toast on the screen."""

    text: str
    """What it shows: its title on a line of its own when it has one, then the message."""
    severity: str
    """information, warning or error."""


async def notices(pilot: Pilot[Any]) -> list[Notice]:
    """The notices the app's screen shows once those raised so far are on it, oldest first.

    A notice is a message to the app, and its toast is mounted after the app has handled it:
    the pilot waits for that first. An app run without ``notifications=True`` has no toasts to
    show, and is refused (an empty list would pass a test that a notice is absent)."""
    await pilot.pause()
    await pilot.pause()
    screen = pilot.app.screen
    if not screen.query("ToastRack"):
        raise AssertionError("no toasts here: run the app with run_test(notifications=True)")
    shown = []
    for toast in screen.query("Toast"):
        (severity,) = [name for name in SEVERITIES if toast.has_class(f"-{name}")]
        shown.append(Notice(str(toast.render()), severity))
    return shown


async def notice_texts(pilot: Pilot[Any]) -> list[str]:
    """The texts of the notices on the screen (`notices`)."""
    return [notice.text for notice in await notices(pilot)]
