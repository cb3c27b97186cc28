"""What every console screen shares: the store, the palette, the title line, refresh hooks."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.screen import Screen
from textual.theme import Theme

from gpuconsole.messages import FleetUpdated
from gpuconsole.store import FleetStore
from gpuconsole.widgets.cells import Palette
from gpuconsole.widgets.steady import Steady
from gpuconsole.widgets.title_bar import fleet_line

if TYPE_CHECKING:
    from gpuconsole.app import GpuConsoleApp


class ConsoleScreen(Screen[None]):
    """A screen that renders from the fleet store when told that hosts changed."""

    WHERE = ""
    HELP_TITLE: ClassVar[str | None] = None
    """The heading of the screen's keys on the help screen (`?`); None: not listed there."""
    HELP_ORDER: ClassVar[int] = 100
    """Where the heading comes on the help screen: lower first."""

    def where(self) -> str:
        """Where the user is, for the title line."""
        return self.WHERE

    @property
    def console(self) -> GpuConsoleApp:
        return self.app  # type: ignore[return-value]

    @property
    def store(self) -> FleetStore:
        return self.console.fleet.store

    @property
    def palette(self) -> Palette:
        return self.console.palette

    def title_bar(self) -> Steady:
        return Steady(id="title-bar")

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self.refresh_view(None)

    def on_screen_resume(self) -> None:
        self.refresh_view(None)

    def _on_theme_changed(self, _theme: Theme) -> None:
        self.refresh_view(None)

    def on_fleet_updated(self, message: FleetUpdated) -> None:
        self.refresh_view(message.changed)

    def refresh_view(self, changed: set[str] | None) -> None:
        """Show the store's state; ``changed`` names the hosts that changed (None: all)."""
        notes = [self.where()]
        if self.console.starting:
            notes.append("reading the hosts' recent past…")
        if self.console.paused:
            notes.append("paused: p resumes")
        where = " · ".join(note for note in notes if note)
        self.query_one("#title-bar", Steady).show(
            fleet_line(self.store, self.console.label, self.palette, where)
        )
