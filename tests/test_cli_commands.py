"""The subcommands as a script runs them: real processes, real files, exit codes and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import gpuconsole

from gpuconsole.telemetry.nvml import nvml_unavailable_reason
from gpuconsole.telemetry.sim import demo_rack
from gpuconsole.telemetry.smi_xml import dump_xml

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
no_gpu = pytest.mark.skipif(nvml_unavailable_reason() is None, reason="this host has a GPU")


def test_snapshot_demo_json_carries_readings_and_findings() -> None:
    result = gpuconsole("snapshot", "--demo", "--json")
    data = json.loads(result.stdout)
    assert data["host"] == "h100-01"
    assert len(data["gpus"]) == 8
    lost = [g for g in data["gpus"] if g["lost"]]
    assert [g["index"] for g in lost] == [3]
    assert lost[0]["utilization_pct"] is None  # missing is null, never 0
    codes = {(f["code"], f["gpu"]) for f in data["findings"]}
    assert ("gpu-lost", 3) in codes
    assert set(data["findings"][0]) == {"severity", "code", "host", "gpu", "message", "remediation"}
    assert result.returncode == 2  # critical


@no_gpu
def test_without_a_driver_the_console_says_so_and_points_to_demo() -> None:
    for args in ((), ("snapshot",)):
        result = gpuconsole(*args)
        assert result.returncode == 3
        assert "--demo" in result.stderr
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_triage_of_a_healthy_h200_dump_is_clean() -> None:
    result = gpuconsole("triage", "--from", str(FIXTURES / "h200-q.xml"), "--json")
    data = json.loads(result.stdout)
    assert data["gpus"] == 1
    assert data["driver_version"] == "580.159.04"
    assert data["findings"] == []
    assert result.returncode == 0


def test_triage_of_the_loaded_text_dump_reports_the_power_cap_as_info() -> None:
    result = gpuconsole("triage", "--from", str(FIXTURES / "h200-q-loaded.txt"))
    assert "power-cap" in result.stdout
    assert result.returncode == 0


def test_triage_of_a_simulated_incident_exits_critical(tmp_path: Path) -> None:
    rack = demo_rack(hosts=6, seed=7)
    rack.set_fault("h100-02", "ecc-uncorrectable", gpu=4, since=rack.epoch + 60)
    dump = tmp_path / "h100-02.xml"
    dump.write_text(dump_xml(rack.read("h100-02", rack.epoch + 300)))
    result = gpuconsole("triage", "--from", str(dump), "--json")
    findings = json.loads(result.stdout)["findings"]
    assert {("ecc-uncorrectable", 4), ("row-remap-pending", 4)} <= {
        (f["code"], f["gpu"]) for f in findings
    }
    assert result.returncode == 2


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "No such file"), ("# notes\n", "neither nvidia-smi"), ("<nvidia_smi_log>", "")],
)
def test_triage_of_an_unreadable_dump_is_one_line_naming_the_file(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "dump.xml"
    if content is not None:
        path.write_text(content)
    result = gpuconsole("triage", "--from", str(path))
    assert result.returncode == 3
    assert result.stderr.startswith(f"gpuconsole: {path}:")
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
