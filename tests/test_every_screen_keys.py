"""What a user meets first, on any screen: the cursor on the worst host and staying on its host,
Home/End/PgUp/PgDn, a filter of whole words that knows states and severities, `y` copying the
value under the cursor, the palette offering every screen, `q` quitting everywhere, notices that
replace their own kind, the time of the readings in every title, and NO_COLOR kept through the
real terminal path."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pyte
import pytest
from cli_runner import GPUCONSOLE
from hostile import run_in_pty
from notices import notice_texts, notices
from pilot_wait import until
from test_app import row_keys, tick

from gpuconsole.core.model import HostState
from gpuconsole.fleet.host_order import host_matches
from gpuconsole.telemetry.sim import SimSource, demo_rack
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.commands import ConsoleCommands
from gpuconsole.ui.screens.copy import CopyScreen
from gpuconsole.ui.screens.help import HelpScreen
from gpuconsole.ui.screens.host import HostScreen
from gpuconsole.ui.widgets.cells import fit_text
from gpuconsole.ui.widgets.key_bar import KeyBar, KeyEntry, fitted
from gpuconsole.ui.widgets.keyed_table import ColumnSpec, KeyedTable, fit_columns
from gpuconsole.ui.widgets.notices import laid_out
from gpuconsole.ui.widgets.title_bar import TitleBar, fit_title, part

ROOT = Path(__file__).resolve().parent.parent


def title(app: GpuConsoleApp) -> str:
    return str(app.screen.query_one(TitleBar).render())


def key_bar(app: GpuConsoleApp) -> str:
    return str(app.screen.query_one(KeyBar).render())


# --- the cursor -----------------------------------------------------------------------------------


@pytest.mark.parametrize("hosts", [6, 64])
async def test_the_cursor_starts_on_the_worst_host_once_the_rack_is_read(clock, hosts) -> None:
    """The first frame lists every host `connecting`, by name; the cursor stays on the first row
    while the readings arrive and sort the rack, so Enter at once opens the worst host."""
    rack = demo_rack(hosts=hosts, seed=7, epoch=clock.now - 900)
    app = GpuConsoleApp(SimSource(rack, clock), auto_poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await until(pilot, lambda: not app.starting, timeout=60)
        await pilot.pause()
        worst = row_keys(app.screen, "fleet")[0]
        assert app.fleet.store.severity(worst) == max(
            s for h in app.fleet.store.hosts if (s := app.fleet.store.severity(h)) is not None
        )
        assert app.screen.query_one("#fleet", KeyedTable).cursor_key == worst
        await pilot.press("enter")
        assert isinstance(app.screen, HostScreen) and app.screen.host == worst


async def test_the_cursor_stays_on_its_host_when_the_order_changes(make_app, rack, clock) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one("#fleet", KeyedTable)
        await pilot.press("down", "down")
        chosen = table.cursor_key
        assert chosen == row_keys(app.screen, "fleet")[2]
        await pilot.press("s")  # by name: the rows move, the cursor with its host
        assert row_keys(app.screen, "fleet") == sorted(app.fleet.store.hosts)
        assert table.cursor_key == chosen
        await pilot.press("s", "s", "s", "s", "s")  # round to worst first again
        rack.set_fault(chosen, "xid-79", gpu=1, since=clock.now + 1)  # it turns critical
        tick(app, clock)
        await pilot.pause()
        assert row_keys(app.screen, "fleet").index(chosen) < 2
        assert table.cursor_key == chosen
        await pilot.resize_terminal(160, 48)  # other columns: the rows are made again
        await pilot.pause()
        assert "jobs" in [spec.key for spec in table.columns_shown]
        assert table.cursor_key == chosen


async def test_home_end_and_pages_move_the_cursor(clock) -> None:
    rack = demo_rack(hosts=40, seed=7, epoch=clock.now - 900)
    app = GpuConsoleApp(SimSource(rack, clock), auto_poll=False, background_start=False)
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one("#fleet", KeyedTable)
        keys = row_keys(app.screen, "fleet")
        await pilot.press("end")
        assert table.cursor_key == keys[-1]
        await pilot.press("home")
        assert table.cursor_key == keys[0]
        await pilot.press("pagedown")
        page = table.cursor_coordinate.row
        assert 10 <= page < len(keys) - 1  # a screenful down
        await pilot.press("pagedown")
        assert table.cursor_coordinate.row > page
        await pilot.press("pageup", "pageup")
        assert table.cursor_coordinate.row == 0


# --- the filter -----------------------------------------------------------------------------------


async def test_the_filter_matches_whole_words(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        store = app.fleet.store
        hot = "a100-01"  # its finding reads "slowdown at 89 °C"
        assert any("slowdown" in f.message for f in store.findings(hot))
        await pilot.press("slash", *"down")
        assert row_keys(app.screen, "fleet") == []  # no host is down; slowdown is no "down"
        await pilot.press(*["backspace"] * 4, *"crit")
        critical = [h for h in store.hosts if (store.severity(h) or 0) >= 2]
        assert sorted(row_keys(app.screen, "fleet")) == sorted(critical) and len(critical) == 2
        await pilot.press("escape")
        assert len(row_keys(app.screen, "fleet")) == len(store.hosts)


@pytest.mark.parametrize(
    ("host", "text", "expected"),
    [
        ("a100-01", "down", False),  # "slowdown" is not "down"
        ("a100-01", "slowdown", True),
        ("a100-01", "crit", True),  # the badge's word
        ("a100-01", "critical", True),
        ("a100-02", "crit", False),
        ("h100-01", "gpu-lost", True),  # a code
        ("h100-01", "lost", True),  # a word of a code
        ("a100-01", "a100 pcie", True),  # a model, word by word
        ("a100-01", "h10", False),  # no part of a word
        ("h100-02", "h100", True),
        ("h100-02", "h100 crit", False),  # every word must match
        ("h100-02", "info", True),  # its info findings
    ],
)
async def test_filter_words(make_app, host: str, text: str, expected: bool) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)):
        assert host_matches(app.fleet.store, host, text) is expected


async def test_the_filter_knows_a_states_short_word(make_app, rack, clock) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)):
        rack.set_fault("l40s-01", "host-unresponsive", since=clock.now)
        for _ in range(10):
            tick(app, clock)
        assert app.fleet.store.status("l40s-01").state is HostState.DOWN
        assert host_matches(app.fleet.store, "l40s-01", "down")
        assert not host_matches(app.fleet.store, "a100-01", "down")


# --- copying ------------------------------------------------------------------------------------


async def test_y_copies_the_value_under_the_cursor(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        host = row_keys(app.screen, "fleet")[0]
        await pilot.press("y")
        assert app.clipboard == host
        await pilot.press("enter")  # the host: the UUID of its worst GPU, where the cursor starts
        snapshot = app.fleet.store.latest(host)
        assert (host, app.screen.selected_gpu) == ("h100-01", 3)  # fallen off the bus
        await pilot.press("y")
        assert app.clipboard == snapshot.gpu(3).uuid
        await pilot.press("tab", "y")  # the process list: the first process's PID
        first = app.screen.query_one("#processes", KeyedTable).cursor_key
        assert first is not None and app.clipboard == first.partition("/")[2]
        await pilot.press("Y")  # or choose: its command
        assert isinstance(app.screen, CopyScreen)
        assert [v.what for v in app.screen.values][:2] == ["PID", "command"]
        await pilot.press("down", "enter")
        pid = int(first.partition("/")[2])
        (process,) = [p for p in snapshot.processes if p.pid == pid]
        assert app.clipboard == process.command
        # four copies, one notice: each replaced the one before
        copies = [n for n in await notice_texts(pilot) if n.startswith("copied ")]
        assert len(copies) == 1 and copies[0].startswith("copied command: "), copies


# --- the palette, help, notices -----------------------------------------------------------------


async def test_the_palette_offers_every_screen_and_this_screens_keys(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("enter")
        names = [name for name, _, _ in ConsoleCommands(app.screen)._commands()]
        for wanted in ("Fleet", "Alerts", "Triage", "Help", "Copy", "Topology", "Benchmark"):
            assert wanted in names, wanted
        assert names.count("Topology") == 1


async def test_q_quits_from_help(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


async def test_the_sorted_column_says_so_in_its_header_and_s_reverses_it(make_app) -> None:
    """No notice over the rows: the header of the column sorted by carries the arrow, at 80
    columns as at 160; S turns the order round."""
    app = make_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        table = app.screen.query_one("#fleet", KeyedTable)

        def headers() -> list[str]:
            return [str(column.label) for column in table.columns.values()]

        assert "Worst problem▼" in headers()
        await pilot.press(*"sssss")
        await pilot.pause()
        assert app.screen.sort_key == "memory" and "Mem▼" in headers()
        assert "Worst problem" in headers()
        highest = app.screen.ordered_hosts()
        await pilot.press("S")
        assert "Mem▲" in headers()
        assert app.screen.ordered_hosts() == highest[::-1]
        assert [row.key.value for row in table.ordered_rows] == highest[::-1]
        assert await notices(pilot) == []


async def test_o_orders_the_process_list_and_its_header_says_by_what(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("enter", "tab")
        table = app.screen.query_one("#processes", KeyedTable)
        snapshot = app.fleet.store.latest(app.screen.host)
        by_pid = {p.pid: p for p in snapshot.processes}

        def shown() -> tuple[list[str], list[int]]:
            headers = [str(column.label) for column in table.columns.values()]
            pids = [int(row.key.value.partition("/")[2]) for row in table.ordered_rows]
            return headers, pids

        headers, pids = shown()
        assert "GPU▲" in headers and [by_pid[p].gpu for p in pids] == sorted(
            by_pid[p].gpu for p in pids
        )
        await pilot.press("o")
        headers, pids = shown()
        memory = [by_pid[p].used_memory_mib or 0 for p in pids]
        assert "Memory▼" in headers and memory == sorted(memory, reverse=True)
        await pilot.press("o", "o")
        headers, pids = shown()
        started = [by_pid[p].started for p in pids]
        assert "Age▼" in headers and started == sorted(started)  # the longest running first
        await pilot.press("o")
        assert shown()[1] == sorted(by_pid)
        await pilot.press("o")
        assert "GPU▲" in shown()[0]


async def test_a_notice_is_a_line_of_its_own_over_no_row_of_data(make_app) -> None:
    """The key bar leaves its top row to the notice while it shows, and takes it back after."""
    app = make_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("enter")
        bar = app.screen.query_one(KeyBar)
        assert bar.region.height == 1
        app.notify("copied UUID of h100-01 GPU 3", timeout=0.6)
        await pilot.pause()
        await pilot.pause()
        (toast,) = app.screen.query("Toast")
        assert bar.region.height == 2 and toast.region.height == 1
        assert toast.region.y == bar.region.y  # on the bar's free row, under every list
        assert bar.region.y + 1 == 23 and key_bar(app).strip().startswith("⏎ Open GPU")
        await pilot.pause(0.9)  # its timeout passed
        assert bar.region.height == 1


def test_a_long_path_in_a_notice_is_never_broken_in_a_name() -> None:
    home = os.path.expanduser("~")
    name = "gpuconsole-bundle-h100-01-20260101T001500Z.tar.gz"
    message = f"bundle written: {home}/.local/share/gpuconsole/bundles/{name} (2 not collected)"
    lines = laid_out(message).split("\n")
    assert name in lines and all(len(line) <= 56 for line in lines)
    assert "~/.local/share/gpuconsole/bundles/" in lines
    assert laid_out("sorted by name") == "sorted by name"


# --- fitting --------------------------------------------------------------------------------------


def test_columns_drop_by_priority_and_growing_ones_share_the_rest() -> None:
    columns = (
        ColumnSpec("a", "A", 10),
        ColumnSpec("b", "B", 5, drop=2),
        ColumnSpec("c", "C", 5, drop=1),
        ColumnSpec("m", "M", 10, grow=1),
        ColumnSpec("o", "O", 8, grow=2, most=12),
    )
    assert [(c.key, c.width) for c in fit_columns(columns, 40)] == [
        ("a", 10), ("m", 12), ("o", 10)
    ]  # fmt: skip
    wide = fit_columns(columns, 120)
    assert [c.key for c in wide] == ["a", "b", "c", "m", "o"]
    assert sum((c.width or 0) + 2 for c in wide) == 118 and wide[-1].width == 12


def test_the_key_bar_keeps_help_and_drops_from_the_end() -> None:
    entries = [KeyEntry(k, "x" * 8, k) for k in "abcdefgh"]
    entries.insert(6, KeyEntry("?", "Help", "question_mark", pinned=True))
    palette = KeyEntry("^p", "palette", "ctrl+p")
    shown = fitted(entries, 40, palette)
    assert [e.keys for e in shown] == ["a", "b", "?"]
    assert fitted(entries, 400, palette)[-1] is palette


def test_the_title_shortens_the_least_telling_parts_first() -> None:
    parts = [
        part("gpuconsole", rank=7),
        part("demo rack", rank=4),
        part("6 hosts: 6 live", "6 live", rank=3),
        part("2 critical", rank=1),
        part("host h100-01", rank=0, right=True),
        part("read 00:15:00 UTC", "00:15:00", rank=2, right=True),
    ]
    assert fit_title(parts, 200).plain.startswith("gpuconsole · demo rack")
    assert fit_title(parts, 53).plain == "6 live · 2 critical  host h100-01 · read 00:15:00 UTC"
    assert fit_title(parts, 44).plain == "2 critical  host h100-01 · read 00:15:00 UTC"
    assert fit_title(parts, 35).plain == "2 critical  host h100-01 · 00:15:00"
    assert fit_title(parts, 10).plain.startswith("host h100-01")


def test_text_is_cut_where_a_word_ends() -> None:
    from rich.text import Text

    cut = fit_text(Text("reboot the node; if it recurs, check the GPU"), 24)
    assert cut.plain == "reboot the node; if it…"


# --- when the readings were taken ---------------------------------------------------------------


async def test_every_title_says_when_its_readings_were_taken(make_app, rack, clock) -> None:
    app = make_app(clock=clock)
    async with app.run_test(size=(80, 24)) as pilot:
        assert "read 00:15:00 UTC" in title(app)
        rack.set_fault("l40s-01", "host-unresponsive", since=clock.now)
        for _ in range(4):
            tick(app, clock)
        app.push_screen(HostScreen("l40s-01"))
        await pilot.pause()
        assert app.fleet.store.status("l40s-01").state is HostState.STALE
        assert "00:15:00 UTC, 4s ago" in title(app)  # stale: how long ago
        await pilot.press("escape", "p")
        assert "paused since 00:15:04 UTC" in title(app)
        await pilot.press("a", "T")
        for _ in range(2):
            assert "read 00:15:04 UTC" in title(app) or "00:15:04" in title(app)
            assert "?" in key_bar(app)
            await pilot.press("escape")


async def test_every_screen_keeps_help_in_its_key_bar_at_80_columns(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        for keys in (["enter"], ["t"], ["escape", "escape", "a"], ["T"]):
            await pilot.press(*keys)
            shown = key_bar(app)
            assert "? Help" in shown and len(shown) <= 80, (keys, shown)


async def test_the_key_bar_keeps_the_on_call_keys_and_follows_focus(make_app) -> None:
    """The fleet keeps Enter, a, T, ? and q at 80 columns; on the host screen, Tab into the
    process list puts its keys (k, K, y) first, Tab back the GPU list's Enter."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        fleet = key_bar(app)
        for entry in ("⏎ Open host", "a Alerts", "T Triage", "? Help", "q Quit"):
            assert entry in fleet, fleet
        assert len(fleet) <= 80
        await pilot.press("enter")
        assert key_bar(app).startswith(" ⏎ Open GPU"), key_bar(app)
        await pilot.press("tab")
        assert key_bar(app).startswith(" k Terminate  K Kill  y Copy"), key_bar(app)
        await pilot.press("tab")
        assert key_bar(app).startswith(" ⏎ Open GPU"), key_bar(app)


# --- NO_COLOR, through the real terminal ---------------------------------------------------------

_SGR = re.compile(rb"\x1b\[([0-9;:]*)m")
_COLOUR = re.compile(r"^(3[0-9]|4[0-9]|9[0-7]|10[0-7]|5[89])$")


def colour_codes(output: bytes) -> list[str]:
    """Every SGR parameter in ``output`` that sets a colour (foreground, background, underline,
    default colours included)."""
    found = []
    for match in _SGR.finditer(output):
        found += [p for p in re.split(r"[;:]", match.group(1).decode()) if _COLOUR.match(p)]
    return found


def test_no_color_writes_no_colour_and_marks_by_attributes(tmp_path) -> None:
    env = {
        **os.environ,
        "TERM": "xterm-256color",
        "COLORTERM": "truecolor",
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        **{v: str(tmp_path / v.lower()) for v in ("XDG_CONFIG_HOME", "XDG_DATA_HOME")},
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    env.pop("GPUCONSOLE_PLAIN_OUTPUT", None)
    keys = [(8.0, b"y"), (9.0, b"\r"), (11.0, b"T"), (13.0, b"q")]
    output, _ = run_in_pty([*GPUCONSOLE, "--demo"], env, keys, size=(80, 24), cwd=ROOT)
    assert b"CRIT" in output, output[-2000:]
    assert colour_codes(output) == []
    # y on the fleet copied the host under the cursor (the worst), through OSC 52
    copied = re.search(rb"\x1b\]52;c;([A-Za-z0-9+/=]+)", output)
    assert copied is not None
    assert re.fullmatch(r"[a-z0-9]+-\d\d", base64.b64decode(copied.group(1)).decode())
    # the last frame before the console left the screen: triage, its CRIT badges reversed
    screen = pyte.Screen(80, 24)
    pyte.ByteStream(screen).feed(output[: output.rindex(b"\x1b[?1049l")])
    badges = [
        [row[x + i] for i in range(4)]
        for row in (screen.buffer[y] for y in range(24))
        for x in range(76)
        if "".join(row[x + i].data for i in range(4)) == "CRIT"
    ]
    assert badges and all(c.bold and c.reverse for badge in badges for c in badge)


async def test_no_color_palette_marks_critical_and_hot_by_emphasis(make_app, monkeypatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app()
    async with app.run_test(size=(80, 24)):
        assert app.no_color
        palette = app.palette
        assert palette.temperature(92) == "bold"
        assert palette["severity-critical"] == "bold reverse"
        assert [type(f).__name__ for f in app._filters] == ["Colourless"]


# --- replay ---------------------------------------------------------------------------------------


async def test_replay_plays_at_the_speed_it_names(tmp_path, rack, audit_log) -> None:
    from test_record import START, record_incident

    from gpuconsole.fleet.record.reader import Recording
    from gpuconsole.ui.replay_app import ReplayApp

    path = tmp_path / "r.sqlite"
    record_incident(path, rack, seconds=120, fault_at=30)
    recording = Recording(path)
    app = ReplayApp(recording, at=START + 5)
    wall = [100.0]
    app._monotonic = lambda: wall[0]
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.press("F")  # 10×
            assert "F Faster" in key_bar(app) and "n N finding" in key_bar(app)
            app.refresh_seconds = 0.05
            await pilot.press("P")
            wall[0] += 3.0  # however few ticks ran meanwhile, 3 s of the clock are 30 s
            await pilot.pause(0.3)
            await pilot.press("P")
            assert app.replay.cursor == START + 5 + 30
    finally:
        recording.close()
