"""The replay's damage line: above the cursor bar, there only when the recording is damaged."""

from __future__ import annotations

from textual.widgets import Static


class DamageBar(Static):
    """One line above the cursor bar, there only when the recording is damaged."""

    DEFAULT_CSS = """
    DamageBar {
        dock: bottom;
        height: 1;
        padding: 0 1;
        margin-bottom: 2;
        background: $error 30%;
        display: none;
    }
    """

    def __init__(self) -> None:
        super().__init__(markup=False)

    def show(self, line: str) -> None:
        self.update(line)
        self.display = bool(line)
