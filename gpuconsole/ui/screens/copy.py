"""`Y`: which value of the row under the cursor to copy (a PID, a command, a UUID, a path...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from gpuconsole.ui.widgets.cells import fit

if TYPE_CHECKING:
    from gpuconsole.ui.screens.base import Copyable


class CopyScreen(ModalScreen[int | None]):
    """Lists the values; dismisses with the index of the one chosen, or None (Esc)."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="copy.cancel"),
        Binding("q", "app.quit", "Quit", id="copy.quit"),
    ]
    CSS = """
    CopyScreen { align: center middle; }
    CopyScreen #copy-body {
        width: 76; max-width: 100%; height: auto; padding: 1 2;
        border: round $primary; background: $surface;
    }
    CopyScreen #copy-choices { height: auto; max-height: 16; margin-top: 1; }
    """

    def __init__(self, values: Sequence[Copyable]) -> None:
        super().__init__()
        self.values = tuple(values)

    def compose(self) -> ComposeResult:
        with Vertical(id="copy-body"):
            yield Static("Copy to the clipboard (Enter; Esc cancels)", markup=False)
            yield OptionList(
                *(
                    Option(Text.assemble((f"{v.what}: ", "bold"), fit(v.value, 64)), id=str(i))
                    for i, v in enumerate(self.values)
                ),
                id="copy-choices",
            )

    @on(OptionList.OptionSelected, "#copy-choices")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id or 0))

    def action_cancel(self) -> None:
        self.dismiss(None)
