"""The console's themes: Textual `Theme` objects with the console's colour bands as variables.

Bands (theme variables, usable as `$temp-hot` in .tcss and read by the cell renderers):
temperature cool / warm / hot, utilization low / mid / high, and one colour per severity.
"""

from __future__ import annotations

from textual.theme import Theme

BAND_VARIABLES = (
    "temp-cool",
    "temp-warm",
    "temp-hot",
    "util-low",
    "util-mid",
    "util-high",
    "severity-info",
    "severity-warning",
    "severity-critical",
    "link-nvlink",
    "link-pcie",
    "link-sys",
)

DARK = Theme(
    name="gpuconsole-dark",
    primary="#4fa3e0",
    secondary="#8a7fd8",
    accent="#e0a84f",
    warning="#e0c04f",
    error="#e05f5f",
    success="#5fc27a",
    foreground="#d8dee6",
    background="#121518",
    surface="#1a1e22",
    panel="#23292f",
    dark=True,
    variables={
        "temp-cool": "#5fa8d3",
        "temp-warm": "#e0c04f",
        "temp-hot": "#ff5f5f",
        "util-low": "#6c7a89",
        "util-mid": "#4fa3e0",
        "util-high": "#5fc27a",
        "severity-info": "#6cb6ff",
        "severity-warning": "#e0c04f",
        "severity-critical": "#ff5f5f",
        "link-nvlink": "#5fc27a",
        "link-pcie": "#e0c04f",
        "link-sys": "#e07f5f",
        "footer-key-foreground": "#4fa3e0",
    },
)

LIGHT = Theme(
    name="gpuconsole-light",
    primary="#1f6fb2",
    secondary="#5b4fb8",
    accent="#a86a0c",
    warning="#9a7a00",
    error="#c0392b",
    success="#2e8b4a",
    foreground="#1b232c",
    background="#f6f7f9",
    surface="#eceff3",
    panel="#dde3ea",
    dark=False,
    variables={
        "temp-cool": "#1f6fb2",
        "temp-warm": "#9a6a00",
        "temp-hot": "#c0392b",
        "util-low": "#7a8794",
        "util-mid": "#1f6fb2",
        "util-high": "#2e8b4a",
        "severity-info": "#1f6fb2",
        "severity-warning": "#9a6a00",
        "severity-critical": "#c0392b",
        "link-nvlink": "#2e8b4a",
        "link-pcie": "#9a6a00",
        "link-sys": "#b5531f",
        "footer-key-foreground": "#1f6fb2",
    },
)

THEMES: dict[str, Theme] = {theme.name: theme for theme in (DARK, LIGHT)}
DEFAULT_THEME = DARK.name
