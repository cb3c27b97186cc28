"""The benchmark history of one host (`H` on the host screen): its runs and its peers' (other
hosts with the same GPU model), newest first, each flagged as `launch` flagged it, and for the run
under the cursor the comparisons the command line prints: host median, peer median, references.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.events import Resize
from textual.message import Message
from textual.widgets import DataTable, Static

from gpuconsole.bench.history import BenchHistory, HistoryError, unit
from gpuconsole.bench.output import HEADER, RIGHT_ALIGNED, row
from gpuconsole.bench.review import JudgedRun, host_review
from gpuconsole.core.fields import gib
from gpuconsole.ui.screens.base import ConsoleScreen
from gpuconsole.ui.widgets.keyed_table import Cells, ColumnSpec, KeyedTable, fit_columns

_LABELS = {"when": "When (UTC)", "peak mem": "Peak mem"}
_DROP = {"preset": 6, "GPU": 5, "world": 4, "peak mem": 3, "recipe": 2, "status": 1}
"""Where the width is short, these columns go, the highest first (the run under the cursor's
detail says them all): when, where, how fast and whether flagged stay."""


class HistoryScreen(ConsoleScreen):
    """Reads the history in a worker on opening and on `r`; Esc goes back."""

    HELP_TITLE = "Benchmark history"
    HELP_ORDER = 60

    CSS = """
    HistoryScreen #history-status { height: 1; padding: 0 1; }
    HistoryScreen #history-detail-box {
        height: 1fr;
        min-height: 6;
        border-top: solid $panel;
        padding: 0 1;
    }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="history.back"),
        Binding("r", "reload", "Reload", id="history.reload", tooltip="read the history again"),
    ]

    class Loaded(Message):
        """The history was read: the runs, or why they could not be."""

        def __init__(self, runs: list[JudgedRun] | None, error: str | None = None) -> None:
            super().__init__()
            self.runs = runs
            self.error = error

    def __init__(self, host: str, history: BenchHistory | None = None) -> None:
        super().__init__()
        self.host = host
        self.history = history or BenchHistory()
        self.runs: list[JudgedRun] | None = None
        self.error: str | None = None

    def where(self) -> str:
        return f"bench history {self.host}"

    def compose(self) -> ComposeResult:
        yield self.title_bar()
        yield Static(id="history-status", markup=False)
        yield KeyedTable(id="history-runs")
        with VerticalScroll(id="history-detail-box"):
            yield Static(id="history-detail", markup=False)
        yield self.key_bar()

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#history-runs", KeyedTable).focus()
        self._read(self._gpu_models())

    def action_reload(self) -> None:
        self.runs, self.error = None, None
        self.refresh_view(None)
        self._read(self._gpu_models())

    def _gpu_models(self) -> set[str]:
        """The host's GPU models as the fleet last read them: its peers are hosts with one."""
        snapshot = self.store.latest(self.host) if self.host in self.store.hosts else None
        return {g.name for g in snapshot.gpus if g.name} if snapshot is not None else set()

    @work(
        thread=True,
        exclusive=True,
        exit_on_error=False,
        group="history",
        description="read the bench history",
    )
    def _read(self, gpu_models: set[str]) -> None:
        """Off the UI thread: SQLite may wait on a writer (a launch keeping its result)."""
        try:
            runs = host_review(self.history, self.host, gpu_models)
        except HistoryError as error:
            self.post_message(self.Loaded(None, str(error)))
            return
        self.post_message(self.Loaded(runs))

    def on_history_screen_loaded(self, message: Loaded) -> None:
        self.runs, self.error = message.runs, message.error
        self.refresh_view(None)

    def refresh_view(self, changed: set[str] | None) -> None:
        super().refresh_view(changed)
        if changed is not None:  # new readings of hosts: the history is the same
            return
        self.query_one("#history-status", Static).update(self._status())
        rows = self._rows()
        table = self.query_one("#history-runs", KeyedTable)
        columns = fit_columns(_columns([cells for _, cells in rows]), self.size.width or 80)
        table.set_columns(columns)
        kept = [HEADER.index(spec.key) for spec in columns]
        table.sync([(key, tuple(cells[i] for i in kept)) for key, cells in rows])
        self._show_detail()

    def on_resize(self, _event: Resize) -> None:
        self.refresh_view(None)

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def _status(self) -> Text:
        if self.error is not None:
            return Text(self.error, style=self.palette["severity-critical"])
        if self.runs is None:
            return Text("reading the bench history…", style="dim")
        if not self.runs:
            return Text(
                f"no benchmark runs of {self.host} or of hosts with its GPU model yet; "
                "b on the host screen runs one",
                style="dim",
            )
        own = sum(1 for r in self.runs if not r.peer)
        flagged = sum(1 for r in self.runs if r.judgement.flagged)
        failed = sum(1 for r in self.runs if r.run.status == "failed")
        line = Text(f"{own} run(s) of {self.host}, {len(self.runs) - own} of its peers")
        if flagged:
            line.append(f", {flagged} flagged", style=f"bold {self.palette['severity-warning']}")
        if failed:
            line.append(f", {failed} failed", style=self.palette["severity-critical"])
        line.append("; newest first", style="dim")
        return line

    def _rows(self) -> list[tuple[str, Cells]]:
        return [(_key(judged), self._cells(judged)) for judged in self.runs or []]

    def _cells(self, judged: JudgedRun) -> Cells:
        shown = row(judged.run, judged.judgement, utc=True)
        cells: list[Text] = []
        for name, value in zip(HEADER, shown, strict=True):
            cell = Text(value, justify="right" if name in RIGHT_ALIGNED else "left")
            if name == "flag" and value:
                cell.stylize(f"bold {self.palette['severity-warning']}")
            elif name == "status" and value == "failed":
                cell.stylize(self.palette["severity-critical"])
            elif judged.peer:
                cell.stylize("dim")
            cells.append(cell)
        return tuple(cells)

    def _show_detail(self) -> None:
        key = self.query_one("#history-runs", KeyedTable).cursor_key
        judged = next((r for r in self.runs or [] if _key(r) == key), None)
        detail = self.query_one("#history-detail", Static)
        detail.update(self._detail(judged) if judged is not None else "")

    def _detail(self, judged: JudgedRun) -> Text:
        run = judged.run
        text = Text()
        text.append(f"run {run.run_id}  {run.host}  {run.recipe} {run.preset}", style="bold")
        text.append(f"  on {run.world_size} × {run.gpu_model or 'N/A'}")
        text.append(f"  driver {run.driver or 'N/A'}  torch {run.torch or 'N/A'}\n", style="dim")
        if run.status == "failed":
            text.append("failed: ", style=f"bold {self.palette['severity-critical']}")
            return text.append(f"{run.message or 'no cause recorded'}\n")
        if run.samples_per_s is None:
            return text.append("no measured steps: not judged\n", style="dim")
        text.append(f"{run.samples_per_s:,.1f} {unit(run.recipe)}")
        if run.peak_memory_mib is not None:
            text.append(f", peak {gib(run.peak_memory_mib)} GiB")
        text.append("\n")
        for comparison in judged.judgement.comparisons:
            if comparison.flagged:
                text.append("  FLAG ", style=f"bold {self.palette['severity-warning']}")
            else:
                text.append("       ")
            text.append(f"{comparison.message}\n")
        knobs = " ".join(f"{name}={value}" for name, value in sorted(run.knobs.items()))
        if knobs:
            text.append(f"knobs: {knobs}\n", style="dim")
        return text


def _columns(rows: list[Cells]) -> list[ColumnSpec]:
    """Columns as wide as their widest cell, set with the rows: a table that sized itself to
    rows arriving after it was drawn could keep its header at the old widths."""
    labels = [_LABELS.get(name, name[:1].upper() + name[1:]) for name in HEADER]
    return [
        ColumnSpec(
            name,
            label,
            max([len(label), *(len(str(cells[i])) for cells in rows)]),
            drop=_DROP.get(name, 0),
        )
        for i, (name, label) in enumerate(zip(HEADER, labels, strict=True))
    ]


def _key(judged: JudgedRun) -> str:
    return str(judged.run.run_id)
