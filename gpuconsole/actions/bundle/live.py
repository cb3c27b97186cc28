"""The console's side of the incident bundle (`B` on the host screen): copy what the console holds
on the UI thread, then collect and write on a worker thread; a notice says where it went.

The console is any object with the attributes of `Console` (the live app and replay have them):
this module needs its state, its workers and its notices, not Textual.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from gpuconsole.actions.bundle.archive import BundleError
from gpuconsole.actions.bundle.contents import BundleInputs
from gpuconsole.actions.bundle.inputs import live_inputs
from gpuconsole.actions.bundle.make import BundleResult, make_bundle
from gpuconsole.hosts.targets import Target, TargetFinder

if TYPE_CHECKING:
    from gpuconsole.fleet.session import FleetSession

NO_SHELL = "nvidia-smi -q, kernel log, verification: a simulated host has no shell to run them in"


class Console(Protocol):
    """What a bundle takes of the console: a Textual app's workers and notices."""

    def notify(self, message: str, *, severity: Any = ..., timeout: float | None = ...) -> None: ...

    def run_worker(self, work: Callable[[], None], **options: Any) -> object: ...

    def call_from_thread(
        self, callback: Callable[..., object], *args: Any, **kwargs: Any
    ) -> Any: ...


class LiveConsole(Console, Protocol):
    """The live console: its name, how to reach its hosts, and what it shows now."""

    label: str
    targets: TargetFinder | None
    fleet: FleetSession


def _fleet(app: LiveConsole) -> FleetSession:
    """The store, alerts and onsets the console shows now: the one place that says where the
    app keeps them."""
    return app.fleet


def bundle_live(app: LiveConsole, host: str) -> None:
    """A bundle of ``host`` as the live console sees it now."""
    fleet = _fleet(app)
    store = fleet.store
    history = tuple(store.history(host))
    newest = [s.time for h in store.hosts if (s := store.latest(h)) is not None]
    at = history[-1].time if history else max(newest, default=time.time())
    findings = store.findings(host)
    alerts = tuple(fleet.alerts.active())
    episodes = tuple(fleet.onsets.episodes_now())
    target = app.targets.target_for(host) if app.targets else None
    notes = (NO_SHELL,) if target is None else ()
    recording = fleet.recording

    def build() -> BundleInputs:
        return live_inputs(
            host,
            f"the live console ({app.label})",
            history,
            findings,
            alerts,
            episodes,
            at=at,
            kept=store.history_length,
            recording=recording,
            notes=notes,
        )

    start(app, host, build, target)


def start(
    app: Console, host: str, build: Callable[[], BundleInputs], target: Target | None
) -> None:
    """Build the inputs and write the bundle on a worker thread (it may run commands on the
    host for a minute), then tell the user."""
    app.notify(f"writing an incident bundle of {host}…", timeout=3)

    def work() -> None:
        try:
            result = asyncio.run(make_bundle(build(), target))
        except BundleError as error:
            app.call_from_thread(app.notify, str(error), severity="error", timeout=15)
            return
        app.call_from_thread(app.notify, done_message(result), timeout=15)

    app.run_worker(
        work,
        thread=True,
        group="bundle",
        exit_on_error=False,
        description=f"incident bundle of {host}",
    )


def done_message(result: BundleResult) -> str:
    if not result.notes:
        return f"bundle written: {result.path}"
    return f"bundle written: {result.path} ({len(result.notes)} not collected: see summary.md)"
