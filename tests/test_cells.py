"""Cell renderers and sparklines: N/A for missing values, widths, bands and orderings."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.text import Text

from gpuconsole.core.model import PcieLink, Severity
from gpuconsole.ui.themes import DARK
from gpuconsole.ui.widgets import cells
from gpuconsole.ui.widgets.cells import Palette, bar
from gpuconsole.ui.widgets.trend import sparkline

P = Palette(DARK.variables)
V = DARK.variables


# --- N/A ------------------------------------------------------------------------------------------

MISSING: list[tuple[str, Callable[[], Text]]] = [
    ("percent", lambda: cells.percent(None, P)),
    ("utilization_bar", lambda: cells.utilization_bar(None, P)),
    ("memory used None", lambda: cells.memory(None, 81920.0, P)),
    ("memory total None", lambda: cells.memory(1024.0, None, P)),
    ("memory total 0", lambda: cells.memory(1024.0, 0.0, P)),
    ("memory_bar used None", lambda: cells.memory_bar(None, 81920.0, P)),
    ("memory_bar total None", lambda: cells.memory_bar(1024.0, None, P)),
    ("memory_bar total 0", lambda: cells.memory_bar(0.0, 0.0, P)),
    ("memory_percent used None", lambda: cells.memory_percent(None, 100.0, P)),
    ("memory_percent total None", lambda: cells.memory_percent(10.0, None, P)),
    ("memory_percent total 0", lambda: cells.memory_percent(0.0, 0.0, P)),
    ("temperature", lambda: cells.temperature(None, P)),
    ("power", lambda: cells.power(None, 700.0)),
    ("power no limit", lambda: cells.power(None, None)),
    ("kilowatts", lambda: cells.kilowatts(None, 5600.0)),
    ("power_percent watts None", lambda: cells.power_percent(None, 700.0)),
    ("power_percent limit None", lambda: cells.power_percent(350.0, None)),
    ("power_percent limit 0", lambda: cells.power_percent(0.0, 0.0)),
    ("number", lambda: cells.number(None, "W")),
    ("text", lambda: cells.text(None)),
    ("pcie None", lambda: cells.pcie(None, P)),
    ("pcie gen None", lambda: cells.pcie(PcieLink(None, 16, 5, 16), P)),
    ("pcie width None", lambda: cells.pcie(PcieLink(5, None, 5, 16), P, compact=True)),
    ("throttle", lambda: cells.throttle(None, P)),
    ("throttle compact", lambda: cells.throttle(None, P, compact=True)),
    ("ecc", lambda: cells.ecc(None, None, P)),
]


@pytest.mark.parametrize("render", [r for _, r in MISSING], ids=[n for n, _ in MISSING])
def test_missing_value_shows_na_never_zero(render: Callable[[], Text]) -> None:
    cell = render()
    assert isinstance(cell, Text)
    assert cell.plain == "N/A"
    assert "0" not in cell.plain


def test_zero_is_shown_as_zero_not_na() -> None:
    assert cells.percent(0.0, P).plain == "  0%"
    assert cells.temperature(0.0, P).plain == "0°C"
    assert cells.number(0.0).plain == "0"
    assert cells.power(0.0, None).plain == "0W"
    assert cells.memory(0.0, 1024.0, P).plain == "0.0/1.0 GiB"
    assert cells.ecc(0, 0, P).plain == "0/0"


# --- bar ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fraction", "width", "expected"),
    [
        (0.5, 4, "██  "),
        (0.0, 4, "    "),
        (1.0, 4, "████"),
        (1 / 32, 4, "▏   "),
        (0.1, 4, "▍   "),  # 3.2 eighths → 3
        (0.3, 4, "█▎  "),  # 9.6 eighths round to 10, not down to 9
        (0.99, 1, "█"),
        (0.5 + 4 / 32, 4, "██▌ "),
        (7 / 8, 1, "▉"),
        (0.25, 8, "██      "),
        (-0.5, 4, "    "),
        (1.5, 4, "████"),
        (2.0, 3, "███"),
    ],
)
def test_bar(fraction: float, width: int, expected: str) -> None:
    assert bar(fraction, width) == expected
    assert len(bar(fraction, width)) == width


def test_utilization_and_memory_bars() -> None:
    util = cells.utilization_bar(50.0, P, width=4)
    assert util.plain == "██    50%"
    assert util.style == V["util-mid"]
    mem = cells.memory_bar(40960.0, 81920.0, P, width=4)
    assert mem.plain == "██   40/80 GiB"


# --- colour bands ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pct", "band"),
    [
        (100.0, "util-high"),
        (90.0, "util-high"),
        (89.6, "util-high"),  # shown as 90%: the colour follows the figure on screen
        (89.4, "util-mid"),
        (30.0, "util-mid"),
        (29.4, "util-low"),
        (0.0, "util-low"),
    ],
)
def test_percent_colour_bands(pct: float, band: str) -> None:
    cell = cells.percent(pct, P)
    assert cell.style == V[band]
    assert cell.plain == f"{pct:3.0f}%"


@pytest.mark.parametrize(
    ("celsius", "slowdown", "band"),
    [
        (95.0, None, "temp-hot"),
        (85.0, None, "temp-hot"),
        (84.6, None, "temp-hot"),  # shown as 85°C: the colour follows the figure on screen
        (84.4, None, "temp-warm"),
        (75.0, None, "temp-warm"),
        (74.4, None, "temp-cool"),
        (71.0, 87.0, "temp-cool"),  # a working H100 (slowdown 87 °C): 16 degrees of headroom
        (57.0, 87.0, "temp-cool"),
        (80.0, 87.0, "temp-warm"),
        (80.0, 80.0, "temp-hot"),  # a card that slows down at 80 °C is hot from there
        (70.0, 80.0, "temp-warm"),
        (69.0, 80.0, "temp-cool"),
        (25.0, None, "temp-cool"),
    ],
)
def test_temperature_colour_bands(celsius: float, slowdown: float | None, band: str) -> None:
    cell = cells.temperature(celsius, P, slowdown)
    assert cell.style == V[band]
    assert cell.plain == f"{celsius:.0f}°C"


def test_the_legend_says_each_band_in_its_colour() -> None:
    legend = cells.band_legend(P)
    styled = {legend.plain[span.start : span.end]: span.style for span in legend.spans}
    assert styled["warm"] == V["temp-warm"] and styled["hot"] == V["temp-hot"]
    assert "below 75 °C" in legend.plain and "from 85 °C" in legend.plain


def test_bands_are_distinct_colours() -> None:
    assert len({V["util-low"], V["util-mid"], V["util-high"]}) == 3
    assert len({V["temp-cool"], V["temp-warm"], V["temp-hot"]}) == 3


@pytest.mark.parametrize(
    ("used", "style"),
    [
        (50.0, ""),
        (80.0, V["severity-warning"]),
        (94.0, V["severity-warning"]),
        (95.0, V["severity-critical"]),
    ],
)
def test_memory_colour_bands(used: float, style: str) -> None:
    assert cells.memory(used * 1024, 100.0 * 1024, P).style == style
    assert cells.memory_percent(used, 100.0, P).style == style
    assert cells.memory_percent(used, 100.0, P).plain == f"{used:3.0f}%"


def test_memory_text_in_gib() -> None:
    assert cells.memory(40960.0, 81920.0, P).plain == "40/80 GiB"
    assert cells.memory(1536.0, 46068.0, P).plain == "1.5/45 GiB"
    assert cells.memory(40960.0, 81920.0, P, unit=False).plain == "40/80"  # the header says GiB


def test_power_texts() -> None:
    assert cells.power(350.4, 700.0).plain == "350/700W"
    assert cells.power(72.0, None).plain == "72W"
    assert cells.kilowatts(5600.0, 5600.0).plain == "5.6/5.6kW"
    assert cells.kilowatts(2400.0, None).plain == "2.4kW"
    assert cells.power_percent(350.0, 700.0).plain == " 50%"
    assert cells.number(81.4, "°C").plain == "81°C"
    assert cells.text("P0").plain == "P0"


# --- pcie -----------------------------------------------------------------------------------------


def test_pcie_full_link_shows_only_current() -> None:
    cell = cells.pcie(PcieLink(5, 16, 5, 16), P)
    assert cell.plain == "5×16"
    assert cell.style == ""


def test_pcie_unknown_maximum_is_not_degraded() -> None:
    assert cells.pcie(PcieLink(4, 16, None, None), P).plain == "4×16"


def test_pcie_degraded_width_shows_maximum_in_warning_colour() -> None:
    link = PcieLink(5, 8, 5, 16)
    full = cells.pcie(link, P)
    assert full.plain == "5×8/5×16"
    assert full.style == V["severity-warning"]
    compact = cells.pcie(link, P, compact=True)
    assert compact.plain == "5×8"
    assert compact.style == V["severity-warning"]


def test_pcie_lower_generation_alone_is_dim() -> None:
    link = PcieLink(1, 16, 5, 16)  # an idle GPU saving power
    assert cells.pcie(link, P).plain == "1×16/5×16"
    assert cells.pcie(link, P).style == "dim"
    assert cells.pcie(link, P, compact=True).plain == "1×16"


@pytest.mark.parametrize(
    ("link", "now"),
    [(PcieLink(5, 8, None, 16), "5×8"), (PcieLink(1, 16, 5, None), "1×16")],
    ids=["max-gen-unknown", "max-width-unknown"],
)
def test_pcie_partly_unknown_maximum_never_shows_none(link: PcieLink, now: str) -> None:
    cell = cells.pcie(link, P)
    assert cell.plain.startswith(now)
    assert "None" not in cell.plain
    assert cells.pcie(link, P, compact=True).plain == now


# --- throttle -------------------------------------------------------------------------------------


def test_throttle_none_active_is_a_dash() -> None:
    cell = cells.throttle((), P)
    assert cell.plain == "—"
    assert cell.plain != "N/A"


def test_throttle_orders_hw_thermal_first_and_colours_thermal_critical() -> None:
    reasons = ("gpu-idle", "sw-power-cap", "hw-thermal", "sw-thermal")
    cell = cells.throttle(reasons, P)
    assert cell.plain == "hw-therm,sw-therm,pwr-cap,idle"
    assert cell.style == V["severity-critical"]


def test_throttle_compact_shows_first_and_count() -> None:
    reasons = ("sw-power-cap", "hw-power-brake", "hw-thermal")
    assert cells.throttle(reasons, P, compact=True).plain == "hw-therm+2"
    assert cells.throttle(("sw-power-cap",), P, compact=True).plain == "pwr-cap"


def test_throttle_without_thermal_is_uncoloured_and_unknown_codes_go_last() -> None:
    cell = cells.throttle(("vendor-special", "sw-power-cap"), P)
    assert cell.plain == "pwr-cap,vendor-special"
    assert cell.style == ""


# --- ecc and severity -----------------------------------------------------------------------------


def test_ecc() -> None:
    assert cells.ecc(0, 3, P).style == ""
    hit = cells.ecc(2, 5, P)
    assert hit.plain == "2/5"
    assert hit.style == V["severity-critical"]
    assert cells.ecc(None, 3, P).plain == "?/3"
    assert cells.ecc(1, None, P).plain == "1/?"


@pytest.mark.parametrize(
    ("severity", "plain", "style"),
    [
        (None, "ok", V["util-high"]),
        (Severity.INFO, "info", f"bold {V['severity-info']}"),
        (Severity.WARNING, "WARN", f"bold {V['severity-warning']}"),
        (Severity.CRITICAL, "CRIT", f"bold {V['severity-critical']}"),
    ],
)
def test_severity_badge(severity: Severity | None, plain: str, style: str) -> None:
    badge = cells.severity_badge(severity, P)
    assert badge.plain == plain
    assert badge.style == style


def test_palette_unknown_band_is_no_style() -> None:
    assert P["no-such-band"] == ""
    assert Palette({}).utilization(99.0) == ""


# --- sparkline ------------------------------------------------------------------------------------


def test_sparkline_fixed_scale_steady_high_is_high_not_flat_low() -> None:
    line = sparkline([95.0] * 10, 0.0, 100.0, 10)
    assert line == "█" * 10
    assert "▁" not in line


def test_sparkline_steady_low_is_low() -> None:
    assert sparkline([5.0] * 4, 0.0, 100.0, 4) == "▁▁▁▁"


def test_sparkline_levels() -> None:
    assert sparkline([0.0, 25.0, 50.0, 75.0, 100.0], 0.0, 100.0, 5) == "▁▃▅▇█"


def test_sparkline_pads_on_the_left_to_width() -> None:
    line = sparkline([50.0], 0.0, 100.0, 4)
    assert line == "   ▅"
    assert sparkline([], 0.0, 100.0, 3) == "   "


def test_sparkline_shows_the_last_width_values() -> None:
    assert sparkline([0.0, 100.0, 0.0], 0.0, 100.0, 2) == "█▁"
    assert sparkline([1.0, 2.0], 0.0, 100.0, 0) == ""


def test_sparkline_clamps_out_of_range_values() -> None:
    assert sparkline([-10.0, 150.0], 0.0, 100.0, 2) == "▁█"


def test_sparkline_zero_span_is_flat() -> None:
    assert sparkline([3.0, 7.0], 5.0, 5.0, 2) == "▁▁"


# --- wrapping -------------------------------------------------------------------------------------

_WRAPPABLE = st.text(
    alphabet=st.sampled_from([*"abcdefghij →:;.-/", "界", "🔥", "é"]), min_size=0, max_size=300
)


@settings(max_examples=300)
@given(text=_WRAPPABLE, width=st.integers(1, 120), indent=st.integers(0, 8))
def test_wrapped_rows_fit_and_keep_every_word(text: str, width: int, indent: int) -> None:
    """For any text and width: no row wider than the width (a lone wide character on a row
    narrower than it aside), the words in their order, each later row indented alike."""
    rows = cells.wrap_text(Text(text, style="bold"), width, indent)
    kept = min(indent, max(width, 1) // 2)
    for number, row in enumerate(rows):
        body = row.plain[kept:] if number else row.plain
        assert cell_len(row.plain) <= width or len(body) == 1, (row.plain, width)
        if number:
            assert row.plain.startswith(" " * kept)
    assert "".join(r.plain.replace(" ", "") for r in rows) == text.replace(" ", "")
    assert all(span.style == "bold" for row in rows for span in row.spans)


def test_a_finding_wraps_under_its_message() -> None:
    line = Text("CRIT GPU 3 stopped answering → reboot the node; check its seating")
    assert [row.plain for row in cells.wrap_text(line, 29, 5)] == [
        "CRIT GPU 3 stopped answering",
        "     → reboot the node; check",
        "     its seating",
    ]


# --- the theme in 256 colours ---------------------------------------------------------------------


def test_the_dark_themes_backgrounds_stay_grey_in_256_colours() -> None:
    """Over SSH without COLORTERM the terminal gets 256 colours: the dark theme's backgrounds
    (and Textual's shades of them) land on the grey ramp, not on navy (colour 17 was the fleet's
    header and rows)."""
    from rich.color import Color, ColorSystem
    from textual.app import App

    from gpuconsole.ui.themes import DARK

    app: App[None] = App()
    app.register_theme(DARK)
    app.theme = DARK.name
    variables = app.get_css_variables()
    names = [
        name
        for name in variables
        if name.split("-")[0] in ("background", "surface", "panel")
        and not variables[name].endswith(("%", ")"))
        and len(variables[name]) == 7
    ]
    assert {"background", "surface", "panel", "surface-lighten-1"} <= set(names)
    for name in names:
        shade = Color.parse(variables[name]).downgrade(ColorSystem.EIGHT_BIT)
        assert shade.number == 16 or 232 <= (shade.number or 0) <= 255, (name, variables[name])
