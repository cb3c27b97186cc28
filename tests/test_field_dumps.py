"""Dumps from the field through the parser and `gpuconsole triage --from`: Windows (WDDM), driver
610's text, a dump cut off mid-GPU, pending page retirement, MIG devices, ``--query-gpu`` CSV."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuconsole import health
from gpuconsole.telemetry.smi import SmiParseError, parse_dump, parse_query_gpu_csv

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
WDDM = FIXTURES / "rtx4070-laptop-wddm-q.txt"
RETIRED = FIXTURES / "azure-q-retired-pages-8gpu.txt"
H200_TEXT = FIXTURES / "h200-q-loaded.txt"
H200_XML = FIXTURES / "h200-q.xml"

# The process a Windows host lists under WDDM, as nvidia-smi -q prints it.
WDDM_PROCESSES = """    Processes
        GPU instance ID                   : N/A
        Compute instance ID               : N/A
        Process ID                        : 10588
            Type                          : C+G
            Name                          : C:\\Windows\\explorer.exe
            Used GPU Memory               : Not available in WDDM driver model
"""


def triage(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuconsole", "triage", "--from", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def refused(result: subprocess.CompletedProcess[str], path: Path) -> str:
    """The one-line error of a refused dump, checked to name the file and hold no traceback."""
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"gpuconsole: {path}: ")
    return line


def wddm_dump() -> str:
    text = WDDM.read_text()
    return text.replace("    Processes                             : None\n", WDDM_PROCESSES)


def test_wddm_process_memory_reads_as_unknown(tmp_path: Path) -> None:
    snapshot = parse_dump(wddm_dump(), host="win", time=0.0)
    (process,) = snapshot.processes
    assert (process.pid, process.kind, process.used_memory_mib) == (10588, "compute+graphics", None)
    dump = tmp_path / "win.txt"
    dump.write_text(wddm_dump())
    result = triage(dump)
    assert result.returncode == 0, result.stderr
    assert "1 GPUs, driver 566.36" in result.stdout


def test_the_real_wddm_dump_is_read() -> None:
    (gpu,) = parse_dump(WDDM.read_text(), host="win", time=0.0).gpus
    assert (gpu.name, gpu.power_limit_w, gpu.memory_total_mib) == (
        "NVIDIA GeForce RTX 4070 Laptop GPU",
        61.24,
        8188.0,
    )


def driver_610(text: str) -> str:
    """The H200's -q text as driver 610 writes its two changed parts: the version's deprecation
    note, and the power limits nested under "GPU Ceiling Power Limit"."""
    text = text.replace(
        ": 580.159.04\n",
        ": 610.10 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]\n",
        1,
    )
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "Current Power Limit" in line)
    nested = ["        GPU Ceiling Power Limit\n"]
    nested += ["    " + line for line in lines[start : start + 3]]
    return "".join(lines[:start] + nested + lines[start + 3 :])


def test_driver_610_power_limit_and_version(tmp_path: Path) -> None:
    text = driver_610(H200_TEXT.read_text())
    assert "GPU Ceiling Power Limit\n            Current Power Limit" in text
    snapshot = parse_dump(text, host="h", time=0.0)
    assert snapshot.driver_version == "610.10"
    assert snapshot.gpus[0].power_limit_w == 700.0
    dump = tmp_path / "610.txt"
    dump.write_text(text)
    result = triage(dump)
    assert "1 GPUs, driver 610.10\n" in result.stdout
    assert "691 W of 700 W" in result.stdout


def test_a_dump_cut_off_in_gpu_0_of_8_is_refused(tmp_path: Path) -> None:
    text = RETIRED.read_text()
    cut = text[: text.index("Double Bit ECC")]
    with pytest.raises(SmiParseError, match=r"announces 8 GPUs .* holds 1"):
        parse_dump(cut, host="h", time=0.0)
    dump = tmp_path / "cut.txt"
    dump.write_text(cut)
    assert "announces 8 GPUs (Attached GPUs) but holds 1" in refused(triage(dump), dump)


def test_an_xml_dump_with_fewer_gpus_than_attached_is_refused() -> None:
    text = H200_XML.read_text().replace("<attached_gpus>1<", "<attached_gpus>8<")
    with pytest.raises(SmiParseError, match=r"announces 8 GPUs .* holds 1"):
        parse_dump(text, host="h", time=0.0)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_dump_cut_at_any_line_is_complete_or_refused(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from([RETIRED, H200_TEXT]))
    lines = path.read_text().splitlines(keepends=True)
    cut = data.draw(st.integers(0, len(lines)))
    text = "".join(lines[:cut])
    announced = 8 if path == RETIRED else 1
    try:
        snapshot = parse_dump(text, host="h", time=0.0)
    except SmiParseError:
        return
    assert len(snapshot.gpus) == announced


def test_pending_page_retirement_is_a_warning(tmp_path: Path) -> None:
    snapshot = parse_dump(RETIRED.read_text(), host="h", time=0.0)
    pending = [gpu.index for gpu in snapshot.gpus if gpu.retired_pages_pending]
    assert pending == [1, 3, 5, 7]
    findings = [f for f in health.evaluate(snapshot) if f.code == "retired-pages-pending"]
    assert [f.gpu for f in findings] == pending
    assert all(f.severity is health.Severity.WARNING for f in findings)
    assert "reset" in findings[0].remediation
    result = triage(RETIRED)
    assert result.returncode == 1, result.stderr
    assert result.stdout.count("retired-pages-pending") == 4


def test_pending_retirement_in_xml() -> None:
    text = H200_XML.read_text().replace(
        "<pending_retirement>N/A</pending_retirement>",
        "<pending_retirement>Yes</pending_retirement>",
    )
    (gpu,) = parse_dump(text, host="h", time=0.0).gpus
    assert gpu.retired_pages_pending is True
    assert "retired-pages-pending" in {f.code for f in health.evaluate(parse_dump(text, "h", 0))}


MIG_TEXT = """    MIG Devices
        MIG Device
            Index                         : 0
            GPU Instance ID               : 1
            Compute Instance ID           : 0
            FB Memory Usage
                Total                     : 71424 MiB
                Reserved                  : 0 MiB
                Used                      : 14 MiB
                Free                      : 71409 MiB
        MIG Device
            Index                         : 1
            GPU Instance ID               : 2
            Compute Instance ID           : 0
            FB Memory Usage
                Total                     : 71424 MiB
                Reserved                  : 0 MiB
                Used                      : 8000 MiB
                Free                      : 63423 MiB
"""
MIG_XML = """<mig_devices><mig_device><index>0</index><gpu_instance_id>3</gpu_instance_id>
<compute_instance_id>0</compute_instance_id><fb_memory_usage><total>35584 MiB</total>
<used>11 MiB</used></fb_memory_usage></mig_device></mig_devices>
"""


def test_mig_devices_in_text_and_xml() -> None:
    text = H200_TEXT.read_text().replace("    Processes", MIG_TEXT + "    Processes", 1)
    (gpu,) = parse_dump(text, host="h", time=0.0).gpus
    assert [
        (m.gpu_instance_id, m.compute_instance_id, m.memory_used_mib) for m in gpu.mig_instances
    ] == [
        (1, 0, 14.0),
        (2, 0, 8000.0),
    ]
    xml = H200_XML.read_text().replace("<mig_devices>\n\t\t\tNone\n\t\t</mig_devices>\n", MIG_XML)
    assert MIG_XML in xml
    (gpu,) = parse_dump(xml, host="h", time=0.0).gpus
    (instance,) = gpu.mig_instances
    assert (instance.gpu_instance_id, instance.memory_total_mib) == (3, 35584.0)


def test_a_mig_device_without_an_instance_id_is_refused() -> None:
    text = H200_TEXT.read_text().replace(
        "    Processes", MIG_TEXT.replace("GPU Instance ID", "Other") + "    Processes", 1
    )
    with pytest.raises(SmiParseError, match="MIG device without a GPU instance ID"):
        parse_dump(text, host="h", time=0.0)


def test_query_gpu_csv_is_triage_input(tmp_path: Path) -> None:
    path = FIXTURES / "h200-query-gpu.csv"
    snapshot = parse_dump(path.read_text(), host="h", time=0.0)
    assert snapshot.driver_version == "580.159.04"
    assert snapshot.gpus[0].name == "NVIDIA H200"
    result = triage(path)
    assert result.returncode == 0, result.stderr
    assert "1 GPUs, driver 580.159.04" in result.stdout
    hot = tmp_path / "hot.csv"
    hot.write_text("index, name, persistence_mode, pci.baseClass\n0, NVIDIA H200, Disabled, 0x3\n")
    result = triage(hot)
    assert result.returncode == 1 and "persistence-off" in result.stdout


def test_query_gpu_header_with_capitals() -> None:
    (gpu,) = parse_query_gpu_csv("index, pci.baseClass, temperature.gpu\n0, 0x3, 40\n")
    assert (gpu.index, gpu.temperature_c) == (0, 40.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("index, name\n", "without GPU rows"),
        ("pid, process_name\n1, python\n", "no --query-gpu field"),
        ("index, name\n0, a, b\n", "row 1 has 3 values for 2 fields"),
        ("index, temperature.gpu\n0, hot\n", "'hot' is not a number"),
    ],
)
def test_bad_query_gpu_csv_is_refused(tmp_path: Path, content: str, message: str) -> None:
    dump = tmp_path / "bad.csv"
    dump.write_text(content)
    assert message in refused(triage(dump), dump)
