"""A host's state as every screen and subcommand says it: one word, from one place.

The word is the reading stream's state (`HostState`), except that a live host whose scheduler
node is out of service (drained, or draining) is ``drain``: no new work lands on it, and that is
what the on-call must see first, in the fleet's State column, the host screen's header, the GPU
screen's header and the title line's count alike.
"""

from __future__ import annotations

from gpuconsole.core.model import HostSnapshot, HostState

DRAIN = "drain"

SHORT_WORDS = {
    HostState.CONNECTING: "conn",
    HostState.AUTH_FAILED: "auth",
    HostState.HOST_KEY_MISMATCH: "hkey",
    HostState.HOST_KEY_UNKNOWN: "nokey",
    HostState.HOST_KEY_REVOKED: "rvkd",
    HostState.REFUSED: "rfsd",
    HostState.NO_DRIVER: "nodrv",
    HostState.AGENT_ERROR: "agerr",
}
"""The short words the fleet's State column shows for these states, which the filter knows
as well."""


def _draining(state: HostState, snapshot: HostSnapshot | None) -> bool:
    """Whether the host is live and its scheduler node out of service."""
    node = snapshot.node if snapshot is not None else None
    return state is HostState.LIVE and node is not None and node.out_of_service


def state_word(state: HostState, snapshot: HostSnapshot | None, *, short: bool = False) -> str:
    """``live``, ``drain``, ``down``, ``connecting`` (``short``: ``conn``, as a narrow column
    says it)."""
    if _draining(state, snapshot):
        return DRAIN
    return SHORT_WORDS.get(state, state.value) if short else state.value
