"""Cell renderers: values in, Rich `Text` out, coloured by the theme's bands.

Every renderer shows a missing value as "N/A" (never 0), and carries meaning in characters as
well as colour, so the console reads the same under NO_COLOR.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.text import Text

from gpuconsole.core.fields import gib
from gpuconsole.core.model import PcieLink, Severity
from gpuconsole.rules.limits import (
    MEMORY_FULL_FRACTION,
    MEMORY_RESERVE_FRACTION,
    TEMP_WARM_BELOW_C,
    hot_line_c,
)

NA = "N/A"
ELLIPSIS = "…"
_BREAKS = frozenset(" /-_.,:;=@+")
"""Where a name or a command may be cut: between words, or between the parts of one."""
_EIGHTHS = " ▏▎▍▌▋▊▉"

# The guide's bands: utilization ≥ 90 % is the ideal; the temperature alarm and the memory
# reserve are the health rules' (`gpuconsole.rules.limits`).
UTIL_HIGH = 90.0
UTIL_LOW = 30.0

SEVERITY_BADGES = {Severity.INFO: "info", Severity.WARNING: "WARN", Severity.CRITICAL: "CRIT"}

SHORT_REASONS = {
    "gpu-idle": "idle",
    "applications-clocks": "app-clk",
    "sw-power-cap": "pwr-cap",
    "hw-slowdown": "hw-slow",
    "sync-boost": "sync",
    "sw-thermal": "sw-therm",
    "hw-thermal": "hw-therm",
    "hw-power-brake": "pwr-brake",
    "display-clocks": "disp-clk",
}


NO_COLOUR_BANDS: Mapping[str, str] = {
    "temp-hot": "bold",
    "util-low": "dim",
    "severity-warning": "bold",
    "severity-critical": "bold reverse",
    "link-nvlink": "bold",
}
"""The bands under NO_COLOR: what colour would say, said by emphasis (a band not named here is
plain text). A critical value is reversed, a warning or a hot GPU bold, an idle one dim."""


def band_legend(palette: Palette) -> Text:
    """What the colours mean, in the bands' own colours: the help screen's legend."""
    hot = hot_line_c(None)
    warm = hot - TEMP_WARM_BELOW_C
    reserve = MEMORY_RESERVE_FRACTION * 100
    full = MEMORY_FULL_FRACTION * 100
    return Text.assemble(
        ("Colours\n", "bold"),
        "temperature ",
        ("cool", palette["temp-cool"]),
        f" below {warm:.0f} °C, ",
        ("warm", palette["temp-warm"]),
        " from there, ",
        ("hot", palette["temp-hot"]),
        f" from {hot:.0f} °C, each {TEMP_WARM_BELOW_C:.0f} °C lower on a GPU whose own slowdown "
        f"temperature is below {hot:.0f} °C\n",
        "utilization ",
        ("idle", palette["util-low"]),
        f" below {UTIL_LOW:.0f} %, ",
        ("busy", palette["util-mid"]),
        ", ",
        ("full", palette["util-high"]),
        f" from {UTIL_HIGH:.0f} % (the ideal)\n",
        "memory ",
        ("past the reserve", palette["severity-warning"]),
        f" above {reserve:.0f} % used, ",
        ("nearly full", palette["severity-critical"]),
        f" above {full:.0f} %",
    )


@dataclass(frozen=True, slots=True)
class Palette:
    """The theme's band colours, read once per theme change."""

    colours: Mapping[str, str]

    def __getitem__(self, band: str) -> str:
        return self.colours.get(band, "")

    def utilization(self, pct: float) -> str:
        if pct >= UTIL_HIGH:
            return self["util-high"]
        return self["util-mid"] if pct >= UTIL_LOW else self["util-low"]

    def temperature(self, celsius: float, slowdown_c: float | None = None) -> str:
        """Hot from the GPU's hot line (`hot_line_c`: 85 °C, or its slowdown temperature where
        lower), warm within `TEMP_WARM_BELOW_C` under it, cool below."""
        hot = hot_line_c(slowdown_c)
        if celsius >= hot:
            return self["temp-hot"]
        return self["temp-warm"] if celsius >= hot - TEMP_WARM_BELOW_C else self["temp-cool"]

    def memory(self, fraction: float) -> str:
        if fraction >= MEMORY_FULL_FRACTION:
            return self["severity-critical"]
        return self["severity-warning"] if fraction >= MEMORY_RESERVE_FRACTION else ""

    def severity(self, severity: Severity) -> str:
        return self[f"severity-{severity.label}"]


def na() -> Text:
    return Text(NA, style="dim")


def bar(fraction: float, width: int) -> str:
    """A horizontal bar of ``width`` cells in eighth-block steps."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[part] if part else "")
    return text.ljust(width)


def percent(value: float | None, palette: Palette) -> Text:
    if value is None:
        return na()
    return Text(f"{value:3.0f}%", style=palette.utilization(round(value)))


def utilization_bar(value: float | None, palette: Palette, width: int = 8) -> Text:
    if value is None:
        return na()
    style = palette.utilization(round(value))
    return Text(f"{bar(value / 100, width)} {value:3.0f}%", style=style)


def memory(used: float | None, total: float | None, palette: Palette, *, unit: bool = True) -> Text:
    """'35/80 GiB'; without ``unit`` for a column whose header names it ('Memory GiB')."""
    if used is None or not total:
        return na()
    shown = f"{gib(used)}/{gib(total)}" + (" GiB" if unit else "")
    return Text(shown, style=palette.memory(used / total))


def memory_bar(used: float | None, total: float | None, palette: Palette, width: int = 8) -> Text:
    if used is None or not total:
        return na()
    fraction = used / total
    shown = f"{bar(fraction, width)} {gib(used)}/{gib(total)} GiB"
    return Text(shown, style=palette.memory(fraction))


def memory_percent(used: float | None, total: float | None, palette: Palette) -> Text:
    if used is None or not total:
        return na()
    fraction = used / total
    return Text(f"{fraction * 100:3.0f}%", style=palette.memory(fraction))


def temperature(celsius: float | None, palette: Palette, slowdown_c: float | None = None) -> Text:
    """A temperature in the band of its GPU's own slowdown temperature, where known."""
    if celsius is None:
        return na()
    return Text(f"{celsius:.0f}°C", style=palette.temperature(round(celsius), slowdown_c))


def power(watts: float | None, limit: float | None) -> Text:
    if watts is None:
        return na()
    if limit is None:
        return Text(f"{watts:.0f}W")
    return Text(f"{watts:.0f}/{limit:.0f}W")


def kilowatts(watts: float | None, limit: float | None) -> Text:
    if watts is None:
        return na()
    if limit is None:
        return Text(f"{watts / 1000:.1f}kW")
    return Text(f"{watts / 1000:.1f}/{limit / 1000:.1f}kW")


def power_percent(watts: float | None, limit: float | None) -> Text:
    if watts is None or not limit:
        return na()
    return Text(f"{watts / limit * 100:3.0f}%")


def number(value: float | None, suffix: str = "") -> Text:
    return na() if value is None else Text(f"{value:.0f}{suffix}")


def text(value: str | None, width: int | None = None) -> Text:
    """The value as it reads, fitted into ``width`` cells (see `fit`) when given."""
    if value is None:
        return na()
    return Text(value if width is None else fit(value, width))


def fit(value: str, width: int) -> str:
    """``value`` in at most ``width`` cells: whole, or cut where a word or a part of one ends
    (``pod svc-train/…``, ``python3 -u pretrain…``) and marked with an ellipsis; cut mid-word
    only where the last such place would lose more than a third of the room."""
    if cell_len(value) <= width:
        return value
    if width < 2:
        return ELLIPSIS[:width]
    head = set_cell_size(value, width - 1).rstrip(" ")
    room = len(head)
    for end in range(room, room * 2 // 3, -1):
        after = value[end] if end < len(value) else " "
        if head[end - 1] in _BREAKS or after in _BREAKS:
            return _without_dangling(head[:end]) + ELLIPSIS
    return head + ELLIPSIS


def fit_text(value: Text, width: int) -> Text:
    """A styled ``value`` in at most ``width`` cells, cut as `fit` cuts its plain text."""
    plain = value.plain
    shown = fit(plain, width)
    if shown == plain:
        return value
    kept = len(shown) - len(ELLIPSIS) if shown.endswith(ELLIPSIS) else len(shown)
    return Text.assemble(value[:kept], ELLIPSIS)


def wrap_text(value: Text, width: int, indent: int = 0) -> list[Text]:
    """A styled ``value`` as the rows it needs in ``width`` cells, broken where words end (a word
    wider than a row is broken where the row ends); each row after the first starts with
    ``indent`` blanks, so that a finding's remedy lines up under its message."""
    width = max(width, 1)
    indent = min(indent, width // 2)
    rows: list[Text] = []
    rest = value
    room = width
    while cell_len(rest.plain) > room:
        cut = _wrap_point(rest.plain, room)
        head, rest = rest[:cut], rest[cut:]
        head.rstrip()
        rows.append(head)
        while rest.plain.startswith(" "):
            rest = rest[1:]
        room = width - indent
    rows.append(rest)
    return [rows[0], *(Text.assemble(" " * indent, row) for row in rows[1:])]


def _wrap_point(plain: str, room: int) -> int:
    """Where a row of at most ``room`` cells of ``plain`` ends: after its last blank that fits,
    else after as many characters as fit (at least one)."""
    fits = 0
    used = 0
    for index, char in enumerate(plain):
        used += cell_len(char)
        if used > room:
            break
        fits = index + 1
    blank = plain.rfind(" ", 0, fits + 1)
    return blank if blank > 0 else max(fits, 1)


def _without_dangling(kept: str) -> str:
    """``kept`` less trailing blanks and a last word of punctuation alone (an option's ``--``
    whose name was cut off)."""
    kept = kept.rstrip(" ")
    last = kept.rpartition(" ")[2]
    if last and all(ch in _BREAKS for ch in last):
        kept = kept[: -len(last)].rstrip(" ")
    return kept


def share(value: float | None) -> Text:
    """A percentage without a band colour (a process's share of the memory controller)."""
    return na() if value is None else Text(f"{value:3.0f}%")


def age(seconds: float | None) -> Text:
    """How long something has run, in at most six cells: ``12:05`` (minutes and seconds),
    ``5h07m``, ``3d04h``, ``412d``; N/A when unknown, or when the clocks disagree (negative)."""
    if seconds is None or seconds < 0:
        return na()
    whole = int(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days >= 100:
        return Text(f"{days}d")
    if days:
        return Text(f"{days}d{hours:02d}h")
    if hours:
        return Text(f"{hours}h{minutes:02d}m")
    return Text(f"{minutes}:{secs:02d}")


def duration(seconds: float) -> str:
    """How long ago, or for how long: ``45s``, ``12m 03s``, ``3h 05m``, ``2d 04h``."""
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


def pcie(link: PcieLink | None, palette: Palette, compact: bool = False) -> Text:
    """'5×16'; a link below its maximum also shows the maximum, unless ``compact``.

    A narrower width than the maximum is a fault (warning colour); a lower generation alone is
    usually an idle GPU saving power (dim).
    """
    if link is None or link.gen is None or link.width is None:
        return na()
    now = f"{link.gen}×{link.width}"
    if not (link.degraded_width or link.degraded_gen):
        return Text(now)
    style = palette["severity-warning"] if link.degraded_width else "dim"
    if compact:
        return Text(now, style=style)
    best = f"{_or_unknown(link.max_gen)}×{_or_unknown(link.max_width)}"
    return Text(f"{now}/{best}", style=style)


def _or_unknown(value: int | None) -> str:
    return "?" if value is None else str(value)


# Most telling first: the compact cell shows the first active one and a count of the rest.
_REASON_PRIORITY = (
    "hw-thermal",
    "sw-thermal",
    "hw-power-brake",
    "hw-slowdown",
    "sw-power-cap",
    "sync-boost",
    "applications-clocks",
    "display-clocks",
    "gpu-idle",
)


def throttle(
    reasons: tuple[str, ...] | None,
    palette: Palette,
    compact: bool = False,
    width: int | None = None,
) -> Text:
    """The active clock-event reasons, most telling first; ``compact``: the first and a count of
    the others; with ``width``: in full where they fit in it, else compact."""
    if reasons is None:
        return na()
    if not reasons:
        return Text("—", style="dim")
    ordered = sorted(
        reasons, key=lambda r: _REASON_PRIORITY.index(r) if r in _REASON_PRIORITY else 99
    )
    shown = [SHORT_REASONS.get(r, r) for r in ordered]
    thermal = any(r in ("hw-thermal", "sw-thermal") for r in reasons)
    style = palette["severity-critical"] if thermal else ""
    full = ",".join(shown)
    if width is not None:
        compact = len(full) > width
    if compact and len(shown) > 1:
        return Text(f"{shown[0]}+{len(shown) - 1}", style=style)
    return Text(full, style=style)


def ecc(volatile_uncorrected: int | None, volatile_corrected: int | None, palette: Palette) -> Text:
    if volatile_uncorrected is None and volatile_corrected is None:
        return na()
    unc = "?" if volatile_uncorrected is None else str(volatile_uncorrected)
    cor = "?" if volatile_corrected is None else str(volatile_corrected)
    style = palette["severity-critical"] if volatile_uncorrected else ""
    return Text(f"{unc}/{cor}", style=style)


def severity_badge(severity: Severity | None, palette: Palette) -> Text:
    if severity is None:
        return Text("ok", style=palette["util-high"])
    return Text(SEVERITY_BADGES[severity], style=f"bold {palette.severity(severity)}")
