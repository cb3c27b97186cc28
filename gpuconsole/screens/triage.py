"""The triage view (`T`): one row per problem of the fleet (a finding with the alerts raised on
it, or a firing alert on no finding; see `gpuconsole.triage_view`), worst first, then newest;
below the list, the highlighted row in full with what to do next. Enter opens its host and GPU.
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

from gpuconsole.alerts.engine import FIRING
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
_WIDE = 120
"""From this width the Alert column says since when, as well as pending or firing."""


class TriageScreen(ConsoleScreen):
    """The fleet's problems as one list; ``since`` says how new each one is: when the finding
    or alert of an identity began (the session's onsets), None when not known."""

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
        width = self.size.width or _WIDE
        self._alert_times = width >= _WIDE
        alert = ColumnSpec("alert", "Alert", 16 if self._alert_times else 7)
        fixed = (*_FIXED, alert)
        rest = max(2 * _MIN_TEXT, width - sum((c.width or 0) + 2 for c in fixed) - 6)
        what = max(_MIN_TEXT, rest * 2 // 5)
        self._widths = (what, rest - what)
        self.table.set_columns(
            (
                *fixed,
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
            self._alert_cell(item),
            what,
            step,
        )

    def _alert_cell(self, item: TriageItem) -> Text:
        shown = item.alert_state
        if shown is None:
            return Text("")
        style = "bold" if shown.state == FIRING else "dim"
        text = f"{shown.state} {clock(shown.since)}" if self._alert_times else shown.state
        return Text(text, style=style)

    def _show_status(self) -> None:
        rows = len(self.items)
        firing = sum(1 for i in self.items for a in i.alerts if a.state == FIRING)
        line = Text(f"{rows} problem{'s' if rows != 1 else ''}")
        line.append(f", {firing} firing alert{'s' if firing != 1 else ''} on them")
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
        lines = [head, Text(item.what)]
        if item.kind != ALERT and item.alerts:
            alerts = ", ".join(
                f"{a.rule} {a.state} since {clock(a.since)} UTC" for a in item.alerts
            )
            lines.append(Text.assemble(("alerts: ", "bold"), alerts))
        if item.affects:
            lines.append(Text.assemble(("affects: ", "bold"), ", ".join(item.affects)))
        lines.append(Text.assemble(("next: ", "bold"), item.next_step))
        widget.update(Text("\n").join(lines))

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
