"""The key bar at the bottom of every console screen: the screen's keys that fit its width.

Textual's Footer lays every key out in a row and lets the ones that do not fit fall off the right
edge, `?` (help) among them. This bar keeps the keys in the order the screen and the app declare
them, which is their priority: where the width is short the last ones go first, the command
palette's key before any, and the pinned ones stay whatever the width: `?`, so every key can
still be found, and the on-call keys a screen pins (`PINNED_KEYS`: the fleet's Enter, `a`, `T`,
`q`), unless the app leads with keys of its own (replay's `LEADING_KEYS`). It follows focus:
the keys a screen declares for its focused list (`FOCUS_KEYS`: the host screen's process list
leads with `k`, `K`, `y`) come first, shown even where the binding is not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.widget import Widget

PINNED = frozenset({"help"})
"""Binding ids the bar shows whatever its width, on every screen."""
_GAP = 2
_DISABLED = Style(dim=True)


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One entry of the bar: the keys as shown, what they do, and the key a click presses."""

    keys: str
    description: str
    key: str
    enabled: bool = True
    pinned: bool = False
    group: str | None = None
    """The binding group whose keys share this entry (Textual's `Binding.Group`)."""
    binding_id: str | None = None

    @property
    def width(self) -> int:
        return len(self.keys) + (1 + len(self.description) if self.description else 0)


def fitted(entries: list[KeyEntry], width: int, palette: KeyEntry | None) -> list[KeyEntry]:
    """The entries to show in ``width`` cells, in their order: the last unpinned ones dropped
    until the rest fit; the palette's entry (shown last) only where everything else fits."""
    kept = list(entries)

    def used(shown: list[KeyEntry]) -> int:
        return 1 + sum(entry.width for entry in shown) + _GAP * max(len(shown) - 1, 0)

    while used(kept) > width:
        droppable = [entry for entry in kept if not entry.pinned]
        if not droppable:
            break
        kept.remove(droppable[-1])
    if palette is not None and used([*kept, palette]) <= width and len(kept) == len(entries):
        kept.append(palette)
    return kept


class KeyBar(Widget):
    """Docked at the bottom of a screen; follows the screen's active bindings and its width."""

    COMPONENT_CLASSES = {"key-bar--key", "key-bar--description"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        background: $footer-background;
        color: $footer-foreground;
    }
    KeyBar > .key-bar--key {
        color: $footer-key-foreground;
        text-style: bold;
    }
    KeyBar > .key-bar--description {
        color: $footer-description-foreground;
    }
    """

    def __init__(self) -> None:
        super().__init__(id="key-bar")
        self._room = False
        self._shown: list[tuple[int, int, str]] = []
        """Where each shown entry starts and ends, and the key a click on it presses."""

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, lambda _screen: self.refresh())

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def entries(self) -> tuple[list[KeyEntry], KeyEntry | None]:
        """The screen's shown keys in priority order (one entry per action; a binding group's
        keys in one entry; the app's `LEADING_KEYS` and the focused list's keys first), and the
        command palette's key."""
        app = self.app
        screen = self.screen
        app_keys: frozenset[str] = getattr(app, "LEADING_KEYS", frozenset())
        # Where the app leads with keys of its own (replay's), the screen's pins give way.
        pins: frozenset[str] = frozenset() if app_keys else getattr(screen, "PINNED_KEYS", PINNED)
        pinned = PINNED | pins
        focused = screen.focused.id if screen.focused is not None else None
        focus_keys: dict[str, tuple[str, ...]] = getattr(screen, "FOCUS_KEYS", {})
        focus_first = focus_keys.get(focused or "", ())
        wanted = pinned | app_keys | frozenset(focus_first)
        entries: list[KeyEntry] = []
        actions: set[str] = set()
        palette: KeyEntry | None = None
        active = list(screen.active_bindings.values())
        found = {binding.id for _node, binding, _enabled, _tooltip in active}
        # A wanted binding that a focused widget's own binding of its key hides (the fleet's
        # Enter under its table's): the table passes the key on to the screen's action.
        hidden = [
            (None, binding, True, None)
            for binding in (*screen.BINDINGS, *app.BINDINGS)
            if isinstance(binding, Binding) and binding.id in wanted - found
        ]
        for _node, binding, enabled, _tooltip in (*active, *hidden):
            if binding.key == app.COMMAND_PALETTE_BINDING and app.ENABLE_COMMAND_PALETTE:
                palette = KeyEntry(app.get_key_display(binding), "palette", binding.key)
                continue
            if not (binding.show or binding.id in wanted) or binding.action in actions:
                continue
            actions.add(binding.action)
            shown = app.get_key_display(binding)
            group = binding.group.description if binding.group is not None else None
            if group is not None and entries and entries[-1].group == group:
                entries[-1] = replace(entries[-1], keys=f"{entries[-1].keys} {shown}")
                continue
            description = binding.description if group is None else group
            entries.append(
                KeyEntry(
                    shown,
                    description,
                    binding.key,
                    enabled,
                    binding.id in pinned,
                    group,
                    binding.id,
                )
            )

        # stable: the app's leading keys in their declared order, then the focused list's
        def rank(entry: KeyEntry) -> int:
            if entry.binding_id in app_keys:
                return -1
            if entry.binding_id in focus_first:
                return focus_first.index(entry.binding_id)
            return len(focus_first)

        entries.sort(key=rank)
        return entries, palette

    def render(self) -> Text:
        entries, palette = self.entries()
        key_style = self.get_component_rich_style("key-bar--key")
        description_style = self.get_component_rich_style("key-bar--description")
        width = self.size.width
        line = Text(" ", no_wrap=True, overflow="crop")
        self._shown = []
        for index, entry in enumerate(fitted(entries, width, palette)):
            if entry is palette:  # at the right edge, as Textual's footer has it
                line.append(" " * max(_GAP, width - line.cell_len - entry.width - 1))
            elif index:
                line.append(" " * _GAP)
            start = line.cell_len
            line.append(entry.keys, key_style if entry.enabled else key_style + _DISABLED)
            if entry.description:
                line.append(" ")
                line.append(entry.description, description_style)
            self._shown.append((start, line.cell_len, entry.key))
        if not self._room:
            return line
        rows = Text("\n", no_wrap=True, overflow="crop")
        rows.append_text(line)
        return rows

    def room_for_notice(self, room: bool) -> None:
        """Two rows while a notice shows: the top one free for it (notices dock just above the
        bar's last row), the keys on the last; one row otherwise."""
        if room != self._room:
            self._room = room
            self.styles.height = 2 if room else 1

    def on_click(self, event: events.Click) -> None:
        for start, end, key in self._shown:
            if start <= event.x < end:
                self.app.simulate_key(key)
                return
