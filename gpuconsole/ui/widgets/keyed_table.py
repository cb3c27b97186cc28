"""A DataTable that is synchronised from keyed rows and repaints only what changed.

Clearing and re-adding every row each tick loses the cursor and costs layout per row; this table
instead compares each new cell with the one shown and repaints only the cells that differ. Rows
are rebuilt only when the set or the order of keys changes. The cursor stays on the first row
until the user moves it (so a list that sorts itself once its readings arrive opens on its worst
row), then on its key, whatever the order or the columns become.

`fit_columns` is the one place that decides which columns a table shows in a given width, and
how wide the ones that grow are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from rich.text import Text
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowDoesNotExist, RowKey

Cells = tuple[Text | str, ...]


def same_cell(a: Text | str, b: Text | str) -> bool:
    """Equal as shown: rich's `Text.__eq__` ignores the base style, so a recoloured cell
    (a theme change, a temperature crossing a band) would compare equal to the old one."""
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return a == b


def _literal(cell: Text | str) -> Text:
    """A cell as it reads: DataTable would take a plain string for markup, and a process name
    like ``[@click=app.quit]`` must show as those characters, not become an action or a link."""
    return Text(cell) if isinstance(cell, str) else cell


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """A column: its key, its header label and its width (None: fit the content).

    ``drop`` ranks the column for `fit_columns`: 0 is always shown, and where the width is short
    the column with the highest rank goes first. A column that ``grow``s (its share of what the
    other columns leave, against the other growing columns' shares) has ``width`` as its least,
    and ``most`` as its most (None: no limit).
    """

    key: str
    label: str
    width: int | None = None
    drop: int = 0
    grow: int = 0
    most: int | None = None


def sorted_by(spec: ColumnSpec, arrow: str) -> ColumnSpec:
    """``spec`` as the column a list is sorted by: its header ends with ``arrow`` (▼ or ▲), and
    the column is wide enough for it."""
    label = f"{spec.label}{arrow}"
    return replace(spec, label=label, width=max(spec.width or 0, len(label)))


CELL_PADDING = 2
"""DataTable pads each cell by one on either side."""
SCROLLBAR = 2
"""Kept free for a table's vertical scroll bar, so that no cell is clipped when one shows."""


def fit_columns(
    columns: Sequence[ColumnSpec], width: int, reserve: int = SCROLLBAR
) -> tuple[ColumnSpec, ...]:
    """The columns to show in ``width`` cells (less ``reserve``), in their order: the least
    important dropped (highest ``drop`` first, the rightmost among equals) until the rest fit,
    a dropped one taken back where it fits after all (the most important first), then what is
    left shared among the growing ones."""
    room = width - reserve
    kept = list(columns)
    dropped = []
    while _needed(kept) > room:
        droppable = [spec for spec in kept if spec.drop]
        if not droppable:
            break
        rank = max(spec.drop for spec in droppable)
        dropped.append([spec for spec in droppable if spec.drop == rank][-1])
        kept.remove(dropped[-1])
    for spec in reversed(dropped):
        if _needed([*kept, spec]) <= room:
            kept.append(spec)
    kept.sort(key=list(columns).index)
    return _grown(kept, room - _needed(kept))


def _needed(columns: Sequence[ColumnSpec]) -> int:
    return sum((spec.width or 0) + CELL_PADDING for spec in columns)


def _grown(columns: list[ColumnSpec], spare: int) -> tuple[ColumnSpec, ...]:
    """``spare`` cells shared among the growing columns by their ``grow``; a column that reaches
    its ``most`` leaves the rest to the others."""
    widths = {spec.key: spec.width or 0 for spec in columns}
    growing = [spec for spec in columns if spec.grow]
    while spare > 0 and growing:
        total = sum(spec.grow for spec in growing)
        given = 0
        for spec in growing:
            share = max(1, spare * spec.grow // total)
            limit = spec.most - widths[spec.key] if spec.most is not None else share
            step = max(0, min(share, limit, spare - given))
            widths[spec.key] += step
            given += step
        spare -= given
        growing = [s for s in growing if s.most is None or widths[s.key] < s.most]
        if not given:
            break
    return tuple(replace(spec, width=widths[spec.key]) if spec.grow else spec for spec in columns)


class KeyedTable(DataTable[Text | str]):
    """Rows keyed by a stable string; `sync` applies a full new state as a minimal change."""

    DEFAULT_CSS = """
    KeyedTable { height: auto; max-height: 1fr; }
    """
    """As tall as its rows, within what its screen leaves it; a screen's CSS may bound it."""
    BINDINGS = [
        Binding("home", "scroll_top", "First row", show=False),
        Binding("end", "scroll_bottom", "Last row", show=False),
    ]

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=False)
        self._columns_shown: tuple[ColumnSpec, ...] = ()
        self._shown: dict[str, Cells] = {}
        self.chosen = False
        """Whether the cursor was put on a row (by a key, a click or a screen); until then it
        stays on the first row, whatever the rows' order becomes."""
        self._placing = False
        self._kept_key: str | None = None
        """The cursor's key while new columns wait for their rows."""

    def watch_cursor_coordinate(self, old: Coordinate, new: Coordinate) -> None:
        super().watch_cursor_coordinate(old, new)
        if old != new and not self._placing:
            self.chosen = True

    def set_columns(self, columns: Sequence[ColumnSpec]) -> None:
        """Replace the columns (and so every row) when they differ from those shown; the cursor
        returns to its key with the next `sync`."""
        columns = tuple(columns)
        if columns == self._columns_shown:
            return
        self._kept_key = self.cursor_key or self._kept_key
        self._placing = True
        try:
            self.clear(columns=True)
            self._shown = {}
            for spec in columns:
                self.add_column(spec.label, key=spec.key, width=spec.width)
        finally:
            self._placing = False
        self._columns_shown = columns

    @property
    def columns_shown(self) -> tuple[ColumnSpec, ...]:
        return self._columns_shown

    @property
    def cursor_key(self) -> str | None:
        """The key of the row under the cursor, or None for an empty table."""
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except RowDoesNotExist:
            return None
        return row_key.value

    def sync(self, rows: Sequence[tuple[str, Cells]]) -> None:
        """Show exactly ``rows``, touching only the cells that changed."""
        keys = [key for key, _ in rows]
        if keys != list(self._shown):
            self._rebuild(rows)
            return
        column_keys = [spec.key for spec in self._columns_shown]
        changed: list[tuple[str, str, Text | str]] = []
        for key, cells in rows:
            shown = self._shown[key]
            for column, new, old in zip(column_keys, cells, shown, strict=True):
                if not same_cell(new, old):
                    changed.append((key, column, new))
            self._shown[key] = cells
        if changed:
            self._repaint_cells(changed)

    def _repaint_cells(self, changed: Sequence[tuple[str, str, Text | str]]) -> None:
        """Set cells and repaint only their regions.

        DataTable.update_cell refreshes the whole table, so one changed number would resend every
        row to the terminal (about a kilobyte a row in truecolor). Here the data is set as
        update_cell sets it (Textual is pinned to the version whose internals these are) and
        each cell's own region is refreshed: the terminal receives only the changed cells.
        """
        cells = set()
        for key, column, value in changed:
            cell = (RowKey(key), ColumnKey(column))
            self._data[cell[0]][cell[1]] = _literal(value)
            cells.add(cell)
        self._forget_renders(cells)
        for key, column, _ in changed:
            self.refresh_coordinate(self.get_cell_coordinate(key, column))

    def _forget_renders(self, cells: set[tuple[RowKey, ColumnKey]]) -> None:
        """Drop the cached renders of these cells and of the lines and rows that hold them.

        DataTable keys its render caches by a count of updates, so one changed cell would make
        every cell of every row render again (Rich's padding and styling, the bulk of a tick's
        CPU on a 64-host fleet); here only what shows a changed cell is dropped.
        """
        rows = {row for row, _ in cells}
        indices = {self._row_locations.get(row) for row in rows}
        top = self.header_height if self.show_header else 0
        lines = {top + y for y, (row, _) in enumerate(self._y_offsets) if row in rows}
        for cache, stale in (
            (self._cell_render_cache, lambda key: (key[0], key[1]) in cells),
            (self._row_render_cache, lambda key: key[0] in rows),
            (self._row_renderable_cache, lambda key: key[1] in indices),
            (self._line_cache, lambda key: key[0] in lines),
        ):
            # LRUCache has keys() but no __iter__.
            for key in [key for key in cache.keys() if stale(key)]:  # noqa: SIM118
                cache.discard(key)

    def _rebuild(self, rows: Sequence[tuple[str, Cells]]) -> None:
        keep = (self.cursor_key or self._kept_key) if self.chosen else None
        self._kept_key = None
        self._placing = True
        try:
            self.clear()
            self._shown = {}
            for key, cells in rows:
                self.add_row(*map(_literal, cells), key=key)
                self._shown[key] = cells
            if keep in self._shown:
                self.move_cursor(row=self.get_row_index(keep), animate=False, scroll=True)
            elif not self.chosen and self._shown:
                self.move_cursor(row=0, animate=False, scroll=True)
        finally:
            self._placing = False
