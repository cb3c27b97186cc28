"""The help screen (`?`): every key of every screen, read from the bindings themselves."""

from __future__ import annotations

import importlib
import pkgutil

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from gpuconsole.ui.screens.console import console_of
from gpuconsole.ui.widgets import cells

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


def bindings_table(app_type: type[App[object]], first: type | None = None) -> Table:
    """The keys of the app and of every console screen, under each one's `HELP_TITLE`; those of
    ``first`` (the screen help was asked on) before any."""
    table = Table(box=None, padding=(0, 2), show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for title, bindings in _sections(app_type, first):
        table.add_row(Text(title, style="underline"), "")
        for binding in bindings:
            if isinstance(binding, Binding):
                meaning = binding.description
                if binding.tooltip:
                    meaning = f"{meaning}: {binding.tooltip}"
                table.add_row(key_label(binding.key), meaning)
    table.add_row(Text("Also", style="underline"), "")
    table.add_row("Ctrl+P", "command palette: every screen, each host, this screen's keys, themes")
    table.add_row("↑ ↓ PgUp PgDn", "move the cursor; Home and End: to the first and last row")
    return table


def _sections(app_type: type[App[object]], first: type | None) -> list[tuple[str, list[object]]]:
    """Each class that names a `HELP_TITLE`, with its own bindings, in `HELP_ORDER`: the app's
    classes (the console, and replay when it runs) and the screens of this package's modules,
    found by walking it (a new screen is listed without anyone listing it here)."""
    owners: list[type] = [c for c in app_type.__mro__ if vars(c).get("HELP_TITLE")]
    owners += [c for c in screen_classes() if vars(c).get("HELP_TITLE")]
    owners.sort(key=lambda c: (c is not first, c.HELP_ORDER))  # type: ignore[attr-defined]
    return [(c.HELP_TITLE, list(vars(c).get("BINDINGS", []))) for c in owners]  # type: ignore[attr-defined]


def screen_classes() -> list[type[Screen[object]]]:
    """Every screen class defined in a module of `gpuconsole.ui.screens`."""
    import gpuconsole.ui.screens

    found: list[type[Screen[object]]] = []
    for info in pkgutil.iter_modules(gpuconsole.ui.screens.__path__):
        module = importlib.import_module(f"{gpuconsole.ui.screens.__name__}.{info.name}")
        found += [
            c
            for c in vars(module).values()
            if isinstance(c, type) and issubclass(c, Screen) and c.__module__ == module.__name__
        ]
    return found


class HelpScreen(ModalScreen[None]):
    """Lists every key; Esc or ? closes it. A modal screen stops the app's keys: q is bound here
    again, so that it quits here as everywhere."""

    CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen #help-body {
        width: 72;
        max-width: 100%;
        height: auto;
        max-height: 90%;
        padding: 1 2;
        border: round $primary;
        background: $surface;
    }
    """
    BINDINGS = [
        Binding("escape,question_mark", "app.pop_screen", "Close", id="help.close"),
        Binding("q", "app.quit", "Quit", id="help.quit"),
    ]

    def __init__(self, asked_on: type | None = None) -> None:
        """``asked_on``: the class of the screen help was asked on; its keys come first."""
        super().__init__()
        self._asked_on = asked_on

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(Text("gpuconsole keys", style="bold"), id="help-title")
            yield Static(bindings_table(type(self.app), self._asked_on), id="help-keys")
            yield Static(cells.band_legend(console_of(self.app).palette), id="help-legend")
