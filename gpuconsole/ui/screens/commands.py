"""The command palette's provider (Ctrl+P): every screen, the keys of the screen it was opened on
and the console's own, and each host's screens."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider

from gpuconsole.ui.screens.console import console_of
from gpuconsole.ui.screens.help import key_label

if TYPE_CHECKING:
    from textual.dom import DOMNode

Command = tuple[str, Callable[[], object], str]
"""A palette entry: its name, what choosing it does, and its help line."""


class ConsoleCommands(Provider):
    """'Fleet', the console's screens and keys ('Alerts', 'Triage', 'Copy'...), the keys of the
    screen it was opened on ('Topology', 'Verify'...), and 'Host NAME' and 'Topology of NAME'
    for every host."""

    def _commands(self) -> list[Command]:
        from gpuconsole.ui.screens.host import HostScreen
        from gpuconsole.ui.screens.topology import TopologyScreen

        commands: list[Command] = [("Fleet", self._to_fleet, "every host, worst first")]
        commands += _key_commands(self.screen, _own_bindings(type(self.screen)))
        commands += _key_commands(self.app, _own_bindings(type(self.app)))
        for host in console_of(self.app).store.hosts:
            commands.append((f"Host {host}", partial(self._open, HostScreen, host), "its GPUs"))
            commands.append(
                (f"Topology of {host}", partial(self._open, TopologyScreen, host), "GPU links")
            )
        return _unique(commands)

    def _to_fleet(self) -> None:
        from gpuconsole.ui.screens.fleet import back_to_fleet

        back_to_fleet(self.app)

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


def _own_bindings(node_type: type) -> list[Binding]:
    """The bindings a class and its console ancestors declare, the class's own first (as the
    help screen lists them); Textual's own classes are left out."""
    found: list[Binding] = []
    for cls in node_type.__mro__:
        if cls.__module__.startswith("gpuconsole."):
            found += [b for b in vars(cls).get("BINDINGS", []) if isinstance(b, Binding)]
    return found


def _key_commands(node: DOMNode, bindings: Iterable[Binding]) -> list[Command]:
    """A palette entry for each binding: its description, and its key and tooltip as help."""
    commands: list[Command] = []
    for binding in bindings:
        if binding.action == "command_palette":
            continue
        help_text = f"key {key_label(binding.key)}" + (
            f": {binding.tooltip}" if binding.tooltip else ""
        )
        run = partial(node.run_action, binding.action)
        commands.append((binding.description, run, help_text))
    return commands


def _unique(commands: list[Command]) -> list[Command]:
    """The first entry of each name (a screen's key before the console's of the same name)."""
    seen: set[str] = set()
    kept = []
    for command in commands:
        if command[0] not in seen:
            seen.add(command[0])
            kept.append(command)
    return kept
