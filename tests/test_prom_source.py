"""A real Prometheus on 127.0.0.1 scrapes the exporter (and a static exposition in dcgm-exporter
4.9's names and units); the console's Prometheus source reads the same values back, and the
exported rules alert where the console's engine does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from conftest import EPOCH, NOW
from promserver import Prometheus, free_port, prometheus_available

from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import HostState, RowRemap
from gpuconsole.fleet.alerts.config import merge_rules
from gpuconsole.fleet.alerts.defaults import DEFAULT_RULES
from gpuconsole.fleet.alerts.engine import AlertEngine
from gpuconsole.fleet.poller import collect
from gpuconsole.prom.exporter import Exporter
from gpuconsole.prom.grafana import panels
from gpuconsole.prom.rules_export import rule_expr, rules_yaml
from gpuconsole.rules import health
from gpuconsole.telemetry import SourceError, dcgm
from gpuconsole.telemetry.prometheus import (
    FAST_READINGS,
    SLOW_READINGS,
    PrometheusError,
    PrometheusSource,
)
from gpuconsole.telemetry.sim import HostUnreachable, SimRack, demo_rack
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.fleet import FleetScreen
from gpuconsole.ui.widgets.keyed_table import KeyedTable

pytestmark = pytest.mark.skipif(
    not prometheus_available(), reason="prometheus is not installed (Debian package prometheus)"
)

# A node behind dcgm-exporter 4.9.0 as its release notes document it: DCGM 4.7 names, clocks in
# hertz, utilization as a 0-1 ratio, memory in bytes (with the capacity collected by default),
# the `hostname` label of 4.8.3 and later and the DCGM_FI_SYSTEM_DRIVER_VERSION label; then
# fields outside the default collector file, as a collector file that adds them names them.
CURRENT_HOST = "dcgm49-node"
_CURRENT_LABELS = (
    'gpu="{gpu}",UUID="GPU-0000000{gpu}-aaaa-bbbb-cccc-ddddeeeeffff",'
    'pci_bus_id="00000000:1{gpu}:00.0",device="nvidia{gpu}",modelName="NVIDIA H200",'
    f'hostname="{CURRENT_HOST}",DCGM_FI_SYSTEM_DRIVER_VERSION="580.65.06"'
)
MIB = 1048576
_CURRENT_VALUES = (
    ("DCGM_FI_DEV_SM_CLOCK_HERTZ", "gauge", (1980e6, 345e6)),
    ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "gauge", (3201e6, 3201e6)),
    ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "gauge", (62, 35)),
    ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "gauge", (71, 38)),
    ("DCGM_FI_DEV_BOARD_POWER_WATTS", "gauge", (655.5, 80.25)),
    ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "counter", (8.1e6, 2.2e6)),
    ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "counter", (0, 0)),
    ("DCGM_FI_DEV_GPU_UTIL_RATIO", "gauge", (0.87, 0.0)),
    ("DCGM_FI_DEV_MEMORY_UTIL_RATIO", "gauge", (0.42, 0.0)),
    ("DCGM_FI_DEV_ENC_UTIL_RATIO", "gauge", (0.0, 0.0)),
    ("DCGM_FI_DEV_DEC_UTIL_RATIO", "gauge", (0.0, 0.0)),
    ("DCGM_FI_DEV_XID_ERROR", "gauge", (0, 48)),
    ("DCGM_FI_DEV_FB_FREE_BYTES", "gauge", (20000 * MIB, 140000 * MIB)),
    ("DCGM_FI_DEV_FB_USED_BYTES", "gauge", (120000 * MIB, 0)),
    ("DCGM_FI_DEV_FB_RESERVED_BYTES", "gauge", (3771 * MIB, 3771 * MIB)),
    ("DCGM_FI_DEV_FB_CAPACITY_BYTES", "gauge", (143771 * MIB, 143771 * MIB)),
    ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", "counter", (0, 0)),
    ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", "counter", (0, 2)),
    ("DCGM_FI_DEV_ROW_REMAP_FAILED", "gauge", (0, 0)),
    # Outside the defaults:
    ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", "gauge", (700, 700)),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", (0, 1)),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", (0x4, 0x1)),
)


SCRAPE_SECONDS = 3.0
"""The exporter takes some 0.12 s to render the 24 hosts' 4,800 lines when the machine is idle;
under a loaded test run a one-second scrape can time out, and Prometheus then marks every
series of the exporter stale until the next scrape succeeds."""


def current_exposition() -> str:
    lines = []
    for name, kind, values in _CURRENT_VALUES:
        lines.append(f"# HELP {name} {name}.\n# TYPE {name} {kind}")
        lines += [
            f"{name}{{{_CURRENT_LABELS.format(gpu=gpu)}}} {value!r}"
            for gpu, value in enumerate(values)
        ]
    # Mid-upgrade, GPU 1 also reports the classic name: that one is read.
    lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{_CURRENT_LABELS.format(gpu=1)}}} 39")
    return "\n".join(lines) + "\n"


class _Static(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_args: object) -> None:
        pass


@dataclass
class Fleet:
    rack: SimRack
    exporter: Exporter
    exporter_target: str
    prometheus: Prometheus


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """24 simulated hosts (every demo fault) frozen at NOW, and the dcgm-exporter 4.9 node."""
    rack = demo_rack(hosts=24, seed=7, epoch=EPOCH)
    exporter = Exporter(rack_source(rack))
    for _ in range(10):  # ten rounds without an answer: the exporter calls a100-04 down
        exporter.poll_once()
    _, port = exporter.listen("127.0.0.1", 0)
    handler = type("Current", (_Static,), {"body": current_exposition().encode()})
    static = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=static.serve_forever, daemon=True).start()
    directory = tmp_path_factory.mktemp("prometheus")
    rules = directory / "gpuconsole.rules.yml"
    rules.write_text(rules_yaml(DEFAULT_RULES, dcgm.Dialect.of("classic")))
    prometheus = Prometheus(
        directory,
        [f"127.0.0.1:{port}", f"127.0.0.1:{static.server_address[1]}"],
        interval=SCRAPE_SECONDS,
        rule_files=[rules],
    ).start()
    try:
        prometheus.wait_for("DCGM_FI_DEV_GPU_UTIL", count=gpus_answering(rack))
        prometheus.wait_for("DCGM_FI_DEV_GPU_UTIL_RATIO", count=2)
        yield Fleet(rack, exporter, f"127.0.0.1:{port}", prometheus)
    finally:
        prometheus.stop()
        static.shutdown()
        exporter.close()


def rack_source(rack: SimRack):
    from gpuconsole.telemetry.sim import SimSource

    return SimSource(rack, ManualClock(NOW))


def gpus_answering(rack: SimRack) -> int:
    return sum(not g.lost for s in sim_readings(rack).values() for g in s.gpus)


def sim_readings(rack: SimRack) -> dict:
    readings = {}
    for host in rack.hosts:
        try:
            readings[host] = rack.read(host, NOW)
        except HostUnreachable:
            continue
    return readings


def test_source_reads_back_what_the_exporter_served(fleet: Fleet) -> None:
    source = PrometheusSource(fleet.prometheus.url)
    expected = sim_readings(fleet.rack)
    assert set(source.hosts) == set(fleet.rack.hosts) | {CURRENT_HOST}
    read = set(FAST_READINGS + SLOW_READINGS) - {"memory_free_mib"}
    exported = [m for m in dcgm.METRICS if m.field in read]
    # All but free memory (it makes the total).
    assert len(exported) == len(dcgm.METRICS) - 1
    for host, want in expected.items():
        got = source.read(host)
        assert got.source == "prometheus"
        assert [g.index for g in got.gpus] == [g.index for g in want.gpus]
        for mine, theirs in zip(got.gpus, want.gpus, strict=True):
            assert (mine.name, mine.uuid, mine.pci_bus_id) == (
                theirs.name,
                theirs.uuid,
                theirs.pci_bus_id,
            )
            assert mine.lost == theirs.lost
            assert mine.memory_total_mib == theirs.memory_total_mib
            for metric in exported:
                assert metric.value(mine) == metric.value(theirs), (host, mine.index, metric.name)
            assert mine.throttle_reasons == theirs.throttle_reasons
            assert mine.pcie == theirs.pcie
            assert mine.remap == theirs.remap


def test_the_same_findings_where_the_metrics_allow(fleet: Fleet) -> None:
    """Everything but the driver's recovery action (no dcgm-exporter metric carries it)."""
    source = PrometheusSource(fleet.prometheus.url)
    for host, want in sim_readings(fleet.rack).items():
        got = health.evaluate(source.read(host))
        wanted = health.evaluate(want)

        def codes(findings: list) -> set:
            return {(f.code, f.gpu) for f in findings if f.code != "recovery-action"}

        assert codes(got) == codes(wanted), host
    thermal = [f for f in health.evaluate(source.read("a100-01")) if f.code == "thermal-throttle"]
    assert [f.gpu for f in thermal] == [2]


def test_dcgm_exporter_4_9_read_back(fleet: Fleet) -> None:
    """A real Prometheus scraped the 4.9 exposition: every reading in the console's units."""
    source = PrometheusSource(fleet.prometheus.url)
    node = source.read(CURRENT_HOST)
    busy, idle = node.gpus
    assert busy.utilization_pct == pytest.approx(87.0)  # a ratio, as a percentage
    assert idle.utilization_pct == 0.0  # a real 0 stays 0
    assert busy.memory_utilization_pct == pytest.approx(42.0)
    assert busy.memory_used_mib == 120000  # bytes, as MiB
    assert idle.memory_used_mib == 0
    assert busy.memory_total_mib == 143771  # the capacity, in bytes, as MiB
    assert busy.memory_fraction == pytest.approx(120000 / 143771)
    assert busy.temperature_c == 71
    assert idle.temperature_c == 39  # the classic name wins over DCGM_FI_DEV_GPU_TEMP_CELSIUS 38
    assert busy.power_w == 655.5
    assert idle.power_w == 80.25
    assert busy.power_limit_w == 700
    assert busy.sm_clock_mhz == 1980  # hertz, as MHz
    assert idle.sm_clock_mhz == 345
    assert busy.memory_clock_mhz == 3201
    assert busy.throttle_reasons == ("sw-power-cap",)
    assert idle.remap == RowRemap(correctable=2, uncorrectable=0, pending=True, failure=False)
    assert busy.name == "NVIDIA H200"
    assert busy.uuid == "GPU-00000000-aaaa-bbbb-cccc-ddddeeeeffff"
    assert node.driver_version == "580.65.06"
    assert [(e.xid, e.gpu) for e in node.xid_events] == [(48, 1)]
    codes = {(f.code, f.gpu) for f in health.evaluate(node)}
    assert {("xid", 1), ("row-remap-pending", 1)} <= codes


def test_rules_and_dashboard_for_4_9_select_the_4_9_node(fleet: Fleet) -> None:
    """The PromQL exported for dcgm-exporter 4.9, asked of the real Prometheus: the conditions
    hold on the 4.9 node where the console's readings say, in the console's units."""
    rules = merge_rules(
        {
            "rule": [
                {"name": name, "expr": expr, "severity": "info", "message": "{host}"}
                for name, expr in (
                    ("hot", "temperature_c > 70"),
                    ("busy", "utilization_pct > 80 and sm_clock_mhz > 1900"),
                    ("full", "memory_used_pct > 80"),
                    ("near-cap", "power_w >= power_limit_w * 0.9"),
                )
            ]
        },
        "test",
    )
    by_name = {rule.name: rule for rule in rules}
    for name in ("hot", "busy", "full", "near-cap"):
        found = fleet.prometheus.query(rule_expr(by_name[name], dcgm.Dialect.of("4.9")))
        assert [(s["metric"]["hostname"], s["metric"]["gpu"]) for s in found] == [
            (CURRENT_HOST, "0")
        ], name
    used_pct = {
        s["metric"]["gpu"]: float(s["value"][1])
        for s in fleet.prometheus.query(
            rule_expr(by_name["full"], dcgm.Dialect.of("4.9")).replace(" > 80", "")
        )
    }
    assert used_pct == {"0": pytest.approx(120000 / 140000 * 100), "1": 0.0}


def test_exported_rules_alert_where_the_console_does(fleet: Fleet) -> None:
    """Prometheus's ALERTS from the exported rules = the console engine's alerts, same data."""
    engine = AlertEngine(DEFAULT_RULES)
    engine.evaluate(sim_readings(fleet.rack).values(), NOW)
    ours = {(a.rule, a.host, a.gpu) for a in engine.active()}
    names = {rule.alert_name for rule in DEFAULT_RULES}
    theirs: set = set()
    for sample in fleet.prometheus.wait_for('ALERTS{rule!=""}', count=len(ours)):
        labels = sample["metric"]
        host = labels.get("Hostname") or labels.get("hostname")
        if host == CURRENT_HOST:
            continue
        assert labels["alertname"] in names
        gpu = labels.get("gpu")
        theirs.add((labels["rule"], host, int(gpu) if gpu else None))
    assert ours
    assert theirs == ours


@pytest.mark.parametrize("generation", ["classic", "4.9", "both"])
def test_dashboard_queries_return_data(fleet: Fleet, generation: str) -> None:
    fleet.prometheus.wait_for('ALERTS{alertstate="firing"}')
    for panel in panels(dcgm.Dialect.of(generation)):
        for expr, _legend in panel.targets:
            result = fleet.prometheus.query(expr.replace("$host", ".*"))
            assert result, f"{panel.title}: {expr}"
    one_host = panels(dcgm.Dialect.of(generation))[0].targets[0][0].replace("$host", "a100-01")
    hosts = {
        s["metric"].get("Hostname") or s["metric"].get("hostname")
        for s in fleet.prometheus.query(one_host)
    }
    assert hosts == ({"a100-01"} if generation != "4.9" else set())


async def test_console_on_the_prometheus_source(fleet: Fleet) -> None:
    source = PrometheusSource(fleet.prometheus.url)
    app = GpuConsoleApp(source, label="prometheus", auto_poll=False, background_start=False)
    async with app.run_test(size=(140, 40)) as pilot:
        assert isinstance(app.screen, FleetScreen)
        table = app.screen.query_one("#fleet", KeyedTable)
        hosts = {table.coordinate_to_cell_key((r, 0)).row_key.value for r in range(table.row_count)}
        assert hosts == set(source.hosts)
        # The host that the exporter knows to be down shows so, at once.
        app.apply_readings(collect(app.source))
        assert app.fleet.store.status("a100-04").state is HostState.DOWN
        assert app.fleet.store.status("a100-01").state is HostState.LIVE
        firing = {a.key for a in app.fleet.alerts.active() if a.state == "firing"}
        assert ("gpu-xid", "h100-01", 3) in firing
        await pilot.press("a")
        assert app.screen.where().startswith("alerts")


def test_each_round_is_one_fresh_query(fleet: Fleet) -> None:
    calls: list[str] = []
    source = PrometheusSource(fleet.prometheus.url)
    api = source._api
    original = api.query

    def counting(promql: str, at: float) -> list:
        calls.append(promql)
        return original(promql, at)

    api.query = counting  # type: ignore[method-assign]
    first = [source.read(host).time for host in source.hosts if host != "a100-04"]
    assert calls == []  # the first round was fetched when the source was made
    second = source.read("h100-01")
    assert len(calls) == 1
    assert second.time > max(first)


def test_unreachable_prometheus_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusError) as caught:
        PrometheusSource(url, timeout=5)
    assert str(caught.value).startswith(f"cannot reach Prometheus at {url}: ")
    assert "\n" not in str(caught.value)
    with pytest.raises(PrometheusError, match="not an http"):
        PrometheusSource("prometheus:9090")


def test_not_a_prometheus_or_no_dcgm_metrics(fleet: Fleet, tmp_path: Path) -> None:
    exporter_url = f"http://{fleet.exporter_target}"
    with pytest.raises(PrometheusError, match="not a Prometheus API answer"):
        PrometheusSource(exporter_url)
    empty = Prometheus(tmp_path / "empty", [f"127.0.0.1:{free_port()}"]).start()
    try:
        with pytest.raises(PrometheusError, match="has no dcgm-exporter GPU metrics"):
            PrometheusSource(empty.url)
    finally:
        empty.stop()


def test_prometheus_going_away_names_the_host(fleet: Fleet, tmp_path: Path) -> None:
    own = Prometheus(tmp_path / "own", [fleet.exporter_target], interval=SCRAPE_SECONDS)
    own.start()
    try:
        own.wait_for("DCGM_FI_DEV_GPU_UTIL", count=gpus_answering(fleet.rack))
        source = PrometheusSource(own.url, timeout=5)
        source.read("h100-01")
    finally:
        own.stop()
    with pytest.raises(SourceError) as caught:
        source.read("h100-01")  # a new round: Prometheus is gone
    assert str(caught.value).startswith(f"h100-01: cannot reach Prometheus at {own.url}")


def test_cli_prometheus_unreachable_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = gpuconsole("--prometheus", url)
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"gpuconsole: cannot reach Prometheus at {url}: ")
