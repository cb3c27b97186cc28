"""The output filter: what an admin sees is the same with it as without, for far fewer bytes.

Both streams (Textual's own, and what the filter makes of it) go into a real terminal emulator,
pyte, and the screens are compared cell by cell: character, colours and attributes. pyte drops a
few attributes (dim, overline, conceal, underline styles) and hyperlinks; `Terminal` keeps those
beside each cell so that they are compared too, and it attaches a combining mark after the last
column as terminals do (pyte wraps first).
"""

from __future__ import annotations

import codecs
import fcntl
import json
import os
import pty
import random
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pyte
import pytest
from cli_runner import GPUCONSOLE
from pyte.screens import Char
from rich.cells import cell_len
from textual import events
from textual.drivers.linux_driver import LinuxDriver
from textual.geometry import Size

from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.terminal import PLAIN_OUTPUT_ENV, console_driver
from gpuconsole.ui.terminal.diff import MAX_SEQUENCE_CHARS, SYNC_END, SYNC_START, ScreenDiff
from gpuconsole.ui.terminal.driver import DiffDriver
from gpuconsole.ui.terminal.sgr import PLAIN, Pen, apply_sgr, sgr_change

ROOT = Path(__file__).resolve().parent.parent

# pyte draws the final byte of CSI sequences it cannot parse (`CSI < u`, `CSI = 1 u`, the kitty
# keyboard protocol); they change nothing on a screen, so they are taken out of both streams.
_PYTE_UNPARSED = re.compile(r"\x1b\[[<=][0-9;]*[a-zA-Z]")
_OSC8 = re.compile(r"\x1b\]8;([^\x07\x1b]*)(?:\x07|\x1b\\)")


class _Screen(pyte.Screen):
    """pyte's screen, keeping in each cell's ``blink`` field what pyte would drop: dim,
    overline, conceal, underline style, rapid blink, other codes, and the hyperlink. Erasing and
    scrolling carry the field along with the rest of the cell."""

    extra: Pen = PLAIN
    link = ""

    def select_graphic_rendition(self, *attrs: int, **_: object) -> None:
        super().select_graphic_rendition(*attrs)
        self.extra = apply_sgr(self.extra, ";".join(map(str, attrs)))
        self.stamp()

    def stamp(self) -> None:
        blink = self.cursor.attrs.blink
        base = blink[0] if isinstance(blink, tuple) else blink
        pen = self.extra
        kept = (pen.dim, pen.overline, pen.conceal, pen.underline, pen.blink, pen.other)
        self.cursor.attrs = self.cursor.attrs._replace(blink=(base, *kept, self.link))

    def draw(self, data: str) -> None:
        # pyte wraps on a combining mark that follows the last column; terminals add it to
        # the character there.
        for index, char in enumerate(data):
            if self.cursor.x == self.columns and unicodedata.combining(char):
                line = self.buffer[self.cursor.y]
                last = line[self.columns - 1]
                line[self.columns - 1] = last._replace(
                    data=unicodedata.normalize("NFC", last.data + char)
                )
            else:
                super().draw(data[index : index + 1])

    def save_cursor(self) -> None:
        super().save_cursor()
        self.saved.append(self.extra)

    def restore_cursor(self) -> None:
        if self.savepoints:
            self.extra = self.saved.pop()
        super().restore_cursor()
        self.stamp()  # the hyperlink is not part of what is saved

    def reset(self) -> None:
        super().reset()
        self.extra = PLAIN
        self.saved: list[Pen] = []
        self.link = ""


# The end of a chunk that may be a sequence cut in two.
_UNFINISHED = re.compile(r"\x1b(\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[ -/]*)\Z")


class Terminal:
    """A terminal emulator (pyte) to compare screens with."""

    def __init__(self, width: int, height: int) -> None:
        self.screen = _Screen(width, height)
        self.stream = pyte.Stream(self.screen)
        self._decode = codecs.getincrementaldecoder("utf-8")()
        self._carry = ""

    def feed(self, data: str | bytes) -> None:
        text = self._carry + (self._decode.decode(data) if isinstance(data, bytes) else data)
        unfinished = _UNFINISHED.search(text)
        self._carry = unfinished.group() if unfinished else ""
        if unfinished:
            text = text[: unfinished.start()]
        text = _PYTE_UNPARSED.sub("", text)
        position = 0
        for match in _OSC8.finditer(text):
            self.stream.feed(text[position : match.start()])
            _params, _, uri = match[1].partition(";")
            self.screen.link = match[1] if uri else ""
            self.screen.stamp()
            position = match.end()
        self.stream.feed(text[position:])

    def resize(self, width: int, height: int) -> None:
        self.screen.resize(height, width)

    def cells(self) -> list[list[Char]]:
        buffer = self.screen.buffer
        columns = range(self.screen.columns)
        return [[_kept(buffer[y][x]) for x in columns] for y in range(self.screen.lines)]


def _kept(char: Char) -> Char:
    """A cell never touched by attributes has pyte's plain ``blink``; give it the full form."""
    if isinstance(char.blink, tuple):
        return char
    return char._replace(blink=(char.blink, "", "", "", "", "", "", ""))


def assert_same(raw: Terminal, filtered: Terminal, where: str = "") -> None:
    want, got = raw.cells(), filtered.cells()
    for y, (want_row, got_row) in enumerate(zip(want, got, strict=True)):
        if want_row != got_row:
            x = next(i for i, (a, b) in enumerate(zip(want_row, got_row, strict=True)) if a != b)
            raise AssertionError(
                f"{where}: row {y} col {x} differs: raw {want_row[x]} filtered {got_row[x]}\n"
                f"raw:      {_line(want_row)!r}\nfiltered: {_line(got_row)!r}"
            )
    cursor = (raw.screen.cursor.x, raw.screen.cursor.y)
    assert (filtered.screen.cursor.x, filtered.screen.cursor.y) == cursor, f"{where}: cursor"


def _line(row: list[Char]) -> str:
    return "".join(char.data or "·" for char in row)


class Pair:
    """Textual's stream into one terminal, the filter's into another."""

    def __init__(self, width: int, height: int) -> None:
        self.diff = ScreenDiff(width, height)
        self.raw = Terminal(width, height)
        self.filtered = Terminal(width, height)

    def write(self, data: str, *, check: bool = True) -> str:
        out = self.diff.feed(data)
        self.raw.feed(data)
        self.filtered.feed(out)
        if check:
            assert_same(self.raw, self.filtered, f"after {data[:60]!r}")
        return out

    def resize(self, width: int, height: int) -> None:
        self.diff.resize(width, height)
        self.raw.resize(width, height)
        self.filtered.resize(width, height)


def at(row: int, col: int) -> str:
    return f"\x1b[{row + 1};{col + 1}H"


def styled(sgr: str, text: str) -> str:
    """A segment as rich writes it: its attributes, the text, a reset."""
    return f"\x1b[{sgr}m{text}\x1b[0m"


def frame(lines: list[str], *, sync: bool = False) -> str:
    """A full-screen update as Textual's compositor writes it."""
    body = "\n".join(at(y, 0) + line for y, line in enumerate(lines)) + at(0, 0)
    return f"{SYNC_START}{body}{SYNC_END}" if sync else body


def printed(out: str) -> str:
    """The characters an output prints, escape sequences taken out."""
    sequences = r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[ -/]*[0-~])|[\x00-\x1f]"
    return re.sub(sequences, "", out)


# -- hand-written cases ------------------------------------------------------------------------

LINES = ["gpu0  45%  71C", "gpu1  12%  38C", "gpu2   0%  29C"]


def table(lines: list[str], colour: str = "38;2;200;200;200;48;2;10;20;30") -> list[str]:
    return [styled(colour, line) for line in lines]


def test_an_unchanged_frame_costs_nothing() -> None:
    pair = Pair(20, 4)
    first = pair.write(frame(table(LINES), sync=True))
    assert printed(first).count("gpu") == 3
    assert pair.write(frame(table(LINES), sync=True)) == ""
    assert pair.write(frame(table(LINES))) == ""


def test_one_changed_digit_is_a_move_and_one_character() -> None:
    pair = Pair(20, 4)
    pair.write(frame(table(LINES)))
    changed = [*LINES]
    changed[1] = "gpu1  13%  38C"
    out = pair.write(frame(table(changed), sync=True))
    assert printed(out) == "3"
    assert out.startswith(SYNC_START) and out.endswith(SYNC_END)
    assert "\x1b[0m" not in out  # the attributes are those of the cells around it


def test_a_colour_change_alone_rewrites_only_that_cell() -> None:
    pair = Pair(20, 4)
    pair.write(frame(table(LINES)))
    hot = at(0, 11) + styled("38;2;255;0;0;48;2;10;20;30", "7")
    out = pair.write(hot + at(0, 0))
    assert printed(out) == "7"
    assert "38;2;255;0;0" in out


def test_attributes_are_sent_once_per_run_not_per_segment() -> None:
    pair = Pair(30, 2)
    same = "38;2;1;2;3;48;2;4;5;6"
    segments = "".join(styled(same, word) for word in ("alpha", " ", "beta", " ", "gamma"))
    out = pair.write(at(0, 0) + segments)
    assert out.count("38;2;1;2;3") == 1
    assert printed(out) == "alpha beta gamma"


def test_wide_characters() -> None:
    pair = Pair(12, 3)
    pair.write(at(0, 0) + styled("1", "显存 ok 👍 x"))
    assert pair.write(at(0, 0) + styled("1", "显存 ok 👍 x")) == ""
    pair.write(at(0, 0) + styled("1", "内存 ok 👍 y"))
    pair.write(at(0, 1) + "abcdef")
    pair.write(at(0, 1) + "中文中")  # wide over narrow
    pair.write(at(0, 1) + "ab")  # narrow over wide
    pair.write(at(1, 1) + "z")  # narrow over the right half of a wide character
    pair.write(at(0, 2) + "12345")
    pair.write(at(0, 2) + "1中45")  # wide over two narrow, shifting nothing else


def test_combining_characters() -> None:
    pair = Pair(10, 2)
    pair.write(at(0, 0) + "cafe\u0301 x")
    assert pair.write(at(0, 0) + "cafe\u0301 x") == ""
    pair.write(at(0, 0) + "cafe x")
    pair.write(at(0, 0) + "cafe" + styled("1", "\u0301") + " y")


def test_clear_screen_makes_the_next_frame_written_in_full() -> None:
    pair = Pair(20, 4)
    pair.write(frame(table(LINES)))
    pair.write("\x1b[2J")
    out = pair.write(frame(table(LINES)))
    assert printed(out).count("gpu") == 3


def test_resize_makes_the_next_frame_written_in_full() -> None:
    pair = Pair(20, 4)
    pair.write(frame(table(LINES)))
    pair.resize(16, 3)
    out = pair.write(frame(table(LINES)))
    assert printed(out).count("gpu") == 3


def test_alternate_screen_switch_invalidates() -> None:
    pair = Pair(20, 4)
    pair.write(frame(table(LINES)))
    out = pair.write("\x1b[?1049h")
    assert out.endswith("\x1b[?1049h")
    out = pair.write(frame(table(LINES)))
    assert printed(out).count("gpu") == 3


def test_what_it_does_not_follow_passes_through_unchanged() -> None:
    pair = Pair(20, 4)
    modes = (
        "\x1b[?1000h\x1b[?1003h\x1b[?1015h\x1b[?1006h\x1b[?25l\x1b[?1004h\x1b[>11u"
        "\x1b[?2026$p\x1b[?2048$p\x1b[?2004h\x1b[?7l\x1b]52;c;aGk=\x07"
        "\x1b]22;pointer\x07\x07\x1b[2 q"
    )
    assert pair.write(modes) == modes
    pair.write(frame(table(LINES)))
    assert pair.write("\x1b[<u\x1b[?25h") == "\x1b[<u\x1b[?25h"


@pytest.mark.parametrize(
    "foreign",
    [
        "\x1b]0;owned\x07",  # window title
        "\x1b]2;owned\x1b\\",
        "\x1b]4;1;rgb:ff/00/00\x07",  # palette
        "\x1b]9;notify\x07",
        "\x1b]1337;File=inline=1:AAAA\x07",
        "\x1bPq#0;2;0;0;0#0~~\x1b\\",  # sixel (DCS)
        "\x1b_Gf=100;AAAA\x1b\\",  # kitty graphics (APC)
        "\x1b^private\x1b\\",
        "\x1bXstring\x1b\\",
        "\x9b2J",  # 8-bit CSI
        "\x9d0;owned\x9c",  # 8-bit OSC
    ],
)
@pytest.mark.parametrize("bypassed", [False, True])
def test_foreign_sequences_never_reach_the_terminal(foreign: str, bypassed: bool) -> None:
    pair = Pair(20, 4)
    pair.write(frame(table(LINES)))
    if bypassed:  # insert mode: everything else passes through as it came
        pair.write("\x1b[4h")
    out = pair.write(at(1, 0) + "a" + foreign + "b", check=False)  # pyte draws what we drop
    assert foreign not in out and "a" in out and "b" in out
    assert not any(c in out for c in "\x9b\x9c\x9d")
    assert all(s not in out for s in ("\x1b]0;", "\x1b]2;", "\x1b]4;", "\x1b]9;", "\x1bP", "\x1b_"))


def test_an_unfinished_sequence_is_dropped_past_its_bound() -> None:
    pair = Pair(20, 4)
    pair.write(frame(table(LINES)))
    pair.write("\x1b]0;" + "x" * (MAX_SEQUENCE_CHARS + 1), check=False)
    out = pair.write(at(0, 0) + "after", check=False)
    assert "after" in printed(out)


def test_hyperlinks() -> None:
    pair = Pair(30, 2)
    link = "\x1b]8;id=7;https://example.com/gpu0\x1b\\"
    close = "\x1b]8;;\x1b\\"
    pair.write(at(0, 0) + "see " + link + styled("4", "gpu0") + close + " now")
    assert pair.write(at(0, 0) + "see " + link + styled("4", "gpu0") + close + " now") == ""
    out = pair.write(at(0, 0) + "see " + styled("4", "gpu0") + " now")
    assert "\x1b]8;id" not in out and printed(out) == "gpu0"


def test_every_attribute_survives() -> None:
    pair = Pair(40, 2)
    # (pyte reads no colon forms such as 4:3: the parser's own test has them)
    codes = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "21", "53", "38;5;208", "48;5;17"]
    codes += ["31", "92", "41", "103", "1;2", "51", "38;2;0;0;0"]
    pair.write(at(0, 0) + "".join(styled(code, "x") for code in codes))
    pair.write(at(0, 0) + "".join(styled(code, "x") for code in reversed(codes)))
    # Piled up without resets (pyte knows neither 6 nor 21, which replace 5 and 4 elsewhere).
    piled = [code for code in codes if code not in ("6", "21")]
    pair.write(at(0, 0) + "".join(f"\x1b[{code}mx" for code in piled) + "\x1b[0m")
    pair.write(at(1, 0) + "\x1b[1;2mab\x1b[22;2mcd\x1b[22mef\x1b[1mgh\x1b[0m")


def test_line_feeds_scrolling_and_wrapping() -> None:
    pair = Pair(8, 3)
    pair.write(frame(["aaaaaaaa", "bbbbbbbb", "cccccccc"]))
    pair.write(at(2, 0) + "\n" + at(0, 0) + "x")  # a line feed on the last line scrolls
    pair.write(frame(["aaaaaaaa", "bbbbbbbb", "cccccccc"]))
    pair.write(at(1, 6) + "0123456")  # autowrap on: onto the next line
    pair.write(at(2, 6) + "0123456")  # and past the bottom: the screen scrolls
    pair.write(at(0, 0) + "\r\n\ty\x08z\x0b")
    pair.write("\x1b[?7l" + at(0, 5) + "0123456" + at(0, 0))  # autowrap off: the last column
    pair.write(frame(["aaaaaaaa", "bbbbbbbb", "cccccccc"]))


def test_relative_cursor_moves() -> None:
    pair = Pair(10, 4)
    pair.write(frame(["0123456789"] * 4))
    pair.write(at(1, 1) + "\x1b[2Ca\x1b[Bb\x1b[3Dc\x1b[Ad\x1b[5Ge\x1b[3df\x1b[Eg\x1b[2Fh\x1b[2`i")
    pair.write("\x1b[9;9Hj\x1b[99Ck")


def test_erasing_scrolling_and_insert_mode() -> None:
    pair = Pair(10, 4)
    lines = ["0123456789"] * 4
    for sequence in (
        "\x1b[K",
        "\x1b[1J",
        "\x1b[2X",
        "\x1b[2P",
        "\x1b[3@",
        "\x1b[L",
        "\x1b[M",
        "\x1b[S",
        "\x1b[T",
        "\x1bM",
        "\x1bD",
        "\x1bE",
        "\x1b#8",
    ):
        pair.write(frame(lines))
        pair.write(at(1, 3) + "\x1b[44m" + sequence + "xy\x1b[0m")
        pair.write(frame(lines))
    pair.write(at(1, 3) + "\x1b[4hxy" + at(2, 3) + "zz\x1b[4l" + at(3, 3) + "w")
    pair.write(frame(lines))


def test_margins_and_origin_mode() -> None:
    pair = Pair(10, 5)
    lines = ["abcdefghij"] * 5
    pair.write(frame(lines))
    pair.write("\x1b[2;4r\x1b[?6h" + at(0, 0) + "X\n\n\n\nY" + "\x1b[?6l\x1b[r" + at(0, 0) + "Z")
    pair.write(frame(lines))


def test_save_restore_and_reset() -> None:
    pair = Pair(10, 3)
    pair.write(frame(["abcdefghij"] * 3))
    pair.write(at(1, 2) + "\x1b[1;31m\x1b7" + at(0, 0) + "\x1b[0mx\x1b8y\x1b[0m")
    pair.write(at(2, 2) + "\x1b[32m\x1b[s" + at(0, 0) + "\x1b[0mx\x1b[uy\x1b[0m")
    pair.write(frame(["abcdefghij"] * 3))
    pair.write("\x1bc")
    pair.write(frame(["abcdefghij"] * 3))


def test_sequences_cut_between_writes() -> None:
    pair = Pair(20, 4)
    whole = frame(table(LINES), sync=True)
    changed = frame(table([*LINES[:2], "gpu2  99%  90C"]), sync=True)
    for cut in range(1, len(changed)):
        pair.write(whole)
        pair.write(changed[:cut], check=False)
        pair.write(changed[cut:])


# Sequences that a frame may hold besides text, for the random streams: moves, line feeds,
# erasing, scrolling, margins, modes, saved cursors, screens, hyperlinks, tabs.
EVERYTHING = (
    "\n",
    "\r",
    "\x08",
    "\t",
    "\x1b[2J",
    "\x1b[K",
    "\x1b[2A",
    "\x1b[3C",
    "\x1b[?7h",
    "\x1b[?7l",
    "\x1b[3;5r",
    "\x1b[r",
    "\x1b[4h",
    "\x1b[4l",
    "\x1b7",
    "\x1b8",
    "\x1b[?1049h",
    "\x1bM",
    "\x1b[S",
    "\x1b]8;id=1;https://example.com\x1b\\",
    "\x1b]8;;\x1b\\",
)


def random_stream(seed: int, *, everything: bool) -> Pair:
    """Random frames through the filter, checked after every write; ``everything`` adds lines
    that overflow and the sequences above to what Textual writes (text placed to fit)."""
    rng = random.Random(seed)
    width, height = rng.randint(3, 20), rng.randint(2, 8)
    pair = Pair(width, height)
    alphabet = "abc 01%|─█▁中文👍é\u0301"
    styles = ["", "1", "2;3", "7", "38;5;208", "38;2;9;9;9;48;2;200;0;0", "4", "9;53", "5", "21"]
    for _ in range(150):
        parts: list[str] = [SYNC_START] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 6)):
            if everything and rng.random() < 0.15:
                parts.append(rng.choice(EVERYTHING))
                continue
            row, col = rng.randrange(height), rng.randrange(width)
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
            while not everything and cell_len(text) > width - col:
                text = text[:-1]
            style = rng.choice(styles)
            parts.append(at(row, col) + (styled(style, text) if style else text))
        if rng.random() < 0.7:
            parts.append(at(rng.randrange(height), rng.randrange(width)))
        if parts and parts[0] == SYNC_START:
            parts.append(SYNC_END)
        data = "".join(parts)
        if data and rng.random() < 0.3:  # cut anywhere, even inside a sequence
            cut = rng.randrange(len(data))
            pair.write(data[:cut], check=False)
            pair.write(data[cut:])
        else:
            pair.write(data)
    return pair


@pytest.mark.parametrize("seed", range(12))
def test_random_frames(seed: int) -> None:
    random_stream(seed, everything=False)


@pytest.mark.parametrize("seed", range(12))
def test_random_streams_with_everything(seed: int) -> None:
    random_stream(1000 + seed, everything=True)


# -- pieces ------------------------------------------------------------------------------------


def test_sgr_parsing() -> None:
    pen = apply_sgr(PLAIN, "1;38;2;1;2;3;48;5;17;4:3")
    assert (pen.bold, pen.fg, pen.bg, pen.underline) == ("1", "38;2;1;2;3", "48;5;17", "4:3")
    assert apply_sgr(pen, "0") == PLAIN
    assert apply_sgr(pen, "22;39").bold == "" and apply_sgr(pen, "39").fg == ""
    assert apply_sgr(PLAIN, "38;5").other == "38;5"  # malformed: kept as it came


def test_sgr_changes_are_short() -> None:
    bold_red = apply_sgr(PLAIN, "1;31")
    assert sgr_change(bold_red, apply_sgr(PLAIN, "1;32")) == "\x1b[32m"
    assert sgr_change(bold_red, PLAIN) == "\x1b[0m"
    assert sgr_change(None, bold_red) == "\x1b[0;1;31m"
    assert sgr_change(apply_sgr(PLAIN, "1;2;31"), apply_sgr(PLAIN, "2;31")) == "\x1b[22;2m"
    assert sgr_change(apply_sgr(PLAIN, "1;2"), apply_sgr(PLAIN, "2")) == "\x1b[0;2m"
    assert sgr_change(bold_red, bold_red) == ""


def test_the_console_uses_the_filter_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert console_driver(LinuxDriver) is DiffDriver
    monkeypatch.setenv(PLAIN_OUTPUT_ENV, "1")
    assert console_driver(LinuxDriver) is LinuxDriver


async def test_headless_runs_keep_textuals_driver(make_app) -> None:  # type: ignore[no-untyped-def]
    app: GpuConsoleApp = make_app()
    assert app.driver_class is DiffDriver
    async with app.run_test():
        assert not isinstance(app._driver, DiffDriver)


# -- the console itself ------------------------------------------------------------------------

RECORDER = '''
import json, os, time
from gpuconsole.ui.terminal.driver import DiffDriver

class RecordingDriver(DiffDriver):
    """Logs what Textual writes, and each size it is told, before the filter sees them."""

    def _log(self, record):
        if not hasattr(self, "_record"):
            self._record = open(os.environ["GPUCONSOLE_TEST_RECORD"], "a", encoding="utf-8")
        self._record.write(json.dumps({"t": time.monotonic(), **record}) + "\\n")
        self._record.flush()

    def write(self, data):
        self._log({"data": data})
        super().write(data)

    def _note_size(self, size):
        self._log({"size": list(size)})
        super()._note_size(size)
'''


XDG_DIRS = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")


@dataclass
class Recording:
    """A run of ``gpuconsole --demo`` in a pseudo-terminal."""

    size: tuple[int, int]
    records: list[dict[str, object]]
    """What Textual wrote (``data``) and the sizes it was told (``size``), in order, timed."""
    output: list[tuple[float, bytes]]
    """What reached the terminal (through the real driver), timed."""
    events: dict[str, float] = field(default_factory=dict)
    """When each key was pressed and each resize made."""


def _record_console(tmp: Path) -> Recording:
    (tmp / "console_recorder.py").write_text(RECORDER)
    log = tmp / "writes.jsonl"
    width, height = 120, 36
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
    env = {
        **os.environ,
        "TERM": "xterm-256color",
        "COLORTERM": "truecolor",
        "LANG": "C.UTF-8",
        "TEXTUAL_DRIVER": "console_recorder:RecordingDriver",
        "GPUCONSOLE_TEST_RECORD": str(log),
        "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)]),
        # (module-scoped: the autouse fixture that keeps config discovery away is not in force)
        **{name: str(tmp / name.lower()) for name in XDG_DIRS},
    }
    env.pop("NO_COLOR", None)
    env.pop(PLAIN_OUTPUT_ENV, None)
    child = subprocess.Popen(
        [*GPUCONSOLE, "--demo"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    os.close(slave)
    output: list[tuple[float, bytes]] = []
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([master], [], [], 0.05)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            output.append((time.monotonic(), chunk))
            if b"\x1b[?2026$p" in chunk:  # a terminal that has synchronized output
                os.write(master, b"\x1b[?2026;2$y")

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    events: dict[str, float] = {}

    def press(name: str, key: bytes, wait: float) -> None:
        events[name] = time.monotonic()
        os.write(master, key)
        time.sleep(wait)

    def resize(name: str, columns: int, rows: int, wait: float) -> None:
        events[name] = time.monotonic()
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        child.send_signal(signal.SIGWINCH)
        time.sleep(wait)

    try:
        deadline = time.monotonic() + 60
        while b"gpuconsole" not in b"".join(c for _, c in output):
            assert child.poll() is None and time.monotonic() < deadline, "no first frame"
            time.sleep(0.1)
        time.sleep(1.0)
        press("host", b"\r", 4.0)
        press("help", b"?", 1.5)
        press("back", b"\x1b", 1.5)
        resize("small", 100, 30, 2.0)
        press("fleet", b"\x1b", 1.5)
        resize("large", 132, 40, 2.0)
        press("quit", b"q", 0.0)
        child.wait(30)
        time.sleep(0.3)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        stop.set()
        reader.join(2)
        os.close(master)
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").split("\n") if line]
    return Recording((width, height), records, output, events)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return _record_console(tmp_path_factory.mktemp("console"))


def test_recorded_console_looks_the_same_after_every_write(recording: Recording) -> None:
    """Textual's real output (fleet, a host, help, back, two resizes) against the filter's."""
    pair = Pair(*recording.size)
    for record in recording.records:
        if "size" in record:
            pair.resize(*record["size"])  # type: ignore[misc]
        else:
            pair.write(str(record["data"]))
    assert "gpu" in pair.raw.screen.display[0] + "".join(pair.raw.screen.display)


def test_the_driver_on_a_terminal_shows_what_textual_drew(recording: Recording) -> None:
    """What reached the pseudo-terminal through the real driver ends as Textual's own stream
    does (resized at the same points: before each resize's full repaint)."""
    raw = Terminal(*recording.size)
    for record in recording.records:
        if "size" in record:
            raw.resize(*record["size"])  # type: ignore[misc]
        else:
            raw.feed(str(record["data"]))
    shown = Terminal(*recording.size)
    resizes = sorted(
        (recording.events[name], size)
        for name, size in (("small", (100, 30)), ("large", (132, 40)))
    )
    for when, chunk in recording.output:
        while resizes and resizes[0][0] <= when:
            shown.resize(*resizes.pop(0)[1])
        shown.feed(chunk)
    assert_same(raw, shown, "at exit")


def test_the_host_screen_costs_a_fraction_of_the_bytes(recording: Recording) -> None:
    """Steady state on a host's screen (its first full paint excluded)."""
    begin, end = recording.events["host"] + 1.5, recording.events["help"]
    diff = ScreenDiff(*recording.size)
    raw = filtered = 0
    for record in recording.records:
        if "size" in record:
            continue
        data = str(record["data"])
        out = diff.feed(data)
        if begin <= float(record["t"]) < end:  # type: ignore[arg-type]
            raw += len(data.encode())
            filtered += len(out.encode())
    assert raw > 2000, "the host screen did not update while it was measured"
    assert filtered * 5 < raw, (raw, filtered)


async def test_the_driver_starts_afresh_after_a_resize_and_outlives_a_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # no handlers in the test process
    monkeypatch.setattr(LinuxDriver, "_get_terminal_size", lambda _: (20, 4))
    logged: list[str] = []

    async def post(_: object) -> bool:
        return True

    app = SimpleNamespace(log=SimpleNamespace(error=logged.append), _post_message=post)
    driver = DiffDriver(app)  # type: ignore[arg-type]
    written: list[str] = []
    driver._writer_thread = SimpleNamespace(write=written.append)  # type: ignore[assignment]
    page = frame(table(LINES))
    driver._get_terminal_size()  # what SIGWINCH does
    driver.write(page)
    driver.write(page)
    assert len(written) == 1 and printed(written[0]).count("gpu") == 3
    driver.process_message(events.Resize(Size(20, 4), Size(20, 4)))  # an in-band report
    driver.write(page)
    assert len(written) == 2 and printed(written[1]).count("gpu") == 3

    def fault(*_: object) -> str:
        raise ValueError("a bug")

    monkeypatch.setattr(ScreenDiff, "feed", fault)
    driver.write(page)
    assert written[-1] == "\x1b[0m\x1b]8;;\x1b\\" + page and logged
    driver.write(page)
    assert written[-1] == page


async def test_forgetting_the_screen_writes_the_next_frame_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What Ctrl+L does: a frame the terminal already shows is written again, whole."""
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    monkeypatch.setattr(LinuxDriver, "_get_terminal_size", lambda _: (20, 4))
    app = SimpleNamespace(log=SimpleNamespace(error=print))
    driver = DiffDriver(app)  # type: ignore[arg-type]
    written: list[str] = []
    driver._writer_thread = SimpleNamespace(write=written.append)  # type: ignore[assignment]
    page = frame(table(LINES))
    driver.write(page)
    driver.write(page)
    assert len(written) == 1
    driver.forget_screen()
    driver.write(page)
    assert len(written) == 2 and printed(written[1]).count("gpu") == 3
    driver.write(page)
    assert len(written) == 2  # and then only changes again


async def test_ctrl_l_repaints_the_screen(make_app) -> None:  # type: ignore[no-untyped-def]
    app: GpuConsoleApp = make_app()
    async with app.run_test() as pilot:
        await pilot.pause()
        painted: list[bool] = []
        refresh = app.screen.refresh

        def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
            painted.append(kwargs.get("repaint", True))
            return refresh(*args, **kwargs)

        app.screen.refresh = recording  # type: ignore[method-assign]
        await pilot.press("ctrl+l")
        assert painted == [True]
