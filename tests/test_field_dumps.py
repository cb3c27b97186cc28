"""Dumps from the field through the parser and `gpuconsole triage --from`: Windows (WDDM) text
and XML, drivers 384 to 610 (XML DTDs v9 to v13, 610's nesting), dumps cut off mid-GPU and dumps of
fewer GPUs (``-i``), pending page retirement, MIG devices, ``--query-gpu`` CSV."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuconsole.rules import health
from gpuconsole.telemetry.smi import SmiParseError, parse_dump, parse_query_gpu_csv

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
WDDM = FIXTURES / "rtx4070-laptop-wddm-q.txt"
RETIRED = FIXTURES / "azure-q-retired-pages-8gpu.txt"
H200_TEXT = FIXTURES / "h200-q-loaded.txt"
H200_XML = FIXTURES / "h200-q.xml"
WDDM_XML = FIXTURES / "rtx2080-wddm-516.xml"
MIG_A100_XML = FIXTURES / "a100-sxm4-mig-510.xml"
P100_XML = FIXTURES / "tesla-p100-510.xml"
K80_XML = FIXTURES / "k80-4gpu-430-v10.xml"
GTX1070_XML = FIXTURES / "gtx1070-384-v9-2of6.xml"

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
    return gpuconsole("triage", "--from", str(path))


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
    assert snapshot.gpus[0].power_limit_default_w == 700.0  # nested as well
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


def test_an_xml_dump_cut_off_is_refused_naming_the_counts(tmp_path: Path) -> None:
    text = H200_XML.read_text()
    cut = text[: text.index("<temperature>")]
    with pytest.raises(SmiParseError, match=r"announces 1 GPUs and 1 GPU sections begin"):
        parse_dump(cut, host="h", time=0.0)
    dump = tmp_path / "cut.xml"
    dump.write_text(cut)
    assert "not well-formed XML" in refused(triage(dump), dump)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_xml_cut_anywhere_is_whole_or_refused(data: st.DataObject) -> None:
    text = K80_XML.read_text()
    cut = data.draw(st.integers(0, len(text)))
    try:
        snapshot = parse_dump(text[:cut], host="h", time=0.0)
    except SmiParseError:
        return
    assert len(snapshot.gpus) == 4


def test_a_dump_of_fewer_gpus_made_with_i_is_read_and_says_so(tmp_path: Path) -> None:
    """``nvidia-smi -q -i 0`` keeps "Attached GPUs" at the host's count: its one section is whole,
    so the dump is read, and triage names each GPU by bus id (its numbers are the dump's)."""
    for path, marker in ((H200_TEXT, "Attached GPUs"), (H200_XML, "<attached_gpus>")):
        text = path.read_text()
        if marker == "Attached GPUs":
            text = text.replace(": 1\n", ": 8\n", 1)
            assert "Attached GPUs                                          : 8" in text
        else:
            text = text.replace("<attached_gpus>1<", "<attached_gpus>8<")
        snapshot = parse_dump(text, host="h", time=0.0)
        assert (len(snapshot.gpus), snapshot.attached_gpus) == (1, 8)
        dump = tmp_path / path.name
        dump.write_text(text)
        result = triage(dump)
        assert result.returncode == 0, result.stderr
        assert "a dump of 1 of the 8 GPUs attached (nvidia-smi -i)" in result.stdout
        assert "GPU 0 = 00000000:00:06.0" in result.stdout
    assert parse_dump(H200_XML.read_text(), host="h", time=0.0).attached_gpus is None


def test_old_driver_dump_of_2_of_6_gpus() -> None:
    """Driver 384's DTD v9 (GTX 1070s), as a dump of 2 of 6 GPUs: both read, processes too."""
    snapshot = parse_dump(GTX1070_XML.read_text(), host="h", time=0.0)
    assert (snapshot.driver_version, snapshot.attached_gpus) == ("384.66", 6)
    assert [(g.name, g.memory_used_mib, g.power_w) for g in snapshot.gpus] == [
        ("GeForce GTX 1070", 2028.0, 119.47),
        ("GeForce GTX 1070", 4057.0, 139.3),
    ]
    assert [g.pcie.width for g in snapshot.gpus if g.pcie] == [1, 1]
    assert ("./ethminer", 2283.0) in {(p.command, p.used_memory_mib) for p in snapshot.processes}


def test_dtd_v10_and_v11_ecc_counts() -> None:
    """Drivers 430 (v10, Tesla K80s) and 510 (v11, Tesla P100) count ECC errors as single and
    double bit totals: the lifetime counts are read, the volatile ones are zero."""
    k80 = parse_dump(K80_XML.read_text(), host="h", time=0.0)
    lifetime = [(g.ecc.aggregate_corrected, g.ecc.aggregate_uncorrected) for g in k80.gpus if g.ecc]
    assert lifetime == [(7, 7), (34, 4), (0, 0), (0, 0)]
    assert {g.ecc.volatile_uncorrected for g in k80.gpus if g.ecc} == {0}
    (p100,) = parse_dump(P100_XML.read_text(), host="h", time=0.0).gpus
    assert p100.ecc is not None and p100.ecc.aggregate_corrected == 3
    assert (p100.power_limit_w, p100.retired_pages_pending) == (250.0, False)


def test_limits_in_older_layouts() -> None:
    """Drivers 430 and 510 (DTD v10, v11) keep the power limits under power_readings and give
    the shutdown temperature itself (gpu_temp_max_threshold), not a margin to T.Limit; a card
    that has no application clocks says N/A."""
    (a100,) = parse_dump(MIG_A100_XML.read_text(), host="h", time=0.0).gpus
    power = (a100.power_limit_min_w, a100.power_limit_max_w, a100.power_limit_default_w)
    assert power == (100.0, 400.0, 400.0)
    assert (a100.sm_clock_application_mhz, a100.memory_clock_application_mhz) == (1095.0, 1215.0)
    assert (a100.slowdown_temperature_c, a100.shutdown_temperature_c) == (89.0, 92.0)
    assert (a100.pcie_tx_kib_s, a100.pcie_rx_kib_s) == (0.0, 0.0)
    k80 = parse_dump(K80_XML.read_text(), host="h", time=0.0).gpus[0]
    assert (k80.power_limit_default_w, k80.power_limit_max_w) == (149.0, 175.0)  # may go higher
    assert (k80.shutdown_temperature_c, k80.pcie_tx_kib_s) == (110.0, None)  # N/A
    (rtx,) = parse_dump(WDDM_XML.read_text(), host="win", time=0.0).gpus
    assert (rtx.sm_clock_application_mhz, rtx.memory_clock_application_mhz) == (None, None)


def test_windows_xml_dump() -> None:
    """A WDDM host's XML (driver 516, RTX 2080): no process memory, the GPU read whole."""
    snapshot = parse_dump(WDDM_XML.read_text(), host="win", time=0.0)
    (gpu,) = snapshot.gpus
    assert (gpu.name, gpu.memory_used_mib, gpu.power_limit_w) == (
        "NVIDIA GeForce RTX 2080",
        862.0,
        275.0,
    )
    assert gpu.pcie is not None and (gpu.pcie.width, gpu.pcie.max_width) == (8, 16)
    assert len(snapshot.processes) == 26
    assert {p.used_memory_mib for p in snapshot.processes} == {None}
    assert "C:\\Windows\\explorer.exe" in {p.command for p in snapshot.processes}


def test_xml_power_limit_nested_one_level_down() -> None:
    """Driver 610 moves the limits under a section ("GPU Ceiling Power Limit" in the text); in
    XML that section is looked in whatever its tag, and the KMD version wins when given."""
    text = H200_XML.read_text().replace(
        "<current_power_limit>700.00 W</current_power_limit>",
        "<gpu_ceiling_power_limit><current_power_limit>650.00 W</current_power_limit>"
        "</gpu_ceiling_power_limit>",
        1,
    )
    text = text.replace(
        "<driver_version>580.159.04</driver_version>",
        "<driver_version>610.10 [Deprecated]</driver_version><kmd_version>610.10</kmd_version>",
    )
    snapshot = parse_dump(text, host="h", time=0.0)
    assert snapshot.gpus[0].power_limit_w == 650.0
    assert snapshot.driver_version == "610.10"


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


def test_real_mig_dump() -> None:
    """An A100 in MIG mode with two 3g.20gb-sized instances (driver 510, DTD v11)."""
    (gpu,) = parse_dump(MIG_A100_XML.read_text(), host="h", time=0.0).gpus
    assert gpu.mig_mode is True
    assert [
        (m.gpu_instance_id, m.compute_instance_id, m.memory_total_mib, m.memory_used_mib)
        for m in gpu.mig_instances
    ] == [(1, 0, 19968.0, 19.0), (2, 0, 19968.0, 19.0)]


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


def test_a_mig_device_without_an_instance_id_is_left_out_with_a_note() -> None:
    text = H200_TEXT.read_text().replace(
        "    Processes", MIG_TEXT.replace("GPU Instance ID", "Other") + "    Processes", 1
    )
    snapshot = parse_dump(text, host="h", time=0.0)
    assert snapshot.gpus[0].mig_instances == ()
    assert snapshot.gpus[0].memory_total_mib == 143771.0
    assert "GPU 0: a MIG device without a GPU instance ID" in snapshot.bad_value_notes


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
    ],
)
def test_bad_query_gpu_csv_is_refused(tmp_path: Path, content: str, message: str) -> None:
    dump = tmp_path / "bad.csv"
    dump.write_text(content)
    assert message in refused(triage(dump), dump)


def test_a_bad_value_read_for_two_fields_is_one_bad_value() -> None:
    """The temperature is read for itself and for the thresholds computed from T.Limit margins:
    a temperature that does not read is one bad value, one note."""
    text = re.sub(r"(GPU Current Temp\s+: )\S+ C", r"\1hot C", H200_TEXT.read_text())
    snapshot = parse_dump(text, host="h", time=0.0)
    (gpu,) = snapshot.gpus
    assert (gpu.temperature_c, gpu.slowdown_temperature_c, gpu.shutdown_temperature_c) == (
        None,
    ) * 3
    assert snapshot.bad_value_notes == (
        "GPU 0 Temperature/GPU Current Temp: 'hot C' is not a number",
    )
    assert snapshot.bad_values == 1
