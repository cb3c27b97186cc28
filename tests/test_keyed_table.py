"""KeyedTable repaints only the cells that changed and keeps the cursor on its key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from rich.text import Text
from textual.app import App, ComposeResult
from textual.pilot import Pilot

from gpuconsole.ui.widgets.keyed_table import Cells, ColumnSpec, KeyedTable, same_cell

COLUMNS = (ColumnSpec("host", "Host", 10), ColumnSpec("util", "Util", 6))


class RecordingTable(KeyedTable):
    """Records every cell `sync` repaints, and any repaint of the whole table."""

    def __init__(self) -> None:
        super().__init__(id="table")
        self.updates: list[tuple[object, object]] = []
        self.whole_repaints = 0

    def _repaint_cells(self, changed):  # type: ignore[no-untyped-def]
        self.updates.extend((key, column) for key, column, _ in changed)
        return super()._repaint_cells(changed)

    def refresh(self, *regions, **kwargs):  # type: ignore[no-untyped-def]
        if not regions and self.is_mounted:
            self.whole_repaints += 1
        return super().refresh(*regions, **kwargs)


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield RecordingTable()


def rows(utils: dict[str, float], style: str = "green") -> list[tuple[str, Cells]]:
    """Fresh cell objects every call, as a screen builds them each tick."""
    return [(key, (Text(key), Text(f"{u:.0f}%", style=style))) for key, u in utils.items()]


def row_keys(table: KeyedTable) -> list[str]:
    return [table.coordinate_to_cell_key((r, 0)).row_key.value for r in range(table.row_count)]


def plain(table: KeyedTable, row: str, column: str) -> str:
    cell = table.get_cell(row, column)
    return getattr(cell, "plain", str(cell))


BASE = {"a": 10.0, "b": 20.0, "c": 30.0}


@asynccontextmanager
async def base_rows_shown() -> AsyncIterator[tuple[Pilot[None], RecordingTable]]:
    """A running app whose table has COLUMNS and BASE's rows (synced, not yet painted)."""
    app = TableApp()
    async with app.run_test() as pilot:
        table = app.query_one(RecordingTable)
        table.set_columns(COLUMNS)
        table.sync(rows(BASE))
        yield pilot, table


async def test_sync_of_identical_rows_updates_nothing() -> None:
    async with base_rows_shown() as (pilot, table):
        await pilot.pause()
        assert row_keys(table) == ["a", "b", "c"]
        assert table.updates == []
        table.sync(rows(BASE))
        table.sync(rows(BASE))
        assert table.updates == []


async def test_changing_one_cell_updates_exactly_that_cell() -> None:
    async with base_rows_shown() as (pilot, table):
        await pilot.pause()
        repaints = table.whole_repaints
        table.sync(rows({**BASE, "b": 99.0}))
        await pilot.pause()
        assert table.updates == [("b", "util")]
        assert table.whole_repaints == repaints  # the cell alone, not the table
        assert plain(table, "b", "util") == "99%"
        assert plain(table, "a", "util") == "10%"
        table.sync(rows({**BASE, "b": 99.0}))  # the shown state was remembered
        assert table.updates == [("b", "util")]


def screen_lines(table: KeyedTable) -> list[str]:
    """The table's lines as they are painted (the header first)."""
    return [table.render_line(y).text for y in range(table.row_count + 1)]


async def test_a_changed_cell_is_painted_and_the_other_rows_come_from_the_cache() -> None:
    async with base_rows_shown() as (pilot, table):
        await pilot.pause()
        assert "10%" in screen_lines(table)[1]
        rows_painted: set[int] = set()
        render_cell = table._render_cell

        def counting(row_index, column_index, *args, **kwargs):  # type: ignore[no-untyped-def]
            rows_painted.add(row_index)
            return render_cell(row_index, column_index, *args, **kwargs)

        table._render_cell = counting  # type: ignore[method-assign]
        cache = table._cell_render_cache
        cached = {key: cache.get(key) for key in cache.keys()}  # noqa: SIM118 (no __iter__)
        table.sync(rows({**BASE, "b": 77.0}))
        lines = screen_lines(table)
        assert "77%" in lines[2] and "20%" not in lines[2]
        assert "10%" in lines[1] and "30%" in lines[3]
        assert rows_painted == {1}  # rows a and c come from the line cache
        fresh = [k[:2] for k in cache.keys() if cache.get(k) is not cached.get(k)]  # noqa: SIM118
        assert [(row.value, column.value) for row, column in fresh] == [("b", "util")]


async def test_style_only_change_updates_the_cell() -> None:
    async with base_rows_shown() as (pilot, table):  # green, as rows() makes them
        recoloured = rows(BASE, style="green")
        recoloured[2] = ("c", (Text("c"), Text("30%", style="red")))
        table.sync(recoloured)
        await pilot.pause()
        assert table.updates == [("c", "util")]
        cell = table.get_cell("c", "util")
        assert isinstance(cell, Text)
        assert cell.style == "red"


def test_same_cell_compares_style_and_spans() -> None:
    assert same_cell(Text("x", style="red"), Text("x", style="red"))
    assert not same_cell(Text("x", style="red"), Text("x", style="green"))
    assert Text("x", style="red") == Text("x", style="green")  # why same_cell exists
    spanned = Text("xy")
    spanned.stylize("bold", 0, 1)
    assert not same_cell(spanned, Text("xy"))
    assert not same_cell(Text("x"), Text("y"))
    assert same_cell("x", "x")
    assert not same_cell("x", "y")


async def test_reordering_rebuilds_and_keeps_cursor_on_its_key() -> None:
    async with base_rows_shown() as (pilot, table):
        await pilot.pause()
        table.move_cursor(row=1, animate=False)
        await pilot.pause()
        assert table.cursor_key == "b"
        table.sync(rows({"c": 30.0, "a": 10.0, "b": 21.0}))
        await pilot.pause()
        assert row_keys(table) == ["c", "a", "b"]
        assert table.cursor_key == "b"
        assert table.cursor_coordinate.row == 2
        assert plain(table, "b", "util") == "21%"
        assert table.updates == []  # a rebuild adds rows, it does not patch cells


async def test_removed_cursor_key_leaves_a_valid_cursor() -> None:
    async with base_rows_shown() as (pilot, table):
        table.move_cursor(row=2, animate=False)
        await pilot.pause()
        table.sync(rows({"a": 1.0, "b": 2.0}))
        await pilot.pause()
        assert row_keys(table) == ["a", "b"]
        assert table.cursor_key in {"a", "b"}


async def test_set_columns_with_equal_specs_does_nothing() -> None:
    async with base_rows_shown() as (pilot, table):
        table.move_cursor(row=2, animate=False)
        await pilot.pause()
        table.set_columns([ColumnSpec("host", "Host", 10), ColumnSpec("util", "Util", 6)])
        await pilot.pause()
        assert table.row_count == 3
        assert len(table.columns) == 2
        assert table.cursor_key == "c"
        table.sync(rows(BASE))
        assert table.updates == []


async def test_set_columns_with_new_specs_replaces_columns_and_rows() -> None:
    async with base_rows_shown() as (pilot, table):
        table.set_columns((*COLUMNS, ColumnSpec("temp", "Temp", 5)))
        await pilot.pause()
        assert table.row_count == 0
        assert [c.value for c in table.columns] == ["host", "util", "temp"]
        table.sync([("a", (Text("a"), Text("1%"), Text("40°C")))])
        assert row_keys(table) == ["a"]
        assert plain(table, "a", "temp") == "40°C"
