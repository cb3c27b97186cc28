"""The verification screen: a check × host matrix filled in as each host's report arrives, and
below it what the check under the cursor found on each host, with the evidence and the fix."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from gpuconsole.actions.verify.checks import CHECKS
from gpuconsole.actions.verify.model import Check, CheckResult, HostReport, Status
from gpuconsole.actions.verify.runner import verify_targets
from gpuconsole.hosts.targets import Target
from gpuconsole.ui.screens.action import ActionScreen
from gpuconsole.ui.widgets.cells import Palette
from gpuconsole.ui.widgets.keyed_table import Cells, ColumnSpec, KeyedTable

VerifyRun = Callable[
    [Sequence[Target], Sequence[Check], Callable[[HostReport], None]], Awaitable[object]
]


async def run_checks(
    targets: Sequence[Target], checks: Sequence[Check], on_report: Callable[[HostReport], None]
) -> object:
    return await verify_targets(targets, checks, on_report=on_report)


def status_text(status: Status | None, palette: Palette) -> Text:
    """A check's verdict as a coloured word; None while the host is still being verified."""
    if status is None:
        return Text("…", style="dim")
    styles = {
        Status.PASS: palette["util-high"],
        Status.WARN: palette["severity-warning"],
        Status.FAIL: f"bold {palette['severity-critical']}",
        Status.SKIP: "dim",
    }
    return Text(status.value, style=styles[status])


class VerifyScreen(ActionScreen):
    """Runs every check on the targets (off the UI thread) and shows them as they arrive."""

    HELP_TITLE = "Verification"
    HELP_ORDER = 70

    CSS = """
    VerifyScreen #verify-status {
        height: 1;
        padding: 0 1;
    }
    VerifyScreen #verify-matrix {
        max-height: 1fr;
    }
    VerifyScreen #verify-detail-box {
        height: 1fr;
        min-height: 6;
        border-top: solid $panel;
        padding: 0 1;
    }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="verify.back"),
        Binding("r", "rerun", "Run again", id="verify.rerun", tooltip="verify the hosts again"),
    ]

    def __init__(
        self,
        targets: Sequence[Target],
        checks: Sequence[Check] = CHECKS,
        run: VerifyRun = run_checks,
    ) -> None:
        super().__init__()
        self.targets = tuple(targets)
        self.checks = tuple(checks)
        self._run_checks = run
        self.reports: dict[str, HostReport] = {}

    def where(self) -> str:
        names = [t.name for t in self.targets]
        return "verify " + (names[0] if len(names) == 1 else f"{len(names)} hosts")

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="verify-status", markup=False)
        yield KeyedTable(id="verify-matrix")
        with VerticalScroll(id="verify-detail-box"):
            yield Static(id="verify-detail", markup=False)
        yield self.key_bar()

    def on_mount(self) -> None:
        columns = [ColumnSpec("check", "Check", 22)]
        columns += [ColumnSpec(f"host:{t.name}", t.name) for t in self.targets]
        self.query_one("#verify-matrix", KeyedTable).set_columns(columns)
        super().on_mount()
        self._start()

    def action_rerun(self) -> None:
        self.reports = {}
        self.refresh_view(None)
        self._start()

    def _start(self) -> None:
        """Each report comes back to the UI thread as it is ready."""

        def arrived(report: HostReport) -> None:
            self.from_thread(self._arrived, report)

        self.act(
            lambda: self._run_checks(self.targets, self.checks, arrived),
            lambda _reports: None,
            group="verify",
        )

    def _arrived(self, report: HostReport) -> None:
        self.reports[report.host] = report
        self.refresh_view(None)

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        self.query_one("#verify-status", Static).update(self._status_line())
        self.query_one("#verify-matrix", KeyedTable).sync(self._rows())
        self._show_detail()

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def _status_line(self) -> Text:
        done = len(self.reports)
        total = len(self.targets)
        if done < total:
            return Text(f"verifying {total} host(s): {done} done; r runs again, Esc goes back")
        counts = {status: 0 for status in Status}
        for report in self.reports.values():
            for result in report.checks:
                counts[result.status] += 1
        unreachable = sum(1 for r in self.reports.values() if r.error is not None)
        parts = [f"{counts[s]} {s.value}" for s in (Status.FAIL, Status.WARN, Status.PASS)]
        if unreachable:
            parts.insert(0, f"{unreachable} host(s) not reached")
        seconds = max((r.seconds for r in self.reports.values()), default=0.0)
        return Text(f"verified {total} host(s) in {seconds:.1f} s: " + ", ".join(parts))

    def _rows(self) -> list[tuple[str, Cells]]:
        rows = []
        for check in self.checks:
            cells: list[Text | str] = [check.id]
            for target in self.targets:
                cells.append(self._cell(target.name, check.id))
            rows.append((check.id, tuple(cells)))
        return rows

    def _cell(self, host: str, check_id: str) -> Text:
        report = self.reports.get(host)
        if report is not None and report.error is not None:
            return Text("down", style=f"bold {self.palette['severity-critical']}")
        result = _result(report, check_id)
        return status_text(result.status if result else None, self.palette)

    def _show_detail(self) -> None:
        table = self.query_one("#verify-matrix", KeyedTable)
        check_id = table.cursor_key
        check = next((c for c in self.checks if c.id == check_id), None)
        detail = Text()
        if check is not None:
            detail.append(f"{check.id}: {check.title}\n", style="bold")
            for target in self.targets:
                detail.append_text(self._host_detail(target.name, check.id))
        self.query_one("#verify-detail", Static).update(detail)

    def _host_detail(self, host: str, check_id: str) -> Text:
        report = self.reports.get(host)
        text = Text()
        text.append(f"{host}  ", style="bold")
        if report is None:
            return text.append("running…\n", style="dim")
        if report.error is not None:
            return text.append(
                f"not reached: {report.error}\n", style=self.palette["severity-critical"]
            )
        result = _result(report, check_id)
        if result is None:
            return text.append("not run\n", style="dim")
        text.append_text(status_text(result.status, self.palette))
        text.append(f"  {result.summary}\n")
        if result.status in (Status.WARN, Status.FAIL):
            for command in result.commands:
                text.append(f"    $ {command}\n", style="dim")
            for line in result.evidence:
                text.append(f"    {line}\n")
            if result.remediation:
                text.append("    fix: ", style="bold")
                text.append(f"{result.remediation}\n")
        return text


def _result(report: HostReport | None, check_id: str) -> CheckResult | None:
    if report is None:
        return None
    return next((r for r in report.checks if r.id == check_id), None)
