"""The README's Prometheus block, run as written, with a real Prometheus: `gpuconsole exporter
--demo`, `rules export` and `grafana export` with their defaults (and then each with the same
``--dcgm-exporter`` generation) agree on names, so that Prometheus, scraping the exporter with the
exported rules loaded, raises the demo's alerts and answers every query of the dashboard."""

from __future__ import annotations

import contextlib
import json
import queue
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_runner import GPUCONSOLE
from promserver import Prometheus, prometheus_available

pytestmark = pytest.mark.skipif(
    not prometheus_available(), reason="prometheus is not installed (Debian package prometheus)"
)

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "### Prometheus and Grafana"
HOT = ("a100-01", "2")
"""The demo's thermal-throttle GPU, at 92 °C; no other GPU of the demo reaches 85 °C."""
LOST = ("h100-01", "3")
"""The demo's GPU that fell off the bus (XID 79)."""
SETUPS: dict[str, tuple[str | None, str | None]] = {
    "as-written": (None, None),
    "classic": ("classic", "classic"),
    "4.9": ("4.9", "4.9"),
    "both": ("both", "both"),
    "mismatched": ("classic", None),
}
"""``--dcgm-exporter`` given to the exporter, and to both exports (None: not given). The last
is the issue's: the exporter serving what it did by default, the exports as they do."""
AGREEING = [name for name, (exporter, exports) in SETUPS.items() if exporter == exports]
HOST_LABEL = {None: "hostname", "classic": "Hostname", "4.9": "hostname", "both": "hostname"}
"""The label the exporter names the host with, by its ``--dcgm-exporter``."""
GRAFANA_INTERVALS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1m"}


def readme_commands() -> dict[str, list[str]]:
    """The block's commands that serve the demo and write the rules and the dashboard to files,
    split as the shell splits them."""
    section = README.read_text(encoding="utf-8").split(SECTION, 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match, f"no sh block under {SECTION!r}"
    wanted = {
        "exporter": ["gpuconsole", "exporter", "--demo"],
        "rules": ["gpuconsole", "rules", "export", "-o"],
        "grafana": ["gpuconsole", "grafana", "export", "-o"],
    }
    found: dict[str, list[str]] = {}
    for line in match.group(1).splitlines():
        words = shlex.split(line, comments=True)
        for what, start in wanted.items():
            if words[: len(start)] == start:
                found.setdefault(what, words)
    assert set(found) == set(wanted), found
    return found


def command(words: list[str], generation: str | None) -> list[str]:
    """A README command for a subprocess, with ``--dcgm-exporter generation`` when given."""
    option = [] if generation is None else ["--dcgm-exporter", generation]
    return [*GPUCONSOLE, *words[1:], *option]


def any_port(words: list[str]) -> list[str]:
    """The exporter's command on a free port (the README's 9400 may be taken)."""
    at = words.index("--port")
    return [*words[: at + 1], "0", *words[at + 2 :]]


def output(words: list[str], cwd: Path) -> Path:
    return cwd / words[words.index("-o") + 1]


def serving_port(process: subprocess.Popen[str], timeout: float = 60.0) -> int:
    """The port of the exporter's "serving N hosts at http://ADDRESS:PORT/metrics" line; its
    stderr is drained in a thread from then on."""
    ports: queue.Queue[int | None] = queue.Queue()
    said: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            said.append(line)
            match = re.search(r"serving .* at http://[^ ]+:(\d+)/metrics", line)
            if match:
                ports.put(int(match.group(1)))
        ports.put(None)

    threading.Thread(target=read, daemon=True).start()
    port = ports.get(timeout=timeout)
    assert port is not None, f"the exporter exited ({process.wait()}): {''.join(said[-5:])}"
    return port


def wait_until(what: str, found: Callable[[], list[Any]], timeout: float = 30.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    while not (result := found()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: nothing within {timeout:.0f} s")
        time.sleep(0.25)
    return result


@dataclass
class Served:
    host_label: str
    prometheus: Prometheus
    dashboard: dict[str, Any]

    def alerts(self, alertname: str, state: str) -> list[dict[str, Any]]:
        return [
            alert
            for alert in self.prometheus.alerts()
            if alert["labels"]["alertname"] == alertname and alert["state"] == state
        ]


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    """For each of `SETUPS`, the README's exporter, rules and dashboard with its
    ``--dcgm-exporter``, and a Prometheus scraping the one with the others loaded, every second.
    All at once: Prometheus finds its targets some 5 s after it starts, and the waits overlap."""
    commands = readme_commands()
    with contextlib.ExitStack() as cleanup:
        started = {}
        for name, (generation, exports_generation) in SETUPS.items():
            directory = tmp_path_factory.mktemp(f"readme-{name}")
            exporter = subprocess.Popen(
                command(any_port(commands["exporter"]), generation),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                cwd=directory,
            )
            cleanup.callback(stop, exporter)
            exports = [
                subprocess.Popen(command(commands[what], exports_generation), cwd=directory)
                for what in ("rules", "grafana")
            ]
            started[name] = (directory, exporter, exports)
        served = {}
        for name, (directory, exporter, exports) in started.items():
            assert [export.wait(timeout=60) for export in exports] == [0, 0]
            prometheus = Prometheus(
                directory / "prometheus",
                [f"127.0.0.1:{serving_port(exporter)}"],
                rule_files=[output(commands["rules"], directory)],
            ).start()
            cleanup.callback(prometheus.stop)
            dashboard = output(commands["grafana"], directory).read_text(encoding="utf-8")
            host_label = HOST_LABEL[SETUPS[name][0]]
            served[name] = Served(host_label, prometheus, json.loads(dashboard))
        yield served


@pytest.fixture(params=AGREEING)
def served(request: pytest.FixtureRequest, everything: dict[str, Served]) -> Served:
    return everything[request.param]


def test_the_xid_alert_fires_naming_the_host(served: Served) -> None:
    """``gpu-xid`` (a finding rule, ``for: 0``) on the console's own series, whose host label
    follows the exporter's, and its summary names the host."""
    firing = wait_until("GpuXid firing", lambda: served.alerts("GpuXid", "firing"))
    assert {
        (alert["labels"].get(served.host_label), alert["labels"]["gpu"], alert["labels"]["code"])
        for alert in firing
    } == {(*LOST, "xid"), (*LOST, "gpu-lost")}
    assert all(alert["annotations"]["summary"].startswith(f"{LOST[0]}: ") for alert in firing)


def test_the_temperature_alert_goes_pending_for_the_hot_gpu(served: Served) -> None:
    """``gpu-temperature-high`` (85 °C, ``for: 1m``) over dcgm-exporter's names, once per GPU
    (with both generations, PromQL's ``or`` keeps one of the two names' series)."""
    pending = wait_until(
        "GpuTemperatureHigh pending", lambda: served.alerts("GpuTemperatureHigh", "pending")
    )
    assert [(a["labels"].get(served.host_label), a["labels"]["gpu"]) for a in pending] == [HOT]
    assert float(pending[0]["value"]) >= 85
    assert pending[0]["annotations"]["summary"].startswith(f"{HOT[0]} GPU {HOT[1]} at ")


def grafana_expr(expr: str, dashboard: dict[str, Any]) -> str:
    """A query as Grafana sends it with every variable at All (its ``allValue``) and its own
    interval variables at a minute."""
    values = dict(GRAFANA_INTERVALS)
    for variable in dashboard["templating"]["list"]:
        if "allValue" in variable:
            values[variable["name"]] = variable["allValue"]
    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: values[m.group(1) or m.group(2)], expr)


def empty_queries(served: Served) -> list[str]:
    """The dashboard's queries that return nothing, once an alert fires (one panel counts
    them)."""
    wait_until("a firing alert", lambda: served.alerts("GpuXid", "firing"))
    queries = [
        (panel["title"], grafana_expr(target["expr"], served.dashboard))
        for panel in served.dashboard["panels"]
        for target in panel["targets"]
    ]
    assert len(queries) >= 10
    return [f"{title}: {expr}" for title, expr in queries if not served.prometheus.query(expr)]


def test_every_panel_query_returns_series(served: Served) -> None:
    assert empty_queries(served) == []


def test_the_host_variable_lists_the_demo_hosts(served: Served) -> None:
    """The dashboard's host filter, asked of Prometheus as Grafana asks it: ``label_values``
    through the label-values API, ``query_result`` as a query whose lines the regex reads."""
    (host,) = [v for v in served.dashboard["templating"]["list"] if v["name"] == "host"]
    query = host["query"]
    if match := re.fullmatch(r"label_values\((.+), (\w+)\)", query):
        metric, label = match.groups()
        hosts = set(served.prometheus.api(f"label/{label}/values", **{"match[]": metric}))
    else:
        match = re.fullmatch(r"query_result\((.+)\)", query)
        assert match, query
        lines = [
            "{" + ",".join(f'{k}="{v}"' for k, v in s["metric"].items()) + "} " + s["value"][1]
            for s in served.prometheus.query(match.group(1))
        ]
        regex = re.compile(host["regex"].strip("/"))
        hosts = {found.group(1) for line in lines if (found := regex.search(line))}
    assert hosts == {"h100-01", "h100-02", "h100-03", "a100-01", "a100-02", "l40s-01"}


def test_the_checks_fail_where_the_names_disagree(everything: dict[str, Served]) -> None:
    """The issue: the exporter serving the classic names under ``Hostname``, the rules and the
    dashboard exported for 4.9. The XID alert fires (a finding rule reads the console's own
    series) but its summary names no host, the temperature alert never goes pending, and the
    dashboard's queries of dcgm-exporter's metrics return nothing."""
    served = everything["mismatched"]
    firing = wait_until("GpuXid firing", lambda: served.alerts("GpuXid", "firing"))
    assert {alert["labels"].get("Hostname") for alert in firing} == {LOST[0]}
    assert all(alert["annotations"]["summary"].startswith(": ") for alert in firing)
    time.sleep(1.5)  # one more evaluation of every rule over the same series
    assert served.alerts("GpuTemperatureHigh", "pending") == []
    assert len(empty_queries(served)) == 7
