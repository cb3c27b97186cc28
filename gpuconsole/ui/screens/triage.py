"""The triage view (`T`): one row per problem of the fleet (a finding with the alerts raised on
it, or a firing alert on no finding; see `gpuconsole.fleet.triage_list`), worst first, then newest;
below the list, the highlighted row in full with what to do next. Enter opens its GPU (or its
host, for a problem of the whole host). Info rows (advice: memory past the reserve, a GPU at its
power limit) are folded away until `i` shows them: the on-call sees what needs a person first.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.widgets import DataTable, Static

from gpuconsole.core.model import Severity
from gpuconsole.fleet.alerts.engine import FIRING
from gpuconsole.fleet.host_order import SEVERITY_WORDS
from gpuconsole.fleet.record.episodes import ALERT
from gpuconsole.fleet.record.when import clock
from gpuconsole.fleet.triage_list import TriageItem
from gpuconsole.ui.messages import ShowGpu
from gpuconsole.ui.screens.base import Copyable
from gpuconsole.ui.screens.folded_list import FoldedListScreen
from gpuconsole.ui.widgets import cells
from gpuconsole.ui.widgets.filter_box import FilterBox
from gpuconsole.ui.widgets.keyed_table import Cells, ColumnSpec, KeyedTable, fit_columns

_WIDE = 120
"""From this width the Alert column says since when, as well as pending or firing."""


def triage_columns(width: int) -> tuple[ColumnSpec, ...]:
    """By priority: the problem keeps at least 24 cells; where that leaves too little for what
    to do next, the line under the list says it in full (and the alert column says only
    pending or firing below `_WIDE`)."""
    alert = ColumnSpec("alert", "Alert", 16 if width >= _WIDE else 7)
    return fit_columns(
        (
            ColumnSpec("severity", "Sev", 4),
            ColumnSpec("since", "Since", 8),
            ColumnSpec("where", "Where", 14, grow=1, most=16),
            alert,
            ColumnSpec("what", "Problem", 24, grow=4),
            ColumnSpec("next", "What to do next", 20, drop=1, grow=6),
        ),
        width,
    )


def _words_of(item: TriageItem) -> list[str]:
    """What the filter matches a row against: where it is, its code, its severity's words, what
    it says, whose work it affects, the alerts on it."""
    return [
        item.where,
        item.code,
        SEVERITY_WORDS[item.severity],
        item.what,
        *item.affects,
        *(alert.rule for alert in item.alerts),
    ]


class TriageScreen(FoldedListScreen):
    """The fleet's problems (`Console.problems`) as one list."""

    HELP_TITLE = "Triage"
    HELP_ORDER = 50

    FOCUS_KEYS = {"triage": ("triage.open",)}
    BINDINGS = [
        Binding("escape", "back", "Back", id="triage.back"),
        Binding("enter", "open", "Open", id="triage.open", tooltip="its GPU, or its host"),
        Binding("i", "toggle_info", "Info", id="triage.info", tooltip="show or fold the info rows"),
        Binding(
            "slash",
            "filter",
            "Filter",
            id="triage.filter",
            tooltip="by host, code, crit/warn/info, job or words of the problem; Esc clears",
        ),
    ]
    CSS = """
    TriageScreen #triage-status { height: 1; padding: 0 1; }
    TriageScreen #triage { height: 1fr; max-height: 100%; }
    TriageScreen #triage-detail {
        height: auto;
        max-height: 8;
        padding: 0 1;
        border-top: solid $panel;
    }
    """

    def __init__(self) -> None:
        super().__init__()
        self.items: list[TriageItem] = []
        """Every problem, info rows included."""

    def where(self) -> str:
        return "triage"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="triage-status", markup=False)
        yield KeyedTable(id="triage")
        yield FilterBox(
            placeholder="filter (whole words): host, code, crit/warn/info, job, problem",
            id="triage-filter",
        )
        yield Static(id="triage-detail", markup=False)
        yield self.key_bar()

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#triage", KeyedTable).focus()

    def on_resize(self, _event: Resize) -> None:
        self.refresh_view(None)

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        self.items = list(self.problems)
        width = self.size.width or _WIDE
        self._alert_times = width >= _WIDE
        columns = triage_columns(width)
        self._widths = {spec.key: spec.width or 0 for spec in columns}
        self.table.set_columns(columns)
        self.table.sync([(item.key, self._cells(item)) for item in self.shown])
        self._show_status()
        self._show_detail()

    @property
    def shown(self) -> list[TriageItem]:
        """The rows listed (`FoldedListScreen.kept`)."""
        return self.kept(self.items, lambda item: item.severity, _words_of)

    def _cells(self, item: TriageItem) -> Cells:
        """The problem's cells for the columns shown; its texts cut where a word ends."""
        widths = self._widths
        what = Text(item.what)
        if item.kind == ALERT:
            what = Text.assemble(("alert ", "italic"), item.what)
        shown = {
            "severity": cells.severity_badge(item.severity, self.palette),
            "since": Text("N/A", style="dim") if item.since is None else Text(clock(item.since)),
            "where": Text(cells.fit(item.where, widths["where"]), style="bold"),
            "alert": self._alert_cell(item),
            "what": cells.fit_text(what, widths["what"]),
            "next": cells.fit_text(Text(item.next_step, style="dim"), widths.get("next", 0)),
        }
        return tuple(shown[key] for key in widths)

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
        folded = 0 if self.info_shown else sum(i.severity is Severity.INFO for i in self.items)
        if folded:
            line.append(f" · {folded} info folded (i shows them)", style="bold")
        terms = self.filter_terms
        if terms:
            line.append(f" · filter {' '.join(terms)!r}: {len(self.shown)} shown", style="bold")
        line.append(" · worst first, then newest · Enter opens its GPU or host", style="dim")
        width = (self.size.width or _WIDE) - 2
        self.query_one("#triage-status", Static).update(cells.fit_text(line, width))

    def copyables(self) -> list[Copyable]:
        """The problem as a line for a ticket, what to do next, and its host."""
        item = self.selected()
        if item is None:
            return []
        badge = cells.SEVERITY_BADGES[item.severity]
        return [
            Copyable("problem", f"{badge} {item.where} {item.code}: {item.what}"),
            Copyable("what to do next", item.next_step),
            Copyable("host name", item.host),
        ]

    def selected(self) -> TriageItem | None:
        key = self.table.cursor_key
        return next((i for i in self.shown if i.key == key), None)

    def _show_detail(self) -> None:
        item = self.selected()
        widget = self.query_one("#triage-detail", Static)
        if item is None:
            nothing = "Nothing to triage: no findings, no firing alerts."
            if self.items:
                nothing = "Nothing needs a person: every problem is info (i shows them)."
            widget.update(Text(nothing, style="dim"))
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
        from gpuconsole.ui.screens.host import HostScreen

        item = self.selected()
        if item is None or item.host not in self.store.hosts:
            return
        if item.gpu is not None:
            self.post_message(ShowGpu(item.host, item.gpu))
        else:
            self.app.push_screen(HostScreen(item.host))
