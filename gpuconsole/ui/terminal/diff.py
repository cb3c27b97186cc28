"""A shadow of the terminal's screen that turns Textual's output into the bytes that change it.

`ScreenDiff.feed` takes exactly what Textual writes and returns what to send instead. It follows
the stream as a terminal would (cursor, attributes, hyperlink) and compares every character it
is asked to print with the cell it would land on. Equal cells are skipped; changed ones are
written with the cheapest cursor move from where the terminal's cursor is, and attributes are
sent only where they differ from the terminal's current ones. A frame that changes nothing costs
nothing, not even its synchronized-output markers.

The invariant: the terminal shows what it would have shown had it received Textual's stream.
Cells are either known (their character and attributes) or unknown; an unknown cell is always
written. What the model does not follow passes through unchanged; if it may change the screen
or move the cursor (clearing, scrolling, margins, an alternate-screen switch, anything not
recognised) the terminal is first put in the state the raw stream would have it in, every cell
becomes unknown, and the cursor is taken to be wherever the raw stream would have left it ("lost")
until the next absolute cursor position. Modes that change what printing or positioning mean
(insert, origin, margins, character sets, unknown private modes), and a restored cursor whose
attributes differ by terminal, make everything pass through unchanged until they end.
Where terminals disagree (a wide character in the last column, a move from past the last
column), the filter does exactly what the stream did and then assumes nothing.
"""

from __future__ import annotations

import re
from functools import lru_cache

from rich.cells import cell_len, get_character_cell_size

from gpuconsole.ui.terminal.sgr import PLAIN, Pen, apply_sgr, sgr_change
from gpuconsole.ui.terminal.tokens import scan

Style = tuple[Pen, str]
"""A cell's attributes and its hyperlink ("params;uri" of OSC 8; "" for none)."""
Cell = tuple[str, Style]
"""A cell's text ("" for the right half of a wide character) and style."""

SYNC_START = "\x1b[?2026h"
SYNC_END = "\x1b[?2026l"

# Private modes that change nothing on the screen nor where the cursor is: cursor keys, cursor
# blink and visibility, mouse reporting, focus events, bracketed paste, synchronized output,
# in-band resize reports.
_HARMLESS_MODES = frozenset(
    {1, 9, 12, 25, 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1015, 1016, 2004, 2026, 2048}
)
# Alternate screens and the cursor saves that go with them: the screen changes under us.
_SCREEN_MODES = frozenset({47, 1047, 1048, 1049})
# Relative and one-coordinate cursor movements (CSI n A ... CSI n e).
_MOVES = frozenset("ABCDEFG`ade")
_DIGITS = re.compile(r"\d*")
# The operating-system commands Textual itself writes: hyperlinks (8), the pointer's shape (22)
# and the clipboard (52, only on `App.copy_to_clipboard`). Any other OSC, every DCS, APC, PM and
# SOS string and every 8-bit control is dropped: none is the console's, so none reaches the
# terminal, whatever a watched host managed to put on the screen.
_OWN_OSC = frozenset({"8", "22", "52"})
MAX_SEQUENCE_CHARS = 1 << 16
"""An escape sequence still unfinished after this many characters is dropped."""


class ScreenDiff:
    """The screen as the terminal shows it, and what to send to make it show the next frame."""

    def __init__(self, width: int, height: int) -> None:
        self.width = width
        self.height = height
        self._rows: list[list[Cell | None]] = []
        self._blank = False
        self._carry = ""
        self._out: list[str] = []
        self._held_sync = False
        # What the stream has asked for: cursor, pen, link and modes.
        self._row = 0
        self._col = 0
        """Column ``width`` means the last column was just written (the wrap is pending)."""
        self._feeds = ""
        """Line feeds not yet written: they only move the cursor unless something needs them."""
        self._lost = True
        self._pen = PLAIN
        self._link = ""
        self._style: Style = (PLAIN, "")
        self._saved: tuple[Pen, bool] | None = None
        """The pen and origin mode saved with the cursor (ESC 7); restoring without a save
        differs by terminal."""
        self._autowrap: bool | None = True
        """None: not known (a restored cursor may have brought its own)."""
        self._bypass: set[str] = set()
        """Why everything passes through as it came (insert mode, margins...); empty: it does
        not."""
        self._muted = False
        # What the terminal has: cursor (None: unknown), pen (None: unknown), link.
        self._trow: int | None = None
        self._tcol: int | None = None
        self._tpen: Pen | None = None
        self._tlink = ""
        self._invalidate()

    def feed(self, data: str) -> str:
        """What to write to the terminal in place of ``data``."""
        if self._carry:
            data, self._carry = self._carry + data, ""
        for token in scan(data):
            if token.lastgroup == "partial":  # the rest of the sequence comes with the next write
                # Bounded: a sequence never ended would otherwise hold back the screen for good.
                self._carry = token.group() if len(token.group()) <= MAX_SEQUENCE_CHARS else ""
            elif not _own(token):
                continue
            elif self._bypass:
                # Everything as it came; the model only follows the pen, the link and the
                # modes, to know when this ends.
                self._emit(token.group())
                self._muted = True
                try:
                    self._token(token)
                finally:
                    self._muted = False
                if not self._bypass:
                    self._tpen, self._tlink = self._pen, self._link
            else:
                self._token(token)
        self._park()
        out = "".join(self._out)
        self._out.clear()
        return out

    def _token(self, token: re.Match[str]) -> None:
        kind = token.lastgroup
        if kind == "text":
            self._text(token.group())
        elif kind == "csi":
            self._csi(token)
        elif kind == "osc":
            self._osc(token)
        elif kind == "control":
            self._control(token.group())
        else:  # esc: DCS, APC, PM and SOS strings never get here (see `_own`)
            self._esc(token.group())

    def resize(self, width: int, height: int) -> None:
        """The terminal changed size: what it shows, and where its cursor is, are unknown."""
        self.width = width
        self.height = height
        self._feeds = ""
        self._blank = False
        self._invalidate()
        self._go_lost()

    # -- printing ----------------------------------------------------------------------------

    def _text(self, text: str) -> None:
        if self._lost or self._feeds:
            self._raw_text(text)
            return
        clusters = _clusters(text)
        if clusters is None and self._col + len(text) <= self.width:
            self._put_narrow(text)
            return
        for cluster, cells in clusters or tuple((char, 1) for char in text):
            self._put(cluster, cells)

    def _put_narrow(self, text: str) -> None:
        """Characters of one cell each, all on the cursor's line (the common case)."""
        r, c = self._row, self._col
        end = c + len(text)
        self._col = end
        style = self._style
        row = self._rows[r]
        new = [(char, style) for char in text]
        if row[c:end] == new:
            return
        self._cut_wide(row, c, end)
        self._blank = False
        index = 0
        count = len(text)
        while index < count:
            if row[c + index] == new[index]:
                index += 1
                continue
            stop = index + 1
            while stop < count and row[c + stop] != new[stop]:
                stop += 1
            self._move(r, c + index)
            self._use(style)
            self._emit(text[index:stop])
            row[c + index : c + stop] = new[index:stop]
            self._advance(r, c + stop)
            index = stop

    def _put(self, cluster: str, cells: int) -> None:
        """One character (with what combines with it) taking ``cells`` cells."""
        if self._lost:
            self._raw_text(cluster)
            return
        if cells == 0:
            self._combine(cluster)
            return
        if self._col >= self.width:
            if self._autowrap is None:
                self._unsure(cluster)
                return
            if not self._autowrap and cells == 1:
                self._col = self.width - 1  # without autowrap it overwrites the last column
            elif not self._autowrap:
                self._unsure(cluster)
                return
            else:
                if self._row < self.height - 1:
                    self._row += 1
                else:
                    self._scroll_for_wrap()
                self._col = 0
        r, c = self._row, self._col
        if c + cells > self.width:  # a wide character in the last column: terminals differ
            self._unsure(cluster)
            return
        style = self._style
        row = self._rows[r]
        new: list[Cell | None] = [(cluster, style)]
        if cells == 2:
            new.append(("", style))
        self._col = c + cells
        if row[c : c + cells] == new:
            return
        self._cut_wide(row, c, c + cells)
        self._blank = False
        self._move(r, c)
        self._use(style)
        self._emit(cluster)
        row[c : c + cells] = new
        if len(cluster) == 1:
            self._advance(r, c + cells)
        else:  # terminals disagree on the width of some sequences: position the next one
            self._trow = self._tcol = None

    def _cut_wide(self, row: list[Cell | None], start: int, end: int) -> None:
        """Writing over one half of a wide character blanks the other half (on most terminals):
        forget the halves left outside ``start:end``."""
        first = row[start]
        if first is not None and first[0] == "" and start > 0:
            row[start - 1] = None
        if end < self.width:
            after = row[end]
            if after is not None and after[0] == "":
                row[end] = None

    def _combine(self, mark: str) -> None:
        """A combining character at the start of a piece of text joins the character before
        the cursor; terminals disagree on which that is next to a wide character, so it is
        written where the raw stream would write it and that character is forgotten."""
        col = self._col
        if not 0 < col < self.width:
            self._unsure(mark)
            return
        self._settle()
        self._emit(mark)
        row = self._rows[self._row]
        before = row[col - 1]
        row[col - 1] = None
        if before is not None and before[0] == "":
            row[col - 2] = None
        self._trow = self._tcol = None

    def _raw_text(self, text: str) -> None:
        """Text whose position is not known: written as it came, where the raw stream would
        have it; it may land anywhere."""
        self._settle()
        self._emit(text)
        self._invalidate()

    def _unsure(self, text: str) -> None:
        """Text whose effect terminals do not agree on: the terminal does what it would have
        done with the raw stream, and nothing about the screen is assumed afterwards."""
        self._settle()
        self._emit(text)
        self._invalidate()
        self._go_lost()

    def _scroll_for_wrap(self) -> None:
        """Printing past the bottom-right corner with autowrap on scrolls the screen up."""
        if self._trow != self.height - 1:
            self._move(self.height - 1, 0)
        self._use(self._style)  # the new line takes the background colour
        self._emit("\r\n")
        self._rows.pop(0)
        self._rows.append([None] * self.width)
        self._trow, self._tcol = self.height - 1, 0

    # -- control characters and sequences -----------------------------------------------------

    def _control(self, char: str) -> None:
        if char in "\n\x0b\x0c":
            self._line_feed(char)
        elif char == "\r":
            if self._lost:
                self._emit(char)
            else:
                self._feeds = ""  # the line feeds before it only moved the cursor down
                self._col = 0
        elif char == "\b":
            if self._feeds or self._col >= self.width:  # after the last column, terminals differ
                self._settle()
                self._go_lost()
            if self._lost:
                self._emit(char)
            else:
                self._col = max(self._col - 1, 0)
        elif char == "\t":
            self._settle()
            self._emit(char)
            self._go_lost()  # where it stops depends on the tab stops
        elif char == "\x0e":  # shift out: another character set until shift in
            self._bypass.add("shift")
            self._opaque(char)
        elif char == "\x0f":
            self._bypass.discard("shift")
            self._emit(char)
        elif "\x00" <= char < "\x1b" or "\x1b" < char < "\x20" or char == "\x7f":
            self._emit(char)  # the bell and others that print nothing
        else:  # an escape that starts nothing valid
            self._opaque(char)

    def _line_feed(self, char: str) -> None:
        if self._lost:
            self._use(self._style)
            self._emit(char)
            self._invalidate()  # it may have scrolled the screen
        elif self._row < self.height - 1:
            self._feeds += char
            self._row += 1
        elif self._feeds:
            self._settle()
            self._line_feed(char)
        else:  # on the last line: the screen scrolls up, the new line takes the background
            self._settle()
            self._emit(char)
            self._rows.pop(0)
            self._rows.append([None] * self.width)
            self._go_lost()  # its column depends on the tty (onlcr)

    def _csi(self, token: re.Match[str]) -> None:
        raw = token.group()
        params, inter, final = token["params"], token["inter"], token["final"]
        prefix = params[:1]
        if prefix == "?":
            self._private(raw, params[1:], inter, final)
        elif prefix in ("<", "=", ">"):
            self._emit(raw)  # keyboard protocol, device attributes, key modifiers
        elif inter:
            if inter == "!" and final == "p":  # soft reset
                self._bypass -= {"?6", "margins", "insert", "charset"}
                self._autowrap = None  # reset by some terminals, kept by others
                self._saved = None
                self._pen = PLAIN
                self._style = (PLAIN, self._link)
                self._opaque(raw)
            elif inter in (" ", "$") and final in "qp":  # cursor style, mode report
                self._emit(raw)
            else:
                self._opaque(raw)
        elif final == "m":
            if "pen" in self._bypass and params.split(";")[0] in ("", "0"):
                self._bypass.discard("pen")  # known again from a reset on
            self._pen = apply_sgr(self._pen, params)
            self._style = (self._pen, self._link)
        elif final in "Hf":
            self._position(raw, params)
        elif final in _MOVES:
            self._relative(raw, params, final)
        elif final in "hl":
            self._ansi_modes(raw, params, final == "h")
        elif final == "r":
            if params in ("", f"1;{self.height}"):
                self._bypass.discard("margins")
            else:
                self._bypass.add("margins")
            self._opaque(raw)
        elif final == "n" and params == "6":  # the terminal reports where its cursor is
            self._settle()
            self._emit(raw)
        elif final in "cgn":  # device attributes, tab stops, status report
            self._emit(raw)
        elif final == "s" and not params:
            self._save(raw)
        elif final == "u" and not params:
            self._restore(raw)
        else:  # erase, insert, delete, scroll, repeat, window operations...
            self._opaque(raw)

    def _position(self, raw: str, params: str) -> None:
        if self._bypass:
            self._emit(raw)
            return
        parts = params.split(";")
        if len(parts) > 2 or not all(_DIGITS.fullmatch(part) for part in parts):
            self._opaque(raw)
            return
        row = max(int(parts[0] or 1), 1)
        col = max(int(parts[1] or 1), 1) if len(parts) > 1 else 1
        if row > self.height or col > self.width:
            self._opaque(raw)  # beyond the screen as we know it: its size changed
            return
        self._lost = False
        self._feeds = ""
        self._row, self._col = row - 1, col - 1

    def _relative(self, raw: str, params: str, final: str) -> None:
        if not params.isdigit() and params:
            self._opaque(raw)
            return
        if self._lost:
            self._emit(raw)
            return
        if final not in "G`" and (self._feeds or self._col >= self.width):
            # After line feeds (the column is the tty's) or past the last column (terminals
            # differ): as the stream goes.
            self._settle()
            self._emit(raw)
            self._go_lost()
            return
        count = max(int(params or 1), 1)
        last_row, last_col = self.height - 1, self.width - 1
        row, col = self._row, min(self._col, last_col)
        if final == "A":
            row = max(row - count, 0)
        elif final in "Be":
            row = min(row + count, last_row)
        elif final in "Ca":
            col = min(col + count, last_col)
        elif final == "D":
            col = max(col - count, 0)
        elif final == "E":
            row, col = min(row + count, last_row), 0
        elif final == "F":
            row, col = max(row - count, 0), 0
        elif final in "G`":
            col = min(count, self.width) - 1
        else:  # d
            row = min(count, self.height) - 1
        self._feeds = ""
        self._row, self._col = row, col

    def _private(self, raw: str, params: str, inter: str, final: str) -> None:
        if raw == SYNC_START and not self._muted:
            self._held_sync = True  # sent with the first byte of the frame, if there is one
            return
        if raw == SYNC_END:
            if self._held_sync:  # nothing changed since the start marker
                self._held_sync = False
                return
            self._park()
        if (inter, final) in (("$", "p"), ("", "u")):  # mode report, keyboard protocol query
            self._emit(raw)
            return
        if (inter, final) == ("", "n"):
            self._settle()  # a status report may be the cursor position
            self._emit(raw)
            return
        parts = params.split(";")
        if inter or final not in "hl" or not all(part.isdigit() for part in parts):
            self._opaque(raw)
            return
        on = final == "h"
        opaque = restores = False
        for mode in map(int, parts):
            if mode in _HARMLESS_MODES:
                continue
            if mode == 7:
                self._autowrap = on
            elif mode in _SCREEN_MODES:
                opaque = True
                restores = restores or (mode in (1048, 1049) and not on)
            else:  # origin mode, margins, column mode...: what positions mean changes
                if on:
                    self._bypass.add(f"?{mode}")
                else:
                    self._bypass.discard(f"?{mode}")
                opaque = True
        if opaque:
            self._opaque(raw)
            # These save and restore the cursor with its pen, or do not, depending on the
            # terminal: the pen is known again at the next reset.
            self._saved = None
            if restores:
                self._bypass.add("pen")
        else:
            self._emit(raw)

    def _ansi_modes(self, raw: str, params: str, on: bool) -> None:
        parts = params.split(";")
        if not all(part.isdigit() for part in parts):
            self._opaque(raw)
            return
        modes = set(map(int, parts))
        if modes <= {2, 12, 20}:  # keyboard lock, local echo, new line: nothing on screen
            self._emit(raw)
            return
        if 4 in modes:  # insert mode: printing shifts what is right of the cursor
            if on:
                self._bypass.add("insert")
            else:
                self._bypass.discard("insert")
        self._opaque(raw)

    def _osc(self, token: re.Match[str]) -> None:
        body = token["body"]
        if body.startswith("8;"):
            _params, _, uri = body[2:].partition(";")
            self._link = body[2:] if uri else ""
            self._style = (self._pen, self._link)
        else:
            self._emit(token.group())  # titles, clipboard, pointer shape, colours

    def _esc(self, raw: str) -> None:
        inter, final = raw[1:-1], raw[-1]
        if inter == "(":
            if final == "B":
                self._bypass.discard("charset")
                self._emit(raw)
            else:
                self._bypass.add("charset")
                self._opaque(raw)
        elif inter in (")", "*", "+", "-", ".", "/", "%") or (not inter and final in "=>H\\"):
            self._emit(raw)  # other character sets, keypad modes, tab stops, string end
        elif not inter and final == "7":
            self._save(raw)
        elif not inter and final == "8":
            self._restore(raw)
        elif not inter and final == "c":
            self._reset(raw)
        else:  # index, reverse index, next line, alignment test, double-size lines...
            self._opaque(raw)

    def _save(self, raw: str) -> None:
        self._settle()
        self._emit(raw)
        self._saved = (self._pen, "?6" in self._bypass)

    def _restore(self, raw: str) -> None:
        self._feeds = ""
        self._use(self._style)  # kept by terminals that had nothing saved
        self._emit(raw)
        self._go_lost()
        self._autowrap = None  # restored on some terminals, not on others
        if self._saved is None:
            self._bypass.add("pen")
            return
        self._pen, origin = self._saved
        self._tpen = self._pen
        self._style = (self._pen, self._link)
        if origin:
            self._bypass.add("?6")
        self._saved = None  # some terminals restore a save only once

    def _reset(self, raw: str) -> None:
        self._emit(raw)
        self._invalidate()
        self._go_lost()
        self._feeds = ""
        self._pen = self._tpen = PLAIN
        self._saved = None
        self._link = self._tlink = ""
        self._style = (PLAIN, "")
        self._autowrap = True
        self._bypass.clear()

    def _opaque(self, raw: str) -> None:
        """A sequence whose effect is not modelled, written in the state the raw stream would
        have the terminal in; afterwards neither the screen nor the cursor is assumed."""
        self._settle()
        self._emit(raw)
        self._invalidate()
        self._go_lost()
        self._tpen = None

    # -- the terminal's state -----------------------------------------------------------------

    def _settle(self) -> None:
        """Put the terminal's cursor, pen and link where the raw stream would have them."""
        if self._feeds:
            self._reach(self._row - len(self._feeds), self._col)
            self._emit(self._feeds)
            self._feeds = ""
            self._go_lost()
        elif not self._lost:
            self._reach(self._row, self._col)
        self._use(self._style)

    def _park(self) -> None:
        """At the end of a write, leave the cursor where the stream left it (input methods
        place their window there)."""
        if self._feeds:
            self._settle()
        elif not self._lost:
            self._reach(self._row, self._col)

    def _reach(self, row: int, col: int) -> None:
        """Move the terminal's cursor to ``row``, ``col``. If that is past the last column
        (waiting to wrap), print the last cell again: no move leaves a terminal in that state,
        and what comes next (an erase, a line feed) may depend on it."""
        if col < self.width:
            self._move(row, col)
            return
        if (self._trow, self._tcol) == (row, col):
            return
        cells = self._rows[row]
        start = col - 1
        if start > 0 and cells[start] is not None and cells[start][0] == "":  # type: ignore[index]
            start -= 1
        last = cells[start]
        if last is None:  # not known (cannot happen after printing): the nearest cell
            self._move(row, col - 1)
            return
        self._move(row, start)
        self._use(last[1])
        self._emit(last[0])
        self._trow, self._tcol = row, col

    def _go_lost(self) -> None:
        self._lost = True
        self._trow = self._tcol = None

    def _invalidate(self) -> None:
        if not self._blank:
            self._rows = [[None] * self.width for _ in range(self.height)]
            self._blank = True

    def _emit(self, text: str) -> None:
        if self._muted:
            return
        if self._held_sync:
            self._out.append(SYNC_START)
            self._held_sync = False
        self._out.append(text)

    def _advance(self, row: int, col: int) -> None:
        """The terminal's cursor after printing up to ``col``; at ``width`` it waits to wrap,
        a state that only an absolute move leaves the same way on every terminal."""
        self._trow, self._tcol = row, col

    def _use(self, style: Style) -> None:
        pen, link = style
        if link != self._tlink:
            self._emit(f"\x1b]8;{link}\x1b\\" if link else "\x1b]8;;\x1b\\")
            self._tlink = link
        if pen != self._tpen:
            self._emit(sgr_change(self._tpen, pen))
            self._tpen = pen

    def _move(self, row: int, col: int) -> None:
        """Move the terminal's cursor by the shortest sequence."""
        trow, tcol = self._trow, self._tcol
        if trow == row and tcol == col:
            return
        best = _cup(row, col)
        if trow is not None and tcol is not None and tcol < self.width:
            vertical = "" if trow == row else _vertical(row - trow)
            if len(vertical) < len(best):
                horizontal = self._horizontal(row, tcol, col)
                if len(vertical) + _cost(horizontal) < _cost(best):
                    best = vertical + horizontal
        self._emit(best)
        self._trow, self._tcol = row, col

    def _horizontal(self, row: int, start: int, col: int) -> str:
        if col == start:
            return ""
        if col < start:
            back = start - col
            options = ["\b" * back if back < 4 else f"\x1b[{back}D"]
        else:
            options = [_forward(col - start)]
            again = self._again(row, start, col)
            if again is not None:
                options.append(again)
        options.append("\r" + _forward(col) if col else "\r")
        options.append(f"\x1b[{col + 1}G")
        return min(options, key=_cost)

    def _again(self, row: int, start: int, end: int) -> str | None:
        """The known cells ``start:end`` of ``row`` in the terminal's current style, to print
        again instead of moving over them (as curses does); None if they are not all such."""
        if end - start > 4:
            return None
        style = (self._tpen, self._tlink)
        texts = []
        for cell in self._rows[row][start:end]:
            if cell is None or cell[1] != style or not _one_cell(cell[0]):
                return None
            texts.append(cell[0])
        return "".join(texts)


def _own(token: re.Match[str]) -> bool:
    """Whether a token may reach the terminal: anything but a foreign OSC, a DCS, APC, PM or SOS
    string, an 8-bit control, or a lone ESC (it starts nothing here, but written out it would
    start a sequence with whatever is written next: ESC, then a dropped sequence, then "]0;"
    reached the terminal as a title's OSC)."""
    kind = token.lastgroup
    if kind == "osc":
        return token["body"].partition(";")[0] in _OWN_OSC
    if kind == "string":
        return False
    if kind == "esc":  # an introducer whose sequence broke off (CSI, OSC, DCS, APC, PM, SOS)
        return token.group()[-1] not in "[]P_^X"
    return not (kind == "control" and (token.group() >= "\x80" or token.group() == "\x1b"))


def _cup(row: int, col: int) -> str:
    if col:
        return f"\x1b[{row + 1};{col + 1}H"
    return f"\x1b[{row + 1}H" if row else "\x1b[H"


def _vertical(rows: int) -> str:
    count = "" if abs(rows) == 1 else str(abs(rows))
    return f"\x1b[{count}{'B' if rows > 0 else 'A'}"


def _forward(cols: int) -> str:
    if not cols:
        return ""
    return "\x1b[C" if cols == 1 else f"\x1b[{cols}C"


def _cost(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


@lru_cache(maxsize=1024)
def _one_cell(text: str) -> bool:
    return len(text) == 1 and get_character_cell_size(text) == 1


@lru_cache(maxsize=4096)
def _clusters(text: str) -> tuple[tuple[str, int], ...] | None:
    """None when every character of ``text`` takes one cell (almost always); else its
    characters, each with the zero-width ones that follow it, and the cells each takes."""
    sizes = [get_character_cell_size(char) for char in text]
    if all(size == 1 for size in sizes):
        return None
    clusters: list[str] = []
    for char, size in zip(text, sizes, strict=True):
        if size == 0 and clusters:
            clusters[-1] += char
        else:
            clusters.append(char)
    return tuple((cluster, cell_len(cluster)) for cluster in clusters)
