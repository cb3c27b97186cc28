"""A list's filter line (`/`): hidden until opened, docked under the list, its words matched as
whole words (`gpuconsole.fleet.host_order.words_match`); Esc clears it."""

from __future__ import annotations

from textual.widgets import Input


class FilterBox(Input):
    """The filter line of one list; its owner filters on `terms` when it changes."""

    DEFAULT_CSS = """
    FilterBox { display: none; dock: bottom; margin-bottom: 1; }
    FilterBox.shown { display: block; }
    """

    @property
    def terms(self) -> list[str]:
        """The filter's words, lower case; none: every row."""
        return self.value.lower().split()

    @property
    def active(self) -> bool:
        return self.has_class("shown")

    def open(self) -> None:
        self.add_class("shown")
        self.focus()

    def close(self) -> None:
        """Clear and hide it (its owner's Changed handler shows every row again)."""
        self.value = ""
        self.remove_class("shown")
