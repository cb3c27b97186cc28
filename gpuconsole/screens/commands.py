"""The command palette's provider: screens and hosts, knowing which screen is open."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from gpuconsole.app import GpuConsoleApp


class ConsoleCommands(Provider):
    """'Fleet', 'Host NAME' and 'Topology of NAME' for every host."""

    def _commands(self) -> list[tuple[str, Callable[[], object], str]]:
        from gpuconsole.screens.host import HostScreen
        from gpuconsole.screens.topology import TopologyScreen

        app: GpuConsoleApp = self.app  # type: ignore[assignment]
        commands: list[tuple[str, Callable[[], object], str]] = [
            ("Fleet", self._to_fleet, "every host, worst first"),
        ]
        for host in app.fleet.store.hosts:
            commands.append((f"Host {host}", partial(self._open, HostScreen, host), "its GPUs"))
            commands.append(
                (f"Topology of {host}", partial(self._open, TopologyScreen, host), "GPU links")
            )
        return commands

    def _to_fleet(self) -> None:
        from gpuconsole.screens.fleet import FleetScreen

        while len(self.app.screen_stack) > 2 and not isinstance(self.app.screen, FleetScreen):
            self.app.pop_screen()

    def _open(self, screen_type: type, host: str) -> None:
        self._to_fleet()
        self.app.push_screen(screen_type(host))

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
