"""What a screen may read of the app it runs in (`Console`): the screens' side of the line between
them and the apps, which import the screens and are never imported by them.

A screen reads the state it shows through `Console` and asks for anything else (a panel opened,
work started) with a message (`gpuconsole.ui.messages.ConsoleRequest`). The live console and
replay are both a `Console`; `tests/test_app.py` holds them to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

if TYPE_CHECKING:
    from textual.app import App
    from textual.notifications import SeverityLevel

    from gpuconsole.actions.processes import ProcessSignals
    from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSender
    from gpuconsole.fleet.alerts.engine import AlertEngine
    from gpuconsole.fleet.store import FleetStore
    from gpuconsole.fleet.triage_list import TriageItem
    from gpuconsole.ui.widgets.cells import Palette


@runtime_checkable
class Console(Protocol):
    """The app as its screens see it. Each member is read when it is needed, never kept: the
    app replaces its session when the hosts' past is read, and replay at every jump."""

    @property
    def label(self) -> str:
        """What the fleet is called in the title line (the rack, the recording)."""
        ...

    @property
    def starting(self) -> bool:
        """Until the hosts' recent past and first readings are in."""
        ...

    @property
    def paused_at(self) -> float | None:
        """When the user paused the screens (`now`), or None."""
        ...

    @property
    def palette(self) -> Palette:
        """The theme's bands (emphasis instead of colours under NO_COLOR)."""
        ...

    @property
    def store(self) -> FleetStore:
        """The readings the screens show."""
        ...

    @property
    def alerts(self) -> AlertEngine:
        """The alerts, which the alerts screen acknowledges and silences."""
        ...

    @property
    def alertmanager(self) -> AlertmanagerSender | None:
        """Where firing alerts go, if anywhere."""
        ...

    @property
    def last_round(self) -> float | None:
        """When the newest round's readings were taken (the alerts' time); None before one."""
        ...

    @property
    def signals(self) -> ProcessSignals | None:
        """Who can signal which host's processes; None: no host's."""
        ...

    @property
    def notice_showing(self) -> bool:
        """Whether a notice is on the screen: the key bar then leaves it a row of its own."""
        ...

    def problems(self) -> Sequence[TriageItem]:
        """The fleet's problems now, worst first, then newest: one row per problem with its one
        severity, start and remedy (`gpuconsole.fleet.triage_list.triage_items`). The triage
        view, the host screen's findings and the GPU screen's head all show these, so a problem
        tells one story wherever it is seen."""
        ...

    def began(self, ident: str) -> float | None:
        """When the open episode ``ident`` (a finding, a firing alert) began; None if none is."""
        ...

    def now(self) -> float:
        """The time the readings are compared with (replay: its cursor)."""
        ...

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
        kind: str | None = None,
    ) -> None:
        """A notice; one of a ``kind`` replaces the one of its kind still shown."""
        ...


def console_of(app: App[object]) -> Console:
    """The app a console screen runs in, as a `Console` (every app that shows them is one)."""
    return cast("Console", app)
