"""The alerts view (`a`): firing and pending alerts across the fleet, with since when.

Space acknowledges (or un-acknowledges) the alert under the cursor, `s` silences it for a time,
`u` lifts the silence, Enter opens its GPU (or its host). An acknowledgement lasts until the alert
resolves; a silence until its time runs out. Silenced alerts sink to the bottom, dimmed.

Where firing alerts go to Alertmanager (``--alertmanager``), a line above the table says where,
or, in the error colour, which Alertmanager they are not reaching, why and since when; and a
silence made here can also be made in Alertmanager, once asked, which mutes the alert's
notifications for everyone (the console's own silence only dims its row here).
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.screen import ModalScreen
from textual.widgets import DataTable, OptionList, Static
from textual.widgets.option_list import Option

from gpuconsole.core.model import Severity
from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSender, DeliveryError, identity
from gpuconsole.fleet.alerts.engine import FIRING, Alert, AlertEngine, AlertKey
from gpuconsole.fleet.host_order import SEVERITY_WORDS
from gpuconsole.ui.messages import ShowGpu
from gpuconsole.ui.screens.base import Copyable
from gpuconsole.ui.screens.confirm import ConfirmScreen
from gpuconsole.ui.screens.folded_list import FoldedListScreen
from gpuconsole.ui.widgets import cells
from gpuconsole.ui.widgets.cells import duration as age
from gpuconsole.ui.widgets.filter_box import FilterBox
from gpuconsole.ui.widgets.keyed_table import Cells, ColumnSpec, KeyedTable, fit_columns

# By priority: where the width is short the start time goes first (For says how long), then the
# message (the line under the list says it in full).
_COLUMNS = (
    ColumnSpec("state", "State", 11, grow=1, most=16),
    ColumnSpec("severity", "Sev", 4),
    ColumnSpec("rule", "Rule", 20),
    ColumnSpec("where", "Where", 14),
    ColumnSpec("since", "Since", 8, drop=2),
    ColumnSpec("age", "For", 8),
    ColumnSpec("message", "Message", 16, drop=1, grow=3),
)
SILENCE_CHOICES: tuple[tuple[str, float], ...] = (
    ("15 minutes", 15 * 60.0),
    ("1 hour", 3600.0),
    ("4 hours", 4 * 3600.0),
    ("1 day", 24 * 3600.0),
)


def row_key(alert: Alert) -> str:
    return f"{alert.rule}|{alert.host}|{'' if alert.gpu is None else alert.gpu}"


class SilenceScreen(ModalScreen[float | None]):
    """Asks for how long to silence an alert; dismisses with seconds, or None."""

    CSS = """
    SilenceScreen { align: center middle; }
    SilenceScreen #silence-body {
        width: 60; max-width: 100%; height: auto; padding: 1 2;
        border: round $primary; background: $surface;
    }
    SilenceScreen #silence-choices { height: auto; margin-top: 1; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="silence.cancel")]

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def compose(self) -> ComposeResult:
        with Static(id="silence-body"):
            yield Static(f"Silence {self.what} for", markup=False)
            yield OptionList(
                *(Option(label, id=str(seconds)) for label, seconds in SILENCE_CHOICES),
                id="silence-choices",
            )

    @on(OptionList.OptionSelected, "#silence-choices")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(float(event.option.id or 0))

    def action_cancel(self) -> None:
        self.dismiss(None)


def _words_of(alert: Alert) -> list[str]:
    """What the filter matches an alert against."""
    return [alert.where, alert.rule, SEVERITY_WORDS[alert.severity], alert.state, alert.message]


class AlertsScreen(FoldedListScreen):
    """Every active alert, the most severe first, firing before pending, then the oldest; info
    alerts folded away until `i` shows them."""

    HELP_TITLE = "Alerts"
    HELP_ORDER = 40

    CSS = """
    AlertsScreen #alerts { height: 1fr; max-height: 100%; }
    AlertsScreen #alerts-delivery { height: auto; padding: 0 1; }
    AlertsScreen #alerts-empty { padding: 1 2; color: $text-muted; }
    AlertsScreen #alerts-detail {
        height: auto;
        max-height: 6;
        padding: 0 1;
        border-top: solid $panel;
    }
    """
    FOCUS_KEYS = {"alerts": ("alerts.open",)}
    BINDINGS = [
        Binding("escape", "back", "Back", id="alerts.back"),
        Binding("enter", "open_host", "Open", id="alerts.open", tooltip="its GPU, or its host"),
        Binding(
            "space",
            "acknowledge",
            "Ack",
            id="alerts.acknowledge",
            tooltip="acknowledge the alert (again: take it back); lasts until it resolves",
        ),
        Binding(
            "s",
            "silence",
            "Silence",
            id="alerts.silence",
            tooltip="silence the alert for 15 minutes, 1 hour, 4 hours or 1 day (and, once "
            "asked, in Alertmanager)",
        ),
        Binding("u", "unsilence", "Unsilence", id="alerts.unsilence", tooltip="lift its silence"),
        Binding("i", "toggle_info", "Info", id="alerts.info", tooltip="show or fold info alerts"),
        Binding(
            "slash",
            "filter",
            "Filter",
            id="alerts.filter",
            tooltip="by host, rule, crit/warn/info, firing/pending or words of the message",
        ),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._keys: dict[str, AlertKey] = {}
        self._delivery: Text | None = None

    @property
    def engine(self) -> AlertEngine:
        return self.console.alerts

    @property
    def alertmanager(self) -> AlertmanagerSender | None:
        return self.console.alertmanager

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="alerts-delivery", markup=False)
        yield KeyedTable(id="alerts")
        yield FilterBox(
            placeholder="filter (whole words): host, rule, crit/warn/info, firing/pending, message",
            id="alerts-filter",
        )
        yield Static("No alerts: every rule is quiet.", id="alerts-empty", markup=False)
        yield Static(id="alerts-detail", markup=False)
        yield self.key_bar()

    def on_mount(self) -> None:
        super().on_mount()
        self.table.focus()

    def where(self) -> str:
        alerts = self.engine.active()
        firing = sum(a.state == FIRING for a in alerts)
        line = f"alerts · {firing} firing, {len(alerts) - firing} pending"
        folded = 0 if self.info_shown else sum(a.severity is Severity.INFO for a in alerts)
        return f"{line} · {folded} info folded (i)" if folded else line

    def shown(self, alerts: list[Alert]) -> list[Alert]:
        """The alerts listed (`FoldedListScreen.kept`)."""
        return self.kept(alerts, lambda alert: alert.severity, _words_of)

    def on_resize(self, _event: Resize) -> None:
        self.refresh_view(None)

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        columns = fit_columns(_COLUMNS, self.size.width or 80)
        self.table.set_columns(columns)
        rows = self._rows({spec.key: spec.width or 0 for spec in columns})
        self.table.sync(rows)
        empty = self.query_one("#alerts-empty", Static)
        empty.display = not rows
        if not rows:
            empty.update(
                "No alert needs a person: the active ones are info (i shows them)."
                if self.engine.active()
                else "No alerts: every rule is quiet."
            )
        self._show_delivery()
        self._show_detail()

    @on(DataTable.RowHighlighted, "#alerts")
    def _highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        """The alert under the cursor in full: what, where, since when, its marks, its message
        and what to do."""
        widget = self.query_one("#alerts-detail", Static)
        alert = self._alert(self._cursor_alert())
        widget.display = alert is not None
        if alert is None:
            return
        engine = self.engine
        now = engine.now if engine.now is not None else alert.since
        since = time.strftime("%H:%M:%S", time.gmtime(alert.since))
        head = Text.assemble(
            cells.severity_badge(alert.severity, self.palette),
            (f" {alert.rule}", "bold"),
            f" {alert.state} on {alert.where}",
            (f" · since {since} UTC, for {age(now - alert.since)}", "dim"),
        )
        if engine.acknowledged(alert.key):
            head.append(" · acknowledged", style="dim")
        silenced = engine.silenced_until(alert.key)
        if silenced is not None:
            head.append(f" · silenced {age(silenced - now)} more", style="dim")
        lines = [head, Text(alert.message)]
        if alert.remedy:
            lines.append(Text.assemble(("next: ", "bold"), alert.remedy))
        widget.update(Text("\n").join(lines))

    def _alert(self, key: AlertKey | None) -> Alert | None:
        return next((a for a in self.engine.active() if a.key == key), None)

    def copyables(self) -> list[Copyable]:
        """The alert's message, its host, its rule."""
        alert = self._alert(self._cursor_alert())
        if alert is None:
            return []
        found = [Copyable("alert", f"{alert.rule} on {alert.where}: {alert.message}")]
        found += [Copyable("host name", alert.host), Copyable("rule", alert.rule)]
        return found

    def _show_delivery(self) -> None:
        """Where firing alerts go, or why they do not get there; nothing without Alertmanager."""
        sender = self.alertmanager
        line = self.query_one("#alerts-delivery", Static)
        line.display = sender is not None
        if sender is None:
            return
        problems = sender.problems()
        if problems:
            text = Text("\n".join(problems), style=self.palette.severity(Severity.CRITICAL))
        else:
            text = Text(f"firing alerts go to Alertmanager at {', '.join(sender.urls)}", "dim")
        if text != self._delivery:
            self._delivery = text
            line.update(text)

    def _rows(self, widths: dict[str, int]) -> list[tuple[str, Cells]]:
        engine = self.engine
        alerts = self.shown(engine.active())
        alerts.sort(key=lambda a: engine.silenced_until(a.key) is not None)  # stable: keeps order
        self._keys = {row_key(a): a.key for a in alerts}
        return [(row_key(a), self._cells(a, widths)) for a in alerts]

    def _cells(self, alert: Alert, widths: dict[str, int]) -> Cells:
        """The alert's cells for the columns shown (``widths``: each one's width)."""
        engine = self.engine
        palette = self.palette
        now = engine.now if engine.now is not None else alert.since
        silenced = engine.silenced_until(alert.key)
        firing = alert.state == FIRING
        state = Text(
            alert.state.upper() if firing else alert.state,
            style=f"bold {palette.severity(alert.severity)}" if firing else "",
        )
        if engine.acknowledged(alert.key):
            state.append(" ack", style="dim")
        if silenced is not None:
            state.append(" muted", style="dim")
        message = Text(alert.message)
        if silenced is not None:
            message = Text(f"(silenced {age(silenced - now)} more) {alert.message}")
        shown = {
            "state": cells.fit_text(state, widths["state"]),
            "severity": cells.severity_badge(alert.severity, palette),
            "rule": cells.text(alert.rule, widths["rule"]),
            "where": cells.text(alert.where, widths["where"]),
            "since": Text(time.strftime("%H:%M:%S", time.gmtime(alert.since))),
            "age": Text(age(now - alert.since)),
            "message": cells.fit_text(message, widths.get("message", 0)),
        }
        row = tuple(shown[key] for key in widths)
        if silenced is not None:
            row = tuple(Text(cell.plain, style="dim") for cell in row)
        return row

    def _cursor_alert(self) -> AlertKey | None:
        key = self.table.cursor_key
        return None if key is None else self._keys.get(key)

    @on(DataTable.RowSelected, "#alerts")
    def _row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_host()

    def action_open_host(self) -> None:
        from gpuconsole.ui.screens.host import HostScreen

        key = self._cursor_alert()
        if key is None or key[1] not in self.store.hosts:
            return
        if key[2] is not None:
            self.post_message(ShowGpu(key[1], key[2]))
        else:
            self.app.push_screen(HostScreen(key[1]))

    def action_acknowledge(self) -> None:
        key = self._cursor_alert()
        if key is None:
            return
        if self.engine.acknowledged(key):
            self.engine.unacknowledge(key)
        else:
            self.engine.acknowledge(key)
        self.refresh_view(None)

    def action_silence(self) -> None:
        key = self._cursor_alert()
        alert = self._alert(key)
        if key is None or alert is None:
            return
        rule, host, gpu = key
        what = f"{rule} on {host}" + ("" if gpu is None else f" GPU {gpu}")

        def chosen(seconds: float | None) -> None:
            if seconds:
                self.engine.silence(key, seconds)
                self.notify(f"{what}: silenced for {age(seconds)}", timeout=3)
                self.refresh_view(None)
                if self.alertmanager is not None:
                    self._ask_alertmanager(self.alertmanager, alert, what, seconds)

        self.app.push_screen(SilenceScreen(what), chosen)

    def _ask_alertmanager(
        self, sender: AlertmanagerSender, alert: Alert, what: str, seconds: float
    ) -> None:
        """Ask whether to silence ``alert`` in Alertmanager too; if so, do it off the UI."""
        matchers = ", ".join(f"{name}={value}" for name, value in identity(alert))
        where = sender.urls[0] + (" (and its cluster)" if len(sender.urls) > 1 else "")
        detail = (
            f"A silence of {age(seconds)} in Alertmanager at {where}, matching {matchers}: "
            "no notification of this alert reaches anyone until it ends."
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(
                    lambda: self._silence_in_alertmanager(sender, alert, seconds),
                    thread=True,
                    exit_on_error=False,
                    group="alertmanager-silence",
                    description="silence an alert in Alertmanager",
                )

        question = f"Also silence {what} in Alertmanager?"
        self.app.push_screen(ConfirmScreen(question, detail), answered)

    def _silence_in_alertmanager(
        self, sender: AlertmanagerSender, alert: Alert, seconds: float
    ) -> None:
        """Make the silence (a worker thread: Alertmanager may be slow); a note says how it went."""
        try:
            made = sender.silence(alert, seconds, comment=f"from gpuconsole: {alert.message}")
        except DeliveryError as error:
            note = f"Alertmanager did not take the silence: {error}"
            self.app.call_from_thread(self.app.notify, note, severity="error", timeout=15)
            return
        until = time.strftime("%H:%M UTC", time.gmtime(made.until))
        note = f"silenced in Alertmanager at {made.url} until {until} (id {made.silence_id})"
        self.app.call_from_thread(self.app.notify, note, timeout=5)

    def action_unsilence(self) -> None:
        key = self._cursor_alert()
        if key is not None:
            self.engine.unsilence(key)
            self.refresh_view(None)
