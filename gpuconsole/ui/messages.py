"""The console's own Textual messages: what the app tells a screen (`FleetUpdated`), and what a
screen asks of the app (`ConsoleRequest`'s kinds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from gpuconsole.actions.service import Change


class FleetUpdated(Message, bubble=False):
    """Hosts changed in the fleet session (a polling round, a pause lifted, a replay's jump);
    the screen shows them. ``changed`` None: anything may have changed.

    One still queued when a newer one comes is dropped if the newer names every host it names:
    a screen that falls behind a busy rack catches up in one refresh.
    """

    def __init__(self, changed: set[str] | None) -> None:
        super().__init__()
        self.changed = changed

    def can_replace(self, message: Message) -> bool:
        """Whether ``message`` (queued after this one) makes this one stale."""
        if not isinstance(message, FleetUpdated):
            return False
        return message.changed is None or (
            self.changed is not None and self.changed <= message.changed
        )


class ConsoleRequest(Message):
    """What a screen asks of the console: a panel opened on hosts, or work started. The screen
    posts it to itself and it bubbles to the app, which handles each kind (`on_show_verify`...)
    as an app handles Textual's `Button.Pressed`; replay handles some its own way. The screen
    knows neither the app's class nor how, or whether, a host can be reached."""


class ShowGpu(ConsoleRequest):
    """Open the GPU screen of ``host``'s GPU ``gpu``."""

    def __init__(self, host: str, gpu: int) -> None:
        super().__init__()
        self.host = host
        self.gpu = gpu


class ShowVerify(ConsoleRequest):
    """Open the verification panel on those of ``hosts`` that can be reached."""

    def __init__(self, hosts: Sequence[str]) -> None:
        super().__init__()
        self.hosts = tuple(hosts)


class ShowRepair(ConsoleRequest):
    """Open the repair panel on ``host``."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class ShowService(ConsoleRequest):
    """Take ``host``'s node out of its scheduler (after asking why) or bring it back, in the
    service panel."""

    def __init__(self, host: str, change: Change) -> None:
        super().__init__()
        self.host = host
        self.change: Change = change


class ShowMemoryTrials(ConsoleRequest):
    """Ask, then try each memory fix of the default job on ``host`` in the memory panel."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class ShowBenchmark(ConsoleRequest):
    """Ask, then run the default benchmark on ``host`` in the run panel."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class WriteBundle(ConsoleRequest):
    """Write an incident bundle of ``host`` in the background; a notice says where."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host
