"""Fleet scale: read a fleet's GPUs from a Prometheus server that scrapes dcgm-exporter.

SSH fan-out keeps one connection per host; past a few hundred hosts the fleet's own Prometheus
is the better engine: it already scrapes every host's dcgm-exporter. This source asks it for
the latest value of every reading of every GPU in one instant query per polling round (PromQL
reduces the series to one per host, GPU and metric, so the answer carries four labels, not a
dozen), then serves each host's `read` from that answer.

Both spellings of every metric are read: dcgm-exporter's classic names and DCGM 4.6's renamed
ones (with 4.9's base units converted back), and the host from ``Hostname`` or ``hostname``
(else the scrape target's ``instance``). See `gpuconsole.telemetry.dcgm` for the names and their
sources. The hosts are those Prometheus knows when the source starts.

A polling round starts with the first `read` of a host already read in the current round: the
poller reads every host once per round. The first round is fetched when the source is made, so
the console's first reading of every host costs no request. Readings Prometheus does not have
stay None, never 0.
"""

from __future__ import annotations

import gc
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpuconsole.clock import Clock, wall_clock
from gpuconsole.model import (
    EccCounts,
    GpuState,
    HostSnapshot,
    HostState,
    PcieLink,
    RowRemap,
    XidEvent,
)
from gpuconsole.telemetry import SourceError, dcgm
from gpuconsole.untrusted import vetted, visible
from gpuconsole.xid import FALLEN_OFF_THE_BUS

_PRESENCE = ("utilization_pct", "temperature_c", "memory_used_mib")
"""A host exists for the source when Prometheus has one of these for it (or, from the console
exporter, its host state)."""
_DRIVER_LABELS = ("DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION")
_IDENTITY_LABELS = ("UUID", "modelName", "pci_bus_id", *_DRIVER_LABELS)
_XID_FIELD = "xid"
_CAPACITY_FIELD = "memory_capacity_mib"
"""A GPU whose only reading is XID 79 has stopped answering: it is lost, not idle."""
_UNREAD_STATES = frozenset(
    state.value for state in HostState if state not in (HostState.LIVE, HostState.CONNECTING)
)
IDENTITY_EVERY_SECONDS = 60.0
"""How often the GPUs' names, UUIDs and bus ids are read again (they rarely change)."""


class PrometheusError(SourceError):
    """Prometheus cannot be asked, or gave no usable answer; one line naming the URL."""


class PrometheusApi:
    """The few calls of Prometheus's HTTP API this source makes."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"{url}: not an http:// or https:// URL of a Prometheus server")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to at ``at``: a list of samples."""
        body = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"}).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/query",
            data=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise PrometheusError(_http_error(self.url, error)) from None
        except TimeoutError:
            raise PrometheusError(
                f"Prometheus at {self.url}: no answer within {self.timeout:g} s"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {reason}") from None
        try:
            answer = json.loads(raw)
            result = answer["data"]["result"]
        except (ValueError, KeyError, TypeError):
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


def _http_error(url: str, error: urllib.error.HTTPError) -> str:
    """Prometheus's own error text when it answered; else say the URL is not Prometheus."""
    try:
        detail = json.loads(error.read()).get("error")
    except (ValueError, AttributeError):
        detail = None
    if detail:
        return f"Prometheus at {url}: HTTP {error.code}: {detail}"
    return _not_prometheus(url, f" (HTTP {error.code} {error.reason})")


def _not_prometheus(url: str, why: str) -> str:
    return f"{url}: not a Prometheus API answer{why}: is this the Prometheus server's base URL?"


@dataclass(frozen=True, slots=True)
class _Round:
    """One polling round's answer: per host, per GPU, per field, a value."""

    time: float
    values: dict[str, dict[int, dict[str, float]]]
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
        self._fleet_query = _fleet_query(by)
        self._identity: dict[str, dict[int, dict[str, str]]] = {}
        self._identity_at = -math.inf
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
        return vetted(
            HostSnapshot(
                host=host,
                time=current.time,
                gpus=tuple(
                    _gpu(index, gpus[index], identity.get(index, {})) for index in sorted(gpus)
                ),
                driver_version=_driver(identity),
                xid_events=_xids(gpus, current.time),
                source="prometheus",
            )
        )

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
        at = self._clock()
        with _collector_paused():
            try:
                if at - self._identity_at >= IDENTITY_EVERY_SECONDS:
                    self._identity = self._read_identity(at)
                    self._identity_at = at
                samples = self._api.query(self._fleet_query, at)
            except PrometheusError as error:
                return _Round(at, {}, {}, str(error))
            return _Round(at, *self._values(samples))

    def _values(
        self, samples: list[dict[str, Any]]
    ) -> tuple[dict[str, dict[int, dict[str, float]]], dict[str, str]]:
        """Per host, per GPU, per field, a value; and the host states. Runs once per sample of
        the whole fleet, so it is written for speed."""
        values: dict[str, dict[int, dict[str, float]]] = {}
        states: dict[str, str] = {}
        host_of, names, isfinite = self._host_of, _NAMES, math.isfinite
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
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if not isfinite(value):
                continue
            field, factor, renamed = known
            gpu = values.setdefault(host_of(labels), {}).setdefault(index, {})
            if renamed and field in gpu:
                continue  # a GPU reporting under both names: the classic name's value wins
            gpu[field] = value * factor
        return values, states

    def _discover(self) -> tuple[tuple[str, ...], str]:
        presence = [name for field in _PRESENCE for name in dcgm.BY_FIELD[field].names]
        names = "|".join((*presence, dcgm.HOST_STATE_METRIC))
        labels = ", ".join((*dcgm.HOST_LABELS, "instance"))
        samples = self._api.query(f'count by ({labels}) ({{__name__=~"{names}"}})', self._clock())
        if not samples:
            raise PrometheusError(
                f"Prometheus at {self.url} has no dcgm-exporter GPU metrics "
                "(DCGM_FI_DEV_GPU_UTIL, _GPU_TEMP or _FB_USED): is it scraping dcgm-exporter?"
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
        temperature = dcgm.BY_FIELD["temperature_c"].names
        names = "|".join((*temperature, dcgm.XID_METRIC, dcgm.XID_RENAMED))
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


# --- the one query of a round -----------------------------------------------------------------


_NAMES: dict[str, tuple[str, float, bool]] = {
    **{metric.name: (metric.field, 1.0, False) for metric in dcgm.METRICS},
    **{
        name: (metric.field, factor, True)
        for metric in dcgm.METRICS
        for name, factor in metric.renamed
    },
    dcgm.XID_METRIC: (_XID_FIELD, 1.0, False),
    dcgm.XID_RENAMED: (_XID_FIELD, 1.0, True),
    dcgm.MEMORY_CAPACITY_BYTES: (_CAPACITY_FIELD, 1.0 / dcgm.MIB, False),
}
"""Every metric name read: the reading it carries, the factor to the classic unit, and whether
it is a newer name (the classic name wins when a GPU reports under both)."""


def _fleet_query(by: str) -> str:
    """Every reading of every GPU, one series per host, GPU and metric name (few labels), and
    the host states the console exporter reports."""
    names = "|".join(_NAMES)
    return f'max by ({by}, __name__) ({{__name__=~"{names}"}}) or {dcgm.HOST_STATE_METRIC} == 1'


# --- one answer to snapshots ---------------------------------------------------------------------


def _index(labels: dict[str, str]) -> int | None:
    try:
        return int(labels["gpu"])
    except (KeyError, TypeError, ValueError):
        return None


def _int(values: dict[str, float], field: str) -> int | None:
    value = values.get(field)
    return None if value is None else int(value)


def _flag(values: dict[str, float], field: str) -> bool | None:
    value = values.get(field)
    return None if value is None else value != 0


def _gpu(index: int, values: dict[str, float], identity: dict[str, str]) -> GpuState:
    if values.keys() <= {_XID_FIELD} and values.get(_XID_FIELD) == FALLEN_OFF_THE_BUS:
        return GpuState(
            index=index,
            name=identity.get("modelName") or None,
            uuid=identity.get("UUID") or None,
            pci_bus_id=identity.get("pci_bus_id") or None,
            lost=True,
        )
    used = values.get("memory_used_mib")
    free = values.get("memory_free_mib")
    total = values.get(_CAPACITY_FIELD)
    if total is None and used is not None and free is not None:
        total = used + free
    mask = values.get("throttle_mask")
    return GpuState(
        index=index,
        name=identity.get("modelName") or None,
        uuid=identity.get("UUID") or None,
        pci_bus_id=identity.get("pci_bus_id") or None,
        utilization_pct=values.get("utilization_pct"),
        memory_utilization_pct=values.get("memory_utilization_pct"),
        memory_used_mib=used,
        memory_total_mib=total,
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
        xid = gpus[index].get(_XID_FIELD)
        if xid:
            events.append(XidEvent(int(xid), index, at))
    return tuple(events)


def _driver(identity: dict[int, dict[str, str]]) -> str | None:
    for labels in identity.values():
        for label in _DRIVER_LABELS:
            if labels.get(label):
                return labels[label]
    return None
