"""Character attributes (SGR, "select graphic rendition"): parse them, and write the shortest
sequence that turns one set into another."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple


class Pen(NamedTuple):
    """The attributes a terminal gives the characters it prints next.

    Each field holds the SGR parameters that set it ("" when off): colours as they arrived
    ("31", "38;5;208", "38;2;16;32;64"), flags as their code ("1", "4:3"). ``other`` keeps codes
    with no switch-off of their own (fonts, frames...), in order: only a reset clears them.
    """

    bold: str = ""
    dim: str = ""
    italic: str = ""
    underline: str = ""
    blink: str = ""
    reverse: str = ""
    conceal: str = ""
    strike: str = ""
    overline: str = ""
    fg: str = ""
    bg: str = ""
    underline_colour: str = ""
    other: str = ""


PLAIN = Pen()

# The code that switches each field off; bold and dim share 22, so they are handled apart.
_OFF = {
    "italic": "23",
    "underline": "24",
    "blink": "25",
    "reverse": "27",
    "conceal": "28",
    "strike": "29",
    "overline": "55",
    "fg": "39",
    "bg": "49",
    "underline_colour": "59",
}

# Fields with several kinds: a terminal may keep one kind on when told another.
_KINDS = frozenset({"blink", "underline"})

_FLAG = {
    1: ("bold", "1"),
    2: ("dim", "2"),
    3: ("italic", "3"),
    4: ("underline", "4"),
    5: ("blink", "5"),
    6: ("blink", "6"),
    7: ("reverse", "7"),
    8: ("conceal", "8"),
    9: ("strike", "9"),
    21: ("underline", "21"),
    53: ("overline", "53"),
}
_CLEAR = {
    23: "italic",
    24: "underline",
    25: "blink",
    27: "reverse",
    28: "conceal",
    29: "strike",
    55: "overline",
    39: "fg",
    49: "bg",
    59: "underline_colour",
}
_EXTENDED = {38: "fg", 48: "bg", 58: "underline_colour"}


@lru_cache(maxsize=4096)
def apply_sgr(pen: Pen, params: str) -> Pen:
    """The pen after ``CSI params m``."""
    values = pen._asdict()
    items = params.split(";")
    index = 0
    while index < len(items):
        item = items[index]
        index += 1
        head, colon, sub = item.partition(":")
        if not head.isdigit() and head:
            values["other"] = _joined(values["other"], ";".join(items[index - 1 :]))
            break
        code = int(head or 0)
        if colon:
            if code in _EXTENDED:
                values[_EXTENDED[code]] = item
            elif code == 4:
                values["underline"] = "" if sub in ("", "0") else item
            else:
                values["other"] = _joined(values["other"], item)
        elif code == 0:
            values = PLAIN._asdict()
        elif code in _FLAG:
            field, value = _FLAG[code]
            values[field] = value
        elif code == 22:
            values["bold"] = values["dim"] = ""
        elif code in _CLEAR:
            values[_CLEAR[code]] = ""
        elif 30 <= code <= 37 or 90 <= code <= 97:
            values["fg"] = str(code)
        elif 40 <= code <= 47 or 100 <= code <= 107:
            values["bg"] = str(code)
        elif code in _EXTENDED:
            kind = items[index] if index < len(items) else ""
            count = {"5": 2, "2": 4}.get(kind, 0)
            if not count or index + count > len(items):
                # Malformed: kept as it came, so that a full rewrite repeats it.
                values["other"] = _joined(values["other"], ";".join(items[index - 1 :]))
                break
            values[_EXTENDED[code]] = ";".join(items[index - 1 : index + count])
            index += count
        else:
            values["other"] = _joined(values["other"], str(code))
    return Pen(**values)


def _joined(before: str, code: str) -> str:
    return f"{before};{code}" if before else code


def _codes(pen: Pen) -> str:
    return ";".join(value for value in pen if value)


@lru_cache(maxsize=4096)
def sgr_change(old: Pen | None, new: Pen) -> str:
    """The shortest SGR sequence that turns ``old`` (None: unknown) into ``new``."""
    full = _codes(new)
    reset = f"\x1b[0;{full}m" if full else "\x1b[0m"
    if old is None or (old.other and old.other != new.other):
        return reset
    codes: list[str] = []
    if (old.bold and not new.bold) or (old.dim and not new.dim):
        codes.append("22")
        codes.extend(value for value in (new.bold, new.dim) if value)
    else:
        pairs = ((new.bold, old.bold), (new.dim, old.dim))
        codes.extend(value for value, was in pairs if value and not was)
    for field, off in _OFF.items():
        value, was = getattr(new, field), getattr(old, field)
        if value != was:
            if value and was and field in _KINDS:
                codes.append(off)  # rapid after slow blink, double after single underline
            codes.append(value or off)
    if new.other != old.other:
        codes.append(new.other)
    if not codes:
        return ""
    change = f"\x1b[{';'.join(codes)}m"
    return change if len(change) < len(reset) else reset
