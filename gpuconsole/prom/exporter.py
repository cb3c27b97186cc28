"""``gpuconsole exporter``: every watched host's readings at ``/metrics``, as dcgm-exporter names
them, plus the console's own findings and host states.

Metric and label names are dcgm-exporter's (see `gpuconsole.telemetry.dcgm`), so dashboards
and rules written for it work unchanged: the names and units of the generation the fleet's own
dcgm-exporter writes (`Naming`: the classic names, 4.9's, or each reading under both), and the
host and driver-version labels as it names them (``Hostname`` or ``hostname``,
``DCGM_FI_DRIVER_VERSION`` or ``DCGM_FI_SYSTEM_DRIVER_VERSION``). Two deliberate differences:
dcgm-exporter declares its error totals (ECC, remapped rows) as counters without the ``_total``
suffix the exposition format expects; here they are gauges, which queries read the same way.
And a reading the GPU does not report is left out rather than written as 0.

Beside them, the console's own series under their own names, the host under the same label:
findings, host states, and the GPU processes of each host (``gpuconsole_process_*``), labelled
with whose they are (user, Slurm job, pod, container) but
never with their command lines, which are unbounded and may hold secrets. A process's series
are its own (pids come and go), so each host gives series to at most `MAX_PROCESS_SERIES` of
its processes, the most memory first, and label values are cut to `MAX_LABEL_CHARS`.

Polling runs in its own thread into a fleet session without alert rules: Prometheus evaluates
the console's rules itself (``gpuconsole rules export`` writes them) over the series served
here. Only an exporter told to send alerts to Alertmanager (``--alertmanager``) evaluates them
too. A scrape only formats what the session's store holds. Scrapes are served a thread each,
by prometheus_client's WSGI app.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry

from gpuconsole.core.model import GpuProcess, GpuState, HostSnapshot, HostState
from gpuconsole.core.untrusted import visible
from gpuconsole.fleet.alerts.alertmanager import AlertmanagerSender
from gpuconsole.fleet.alerts.rules import AlertRule
from gpuconsole.fleet.poller import collect
from gpuconsole.fleet.session import FleetSession
from gpuconsole.fleet.store import FleetStore
from gpuconsole.telemetry import Source, dcgm

LISTEN_BACKLOG = 1024
"""Connections the kernel queues for the server before it accepts them. socketserver's default,
5, overflowed under a burst of 200 scrapes (a connection without room waits for the kernel's SYN
retry: 1 s, 3 s, 7 s ...); Linux caps the value at net.core.somaxconn (4096 since kernel 5.4)."""


MAX_PROCESS_SERIES = 64
"""Processes of one host given series, the most GPU memory first. Each process has series of its
own, so a host running hundreds of small ones (a data loader's workers) must not flood
Prometheus with series that live a minute; `HOST_PROCESSES_METRIC` says how many there were."""
MAX_LABEL_CHARS = 128
"""Label values a host chooses (user, job, pod and container names) are cut to this many
characters: Kubernetes namespaces and container names have at most 63, a Deployment's pods
fewer than 64, but a bare pod's name may have 253 and a Slurm job's name any number."""

PROCESS_LABELS = (
    "gpu",
    "pid",
    "user",
    "slurm_job_id",
    "slurm_job_name",
    "slurm_user",
    "namespace",
    "pod",
    "container",
)
"""Every process series' labels after the host's (`Naming.host`), the GPU as `gpuconsole_findings`
names it; a label that does not apply to a process (a bare process has no pod) is empty, which
Prometheus reads as absent."""
HOST_PROCESSES_METRIC = "gpuconsole_host_gpu_processes"


class ProcessMetric(NamedTuple):
    """One ``gpuconsole_process_*`` metric and the process reading it carries (None: left out)."""

    name: str
    help: str
    value: Callable[[GpuProcess], float | None]


def _memory_bytes(process: GpuProcess) -> float | None:
    mib = process.used_memory_mib
    return None if mib is None else mib * dcgm.MIB


def _share(attribute: str) -> Callable[[GpuProcess], float | None]:
    """A percentage of the process's load sample as a 0-1 ratio, Prometheus's base unit (as
    dcgm-exporter 4.9's ``DCGM_FI_DEV_GPU_UTIL_RATIO``)."""

    def ratio(process: GpuProcess) -> float | None:
        pct = None if process.load is None else getattr(process.load, attribute)
        return None if pct is None else pct / 100.0

    return ratio


PROCESS_METRICS: tuple[ProcessMetric, ...] = (
    ProcessMetric(
        "gpuconsole_process_memory_used_bytes",
        "GPU memory the process holds (bytes).",
        _memory_bytes,
    ),
    ProcessMetric(
        "gpuconsole_process_sm_utilization_ratio",
        "Share of the GPU's SM time the process used over NVML's last sample (0-1).",
        _share("sm_pct"),
    ),
    ProcessMetric(
        "gpuconsole_process_memory_utilization_ratio",
        "Share of time the GPU's memory controller was busy for the process (0-1).",
        _share("memory_pct"),
    ),
    ProcessMetric(
        "gpuconsole_process_encoder_utilization_ratio",
        "Share of the GPU's video encoder time the process used (0-1).",
        _share("encoder_pct"),
    ),
    ProcessMetric(
        "gpuconsole_process_decoder_utilization_ratio",
        "Share of the GPU's video decoder time the process used (0-1).",
        _share("decoder_pct"),
    ),
    ProcessMetric(
        "gpuconsole_process_start_time_seconds",
        "When the process started (Unix time, by the host's clock).",
        lambda process: process.started,
    ),
)
"""Every process metric the exporter writes, in the order it writes them."""


class _MetricsServer(ThreadingWSGIServer):
    """A thread per scrape, with room in the listen queue for a burst of them (IPv4)."""

    request_queue_size = LISTEN_BACKLOG


class _MetricsServer6(_MetricsServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """No line on stderr for each scrape."""

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Naming:
    """How the exporter names what it serves, chosen to match a fleet's dcgm-exporter (see
    `gpuconsole.telemetry.dcgm`): the generations of metric names each reading is written under
    (in each one's unit), the host's label (``Hostname`` before 4.8.3, ``hostname`` since) and
    the driver version's (``DCGM_FI_DRIVER_VERSION`` before 4.9,
    ``DCGM_FI_SYSTEM_DRIVER_VERSION`` since)."""

    generations: tuple[str, ...]
    host: str
    driver: str

    @classmethod
    def of(cls, generation: str, host: str | None = None, driver: str | None = None) -> Naming:
        """``generation``: one of `dcgm.CHOICES`; each label not given is the one that
        generation writes (`dcgm.labels_written`)."""
        generations = dcgm.generations_of(generation)
        written_host, written_driver = dcgm.labels_written(generations)
        return cls(generations, host or written_host, driver or written_driver)

    @property
    def gpu(self) -> tuple[str, ...]:
        """Every GPU series' labels, in dcgm-exporter's order."""
        return (*dcgm.GPU_LABELS, self.host, self.driver)


CLASSIC_NAMING = Naming.of(dcgm.CLASSIC)
"""Classic names, ``Hostname``: the default of `Exporter`, as `dcgm.CLASSIC_DIALECT` is of the
functions that write PromQL for it (the command passes `dcgm.DEFAULT_GENERATION`'s)."""


def gpu_labels(host: str, gpu: GpuState, driver: str | None = None) -> list[str]:
    """dcgm-exporter's label values for one GPU, in `Naming.gpu` order (a driver version
    the host did not report is empty, which Prometheus reads as absent)."""
    return [
        str(gpu.index),
        gpu.uuid or "",
        gpu.pci_bus_id or "",
        f"nvidia{gpu.index}",
        gpu.name or "",
        host,
        label_value(driver),
    ]


def label_value(text: str | None) -> str:
    """Text a host chose, as a label value: empty for None, control characters made visible as
    everywhere else (`untrusted.visible`), cut to `MAX_LABEL_CHARS`, and a lone surrogate (JSON
    can carry one) written as ``\\ud800``, since it has no UTF-8 and would fail the whole scrape.
    prometheus_client escapes the backslash, the double quote and the newline as the exposition
    format requires."""
    if not text:
        return ""
    utf8 = text[: MAX_LABEL_CHARS + 1].encode("utf-8", "backslashreplace").decode("utf-8")
    return visible(utf8, MAX_LABEL_CHARS)


def process_labels(host: str, process: GpuProcess) -> list[str]:
    """A process's label values, in `PROCESS_LABELS` order. Its container is the pod's container
    in a pod, else the runtime's name for it, else the runtime's id."""
    job, pod = process.job, process.pod
    owner = (
        process.user,
        None if job is None else str(job.job_id),
        None if job is None else job.name,
        None if job is None else job.user,
        None if pod is None else pod.namespace,
        None if pod is None else pod.name,
        pod.container if pod is not None else process.container_name or process.container,
    )
    return [host, str(process.gpu), str(process.pid), *map(label_value, owner)]


def _by_memory(process: GpuProcess) -> tuple[bool, float, int, int]:
    """The most memory first, unknown memory last; then by GPU and pid, so that a scrape keeps
    the same processes as the last one did when their memory is equal."""
    mib = process.used_memory_mib
    return (mib is None, -(mib or 0.0), process.gpu, process.pid)


def exported_processes(processes: Iterable[GpuProcess]) -> list[GpuProcess]:
    """The processes given series: at most `MAX_PROCESS_SERIES`, the most memory first, each GPU
    and pid once (NVML lists a process that computes and draws twice, once each way; Prometheus
    would drop one of two samples with one label set as a duplicate)."""
    kept: dict[tuple[int, int], GpuProcess] = {}
    for process in sorted(processes, key=_by_memory):
        if len(kept) == MAX_PROCESS_SERIES:
            break
        kept.setdefault((process.gpu, process.pid), process)
    return list(kept.values())


def process_families(host_label: str) -> list[GaugeMetricFamily]:
    """An empty family for each of `PROCESS_METRICS`, in its order, the host under
    ``host_label``."""
    labels = (host_label, *PROCESS_LABELS)
    return [GaugeMetricFamily(m.name, m.help, labels=labels) for m in PROCESS_METRICS]


def add_processes(families: Sequence[GaugeMetricFamily], host: str, snapshot: HostSnapshot) -> None:
    """The exported processes of ``snapshot`` into ``families`` (from `process_families`)."""
    for process in exported_processes(snapshot.processes):
        labels = process_labels(host, process)
        for metric, family in zip(PROCESS_METRICS, families, strict=True):
            value = metric.value(process)
            if value is not None:
                family.add_metric(labels, value)


class FleetCollector(Collector):
    """Formats the fleet store's latest readings on each scrape."""

    def __init__(self, store: FleetStore, lock: threading.Lock, naming: Naming) -> None:
        self._store = store
        self._lock = lock
        self._naming = naming

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [
                (
                    host,
                    self._store.status(host),
                    self._store.latest(host),
                    self._store.findings(host),
                )
                for host in self._store.hosts
            ]
        naming = self._naming
        host_label = naming.host
        readings = [
            (metric, unit, GaugeMetricFamily(name, help, labels=naming.gpu))
            for metric in dcgm.METRICS
            for name, help, unit in metric.written(naming.generations)
        ]
        xids = [
            GaugeMetricFamily(name, help, labels=naming.gpu)
            for name, help, _ in dcgm.XID.written(naming.generations)
        ]
        findings = GaugeMetricFamily(
            dcgm.FINDINGS_METRIC,
            "Health findings of the console, by host, GPU (empty: host-wide), code and severity.",
            labels=(host_label, "gpu", "code", "severity"),
        )
        states = GaugeMetricFamily(
            dcgm.HOST_STATE_METRIC,
            "1 for the state the host's reading stream is in, 0 for the others.",
            labels=(host_label, "state"),
        )
        last = GaugeMetricFamily(
            dcgm.HOST_LAST_READING_METRIC,
            "When the host's latest reading was taken (Unix time).",
            labels=(host_label,),
        )
        processes = process_families(host_label)
        host_processes = GaugeMetricFamily(
            HOST_PROCESSES_METRIC,
            "GPU processes the host reports, one per process and GPU; the gpuconsole_process_* "
            f"series cover at most {MAX_PROCESS_SERIES} of them, the most memory first.",
            labels=(host_label,),
        )
        for host, status, snapshot, host_findings in rows:
            for state in HostState:
                states.add_metric([host, state.value], float(state is status.state))
            counts = Counter((f.gpu, f.code, f.severity.label) for f in host_findings)
            for (gpu, code, severity), count in sorted(counts.items(), key=str):
                findings.add_metric([host, "" if gpu is None else str(gpu), code, severity], count)
            if status.last_seen is not None:
                last.add_metric([host], status.last_seen)
            if snapshot is None or status.state is not HostState.LIVE:
                continue  # no readings: let Prometheus see the series end, not a frozen value
            for gpu in snapshot.gpus:
                labels = gpu_labels(host, gpu, snapshot.driver_version)
                for xid in xids:
                    xid.add_metric(labels, dcgm.last_xid(snapshot, gpu.index))
                for metric, unit, family in readings:
                    value = metric.value(gpu)
                    if value is not None:
                        family.add_metric(labels, unit.written(value))
            add_processes(processes, host, snapshot)
            host_processes.add_metric([host], len(snapshot.processes))
        yield from (family for _, _, family in readings)
        yield from xids
        yield from (findings, states, last)
        yield from processes
        yield host_processes


class Exporter:
    """A source polled into a fleet session, served over HTTP for Prometheus to scrape."""

    def __init__(
        self,
        source: Source,
        refresh: float = 1.0,
        naming: Naming = CLASSIC_NAMING,
        *,
        rules: Sequence[AlertRule] = (),
        alertmanager: AlertmanagerSender | None = None,
    ) -> None:
        """``rules`` are evaluated only to send their alerts to ``alertmanager``: Prometheus
        evaluates the console's rules itself over the series served here."""
        self.source = source
        self.refresh = refresh
        self.fleet = FleetSession(source.hosts, rules, alertmanager=alertmanager)
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FleetCollector(self.store, self._lock, naming))
        self._server: _MetricsServer | None = None

    @property
    def store(self) -> FleetStore:
        """The readings, host states and findings served."""
        return self.fleet.store

    def poll_once(self) -> None:
        """Read every host once (blocking) and take the readings."""
        readings = collect(self.source)
        with self._lock:
            self.fleet.take(readings)

    def listen(self, address: str, port: int) -> tuple[str, int]:
        """Start serving ``/metrics`` in a background thread; the address and port bound.

        ``address`` is an IPv4 or IPv6 address or a host name. OSError when it cannot be
        resolved or the port cannot be bound.
        """
        family, _, _, _, sockaddr = socket.getaddrinfo(
            address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        server_class = _MetricsServer6 if family == socket.AF_INET6 else _MetricsServer
        server = make_server(
            sockaddr[0], port, make_wsgi_app(self.registry), server_class, _QuietHandler
        )
        threading.Thread(target=server.serve_forever, name="exporter-http", daemon=True).start()
        self._server = server
        bound_address, bound_port = server.server_address[:2]
        return str(bound_address), int(bound_port)

    def run(self, stop: threading.Event) -> None:
        """Poll every ``refresh`` seconds until ``stop`` is set."""
        while not stop.is_set():
            self.poll_once()
            stop.wait(self.refresh)

    def close(self) -> None:
        server = self._server
        if server is not None:
            server.shutdown()
            server.server_close()
            self._server = None
