"""What the triage view and the alerts screen share: a list whose info rows are folded away
until `i` shows them, and whose `/` filter keeps the rows its words match (Esc clears the filter
before it leaves)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from textual import on
from textual.widgets import Input

from gpuconsole.core.model import Severity
from gpuconsole.fleet.host_order import words_match
from gpuconsole.ui.screens.base import ConsoleScreen
from gpuconsole.ui.widgets.filter_box import FilterBox
from gpuconsole.ui.widgets.keyed_table import KeyedTable

Row = TypeVar("Row")


class FoldedListScreen(ConsoleScreen):
    """A screen of one `KeyedTable` and one `FilterBox`; its bindings name the actions here
    (``toggle_info``, ``filter``, ``back``)."""

    info_shown = False
    """Whether the info rows are listed (`i`)."""

    @property
    def table(self) -> KeyedTable:
        return self.query_one(KeyedTable)

    @property
    def filter_terms(self) -> list[str]:
        """The filter's words; none before the screen is mounted."""
        return self.query_one(FilterBox).terms if self.is_mounted else []

    def kept(
        self,
        rows: Iterable[Row],
        severity: Callable[[Row], Severity],
        words: Callable[[Row], list[str]],
    ) -> list[Row]:
        """The rows listed: an info one only once `i` has shown them, and each the filter's
        words match (``words``: what a row is matched against)."""
        terms = self.filter_terms
        return [
            row
            for row in rows
            if (self.info_shown or severity(row) > Severity.INFO)
            and (not terms or words_match(terms, words(row)))
        ]

    def action_toggle_info(self) -> None:
        self.info_shown = not self.info_shown
        self.refresh_view(None)

    def action_filter(self) -> None:
        self.query_one(FilterBox).open()

    def action_back(self) -> None:
        """Esc clears the filter first, then leaves."""
        box = self.query_one(FilterBox)
        if box.active:
            box.close()
            self.table.focus()
            return
        self.app.pop_screen()

    @on(Input.Changed, "FilterBox")
    def _filter_changed(self, _event: Input.Changed) -> None:
        self.refresh_view(None)

    @on(Input.Submitted, "FilterBox")
    def _filter_done(self, _event: Input.Submitted) -> None:
        self.table.focus()
