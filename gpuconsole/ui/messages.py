"""The console's own Textual messages."""

from __future__ import annotations

from textual.message import Message


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
