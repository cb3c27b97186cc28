"""The fleet screen on the Prometheus source: 1,000 hosts × 8 GPUs scraped by a real Prometheus.

    python benchmarks/prometheus_fleet.py [--hosts 1000] [--gpus 8] [--targets 10]
        [--refresh 5] [--scrape-interval 15] [--names classic|4.9] [--warm-up 15] [--seconds 60]

A simulated dcgm-exporter serves ``--hosts`` hosts of ``--gpus`` GPUs, split over ``--targets``
scrape targets, with dcgm-exporter's default metrics and labels (values move between scrapes),
under the classic names or dcgm-exporter 4.9's (``--names``).
A private Prometheus on 127.0.0.1 scrapes it every ``--scrape-interval`` seconds (15 s, a common
production setting; dcgm-exporter itself collects every 30 s by default). The console runs in a
process of its own, headless, on `PrometheusSource` with the same refresh: the Textual app with
its fleet screen (a row per host, worst first) and the alert engine, as `gpuconsole --prometheus
URL --refresh 5` runs it.

Measured in the console's process, over ``--seconds`` after ``--warm-up``:

- query → screen: from the start of a polling round (the instant query) to the first screen
  refresh after its readings were applied (store, health findings, alerts, fleet table);
  split into the query (HTTP + JSON + snapshots, in the worker thread) and the rest; the slow
  readings (each every 30 s, spread over the rounds) are part of the rounds' queries;
- the console's CPU, as a share of one core (user + system, every thread), and its RSS.

Prints a table, then one JSON line with every figure. Needs prometheus (Debian package).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from promserver import Prometheus, prometheus_available  # noqa: E402

from gpuconsole.telemetry import dcgm  # noqa: E402

# dcgm-exporter's default collectors (etc/default-counters.csv), with the kind of value each
# takes: (name, low, high).
METRICS = (
    ("DCGM_FI_DEV_SM_CLOCK", 1400, 1980),
    ("DCGM_FI_DEV_MEM_CLOCK", 2619, 2619),
    ("DCGM_FI_DEV_MEMORY_TEMP", 40, 70),
    ("DCGM_FI_DEV_GPU_TEMP", 35, 88),
    ("DCGM_FI_DEV_POWER_USAGE", 70, 700),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e9, 2e9),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 0, 0),
    ("DCGM_FI_DEV_GPU_UTIL", 0, 100),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", 0, 60),
    ("DCGM_FI_DEV_ENC_UTIL", 0, 0),
    ("DCGM_FI_DEV_DEC_UTIL", 0, 0),
    ("DCGM_FI_DEV_XID_ERRORS", 0, 0),
    ("DCGM_FI_DEV_FB_FREE", 0, 0),  # the capacity less the used memory below
    ("DCGM_FI_DEV_FB_USED", 1000, 80000),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 0, 1e6),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", 0, 0),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 0, 0),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 0, 0),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0, 0),
    ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 700, 700),
)
UNREAD_4_9 = {
    "DCGM_FI_DEV_MEMORY_TEMP": ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1e-3),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 1.0),
    "DCGM_FI_DEV_ENC_UTIL": ("DCGM_FI_DEV_ENC_UTIL_RATIO", 0.01),
    "DCGM_FI_DEV_DEC_UTIL": ("DCGM_FI_DEV_DEC_UTIL_RATIO", 0.01),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND", 1e6),
}
"""dcgm-exporter 4.9's names and units for the default metrics the console does not read (their
4.9 names are DCGM 4.7's; only the number of series matters here). The console's own are in
`gpuconsole.telemetry.dcgm`."""
CAPACITY_MIB = 81559
"""An H100 80GB HBM3's memory, as NVML counts it."""
VARIANTS = 4
"""Pre-rendered expositions per target, served in turn, so the exporter costs little CPU."""


def renamed(name: str, value: float, names: str) -> tuple[str, float]:
    """A classic metric as dcgm-exporter of the generation ``names`` writes it."""
    if names == "classic":
        return name, value
    metric = dcgm.BY_NAME.get(name)
    if metric is not None:
        return metric.current_name, value * metric.unit.divide / metric.unit.multiply
    current, scale = UNREAD_4_9.get(name, (name, 1.0))
    return current, value * scale


def exposition(hosts: list[str], gpus: int, seed: int, names: str) -> bytes:
    rng = random.Random(seed)
    host_label, driver_label = (
        ("Hostname", "DCGM_FI_DRIVER_VERSION")
        if names == "classic"
        else ("hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION")
    )
    metrics = list(METRICS)
    if names != "classic":  # collected by default since 4.9
        metrics.append(("DCGM_FI_DEV_FB_TOTAL", CAPACITY_MIB, CAPACITY_MIB))
    used = {(host, gpu): rng.randint(1000, 80000) for host in hosts for gpu in range(gpus)}
    lines = []
    for classic, low, high in metrics:
        name = renamed(classic, 0, names)[0]
        lines.append(f"# HELP {name} simulated\n# TYPE {name} gauge")
        for host in hosts:
            for gpu in range(gpus):
                labels = (
                    f'gpu="{gpu}",UUID="GPU-{host}-{gpu:02d}-0000-0000-000000000000",'
                    f'pci_bus_id="00000000:{16 + gpu:02X}:00.0",device="nvidia{gpu}",'
                    f'modelName="NVIDIA H100 80GB HBM3",{host_label}="{host}",'
                    f'{driver_label}="570.133.20"'
                )
                if classic == "DCGM_FI_DEV_FB_USED":
                    value = used[host, gpu]
                elif classic == "DCGM_FI_DEV_FB_FREE":
                    value = CAPACITY_MIB - used[host, gpu]
                else:
                    value = low if low == high else round(rng.uniform(low, high))
                lines.append(f"{name}{{{labels}}} {renamed(classic, value, names)[1]!r}")
    return ("\n".join(lines) + "\n").encode()


class SimulatedExporters:
    """``targets`` dcgm-exporters on one port, told apart by path: /t0/metrics, /t1/metrics..."""

    def __init__(self, hosts: int, gpus: int, targets: int, names: str) -> None:
        hostnames = [f"gpu-{i:04d}" for i in range(hosts)]
        per = -(-hosts // targets)
        self.bodies = [
            [
                exposition(hostnames[t * per : (t + 1) * per], gpus, t * 100 + v, names)
                for v in range(VARIANTS)
            ]
            for t in range(targets)
        ]
        self.served = [0] * targets
        bodies, served = self.bodies, self.served

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                target = int(self.path.split("/")[1][1:])
                body = bodies[target][served[target] % VARIANTS]
                served[target] += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def scrape_config(prometheus: Prometheus, port: int, targets: int, interval: float) -> None:
    """One job per target path (Prometheus takes one metrics_path per job)."""
    config = json.loads(prometheus.config.read_text())
    config["global"]["scrape_interval"] = f"{interval:g}s"
    config["scrape_configs"] = [
        {
            "job_name": f"dcgm-{t}",
            "metrics_path": f"/t{t}/metrics",
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
        }
        for t in range(targets)
    ]
    prometheus.config.write_text(json.dumps(config, indent=2))


# --- the measured console process ----------------------------------------------------------------


def console_role(args: argparse.Namespace) -> None:
    from gpuconsole.fleet.alerts.engine import AlertEngine
    from gpuconsole.telemetry import prometheus
    from gpuconsole.telemetry.prometheus import PrometheusSource
    from gpuconsole.ui.app import GpuConsoleApp
    from gpuconsole.ui.screens.fleet import FleetScreen

    rounds: list[dict[str, float]] = []
    spent: dict[str, float] = {}

    def timed(name: str, function):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

        return wrapper

    # Instrumentation only: each phase's time is added up, then read at the end of a round.
    screen_refresh = timed("screen", FleetScreen.refresh_view)
    FleetScreen.refresh_view = screen_refresh  # type: ignore[method-assign]

    class Measured(GpuConsoleApp):
        CSS_PATH = str(
            Path(sys.modules[GpuConsoleApp.__module__].__file__ or "").with_name("app.tcss")
        )

        def poll_now(self):  # type: ignore[no-untyped-def]
            spent.clear()
            self._query_started = time.perf_counter()
            return super().poll_now()

        def apply_readings(self, readings) -> None:  # type: ignore[no-untyped-def]
            applied = time.perf_counter()
            super().apply_readings(readings)
            started = getattr(self, "_query_started", None)
            if started is None:
                return  # the first reading, taken at mount
            taken = time.perf_counter()

            def painted() -> None:
                # The screen refreshes on the session's message, after this round was taken.
                done = time.perf_counter()
                phases = dict(spent)
                phases["store"] = taken - applied - phases.get("alerts", 0.0)
                rounds.append(
                    {
                        "at": done,
                        "query_s": applied - started,
                        "fetch_s": phases.get("fetch", 0.0),
                        "store_s": phases["store"],
                        "alerts_s": phases.get("alerts", 0.0),
                        "screen_s": phases.get("screen", 0.0),
                        "apply_s": done - applied,
                        "total_s": done - started,
                    }
                )

            self.call_after_refresh(painted)

    made = time.perf_counter()
    source = PrometheusSource(args.url)
    first_round_s = time.perf_counter() - made
    source._fetch = timed("fetch", source._fetch)  # type: ignore[method-assign]
    app = Measured(source, label=f"Prometheus {args.url}", refresh=args.refresh)
    AlertEngine.evaluate = timed("alerts", AlertEngine.evaluate)  # type: ignore[method-assign]

    async def run() -> dict[str, object]:
        async with app.run_test(size=(160, 50)):
            await asyncio.sleep(args.warm_up)
            cpu_before = resource.getrusage(resource.RUSAGE_SELF)
            wall_before = time.perf_counter()
            await asyncio.sleep(args.seconds)
            cpu_after = resource.getrusage(resource.RUSAGE_SELF)
            wall = time.perf_counter() - wall_before
            cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (
                cpu_after.ru_stime - cpu_before.ru_stime
            )
            window = [r for r in rounds if wall_before <= r["at"] <= wall_before + wall]
            store = app.fleet.store
            return {
                "hosts": len(source.hosts),
                "gpus": sum(len(s.gpus) for h in store.hosts if (s := store.latest(h))),
                "live": sum(store.status(h).state.value == "live" for h in store.hosts),
                "alerts": len(app.fleet.alerts.active()),
                "rounds": window,
                "cpu_pct_of_core": 100 * cpu / wall,
                "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "first_round_s": first_round_s,
                "fleet_query": prometheus._readings_query(
                    source._by, prometheus.FAST_READINGS, dcgm.HOST_STATE_METRIC
                ),
                "slow_query": prometheus._readings_query(source._by, prometheus.SLOW_READINGS),
            }

    print(json.dumps(asyncio.run(run())), flush=True)


def server_side(prometheus: Prometheus, query: str, repeats: int = 5) -> dict[str, float]:
    """Prometheus's own evaluation time for the console's query, and the answer's size."""
    evals, sizes = [], []
    for _ in range(repeats):
        body = urllib.parse.urlencode({"query": query, "stats": "all"}).encode()
        with urllib.request.urlopen(f"{prometheus.url}/api/v1/query", data=body) as response:
            raw = response.read()
        sizes.append(len(raw))
        evals.append(json.loads(raw)["data"]["stats"]["timings"]["evalTotalTime"])
    return {"server_eval_median_s": statistics.median(evals), "answer_mib": sizes[-1] / 2**20}


def measure_console(url: str, args: argparse.Namespace) -> dict[str, object]:
    child = subprocess.run(
        [
            sys.executable, __file__, "--role", "console", "--url", url,
            "--refresh", str(args.refresh), "--warm-up", str(args.warm_up),
            "--seconds", str(args.seconds),
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if child.returncode != 0:
        raise SystemExit(f"the console process failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def summarize(result: dict[str, object]) -> dict[str, float]:
    rounds = result["rounds"]
    assert isinstance(rounds, list) and rounds, "no refresh completed in the window"

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    return {
        "refreshes": len(rounds),
        "total_median_s": median("total_s"),
        "total_max_s": max(r["total_s"] for r in rounds),
        "query_median_s": median("query_s"),
        "fetch_median_s": median("fetch_s"),
        "store_median_s": median("store_s"),
        "alerts_median_s": median("alerts_s"),
        "screen_median_s": median("screen_s"),
        "apply_median_s": median("apply_s"),
        "cpu_pct_of_core": result["cpu_pct_of_core"],  # type: ignore[dict-item]
        "rss_mib": result["rss_mib"],  # type: ignore[dict-item]
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--refresh", type=float, default=5.0)
    parser.add_argument(
        "--scrape-interval", type=float, default=15.0, help="Prometheus's (default: 15 s)"
    )
    parser.add_argument(
        "--names",
        choices=dcgm.GENERATIONS,
        default="classic",
        help="whose metric names and labels the simulated dcgm-exporter writes (default: classic)",
    )
    parser.add_argument("--warm-up", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "console":
        console_role(args)
        return 0
    if not prometheus_available():
        raise SystemExit("prometheus is not installed (Debian package prometheus)")
    exporters = SimulatedExporters(args.hosts, args.gpus, args.targets, args.names)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="gpuconsole-bench-") as directory:
        prometheus = Prometheus(Path(directory), [], interval=args.scrape_interval)
        scrape_config(prometheus, exporters.port, args.targets, args.scrape_interval)
        prometheus.start()
        try:
            utilization = renamed("DCGM_FI_DEV_GPU_UTIL", 0, args.names)[0]
            prometheus.wait_for(utilization, count=args.hosts * args.gpus, timeout=180)
            server_process = psutil.Process(prometheus.pid)
            before, started = server_process.cpu_times(), time.perf_counter()
            result = measure_console(prometheus.url, args)
            after, wall = server_process.cpu_times(), time.perf_counter() - started
            server_cpu = (after.user - before.user) + (after.system - before.system)
            server = server_side(prometheus, str(result["fleet_query"]))
            slow = server_side(prometheus, str(result["slow_query"]))
        finally:
            prometheus.stop()
            exporters.close()
    figures = {**summarize(result), **server, "load_before": load_before}
    figures["slow_eval_median_s"] = slow["server_eval_median_s"]
    figures["slow_answer_mib"] = slow["answer_mib"]
    figures["prometheus_cpu_pct_of_core"] = 100 * server_cpu / wall
    figures["load_after"] = os.getloadavg()[0]
    print(f"{result['hosts']} hosts, {result['gpus']} GPUs read, {result['live']} live, "
          f"{result['alerts']} alerts active; refresh every {args.refresh:g} s, scrapes every "
          f"{args.scrape_interval:g} s; load average "
          f"{figures['load_before']:.1f} before, {figures['load_after']:.1f} after")  # fmt: skip
    print(
        "query → screen, median / max: "
        f"{figures['total_median_s']:.2f} / {figures['total_max_s']:.2f} s over "
        f"{figures['refreshes']} refreshes"
    )
    print(
        f"  query {figures['query_median_s']:.2f} s (Prometheus evaluates in "
        f"{figures['server_eval_median_s']:.2f} s, answers {figures['answer_mib']:.1f} MiB; "
        f"all the slow readings, of which each round asks some: "
        f"{figures['slow_eval_median_s']:.2f} s, {figures['slow_answer_mib']:.1f} MiB), "
        f"store and findings {figures['store_median_s']:.2f} s, alerts "
        f"{figures['alerts_median_s']:.2f} s, fleet table {figures['screen_median_s']:.2f} s; "
        f"the screen painted {figures['apply_median_s']:.2f} s after the query"
    )
    print(
        f"console CPU {figures['cpu_pct_of_core']:.1f} % of a core, "
        f"RSS {figures['rss_mib']:.0f} MiB; Prometheus CPU meanwhile "
        f"{figures['prometheus_cpu_pct_of_core']:.0f} % of a core"
    )
    print(json.dumps({**figures, "hosts": result["hosts"], "gpus": result["gpus"],
                      "first_round_s": result["first_round_s"], "args": vars(args)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
