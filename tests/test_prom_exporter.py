"""`gpuconsole exporter`: dcgm-exporter's names and labels, the console's findings, promtool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from conftest import NOW
from prometheus_client.parser import text_string_to_metric_families
from promserver import free_port, promtool, promtool_available

from gpuconsole.clock import ManualClock
from gpuconsole.model import HostState
from gpuconsole.prom import dcgm
from gpuconsole.prom.exporter import Exporter
from gpuconsole.telemetry.sim import SimRack, SimSource

needs_promtool = pytest.mark.skipif(not promtool_available(), reason="promtool is not installed")
GPUCONSOLE = (sys.executable, "-m", "gpuconsole")
CAMEL_CASE_LINT = "label names should be written in 'snake_case' not 'camelCase'"
"""dcgm-exporter's own `modelName` label trips this lint; it is kept so dashboards work."""


@pytest.fixture
def exporter(rack: SimRack) -> Iterator[tuple[Exporter, str]]:
    served = Exporter(SimSource(rack, ManualClock(NOW)))
    served.poll_once()
    _, port = served.listen("127.0.0.1", 0)
    yield served, f"http://127.0.0.1:{port}/metrics"
    served.close()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def samples(text: str) -> dict[str, list]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_every_gpu_under_dcgm_exporter_names_and_labels(
    exporter: tuple[Exporter, str], rack: SimRack
) -> None:
    text = scrape(exporter[1])
    families = samples(text)
    expected = rack.read("a100-01", NOW)
    gpu2 = expected.gpu(2)
    assert gpu2 is not None

    def value(name: str, host: str = "a100-01", gpu: str = "2") -> float:
        (sample,) = [
            s for s in families[name] if s.labels["Hostname"] == host and s.labels["gpu"] == gpu
        ]
        return sample.value

    (util,) = [
        s
        for s in families["DCGM_FI_DEV_GPU_UTIL"]
        if s.labels["Hostname"] == "a100-01" and s.labels["gpu"] == "2"
    ]
    assert util.labels == {
        "gpu": "2",
        "UUID": gpu2.uuid,
        "pci_bus_id": gpu2.pci_bus_id,
        "device": "nvidia2",
        "modelName": "NVIDIA A100 80GB PCIe",
        "Hostname": "a100-01",
    }
    assert util.value == gpu2.utilization_pct
    assert value("DCGM_FI_DEV_GPU_TEMP") == gpu2.temperature_c
    assert value("DCGM_FI_DEV_POWER_USAGE") == gpu2.power_w
    assert value("DCGM_FI_DEV_ENFORCED_POWER_LIMIT") == 300.0
    assert value("DCGM_FI_DEV_FB_USED") == gpu2.memory_used_mib
    assert value("DCGM_FI_DEV_FB_FREE") == gpu2.memory_total_mib - gpu2.memory_used_mib  # type: ignore[operator]
    assert value("DCGM_FI_DEV_SM_CLOCK") == gpu2.sm_clock_mhz
    assert value("DCGM_FI_DEV_XID_ERRORS") == 0
    throttling = int(value("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"))
    assert throttling & 0x40 and throttling & 0x20  # hw-thermal and sw-thermal, as NVML's bits
    assert value("DCGM_FI_DEV_PCIE_LINK_WIDTH") == 16
    # Every GPU of every host appears once per metric.
    gpus = sum(len(rack.read(h, NOW).gpus) for h in rack.hosts)
    assert len(families["DCGM_FI_DEV_XID_ERRORS"]) == gpus


def test_a_lost_gpu_reports_its_xid_and_no_readings(exporter: tuple[Exporter, str]) -> None:
    families = samples(scrape(exporter[1]))
    lost = {"Hostname": "h100-01", "gpu": "3"}

    def of(name: str) -> list:
        return [s for s in families[name] if lost.items() <= s.labels.items()]

    assert [s.value for s in of("DCGM_FI_DEV_XID_ERRORS")] == [79]
    assert of("DCGM_FI_DEV_GPU_TEMP") == []  # missing, not 0
    assert of("DCGM_FI_DEV_GPU_UTIL") == []
    findings = {(s.labels["code"], s.labels["severity"]): s.value for s in of(dcgm.FINDINGS_METRIC)}
    assert findings == {("gpu-lost", "critical"): 1, ("xid", "critical"): 1}


def test_findings_host_states_and_reading_times(
    exporter: tuple[Exporter, str], rack: SimRack
) -> None:
    served, url = exporter
    families = samples(scrape(url))
    states = {
        (s.labels["Hostname"], s.labels["state"]): s.value for s in families[dcgm.HOST_STATE_METRIC]
    }
    assert states[("a100-01", "live")] == 1
    assert states[("a100-01", "down")] == 0
    assert sum(states.values()) == len(rack.hosts)
    last = {s.labels["Hostname"]: s.value for s in families[dcgm.HOST_LAST_READING_METRIC]}
    assert last["a100-01"] == NOW
    throttle = [
        s
        for s in families[dcgm.FINDINGS_METRIC]
        if s.labels["code"] == "thermal-throttle" and s.labels["Hostname"] == "a100-01"
    ]
    assert [(s.labels["gpu"], s.labels["severity"], s.value) for s in throttle] == [
        ("2", "critical", 1)
    ]
    counted = sum(s.value for s in families[dcgm.FINDINGS_METRIC])
    assert counted == sum(len(served.store.findings(h)) for h in served.store.hosts)


def test_a_host_without_readings_drops_its_gpu_series(rack: SimRack) -> None:
    clock = ManualClock(NOW)
    served = Exporter(SimSource(rack, clock))
    served.poll_once()
    rack.set_fault("h100-02", "host-unresponsive", since=NOW + 1)
    for _ in range(10):  # ten missed readings: the store calls it down
        clock.advance(1)
        served.poll_once()
    assert served.store.status("h100-02").state is HostState.DOWN
    families = {f.name: f.samples for f in served.registry.collect()}
    assert not [s for s in families["DCGM_FI_DEV_GPU_UTIL"] if s.labels["Hostname"] == "h100-02"]
    down = [
        s
        for s in families[dcgm.HOST_STATE_METRIC]
        if s.labels["Hostname"] == "h100-02" and s.value == 1
    ]
    assert [s.labels["state"] for s in down] == ["down"]


@needs_promtool
def test_promtool_check_metrics(exporter: tuple[Exporter, str]) -> None:
    text = scrape(exporter[1])
    result = promtool("check", "metrics", stdin=text)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    # No format error (exit 1); the only lint is the camelCase of dcgm-exporter's modelName.
    assert result.returncode in (0, 3), problems
    assert problems, "promtool should flag modelName: is the label there?"
    assert all(p.startswith("DCGM_FI_DEV_") and p.endswith(CAMEL_CASE_LINT) for p in problems)
    own = "\n".join(
        line
        for line in text.splitlines()
        if line.startswith(("gpuconsole_", "# HELP gpuconsole_", "# TYPE gpuconsole_"))
    )
    clean = promtool("check", "metrics", stdin=own + "\n")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.strip() == ""


@needs_promtool
def test_the_lint_check_can_fail() -> None:
    """promtool does flag what the exporter avoids: counters without _total, bad lines."""
    counter = "# HELP DCGM_X x\n# TYPE DCGM_X counter\nDCGM_X 1\n"
    assert promtool("check", "metrics", stdin=counter).returncode != 0
    assert promtool("check", "metrics", stdin="not a metric line\n").returncode != 0


def test_cli_exporter_demo_serves_until_terminated(tmp_path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [*GPUCONSOLE, "exporter", "--demo", "--address", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline:
            try:
                text = scrape(f"http://127.0.0.1:{port}/metrics")
                if "DCGM_FI_DEV_GPU_UTIL{" in text:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        hosts = {s.labels["Hostname"] for s in samples(text)["DCGM_FI_DEV_GPU_UTIL"]}
        assert len(hosts) == 6
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0
        assert f"serving 6 hosts at http://127.0.0.1:{port}/metrics" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_cli_exporter_port_in_use_is_one_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*GPUCONSOLE, "exporter", "--demo", "--address", "127.0.0.1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 3
    assert result.stderr.strip() == (
        f"gpuconsole: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
