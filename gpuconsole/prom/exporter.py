"""``gpuconsole exporter``: every watched host's readings at ``/metrics``, as dcgm-exporter names
them, plus the console's own findings and host states.

Metric and label names are dcgm-exporter's (see `gpuconsole.telemetry.dcgm`), so dashboards
and rules written for it work unchanged. Two deliberate differences: dcgm-exporter declares
its error totals (ECC, remapped rows) as counters without the ``_total`` suffix the exposition
format expects; here they are gauges, which queries read the same way. And a reading the GPU
does not report is left out rather than written as 0.

Polling runs in its own thread into a fleet session without alert rules: Prometheus evaluates
the console's rules itself (``gpuconsole rules export`` writes them) over the series served
here. A scrape only formats what the session's store holds. Scrapes are served a thread each,
by prometheus_client's WSGI app.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry

from gpuconsole.fleet import FleetSession
from gpuconsole.model import GpuState, HostState
from gpuconsole.poller import collect
from gpuconsole.store import FleetStore
from gpuconsole.telemetry import Source, dcgm

LISTEN_BACKLOG = 1024
"""Connections the kernel queues for the server before it accepts them. socketserver's default,
5, overflowed under a burst of 200 scrapes (a connection without room waits for the kernel's SYN
retry: 1 s, 3 s, 7 s ...); Linux caps the value at net.core.somaxconn (4096 since kernel 5.4)."""


class _MetricsServer(ThreadingWSGIServer):
    """A thread per scrape, with room in the listen queue for a burst of them (IPv4)."""

    request_queue_size = LISTEN_BACKLOG


class _MetricsServer6(_MetricsServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """No line on stderr for each scrape."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def gpu_labels(host: str, gpu: GpuState) -> list[str]:
    """dcgm-exporter's label values for one GPU, in `dcgm.GPU_LABELS` order."""
    return [
        str(gpu.index),
        gpu.uuid or "",
        gpu.pci_bus_id or "",
        f"nvidia{gpu.index}",
        gpu.name or "",
        host,
    ]


class FleetCollector(Collector):
    """Formats the fleet store's latest readings on each scrape."""

    def __init__(self, store: FleetStore, lock: threading.Lock) -> None:
        self._store = store
        self._lock = lock

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
        families = {
            m.name: GaugeMetricFamily(m.name, m.help, labels=dcgm.GPU_LABELS) for m in dcgm.METRICS
        }
        xid = GaugeMetricFamily(dcgm.XID_METRIC, dcgm.XID_HELP, labels=dcgm.GPU_LABELS)
        findings = GaugeMetricFamily(
            dcgm.FINDINGS_METRIC,
            "Health findings of the console, by host, GPU (empty: host-wide), code and severity.",
            labels=(dcgm.HOST_LABEL, "gpu", "code", "severity"),
        )
        states = GaugeMetricFamily(
            dcgm.HOST_STATE_METRIC,
            "1 for the state the host's reading stream is in, 0 for the others.",
            labels=(dcgm.HOST_LABEL, "state"),
        )
        last = GaugeMetricFamily(
            dcgm.HOST_LAST_READING_METRIC,
            "When the host's latest reading was taken (Unix time).",
            labels=(dcgm.HOST_LABEL,),
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
                labels = gpu_labels(host, gpu)
                xid.add_metric(labels, dcgm.last_xid(snapshot, gpu.index))
                for metric in dcgm.METRICS:
                    value = metric.value(gpu)
                    if value is not None:
                        families[metric.name].add_metric(labels, value)
        yield from families.values()
        yield from (xid, findings, states, last)


class Exporter:
    """A source polled into a fleet session, served over HTTP for Prometheus to scrape."""

    def __init__(self, source: Source, refresh: float = 1.0) -> None:
        self.source = source
        self.refresh = refresh
        self.fleet = FleetSession(source.hosts, ())
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FleetCollector(self.store, self._lock))
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
