"""The triage view (`T`): every finding and firing alert of the fleet, worst first, then newest;
below the list, the highlighted line in full with what to do next. Enter opens its host and GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.widgets import DataTable, Footer, Static

from gpuconsole.record.episodes import ALERT
from gpuconsole.record.when import clock
from gpuconsole.screens.base import ConsoleScreen
from gpuconsole.triage_view import Since, TriageItem, triage_items
from gpuconsole.widgets import cells
from gpuconsole.widgets.keyed_table import Cells, ColumnSpec, KeyedTable

_FIXED = (
    ColumnSpec("severity", "Sev", 4),
    ColumnSpec("since", "Since", 8),
    ColumnSpec("where", "Where", 16),
)
_MIN_TEXT = 16


class TriageScreen(ConsoleScreen):
    """The fleet's problems as one list; ``since`` says how new each one is: when the finding
    or alert of an identity began, None when not known."""

    HELP_TITLE = "Triage"
    HELP_ORDER = 50

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="triage.back"),
        Binding("enter", "open", "Open host", id="triage.open", tooltip="its host, at its GPU"),
    ]
    # Screen CSS, not DEFAULT_CSS: it must win over app.tcss's rule for every KeyedTable.
    CSS = """
    #triage-status { height: 1; padding: 0 1; }
    #triage { height: 1fr; max-height: 100%; }
    #triage-detail {
        height: auto;
        max-height: 8;
        padding: 0 1;
        border-top: solid $panel;
    }
    """

    def __init__(
        self, since: Since, alerts: Callable[[], Sequence[Any]], rules: Sequence[Any] = ()
    ) -> None:
        super().__init__()
        self._since = since
        self._alerts = alerts
        self._rules = tuple(rules)
        self.items: list[TriageItem] = []

    def where(self) -> str:
        return "triage"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="triage-status", markup=False)
        yield KeyedTable(id="triage")
        yield Static(id="triage-detail", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#triage", KeyedTable).focus()

    def on_resize(self, _event: Resize) -> None:
        self.refresh_view(None)

    @property
    def table(self) -> KeyedTable:
        return self.query_one("#triage", KeyedTable)

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        self.items = triage_items(self.store, self._alerts(), self._since, self._rules)
        width = self.size.width or 120
        rest = max(2 * _MIN_TEXT, width - sum((c.width or 0) + 2 for c in _FIXED) - 6)
        what = max(_MIN_TEXT, rest * 2 // 5)
        self._widths = (what, rest - what)
        self.table.set_columns(
            (
                *_FIXED,
                ColumnSpec("what", "Problem", what),
                ColumnSpec("next", "What to do next", rest - what),
            )
        )
        self.table.sync([(item.key, self._cells(item)) for item in self.items])
        self._show_status()
        self._show_detail()

    def _cells(self, item: TriageItem) -> Cells:
        what = Text(item.what, no_wrap=True, overflow="ellipsis")
        if item.kind == ALERT:
            what = Text.assemble(("alert ", "italic"), item.what)
        what.truncate(self._widths[0], overflow="ellipsis")
        step = Text(item.next_step, style="dim")
        step.truncate(self._widths[1], overflow="ellipsis")
        return (
            cells.severity_badge(item.severity, self.palette),
            Text("N/A", style="dim") if item.since is None else Text(clock(item.since)),
            Text(item.where, style="bold"),
            what,
            step,
        )

    def _show_status(self) -> None:
        findings = sum(1 for i in self.items if i.kind != ALERT)
        alerts = len(self.items) - findings
        line = Text(f"{findings} finding{'s' if findings != 1 else ''}")
        line.append(f", {alerts} firing alert{'s' if alerts != 1 else ''}")
        line.append(" · worst first, then newest · Enter opens the host", style="dim")
        self.query_one("#triage-status", Static).update(line)

    def selected(self) -> TriageItem | None:
        key = self.table.cursor_key
        return next((i for i in self.items if i.key == key), None)

    def _show_detail(self) -> None:
        item = self.selected()
        widget = self.query_one("#triage-detail", Static)
        if item is None:
            widget.update(Text("Nothing to triage: no findings, no firing alerts.", style="dim"))
            return
        head = Text.assemble(
            cells.severity_badge(item.severity, self.palette),
            " ",
            (item.where, "bold"),
            f" · {'alert ' if item.kind == ALERT else ''}{item.code}",
        )
        if item.since is not None:
            head.append(f" · since {clock(item.since)} UTC", style="dim")
        widget.update(
            Text("\n").join(
                [head, Text(item.what), Text.assemble(("next: ", "bold"), item.next_step)]
            )
        )

    @on(DataTable.RowHighlighted, "#triage")
    def _highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    @on(DataTable.RowSelected, "#triage")
    def _selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        from gpuconsole.screens.host import HostScreen

        item = self.selected()
        if item is not None and item.host in self.store.hosts:
            self.app.push_screen(HostScreen(item.host, item.gpu))
