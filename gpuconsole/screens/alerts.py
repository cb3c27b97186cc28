"""The alerts view (`a`): firing and pending alerts across the fleet, with since when.

Space acknowledges (or un-acknowledges) the alert under the cursor, `s` silences it for a time,
`u` lifts the silence, Enter opens its host. An acknowledgement lasts until the alert
resolves; a silence until its time runs out. Silenced alerts sink to the bottom, dimmed.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, OptionList, Static
from textual.widgets.option_list import Option

from gpuconsole.alerts.engine import FIRING, Alert, AlertEngine, AlertKey
from gpuconsole.screens.base import ConsoleScreen
from gpuconsole.widgets import cells
from gpuconsole.widgets.keyed_table import Cells, ColumnSpec, KeyedTable

_FIXED = (
    ColumnSpec("state", "State", 16),
    ColumnSpec("severity", "Sev", 4),
    ColumnSpec("rule", "Rule", 20),
    ColumnSpec("where", "Where", 14),
    ColumnSpec("since", "Since (UTC)", 11),
    ColumnSpec("age", "For", 8),
)
_MIN_MESSAGE = 20
SILENCE_CHOICES: tuple[tuple[str, float], ...] = (
    ("15 minutes", 15 * 60.0),
    ("1 hour", 3600.0),
    ("4 hours", 4 * 3600.0),
    ("1 day", 24 * 3600.0),
)


def age(seconds: float) -> str:
    """A duration as the view shows it: ``45s``, ``12m 03s``, ``3h 05m``, ``2d 04h``."""
    seconds = max(0, int(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def row_key(alert: Alert) -> str:
    return f"{alert.rule}|{alert.host}|{'' if alert.gpu is None else alert.gpu}"


class SilenceScreen(ModalScreen[float | None]):
    """Asks for how long to silence an alert; dismisses with seconds, or None."""

    DEFAULT_CSS = """
    SilenceScreen { align: center middle; }
    #silence-body {
        width: 60; max-width: 100%; height: auto; padding: 1 2;
        border: round $primary; background: $surface;
    }
    #silence-choices { height: auto; margin-top: 1; }
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


class AlertsScreen(ConsoleScreen):
    """Every active alert, firing first, then the most severe, then the oldest."""

    HELP_TITLE = "Alerts"
    HELP_ORDER = 40

    DEFAULT_CSS = """
    AlertsScreen #alerts { height: 1fr; max-height: 100%; }
    AlertsScreen #alerts-empty { padding: 1 2; color: $text-muted; }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="alerts.back"),
        Binding("enter", "open_host", "Open host", id="alerts.open", tooltip="its host or GPU"),
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
            tooltip="silence the alert for 15 minutes, 1 hour, 4 hours or 1 day",
        ),
        Binding("u", "unsilence", "Unsilence", id="alerts.unsilence", tooltip="lift its silence"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._keys: dict[str, AlertKey] = {}

    @property
    def engine(self) -> AlertEngine:
        return self.console.fleet.alerts

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield KeyedTable(id="alerts")
        yield Static("No alerts: every rule is quiet.", id="alerts-empty", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        super().on_mount()
        self.table.focus()

    @property
    def table(self) -> KeyedTable:
        return self.query_one("#alerts", KeyedTable)

    def where(self) -> str:
        alerts = self.engine.active()
        firing = sum(a.state == FIRING for a in alerts)
        return f"alerts · {firing} firing, {len(alerts) - firing} pending"

    def on_resize(self, _event: Resize) -> None:
        self.refresh_view(None)

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        width = self.size.width or 80
        used = sum((spec.width or 0) + 2 for spec in _FIXED) + 2
        message = ColumnSpec("message", "Message", max(_MIN_MESSAGE, width - used - 2))
        self.table.set_columns((*_FIXED, message))
        rows = self._rows(message.width or _MIN_MESSAGE)
        self.table.sync(rows)
        self.query_one("#alerts-empty", Static).display = not rows

    def _rows(self, message_width: int) -> list[tuple[str, Cells]]:
        engine = self.engine
        alerts = engine.active()
        alerts.sort(key=lambda a: engine.silenced_until(a.key) is not None)  # stable: keeps order
        self._keys = {row_key(a): a.key for a in alerts}
        return [(row_key(a), self._cells(a, message_width)) for a in alerts]

    def _cells(self, alert: Alert, message_width: int) -> Cells:
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
        message.truncate(message_width, overflow="ellipsis")
        row = (
            state,
            cells.severity_badge(alert.severity, palette),
            Text(alert.rule),
            Text(alert.where),
            Text(time.strftime("%H:%M:%S", time.gmtime(alert.since))),
            Text(age(now - alert.since)),
            message,
        )
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
        from gpuconsole.screens.host import HostScreen

        key = self._cursor_alert()
        if key is not None and key[1] in self.store.hosts:
            self.app.push_screen(HostScreen(key[1], key[2]))

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
        if key is None:
            return
        rule, host, gpu = key
        what = f"{rule} on {host}" + ("" if gpu is None else f" GPU {gpu}")

        def chosen(seconds: float | None) -> None:
            if seconds:
                self.engine.silence(key, seconds)
                self.notify(f"{what}: silenced for {age(seconds)}", timeout=3)
                self.refresh_view(None)

        self.app.push_screen(SilenceScreen(what), chosen)

    def action_unsilence(self) -> None:
        key = self._cursor_alert()
        if key is not None:
            self.engine.unsilence(key)
            self.refresh_view(None)
