"""Ordering and filtering of the fleet's hosts: worst first unless the user asks otherwise."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache

from gpuconsole.core.model import GpuProcess, HostState, Severity
from gpuconsole.fleet.host_state import SHORT_WORDS, state_word
from gpuconsole.fleet.store import FleetStore
from gpuconsole.rules.summary import summarize

SORT_KEYS = ("worst", "name", "utilization", "temperature", "power", "memory")

# A host that cannot be read is worse than any reading: it may be the incident itself.
_STATE_BADNESS = {
    HostState.HOST_KEY_MISMATCH: 5,
    HostState.HOST_KEY_REVOKED: 5,
    HostState.HOST_KEY_UNKNOWN: 4,
    HostState.NO_DRIVER: 4,
    HostState.AGENT_ERROR: 4,
    HostState.AUTH_FAILED: 4,
    HostState.REFUSED: 4,
    HostState.DOWN: 4,
    HostState.STALE: 3,
    HostState.CONNECTING: 1,
    HostState.LIVE: 0,
}


def _badness(store: FleetStore, host: str) -> tuple[int, int, int]:
    """Worst severity, then an unreadable state, then how many problems (warnings or worse).

    Info findings do not count: they come and go with the load (a GPU at its power limit),
    and counting them would shuffle the rows of a busy fleet every tick.
    """
    severity = store.severity(host)
    rank = int(severity) if severity is not None and severity >= Severity.WARNING else -1
    problems = sum(1 for f in store.findings(host) if f.severity >= Severity.WARNING)
    return (-rank, -_STATE_BADNESS[store.status(host).state], -problems)


def _metric(field: str) -> Callable[[FleetStore, str], float]:
    """Sort key for a summary figure, highest first, hosts without a reading last."""

    def key(store: FleetStore, host: str) -> float:
        snapshot = store.latest(host)
        value = None if snapshot is None else getattr(summarize(snapshot), field)
        return float("inf") if value is None else -value

    return key


_KEYS: dict[str, Callable[[FleetStore, str], object]] = {
    "worst": _badness,
    "name": lambda _store, _host: 0,
    "utilization": _metric("utilization_mean"),
    "temperature": _metric("hottest_c"),
    "power": _metric("power_w"),
    "memory": _metric("memory_used_mib"),
}


def sort_hosts(
    store: FleetStore, hosts: Iterable[str], by: str, reverse: bool = False
) -> list[str]:
    """Hosts ordered by ``by`` (one of SORT_KEYS), ties broken by name; ``reverse``: the other
    way round (the best first, the lowest first, Z to A)."""
    key = _KEYS[by]
    return sorted(hosts, key=lambda host: (key(store, host), host), reverse=reverse)


def fleet_order(store: FleetStore, by: str, text: str = "", reverse: bool = False) -> list[str]:
    """The hosts the fleet lists: those ``text`` matches (`host_matches`), ordered by ``by``."""
    matching = [h for h in store.hosts if host_matches(store, h, text)]
    return sort_hosts(store, matching, by, reverse)


SEVERITY_WORDS = {
    Severity.CRITICAL: "crit critical",
    Severity.WARNING: "warn warning",
    Severity.INFO: "info",
}
"""What the badges say (CRIT, WARN), and the words for them."""


def host_matches(store: FleetStore, host: str, text: str) -> bool:
    """Whether every word of a filter string is a whole word (or run of words) of the host's
    name, state, GPU model, a finding (its code, message or severity: ``crit``, ``warn``), the
    owner or user of one of its processes, or its scheduler node's state and reason
    (``drain``). Whole words: ``down`` finds down hosts, not a "slowdown"; ``h100`` finds
    h100-01 and every H100, ``h10`` nothing."""
    terms = text.lower().split()
    if not terms:
        return True
    state = store.status(host).state
    snapshot = store.latest(host)
    haystack = [host, state.value, SHORT_WORDS.get(state, ""), state_word(state, snapshot)]
    if snapshot is not None:
        haystack.extend(g.name or "" for g in snapshot.gpus)
        haystack.extend(f"{p.owner or ''} {p.user or ''}" for p in snapshot.processes)
        if snapshot.node is not None:
            haystack.append(f"{snapshot.node.state} {snapshot.node.reason or ''}")
    for finding in store.findings(host):
        haystack.append(f"{finding.code} {finding.message}")
        haystack.append(SEVERITY_WORDS[finding.severity])
    return words_match(terms, haystack)


def words_match(terms: Iterable[str], haystack: Iterable[str]) -> bool:
    """Whether every term (lower case) is a whole word, or run of words, of some text of
    ``haystack``: the one rule of every list's filter (the fleet's, triage's, the alerts')."""
    lowered = [item.lower() for item in haystack]
    return all(any(_whole_word(term).search(item) for item in lowered) for term in terms)


@lru_cache(maxsize=256)
def _whole_word(term: str) -> re.Pattern[str]:
    """``term`` where neither a letter nor a digit touches it on either side."""
    return re.compile(rf"(?<![^\W_]){re.escape(term)}(?![^\W_])")


def owners(processes: Iterable[GpuProcess]) -> list[str]:
    """Whose work these processes are (`GpuProcess.owner`), each once: the owner on the most
    GPUs first, equals in the order they come; a process with no owner is left out."""
    gpus: dict[str, set[int]] = {}
    for process in processes:
        if process.owner:
            gpus.setdefault(process.owner, set()).add(process.gpu)
    return sorted(gpus, key=lambda owner: -len(gpus[owner]))
