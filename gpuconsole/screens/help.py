"""The help screen (`?`): every key of every screen, read from the bindings themselves."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

_KEY_NAMES = {
    "question_mark": "?",
    "slash": "/",
    "left_square_bracket": "[",
    "right_square_bracket": "]",
    "escape": "Esc",
    "enter": "Enter",
    "space": "Space",
    "comma": ",",
    "full_stop": ".",
    "less_than_sign": "<",
    "greater_than_sign": ">",
}


def key_label(key: str) -> str:
    return ", ".join(_KEY_NAMES.get(k.strip(), k.strip()) for k in key.split(","))


def bindings_table() -> Table:
    from gpuconsole.app import GpuConsoleApp
    from gpuconsole.replay_app import ReplayApp
    from gpuconsole.screens.alerts import AlertsScreen
    from gpuconsole.screens.fleet import FleetScreen
    from gpuconsole.screens.host import HostScreen
    from gpuconsole.screens.topology import TopologyScreen
    from gpuconsole.screens.triage import TriageScreen

    table = Table(box=None, padding=(0, 2), show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    sections = (
        ("Everywhere", GpuConsoleApp.BINDINGS),
        ("Fleet", FleetScreen.BINDINGS),
        ("Host", HostScreen.BINDINGS),
        ("Topology", TopologyScreen.BINDINGS),
        ("Alerts", AlertsScreen.BINDINGS),
        ("Triage", TriageScreen.BINDINGS),
        ("Replay (gpuconsole replay FILE)", ReplayApp.BINDINGS),
    )
    for title, bindings in sections:
        table.add_row(Text(title, style="underline"), "")
        for binding in bindings:
            if isinstance(binding, Binding):
                meaning = binding.description
                if binding.tooltip:
                    meaning = f"{meaning}: {binding.tooltip}"
                table.add_row(key_label(binding.key), meaning)
    table.add_row(Text("Also", style="underline"), "")
    table.add_row("Ctrl+P", "command palette: screens, hosts, themes")
    table.add_row("↑ ↓ PgUp PgDn", "move the cursor")
    return table


class HelpScreen(ModalScreen[None]):
    """Lists every key; any of Esc, q or ? closes it."""

    BINDINGS = [
        Binding("escape,q,question_mark", "app.pop_screen", "Close", id="help.close"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(Text("gpuconsole keys", style="bold"), id="help-title")
            yield Static(bindings_table(), id="help-keys")
