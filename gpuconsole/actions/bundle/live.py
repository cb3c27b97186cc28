"""The live console's incident bundle (`B` on the host screen): what the console's session holds of
a host, copied at once (the session moves on with the next round), and the writing of the bundle,
which runs commands on the host for up to a minute: the console does it on a worker thread and
says where it went (`done_message`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuconsole.actions.bundle.contents import BundleInputs
from gpuconsole.actions.bundle.inputs import live_inputs
from gpuconsole.actions.bundle.make import BundleResult, make_bundle
from gpuconsole.hosts.targets import Target

if TYPE_CHECKING:
    from gpuconsole.fleet.session import FleetSession

NO_SHELL = "nvidia-smi -q, kernel log, verification: a simulated host has no shell to run them in"

InputsBuilder = Callable[[], BundleInputs]
"""Builds a bundle's inputs; a worker thread calls it (it may read a recording)."""


def live_bundle_inputs(
    fleet: FleetSession, host: str, label: str, target: Target | None
) -> InputsBuilder:
    """``host`` as the console labelled ``label`` shows it now from ``fleet``; ``target`` is how
    to reach it, None for a host with no shell (a simulated one)."""
    store = fleet.store
    history = tuple(store.history(host))
    newest = [s.time for h in store.hosts if (s := store.latest(h)) is not None]
    at = history[-1].time if history else max(newest, default=time.time())
    findings = store.findings(host)
    alerts = tuple(fleet.alerts.active())
    episodes = tuple(fleet.onsets.episodes_now())
    notes = (NO_SHELL,) if target is None else ()
    recording = fleet.recording

    def build() -> BundleInputs:
        return live_inputs(
            host,
            f"the live console ({label})",
            history,
            findings,
            alerts,
            episodes,
            at=at,
            kept=store.history_length,
            recording=recording,
            notes=notes,
        )

    return build


def write_bundle(build: InputsBuilder, target: Target | None) -> BundleResult:
    """Build the inputs and write the bundle, collecting from ``target`` where there is one; for
    a worker thread. Raises `BundleError` when it cannot be written."""
    return asyncio.run(make_bundle(build(), target))


def done_message(result: BundleResult) -> str:
    if not result.notes:
        return f"bundle written: {result.path}"
    return f"bundle written: {result.path} ({len(result.notes)} not collected: see summary.md)"
