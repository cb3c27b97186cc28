"""`gpuconsole exporter`: dcgm-exporter's names and labels, the console's findings, promtool."""

from __future__ import annotations

import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import gpuconsole, start_gpuconsole
from conftest import NOW
from hostile import CLIPBOARD, TITLE, UNSAFE
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from promserver import (
    Prometheus,
    free_port,
    prometheus_available,
    promtool,
    promtool_available,
)
from static_source import StaticSource

from gpuconsole.cli.commands import exporter as exporter_command
from gpuconsole.cli.main import build_parser
from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import (
    GpuProcess,
    GpuState,
    HostSnapshot,
    HostState,
    KubePod,
    ProcessLoad,
    SlurmJob,
)
from gpuconsole.prom import exporter as exporter_module
from gpuconsole.prom.exporter import (
    HOST_PROCESSES_METRIC,
    MAX_LABEL_CHARS,
    MAX_PROCESS_SERIES,
    PROCESS_LABELS,
    Exporter,
    Naming,
    label_value,
)
from gpuconsole.telemetry import dcgm
from gpuconsole.telemetry.sim import SimRack, SimSource, demo_rack

needs_promtool = pytest.mark.skipif(not promtool_available(), reason="promtool is not installed")
needs_prometheus = pytest.mark.skipif(
    not prometheus_available(), reason="prometheus is not installed"
)
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


def own_lines(text: str) -> str:
    """The console's own metrics of an exposition (dcgm-exporter's names left out)."""
    return "\n".join(
        line
        for line in text.splitlines()
        if line.startswith(("gpuconsole_", "# HELP gpuconsole_", "# TYPE gpuconsole_"))
    )


def assert_promtool_clean(text: str) -> None:
    """promtool finds neither a format error nor a lint in the console's own metrics."""
    clean = promtool("check", "metrics", stdin=own_lines(text) + "\n")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.strip() == ""


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
        "DCGM_FI_DRIVER_VERSION": expected.driver_version,
    }
    assert expected.driver_version
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


def test_label_names_match_the_fleets_dcgm_exporter(rack: SimRack) -> None:
    """``--dcgm-exporter classic --host-label hostname --driver-label
    DCGM_FI_SYSTEM_DRIVER_VERSION``: every series names the host and the driver as dcgm-exporter
    4.9 does, and none keeps the classic labels."""
    names = Naming.of("classic", host="hostname", driver="DCGM_FI_SYSTEM_DRIVER_VERSION")
    served = Exporter(SimSource(rack, ManualClock(NOW)), naming=names)
    served.poll_once()
    families = samples(generate_latest(served.registry).decode())
    driver = rack.read("a100-01", NOW).driver_version
    for name, found in families.items():
        for sample in found:
            assert "Hostname" not in sample.labels and "DCGM_FI_DRIVER_VERSION" not in sample.labels
            if name.startswith("DCGM_FI_"):
                assert set(sample.labels) == {*dcgm.GPU_LABELS, "hostname", names.driver}, name
    (util,) = [
        s
        for s in families["DCGM_FI_DEV_GPU_UTIL"]
        if s.labels["hostname"] == "a100-01" and s.labels["gpu"] == "0"
    ]
    assert util.labels["DCGM_FI_SYSTEM_DRIVER_VERSION"] == driver
    assert {s.labels["hostname"] for s in families[dcgm.HOST_STATE_METRIC]} == set(rack.hosts)
    assert {s.labels["hostname"] for s in families[dcgm.FINDINGS_METRIC]} <= set(rack.hosts)


def test_cli_exporter_label_options() -> None:
    """The labels follow ``--dcgm-exporter`` unless given; its default is the exports'."""
    parser = build_parser()

    def naming(*words: str) -> Naming:
        args = parser.parse_args(["exporter", "--demo", *words])
        return Naming.of(args.dcgm_exporter, args.host_label, args.driver_label)

    for export in ("rules", "grafana"):
        args = parser.parse_args([export, "export"])
        assert args.dcgm_exporter == dcgm.DEFAULT_GENERATION == "4.9"
    assert naming() == Naming(("4.9",), "hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION")
    assert naming("--dcgm-exporter", "both") == Naming(
        ("classic", "4.9"), "hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION"
    )
    assert naming("--dcgm-exporter", "classic") == Naming(
        ("classic",), "Hostname", "DCGM_FI_DRIVER_VERSION"
    )
    assert naming("--dcgm-exporter", "classic", "--host-label", "hostname") == Naming(
        ("classic",), "hostname", "DCGM_FI_DRIVER_VERSION"
    )
    assert naming("--driver-label", "DCGM_FI_DRIVER_VERSION") == Naming(
        ("4.9",), "hostname", "DCGM_FI_DRIVER_VERSION"
    )
    for wrong in (["--host-label", "node"], ["--dcgm-exporter", "4.8"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["exporter", *wrong])


def test_dcgm_exporter_4_9_names_units_and_labels(rack: SimRack) -> None:
    """4.9: every reading under DCGM 4.7's name in base units, 4.9's labels; both: each reading
    under either name, each in its own unit, with one label set."""
    gpu2 = rack.read("a100-01", NOW).gpu(2)
    assert gpu2 is not None and gpu2.memory_used_mib and gpu2.sm_clock_mhz

    def served(generation: str) -> dict[str, list]:
        exporter = Exporter(SimSource(rack, ManualClock(NOW)), naming=Naming.of(generation))
        exporter.poll_once()
        return samples(generate_latest(exporter.registry).decode())

    def value(families: dict[str, list], name: str) -> float:
        (sample,) = [
            s
            for s in families[name]
            if s.labels["hostname"] == "a100-01" and s.labels["gpu"] == "2"
        ]
        assert "Hostname" not in sample.labels and "DCGM_FI_DRIVER_VERSION" not in sample.labels
        return sample.value

    current = served("4.9")
    renamed = {m.name for m in (*dcgm.METRICS, dcgm.XID) if m.current}
    assert not renamed & set(current)
    assert value(current, "DCGM_FI_DEV_GPU_UTIL_RATIO") == pytest.approx(gpu2.utilization_pct / 100)
    assert value(current, "DCGM_FI_DEV_FB_USED_BYTES") == gpu2.memory_used_mib * 1048576
    assert value(current, "DCGM_FI_DEV_SM_CLOCK_HERTZ") == gpu2.sm_clock_mhz * 1e6
    assert value(current, "DCGM_FI_DEV_GPU_TEMP_CELSIUS") == gpu2.temperature_c == 92
    assert value(current, "DCGM_FI_DEV_XID_ERROR") == 0
    assert value(current, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0  # a name 4.9 kept
    assert {s.labels["hostname"] for s in current[dcgm.FINDINGS_METRIC]} <= set(rack.hosts)
    both = served("both")
    assert set(both) == set(current) | set(served("classic"))
    assert value(both, "DCGM_FI_DEV_SM_CLOCK") == gpu2.sm_clock_mhz
    assert value(both, "DCGM_FI_DEV_SM_CLOCK_HERTZ") == gpu2.sm_clock_mhz * 1e6


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
    for metric in (HOST_PROCESSES_METRIC, "gpuconsole_process_memory_used_bytes"):
        assert families[metric], metric  # the other hosts' processes are there
        assert not [s for s in families[metric] if s.labels["Hostname"] == "h100-02"]


@needs_promtool
def test_promtool_check_metrics(exporter: tuple[Exporter, str]) -> None:
    text = scrape(exporter[1])
    result = promtool("check", "metrics", stdin=text)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    # No format error (exit 1); the only lint is the camelCase of dcgm-exporter's modelName.
    assert result.returncode in (0, 3), problems
    assert problems, "promtool should flag modelName: is the label there?"
    assert all(p.startswith("DCGM_FI_DEV_") and p.endswith(CAMEL_CASE_LINT) for p in problems)
    assert "gpuconsole_process_memory_used_bytes{" in own_lines(text)  # the rack's jobs and pods
    assert_promtool_clean(text)


@needs_promtool
@pytest.mark.parametrize("generation", dcgm.CHOICES)
def test_promtool_check_metrics_of_every_generation(rack: SimRack, generation: str) -> None:
    served = Exporter(SimSource(rack, ManualClock(NOW)), naming=Naming.of(generation))
    served.poll_once()
    result = promtool("check", "metrics", stdin=generate_latest(served.registry).decode())
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode in (0, 3), problems
    assert problems and all(p.endswith(CAMEL_CASE_LINT) for p in problems)


@needs_promtool
def test_the_lint_check_can_fail() -> None:
    """promtool does flag what the exporter avoids: counters without _total, bad lines."""
    counter = "# HELP DCGM_X x\n# TYPE DCGM_X counter\nDCGM_X 1\n"
    assert promtool("check", "metrics", stdin=counter).returncode != 0
    assert promtool("check", "metrics", stdin="not a metric line\n").returncode != 0


def test_cli_exporter_demo_serves_until_terminated(tmp_path) -> None:
    port = free_port()
    process = start_gpuconsole("exporter", "--demo", "--address", "127.0.0.1", "--port", str(port))
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline:
            try:
                text = scrape(f"http://127.0.0.1:{port}/metrics")
                if "DCGM_FI_DEV_GPU_UTIL_RATIO{" in text:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        hosts = {s.labels["hostname"] for s in samples(text)["DCGM_FI_DEV_GPU_UTIL_RATIO"]}
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
        result = gpuconsole("exporter", "--demo", "--address", "127.0.0.1", "--port", str(port))
    assert result.returncode == 3
    assert result.stderr.strip() == (
        f"gpuconsole: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


# --- processes: whose work each is, bounded ----------------------------------------------------

HOST = "gpu-07"
GPUS = (GpuState(0, name="NVIDIA H200", uuid="GPU-0"), GpuState(1, name="NVIDIA H200"))
SECRET = "--token=hf_s3cr3t"
"""On a command line, where it must stay: no label carries the command."""
JOB = SlurmJob(41327, "llama-ft", "alice", "gpu", "2026-01-01T00:00:00", "1-00:00:00", "RUNNING")
POD = KubePod("5f1c2e9a-7b3d-4c8e-9a61-2d4f8b0c7e13", "infer", "llama-13b-7d9f5", "server")
IN_JOB = GpuProcess(
    4101,
    0,
    40960.0,
    "alice",
    f"python3 train.py {SECRET}",
    job=JOB,
    started=NOW - 3600,
    load=ProcessLoad(87.0, 41.5, 0.0, 0.0),
)
IN_POD = GpuProcess(
    5202,
    1,
    20480.0,
    "root",
    "python3 serve.py",
    container=f"k8s-pod:{POD.uid}",
    pod=POD,
    started=NOW - 600,
    load=ProcessLoad(55.0, 30.0, None, None),
)
IN_DOCKER = GpuProcess(
    6303,
    1,
    1024.0,
    "bob",
    "jupyter-lab",
    container="docker:0123456789ab",
    container_name="notebook",
    load=ProcessLoad(2.0, None, None, None),
)
BARE = GpuProcess(7404, 0, 512.0, "carol", "./a.out", started=NOW - 60, load=ProcessLoad(10.0))
NO_LOAD = GpuProcess(8505, 1, None, "dave", "python3 -c pass", started=NOW - 5)
PROCESS_METRIC_NAMES = (
    "gpuconsole_process_memory_used_bytes",
    "gpuconsole_process_sm_utilization_ratio",
    "gpuconsole_process_memory_utilization_ratio",
    "gpuconsole_process_encoder_utilization_ratio",
    "gpuconsole_process_decoder_utilization_ratio",
    "gpuconsole_process_start_time_seconds",
)


def exposition(*processes: GpuProcess) -> str:
    """What a scrape of an exporter watching one host with ``processes`` returns."""
    served = Exporter(StaticSource(HostSnapshot(HOST, NOW, GPUS, processes, source="nvml")))
    served.poll_once()
    assert served.store.status(HOST).state is HostState.LIVE
    return generate_latest(served.registry).decode()


def by_pid(families: dict[str, list], metric: str) -> dict[int, tuple[dict[str, str], float]]:
    return {int(s.labels["pid"]): (s.labels, s.value) for s in families[metric]}


def test_process_series_say_whose_work_it_is() -> None:
    text = exposition(IN_JOB, IN_POD, IN_DOCKER, BARE, NO_LOAD)
    families = samples(text)
    memory = by_pid(families, "gpuconsole_process_memory_used_bytes")
    nobody = dict.fromkeys(PROCESS_LABELS, "") | {"Hostname": HOST}
    assert memory[4101] == (
        nobody
        | {
            "gpu": "0",
            "pid": "4101",
            "user": "alice",
            "slurm_job_id": "41327",
            "slurm_job_name": "llama-ft",
            "slurm_user": "alice",
        },
        40960 * 1024 * 1024,
    )
    assert memory[5202][0] == nobody | {
        "gpu": "1",
        "pid": "5202",
        "user": "root",
        "namespace": "infer",
        "pod": "llama-13b-7d9f5",
        "container": "server",
    }
    assert memory[6303][0]["container"] == "notebook"  # the runtime's name, not its id
    assert memory[7404][0] == nobody | {"gpu": "0", "pid": "7404", "user": "carol"}
    assert 8505 not in memory  # its memory is unknown: no series, not 0
    sm = by_pid(families, "gpuconsole_process_sm_utilization_ratio")
    assert {pid: value for pid, (_, value) in sm.items()} == {
        4101: 0.87,
        5202: 0.55,
        6303: 0.02,
        7404: 0.10,
    }
    mem_util = by_pid(families, "gpuconsole_process_memory_utilization_ratio")
    assert {pid: value for pid, (_, value) in mem_util.items()} == {4101: 0.415, 5202: 0.30}
    encoder = by_pid(families, "gpuconsole_process_encoder_utilization_ratio")
    assert {pid: value for pid, (_, value) in encoder.items()} == {4101: 0.0}  # 0 is a reading
    assert set(by_pid(families, "gpuconsole_process_decoder_utilization_ratio")) == {4101}
    started = by_pid(families, "gpuconsole_process_start_time_seconds")
    assert {pid: value for pid, (_, value) in started.items()} == {
        4101: NOW - 3600,
        5202: NOW - 600,
        7404: NOW - 60,
        8505: NOW - 5,
    }
    assert {s.labels["Hostname"]: s.value for s in families[HOST_PROCESSES_METRIC]} == {HOST: 5}
    assert all(
        set(s.labels) == {"Hostname", *PROCESS_LABELS}
        for m in PROCESS_METRIC_NAMES
        for s in families[m]
    )
    assert SECRET not in text and "train.py" not in text
    assert all(
        f"# HELP {m} " in text and f"# TYPE {m} gauge\n" in text for m in PROCESS_METRIC_NAMES
    )


@needs_promtool
def test_process_series_pass_promtool() -> None:
    assert_promtool_clean(exposition(IN_JOB, IN_POD, IN_DOCKER, BARE, NO_LOAD))


def test_a_host_with_more_processes_than_the_cap_gets_series_for_the_biggest() -> None:
    count = 3 * MAX_PROCESS_SERIES
    sizes = [float((i * 7919) % count + 1) for i in range(count)]  # 1 … count MiB, shuffled
    processes = [GpuProcess(1000 + i, i % 2, mib, "u") for i, mib in enumerate(sizes)]
    unknown = [GpuProcess(9000 + i, 0, None, "u", started=NOW) for i in range(5)]
    families = samples(exposition(*unknown, *processes))
    memory = [s.value for s in families["gpuconsole_process_memory_used_bytes"]]
    biggest = sorted(sizes, reverse=True)[:MAX_PROCESS_SERIES]
    assert sorted(memory, reverse=True) == [mib * 1024 * 1024 for mib in biggest]
    assert len(families["gpuconsole_process_start_time_seconds"]) == 0  # unknown memory: last
    assert [s.value for s in families[HOST_PROCESSES_METRIC]] == [count + 5]


def test_the_cap_reaches_processes_of_unknown_memory_last() -> None:
    unknown = GpuProcess(9000, 0, None, "u", started=NOW)
    families = samples(exposition(unknown, *(GpuProcess(1000 + i, 0, 1.0, "u") for i in range(3))))
    assert [s.labels["pid"] for s in families["gpuconsole_process_start_time_seconds"]] == ["9000"]


def test_a_process_listed_twice_on_one_gpu_has_one_series() -> None:
    graphics = GpuProcess(IN_JOB.pid, IN_JOB.gpu, 64.0, "alice", kind="graphics")
    families = samples(exposition(graphics, IN_JOB))
    assert [s.value for s in families["gpuconsole_process_memory_used_bytes"]] == [
        40960 * 1024 * 1024
    ]


HOSTILE = 'say "hi"\\ \\n\n' + TITLE + "\ud800"
"""A double quote, a backslash, a backslash-n, a newline, a window-title escape and a lone
surrogate (JSON can carry one; it has no UTF-8)."""
HOSTILE_SEEN = 'say "hi"\\ \\n␊␛]0;owned␇\\ud800'
"""The label value it becomes: quote and backslashes kept, the rest made visible."""
LONG = (CLIPBOARD + '"\\\n') * (10_000 // len(CLIPBOARD + '"\\\n') + 1)


def hostile_process() -> GpuProcess:
    pod = KubePod(POD.uid, HOSTILE, LONG[:10_000], HOSTILE)
    job = SlurmJob(1, LONG[:10_000], HOSTILE, None, None, None, None)
    return GpuProcess(4242, 0, 1.0, HOSTILE, LONG, job=job, pod=pod)


def check_hostile(labels: dict[str, str]) -> None:
    assert labels["user"] == labels["slurm_user"] == labels["namespace"] == HOSTILE_SEEN
    assert labels["container"] == HOSTILE_SEEN
    for long in (labels["slurm_job_name"], labels["pod"]):
        assert len(long) == MAX_LABEL_CHARS and long.endswith("…")
        assert long.startswith('␛]52;c;SE9TVElMRQ==␛\\"\\␊')
    assert not any(UNSAFE.search(value) for value in labels.values())


def test_hostile_label_values_parse_back() -> None:
    text = exposition(hostile_process())
    (sample,) = samples(text)["gpuconsole_process_memory_used_bytes"]
    check_hostile(sample.labels)
    (line,) = [line for line in text.splitlines() if line.startswith("gpuconsole_process_memory")]
    assert 'user="say \\"hi\\"\\\\ \\\\n␊' in line  # escaped as the exposition format says
    assert len(line) < (1 + len(PROCESS_LABELS)) * (MAX_LABEL_CHARS + 30)  # every long value cut


@needs_promtool
def test_hostile_label_values_pass_promtool() -> None:
    assert_promtool_clean(exposition(hostile_process()))


@needs_prometheus
def test_prometheus_reads_hostile_label_values_back(tmp_path: Path) -> None:
    """The real judge: Prometheus scrapes (asking for OpenMetrics first) and stores the labels."""
    served = Exporter(StaticSource(HostSnapshot(HOST, NOW, GPUS, (hostile_process(),))))
    served.poll_once()
    _, port = served.listen("127.0.0.1", 0)
    prometheus = Prometheus(tmp_path, [f"127.0.0.1:{port}"]).start()
    try:
        (series,) = prometheus.wait_for("gpuconsole_process_memory_used_bytes")
    finally:
        prometheus.stop()
        served.close()
    labels = dict(series["metric"])
    assert labels.pop("__name__") == "gpuconsole_process_memory_used_bytes"
    assert {labels.pop("instance"), labels.pop("job")} == {f"127.0.0.1:{port}", "gpus"}
    assert set(labels) == {
        "Hostname",
        *PROCESS_LABELS,
    }  # none empty (Prometheus drops an empty label)
    check_hostile(labels)


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(exclude_categories=()), max_size=MAX_LABEL_CHARS + 20))
def test_any_label_text_round_trips(text: str) -> None:
    """Whatever a host calls its user, both exposition formats carry the label value whole, and
    the value is the text itself where the text is short, printable and UTF-8."""
    served = Exporter(StaticSource(HostSnapshot(HOST, NOW, GPUS, (GpuProcess(1, 0, 1.0, text),))))
    served.poll_once()
    value = label_value(text)
    assert len(value) <= MAX_LABEL_CHARS and not UNSAFE.search(value)
    printable = not UNSAFE.search(text) and not any("\ud800" <= c <= "\udfff" for c in text)
    if printable and len(text) <= MAX_LABEL_CHARS:
        assert value == text
    for write, parse in (
        (generate_latest, text_string_to_metric_families),
        (openmetrics.generate_latest, openmetrics_families),
    ):
        families = {f.name: f.samples for f in parse(write(served.registry).decode())}
        (sample,) = families["gpuconsole_process_memory_used_bytes"]
        assert sample.labels["user"] == value


# --- exposure: where it listens, and a burst of scrapers ------------------------------------------

BURST = 200
"""Concurrent scrapers: a Prometheus fleet scraping at the same instant, or one with many jobs."""
TCP_INFO_TOTAL_RETRANS = 100
"""Offset of ``tcpi_total_retrans`` (u32) in Linux's ``struct tcp_info``."""


def somaxconn() -> int | None:
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except OSError:
        return None


def raw_scrape(port: int) -> tuple[str, int]:
    """GET /metrics on a socket of our own: (the response, segments the kernel had to send again).

    On loopback nothing is lost, so a retransmission means the listen queue had no room for the
    connection: its SYN (or the ACK that completes it) was dropped and sent again after a second.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    (retransmitted,) = struct.unpack_from("I", info, TCP_INFO_TOTAL_RETRANS)
    return b"".join(chunks).decode(), retransmitted


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's TCP_INFO")
def test_a_burst_of_200_scrapers_is_served_without_a_retry(
    exporter: tuple[Exporter, str],
) -> None:
    """All connect at once (a barrier), loopback only; each has a 60 s bound, so the test stops
    by itself. socketserver's default backlog of 5 drops most of them for a SYN retry."""
    if (somaxconn() or BURST) < BURST:
        pytest.skip(
            f"net.core.somaxconn is {somaxconn()}: the kernel caps the backlog below {BURST}"
        )
    port = int(exporter[1].rsplit(":", 1)[1].split("/")[0])
    barrier = threading.Barrier(BURST)
    results: list[tuple[str, int] | BaseException] = []

    def scraper() -> None:
        barrier.wait(timeout=60)
        try:
            results.append(raw_scrape(port))
        except OSError as error:
            results.append(error)

    threads = [threading.Thread(target=scraper) for _ in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, failures[:3]
    responses = [r for r in results if not isinstance(r, BaseException)]
    assert len(responses) == BURST
    assert all(text.startswith("HTTP/1.0 200") for text, _ in responses)
    assert all("DCGM_FI_DEV_GPU_UTIL{" in text for text, _ in responses)
    retried = sum(1 for _, retransmitted in responses if retransmitted)
    assert retried == 0, f"{retried} of {BURST} connections had to be sent again"


def test_the_backlog_has_room_for_the_burst() -> None:
    assert exporter_module.LISTEN_BACKLOG >= BURST
    served = Exporter(SimSource(demo_rack(hosts=1, seed=7), ManualClock(NOW)))
    try:
        served.listen("127.0.0.1", 0)
        assert served._server is not None
        assert served._server.request_queue_size == exporter_module.LISTEN_BACKLOG
    finally:
        served.close()


def test_the_exporter_listens_on_loopback_unless_told_otherwise() -> None:
    args = build_parser().parse_args(["exporter"])
    assert args.address == "127.0.0.1"
    assert exporter_command.DEFAULT_ADDRESS == "127.0.0.1"


def serve_until_listening(*options: str) -> tuple[subprocess.Popen[str], str]:
    """`gpuconsole exporter --demo --port 0 OPTIONS`, and the line that says where it serves."""
    process = start_gpuconsole(
        "exporter", "--demo", "--port", "0", *options, stdout=subprocess.DEVNULL
    )
    assert process.stderr is not None
    watchdog = threading.Timer(60, process.kill)  # a bound, should it never say a word
    watchdog.start()
    line = process.stderr.readline()  # the exporter says where it serves, or why it cannot
    watchdog.cancel()
    return process, line


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_cli_exporter_binds_127_0_0_1_by_default() -> None:
    process, line = serve_until_listening()
    try:
        match = re.fullmatch(r"gpuconsole: serving 6 hosts at http://(.+):(\d+)/metrics .*\n", line)
        assert match, line
        assert match[1] == "127.0.0.1"
        assert "DCGM_FI_DEV_GPU_UTIL" in scrape(f"http://127.0.0.1:{match[2]}/metrics")
    finally:
        stop(process)


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize("address", ["::1", "[::1]"])
def test_cli_exporter_on_ipv6_loopback(address: str) -> None:
    process, line = serve_until_listening("--address", address)
    try:
        match = re.fullmatch(
            r"gpuconsole: serving 6 hosts at http://\[::1\]:(\d+)/metrics .*\n", line
        )
        assert match, line
        assert "DCGM_FI_DEV_GPU_UTIL" in scrape(f"http://[::1]:{match[1]}/metrics")
    finally:
        stop(process)


def test_cli_exporter_bad_address_is_one_line() -> None:
    result = gpuconsole("exporter", "--demo", "--address", "no.such.host.invalid", "--port", "0")
    assert result.returncode == 3
    assert result.stderr.startswith("gpuconsole: cannot listen on no.such.host.invalid:0: ")
    assert len(result.stderr.strip().splitlines()) == 1
