"""Fleet scale: read a fleet's GPUs from a Prometheus server that scrapes dcgm-exporter.

SSH fan-out keeps one connection per host; past a few hundred hosts the fleet's own Prometheus
is the better engine: it already scrapes every host's dcgm-exporter. This source asks it for
the latest value of the readings the console uses, of every GPU, in one instant query per
polling round (PromQL reduces the series to one per host, GPU and metric, so the answer carries
four labels, not a dozen), then serves each host's `read` from that answer. Readings that change
slowly (limits, capacities, error counters, memory activity) and the GPUs' identities are asked
for every `SLOW_EVERY_SECONDS` only, as dcgm-exporter collects them, each in a round of its own
(the first round asks for all), so that no round carries them all.

Every spelling of every metric is read: dcgm-exporter's classic names, dcgm-exporter 4.9's
(DCGM 4.7 names, in bytes, hertz and 0-1 ratios, converted to the console's units) and the
other names DCGM gives the same field; the host from ``Hostname`` or ``hostname`` (else the
scrape target's ``instance``). See `gpuconsole.telemetry.dcgm` for the names and their sources.
The hosts are those Prometheus knows when the source starts.

A polling round starts with the first `read` of a host already read in the current round: the
poller reads every host once per round. The first round is fetched when the source is made, so
the console's first reading of every host costs no request. Readings Prometheus does not have
stay None, never 0. Every answer, those of the start included, is read whole within the timeout
and up to `MAX_ANSWER_BYTES` (`gpuconsole.telemetry.http_answer`), or the source says in one
line that Prometheus was slow or its answer too big.
"""

from __future__ import annotations

import gc
import json
import math
import urllib.parse
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuconsole.core.clock import Clock, wall_clock
from gpuconsole.core.model import (
    EccCounts,
    GpuState,
    HostSnapshot,
    HostState,
    PcieLink,
    RowRemap,
    XidEvent,
)
from gpuconsole.core.untrusted import vetted, visible
from gpuconsole.core.xid import FALLEN_OFF_THE_BUS
from gpuconsole.telemetry import SourceError, dcgm

if TYPE_CHECKING:
    from gpuconsole.telemetry.http_answer import Answer

_PRESENCE = ("utilization_pct", "temperature_c", "memory_used_mib")
"""A host exists for the source when Prometheus has one of these for it (or, from the console
exporter, its host state)."""
_IDENTITY_LABELS = ("UUID", "modelName", "pci_bus_id", *dcgm.DRIVER_LABELS)
FAST_READINGS = (
    "utilization_pct",
    "memory_used_mib",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
    "throttle_mask",
    "pcie_gen",
    "pcie_width",
    "xid",
)
"""Readings asked for every round: what moves with the GPU's work (a PCIe link trains down when
idle, so its generation and width move too)."""
SLOW_READINGS = (
    "memory_total_mib",
    "memory_free_mib",
    "memory_utilization_pct",
    "slowdown_temperature_c",
    "power_limit_w",
    "sm_clock_max_mhz",
    "memory_clock_mhz",
    "memory_clock_max_mhz",
    "ecc_corrected",
    "ecc_uncorrected",
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
    "remap_correctable",
    "remap_uncorrectable",
    "remap_pending",
    "remap_failure",
    "pcie_max_gen",
    "pcie_max_width",
    "persistence_mode",
)
"""Readings asked for every `SLOW_EVERY_SECONDS`: settings, capacities, error counters and memory
activity: every reading of `gpuconsole.core.fields` that dcgm-exporter serves and is not fast."""
SLOW_EVERY_SECONDS = 30.0
"""dcgm-exporter's own collection interval (NVIDIA/dcgm-exporter ``pkg/cmd/app.go``,
``collect-interval``, 30000 ms by default): its values change no faster. The GPUs' names, UUIDs,
bus ids and driver are read again at the same pace."""
_SLOW_SET = frozenset(SLOW_READINGS)
_IDENTITY = "identity"
"""The schedule's name for the query of the GPUs' identities."""
_UNREAD_STATES = frozenset(
    state.value for state in HostState if state not in (HostState.LIVE, HostState.CONNECTING)
)
MAX_ANSWER_BYTES = 32 << 20
"""The largest answer read: a first round of 1,000 hosts × 8 GPUs (every reading) is 11.4 MiB
of JSON (docs/benchmarks.md), so some 2,800 hosts fit, twice as many in later rounds. A larger
answer is refused, not read into memory (200 MB of it took the console to 657 MB). Decoded, 32
MiB of samples take some 210 MiB; of JSON written to cost the most (empty objects), 770 MiB."""


class PrometheusError(SourceError):
    """Prometheus cannot be asked, or gave no usable answer; one line naming the URL."""


class PrometheusApi:
    """The few calls of Prometheus's HTTP API this source makes, each answer whole within
    ``timeout`` seconds and at most ``max_bytes`` long."""

    def __init__(self, url: str, timeout: float = 10.0, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"{url}: not an http:// or https:// URL of a Prometheus server")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_bytes = max_bytes

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to at ``at``: a list of samples."""
        # Loaded with the first query, as the Alertmanager sender loads it with its first alert.
        import urllib.request

        from gpuconsole.telemetry.http_answer import AnswerError, Unreachable, read_answer

        body = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"}).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/query",
            data=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            reply = read_answer(request, timeout=self.timeout, limit=self.max_bytes)
        except Unreachable as error:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {error}") from None
        except AnswerError as error:
            raise PrometheusError(f"Prometheus at {self.url}: {error}") from None
        if not reply.ok:
            raise PrometheusError(_http_error(self.url, reply))
        try:
            answer = json.loads(reply.body)
            result = answer["data"]["result"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise PrometheusError(_not_prometheus(self.url, "")) from None
        if answer.get("status") != "success" or answer["data"].get("resultType") != "vector":
            error = visible(str(answer.get("error", "not a vector")), 200)
            raise PrometheusError(f"Prometheus at {self.url}: {error}")
        if not isinstance(result, list):
            raise PrometheusError(_not_prometheus(self.url, ""))
        # What the readers index: a sample's labels (a mapping) and its [time, value] pair.
        return [s for s in result if isinstance(s, dict) and isinstance(s.get("metric"), dict)]


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while an answer is decoded.

    A fleet's answer is some 100,000 small dicts and lists, none in a cycle; building them
    triggers collection after collection, each scanning the whole heap (the store's history
    included): measured, that doubles the time to decode 8,000 GPUs' readings.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _http_error(url: str, answer: Answer) -> str:
    """Prometheus's own error text (made one visible line) when it answered; else say the URL is
    not Prometheus."""
    try:
        detail = json.loads(answer.body).get("error")
    except (ValueError, AttributeError, RecursionError):
        detail = None
    if detail:
        return f"Prometheus at {url}: HTTP {answer.status}: {visible(str(detail), 200)}"
    return _not_prometheus(url, f" (HTTP {answer.status} {answer.reason})")


def _not_prometheus(url: str, why: str) -> str:
    return f"{url}: not a Prometheus API answer{why}: is this the Prometheus server's base URL?"


Values = dict[str, dict[int, dict[str, float]]]
"""Per host, per GPU, per reading, a value in the console's unit."""
_Inputs = tuple[dict[str, float], dict[str, float], dict[str, str]]
"""What a GPU's state is made of: its fast readings, its slow ones, its identity's labels."""


@dataclass(frozen=True, slots=True)
class _Round:
    """One polling round's answer: the fast readings of every GPU and the host states."""

    time: float
    values: Values
    states: dict[str, str]
    """The host states the console exporter reports, for hosts it cannot read."""
    error: str | None = None


class PrometheusSource:
    """The `Source` over a Prometheus server's dcgm-exporter metrics."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        clock: Clock = wall_clock,
        api: PrometheusApi | None = None,
    ) -> None:
        self._api = api or PrometheusApi(url, timeout)
        self.url = self._api.url
        self._clock = clock
        hosts, by = self._discover()
        self._hosts = hosts
        self._by = by
        self._identity: dict[str, dict[int, dict[str, str]]] = {}
        self._slow: Values = {}
        """The latest slow readings, and ``memory_sum_mib``: used + free of the round that
        brought free."""
        self._due = dict.fromkeys((*SLOW_READINGS, _IDENTITY), -math.inf)
        self._last: dict[str, tuple[HostSnapshot, dict[int, tuple[_Inputs, GpuState]]]] = {}
        """Each host's last snapshot, and each of its GPUs that passed vetting unchanged with the
        readings it was made of: a GPU whose readings did not change since (dcgm-exporter
        collects every 30 s, most rounds bring the same values) is that very object again, which
        `vetted` does not check twice."""
        self._served: set[str] = set()
        self._round = self._fetch()

    @property
    def hosts(self) -> tuple[str, ...]:
        return self._hosts

    def read(self, host: str) -> HostSnapshot:
        current = self._current_round(host)
        self._served.add(host)
        if current.error is not None:
            raise SourceError(f"{host}: {current.error}")
        gpus = current.values.get(host)
        if not gpus:
            state = current.states.get(host)
            if state in _UNREAD_STATES:
                raise SourceError(
                    f"{host}: {state} (says the gpuconsole exporter Prometheus scrapes)",
                    HostState(state),
                )
            raise SourceError(f"{host}: no dcgm-exporter readings in Prometheus at {self.url}")
        identity = self._identity.get(host, {})
        slow = self._slow.get(host, {})
        known, built = self._last.get(host, (None, {}))
        made: dict[int, tuple[_Inputs, GpuState]] = {}
        for index in sorted(gpus):
            inputs = (gpus[index], dict(slow.get(index, {})), identity.get(index, {}))
            old = built.get(index)
            gpu = old[1] if old is not None and old[0] == inputs else _gpu(index, *inputs)
            made[index] = (inputs, gpu)
        snapshot = vetted(
            HostSnapshot(
                host=host,
                time=current.time,
                gpus=tuple(gpu for _, gpu in made.values()),
                driver_version=_driver(identity),
                xid_events=_xids(gpus, current.time),
                source="prometheus",
            ),
            known,
        )
        passed = {id(gpu) for gpu in snapshot.gpus}
        self._last[host] = (snapshot, {i: m for i, m in made.items() if id(m[1]) in passed})
        return snapshot

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        return []

    def close(self) -> None:
        """Nothing to release: every call is one HTTP request."""

    # --- rounds ----------------------------------------------------------------------------------

    def _current_round(self, host: str) -> _Round:
        if host in self._served:
            self._round = self._fetch()
            self._served = set()
        return self._round

    def _fetch(self) -> _Round:
        """The fast readings of every GPU, and the slow readings that are due (all of them in the
        first round), in one query; the GPUs' identities in a second when due."""
        at = self._clock()
        due = [name for name, when in self._due.items() if when <= at]
        slow = [name for name in due if name != _IDENTITY]
        query = _readings_query(self._by, (*FAST_READINGS, *slow), dcgm.HOST_STATE_METRIC)
        with _collector_paused():
            try:
                if _IDENTITY in due:
                    self._identity = self._read_identity(at)
                samples = self._api.query(query, at)
            except PrometheusError as error:
                return _Round(at, {}, {}, str(error))
            values, states = self._values(samples)
        self._keep_slow(values, slow)
        self._schedule(due, at)
        return _Round(at, values, states)

    def _schedule(self, done: list[str], at: float) -> None:
        """When each query just done is due next. Those of the first round come due spread
        over the next period, each its own share of it later, so that no later round reads them
        all; then each comes due a period after it last came due (or a period from now, after a
        pause longer than the period), which keeps the spread."""
        for number, name in enumerate(done):
            following = self._due[name] + SLOW_EVERY_SECONDS
            if following == -math.inf:
                following = at + SLOW_EVERY_SECONDS * (number + 1) / (len(done) + 1)
            elif following <= at:
                following = at + SLOW_EVERY_SECONDS
            self._due[name] = following

    def _keep_slow(self, values: Values, read: list[str]) -> None:
        """Move the slow readings of a round's answer into `_slow`, replacing (or forgetting,
        for a GPU that no longer has them) those of the same readings."""
        if not read:
            return
        fields = frozenset(read)
        for gpus in self._slow.values():
            for cached in gpus.values():
                for field in fields & cached.keys():
                    del cached[field]
                if "memory_free_mib" in fields:
                    cached.pop("memory_sum_mib", None)
        for host, gpus in values.items():
            for index, gpu in gpus.items():
                found = _SLOW_SET & gpu.keys()
                if not found:
                    continue
                cached = self._slow.setdefault(host, {}).setdefault(index, {})
                for field in found:
                    cached[field] = gpu.pop(field)
                free = cached.pop("memory_free_mib", None)
                if free is not None and "memory_used_mib" in gpu:
                    cached["memory_sum_mib"] = gpu["memory_used_mib"] + free

    def _values(self, samples: list[dict[str, Any]]) -> tuple[Values, dict[str, str]]:
        """Per host, per GPU, per reading, a value; and the host states. Runs once per sample of
        the whole fleet, so it is written for speed."""
        values: Values = {}
        states: dict[str, str] = {}
        ranks: dict[tuple[int, str], int] = {}
        hosts: dict[str, str] = {}
        """Each host label's value made visible, once per answer rather than once per sample."""
        names, isfinite = _NAMES, math.isfinite

        def host_of(labels: dict[str, Any]) -> str:
            raw = labels.get("Hostname") or labels.get("hostname") or labels.get("instance")
            if not isinstance(raw, str):
                return self._host_of(labels)
            host = hosts.get(raw)
            if host is None:
                host = hosts[raw] = self._host_of(labels)
            return host

        for sample in samples:
            labels = sample["metric"]
            name = labels.get("__name__")
            known = names.get(name) if isinstance(name, str) else None
            if known is None:
                state = labels.get("state")
                if name == dcgm.HOST_STATE_METRIC and isinstance(state, str):
                    states[host_of(labels)] = state
                continue
            try:
                index = int(labels["gpu"])
                value = float(sample["value"][1])
            except (KeyError, IndexError, TypeError, ValueError, OverflowError):
                continue
            if not isfinite(value):
                continue
            field, multiply, divide, rank = known
            gpu = values.setdefault(host_of(labels), {}).setdefault(index, {})
            if field in gpu:  # a GPU reporting under several names: the lowest rank's wins
                key = (id(gpu), field)
                if rank >= ranks.get(key, 0):
                    continue
                ranks[key] = rank
            elif rank:
                ranks[id(gpu), field] = rank
            gpu[field] = value * multiply / divide
        return values, states

    def _discover(self) -> tuple[tuple[str, ...], str]:
        presence = [name for field in _PRESENCE for name in dcgm.BY_FIELD[field].names]
        names = "|".join((*presence, dcgm.HOST_STATE_METRIC))
        labels = ", ".join((*dcgm.HOST_LABELS, "instance"))
        samples = self._api.query(f'count by ({labels}) ({{__name__=~"{names}"}})', self._clock())
        if not samples:
            raise PrometheusError(
                f"Prometheus at {self.url} has no dcgm-exporter GPU metrics "
                "(DCGM_FI_DEV_GPU_UTIL, _GPU_TEMP, _FB_USED or dcgm-exporter 4.9's "
                "_GPU_UTIL_RATIO, _GPU_TEMP_CELSIUS, _FB_USED_BYTES): is it scraping dcgm-exporter?"
            )
        by_instance = any(
            not any(sample["metric"].get(label) for label in dcgm.HOST_LABELS) for sample in samples
        )
        by = ", ".join((*dcgm.HOST_LABELS, *(("instance",) if by_instance else ()), "gpu"))
        hosts = {self._host_of(sample["metric"]) for sample in samples}
        return tuple(sorted(hosts)), by

    def _read_identity(self, at: float) -> dict[str, dict[int, dict[str, str]]]:
        """Each GPU's name, UUID, bus id and driver, from the labels of two metrics every GPU
        has in dcgm-exporter's defaults (a lost GPU keeps only its XID)."""
        names = "|".join((*dcgm.BY_FIELD["temperature_c"].names, *dcgm.XID.names))
        by = ", ".join((self._by, *_IDENTITY_LABELS))
        identity: dict[str, dict[int, dict[str, str]]] = defaultdict(dict)
        for sample in self._api.query(f'group by ({by}) ({{__name__=~"{names}"}})', at):
            labels = sample["metric"]
            index = _index(labels)
            if index is not None:
                identity[self._host_of(labels)][index] = labels
        return identity

    @staticmethod
    def _host_of(labels: dict[str, str]) -> str:
        """The host a sample's labels name, made visible (labels are what exporters wrote)."""
        for label in (*dcgm.HOST_LABELS, "instance"):
            value = labels.get(label)
            if value and isinstance(value, str):
                return visible(value, 255)
        return ""


# --- the queries of a round -----------------------------------------------------------------------


_NAMES: dict[str, tuple[str, float, float, int]] = {
    name: (metric.field, unit.multiply, unit.divide, rank)
    for metric in dcgm.BY_FIELD.values()
    for rank, (name, unit) in enumerate(metric.spellings())
}
"""Every metric name read: the reading it carries, its conversion to the console's unit
(``value * multiply / divide``), and its rank among the reading's names (0 is the classic name;
a GPU reporting under several names is read under the lowest rank)."""


def _readings_query(by: str, fields: tuple[str, ...], *extra: str) -> str:
    """The readings of ``fields`` (every spelling) of every GPU, one series per host, GPU and
    metric name (few labels), or-ed with ``extra`` series where the value is 1."""
    names = "|".join(name for field in fields for name in dcgm.BY_FIELD[field].names)
    query = f'max by ({by}, __name__) ({{__name__=~"{names}"}})'
    return " or ".join((query, *(f"{name} == 1" for name in extra)))


# --- one answer to snapshots ---------------------------------------------------------------------


def _index(labels: dict[str, str]) -> int | None:
    try:
        return int(labels["gpu"])
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def _int(values: dict[str, float], field: str) -> int | None:
    value = values.get(field)
    return None if value is None else int(value)


def _flag(values: dict[str, float], field: str) -> bool | None:
    value = values.get(field)
    return None if value is None else value != 0


def _gpu(
    index: int, fast: dict[str, float], slow: dict[str, float], identity: dict[str, str]
) -> GpuState:
    """A GPU's state from this round's fast readings and the latest slow ones. A GPU whose only
    reading is XID 79 has stopped answering: it is lost, not idle."""
    if fast.keys() <= {"xid"} and fast.get("xid") == FALLEN_OFF_THE_BUS:
        return GpuState(
            index=index,
            name=identity.get("modelName") or None,
            uuid=identity.get("UUID") or None,
            pci_bus_id=identity.get("pci_bus_id") or None,
            lost=True,
        )
    values = {**slow, **fast}
    mask = values.get("throttle_mask")
    return GpuState(
        index=index,
        name=identity.get("modelName") or None,
        uuid=identity.get("UUID") or None,
        pci_bus_id=identity.get("pci_bus_id") or None,
        utilization_pct=values.get("utilization_pct"),
        memory_utilization_pct=values.get("memory_utilization_pct"),
        memory_used_mib=values.get("memory_used_mib"),
        memory_total_mib=values.get("memory_total_mib", values.get("memory_sum_mib")),
        temperature_c=values.get("temperature_c"),
        slowdown_temperature_c=values.get("slowdown_temperature_c"),
        power_w=values.get("power_w"),
        power_limit_w=values.get("power_limit_w"),
        sm_clock_mhz=values.get("sm_clock_mhz"),
        sm_clock_max_mhz=values.get("sm_clock_max_mhz"),
        memory_clock_mhz=values.get("memory_clock_mhz"),
        memory_clock_max_mhz=values.get("memory_clock_max_mhz"),
        throttle_reasons=None if mask is None else dcgm.reasons_of(mask),
        ecc=_ecc(values),
        remap=_remap(values),
        pcie=_pcie(values),
        persistence_mode=_flag(values, "persistence_mode"),
    )


def _has(values: dict[str, float], fields: frozenset[str]) -> bool:
    return not fields.isdisjoint(values)


_ECC_FIELDS = (
    "ecc_corrected",
    "ecc_uncorrected",
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
)
_REMAP_FIELDS = ("remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failure")
_PCIE_FIELDS = ("pcie_gen", "pcie_width", "pcie_max_gen", "pcie_max_width")
_ECC_SET, _REMAP_SET, _PCIE_SET = map(frozenset, (_ECC_FIELDS, _REMAP_FIELDS, _PCIE_FIELDS))


def _ecc(values: dict[str, float]) -> EccCounts | None:
    if not _has(values, _ECC_SET):
        return None
    return EccCounts(*(_int(values, field) for field in _ECC_FIELDS))


def _remap(values: dict[str, float]) -> RowRemap | None:
    if not _has(values, _REMAP_SET):
        return None
    return RowRemap(
        correctable=_int(values, "remap_correctable"),
        uncorrectable=_int(values, "remap_uncorrectable"),
        pending=_flag(values, "remap_pending"),
        failure=_flag(values, "remap_failure"),
    )


def _pcie(values: dict[str, float]) -> PcieLink | None:
    if not _has(values, _PCIE_SET):
        return None
    return PcieLink(*(_int(values, field) for field in _PCIE_FIELDS))


def _xids(gpus: dict[int, dict[str, float]], at: float) -> tuple[XidEvent, ...]:
    """dcgm-exporter keeps the last XID per GPU (0: none); a last XID is an event to report."""
    events = []
    for index in sorted(gpus):
        xid = gpus[index].get("xid")
        if xid:
            events.append(XidEvent(int(xid), index, at))
    return tuple(events)


def _driver(identity: dict[int, dict[str, str]]) -> str | None:
    for labels in identity.values():
        for label in dcgm.DRIVER_LABELS:
            if labels.get(label):
                return labels[label]
    return None
