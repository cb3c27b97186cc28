"""What every console screen shares: the app as a `Console` (the store, the palette...), the
title line and the key bar, refresh hooks, and what `y` copies."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from rich.text import Text
from textual.screen import Screen
from textual.theme import Theme

from gpuconsole.core.model import GpuState, HostState
from gpuconsole.fleet.store import FleetStore
from gpuconsole.fleet.triage_list import TriageItem
from gpuconsole.ui.messages import FleetUpdated
from gpuconsole.ui.screens.console import Console, console_of
from gpuconsole.ui.widgets.cells import Palette
from gpuconsole.ui.widgets.key_bar import KeyBar
from gpuconsole.ui.widgets.title_bar import Part, TitleBar, fleet_parts, part, reading_part


class Copyable(NamedTuple):
    """A value the user may copy from a screen (`y`, `Y`), and what it is."""

    what: str
    value: str


class Freshness(NamedTuple):
    """When the newest reading a screen shows was taken, and whether it is stale."""

    time: float | None
    stale: bool


class ConsoleScreen(Screen[None]):
    """A screen that renders from the fleet store when told that hosts changed. It reads the app
    as a `Console` and asks it for more with a `ConsoleRequest` message.

    Its layout is its class's ``CSS`` (see app.tcss), each rule beginning with the class's name.
    """

    WHERE = ""
    SCOPED_CSS = False
    """A console screen's rules scope themselves: each begins with its class's name. Textual's
    scoping would also require the instance's class as an ancestor, which no node of a
    subclass's instance (the tests' canned panels) has."""
    HELP_TITLE: ClassVar[str | None] = None
    """The heading of the screen's keys on the help screen (`?`); None: not listed there."""
    HELP_ORDER: ClassVar[int] = 100
    """Where the heading comes on the help screen: lower first."""
    PINNED_KEYS: ClassVar[frozenset[str]] = frozenset()
    """Binding ids the key bar keeps whatever the width (beside `?`): the on-call's keys."""
    problems: Sequence[TriageItem] = ()
    """The fleet's problems as of the last `refresh_view` (`Console.problems`): read once a
    refresh, by the title line and by what the screen shows of them."""
    FOCUS_KEYS: ClassVar[dict[str, tuple[str, ...]]] = {}
    """For a widget's id, the binding ids the key bar leads with while it has focus (shown
    even where the binding itself is not)."""

    def where(self) -> str:
        """Where the user is, for the title line (it is never left out of it)."""
        return self.WHERE

    def title_notes(self) -> list[Part]:
        """More about where the user is (a sort, a filter), after `where` in the title line."""
        return []

    def reading(self) -> Freshness:
        """The newest reading of the fleet; stale when no host is live."""
        store = self.store
        times = [s.time for host in store.hosts if (s := store.latest(host)) is not None]
        live = any(store.status(host).state is HostState.LIVE for host in store.hosts)
        return Freshness(max(times, default=None), not live)

    def copyables(self) -> list[Copyable]:
        """What `y` copies (the first) and `Y` offers (all), for the row under the cursor."""
        return []

    @property
    def console(self) -> Console:
        return console_of(self.app)

    @property
    def store(self) -> FleetStore:
        return self.console.store

    @property
    def palette(self) -> Palette:
        return self.console.palette

    def title_bar(self) -> TitleBar:
        return TitleBar()

    def key_bar(self) -> KeyBar:
        return KeyBar()

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self.refresh_view(None)

    def on_screen_resume(self) -> None:
        self.refresh_view(None)
        for bar in self.query(KeyBar):  # a panel may have none
            bar.room_for_notice(self.console.notice_showing)

    def _on_theme_changed(self, _theme: Theme) -> None:
        self.refresh_view(None)

    def on_fleet_updated(self, message: FleetUpdated) -> None:
        self.refresh_view(message.changed)

    def refresh_view(self, changed: set[str] | None) -> None:
        """Show the store's state; ``changed`` names the hosts that changed (None: all)."""
        self.problems = self.console.problems()
        self.query_one(TitleBar).show_parts(self._title_parts())

    def _title_parts(self) -> list[Part]:
        console = self.console
        parts = fleet_parts(self.store, console.label, self.palette, self.problems)
        parts.append(part(Text(self.where(), style="dim"), rank=0, right=True))
        parts += self.title_notes()
        if console.starting:
            parts.append(part("reading the hosts' recent past…", "reading…", rank=1, right=True))
        if console.paused_at is not None:
            stamp = time.strftime("%H:%M:%S", time.gmtime(console.paused_at))
            paused = Text(f"paused since {stamp} UTC: p resumes", style="reverse")
            parts.append(part(paused, Text("paused", style="reverse"), rank=0, right=True))
        reading = self.reading()
        shown = reading_part(reading.time, console.now(), reading.stale, self.palette)
        return parts if shown is None else [*parts, shown]


def gpu_copyables(host: str, gpu: GpuState) -> list[Copyable]:
    """What names a GPU to other tools: its UUID (`nvidia-smi -i`, CUDA_VISIBLE_DEVICES) and its
    PCI bus id, where the reading has them."""
    found = []
    if gpu.uuid:
        found.append(Copyable(f"UUID of {host} GPU {gpu.index}", gpu.uuid))
    if gpu.pci_bus_id:
        found.append(Copyable(f"PCI bus id of {host} GPU {gpu.index}", gpu.pci_bus_id))
    return found
