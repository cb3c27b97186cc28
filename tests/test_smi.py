"""nvidia-smi parsers on outputs captured on an NVIDIA H200, and SmiSource's failure messages."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from smi_captures import NOHEADER_FIELDS, fixture

from gpuconsole.core.model import EccCounts, GpuProcess, GpuState, PcieLink, RowRemap, Topology
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.smi import (
    QUERY_GPU_FIELDS,
    SmiParseError,
    SmiSource,
    gpu_index_map,
    parse_compute_apps_csv,
    parse_dump,
    parse_q_text,
    parse_query_gpu_csv,
    parse_topo_m,
    parse_xml,
    run_command,
)

IDLE_UUID = "GPU-a143f776-ddc0-785d-0c25-421b038c7406"
LOADED_UUID = "GPU-175817c4-01e6-602d-8cec-942989c1e518"
BUS_ID = "00000000:00:06.0"
PYTHON3 = GpuProcess(pid=552, gpu=0, used_memory_mib=1002.0, command="python3", kind="compute")


# --- -q -x XML -----------------------------------------------------------------------------------


def test_xml_idle_h200() -> None:
    snapshot = parse_xml(fixture("h200-q.xml"), "h200", 100.0)
    assert (snapshot.host, snapshot.time, snapshot.source) == ("h200", 100.0, "nvidia-smi")
    assert (snapshot.driver_version, snapshot.cuda_version) == ("580.159.04", "13.0")
    (gpu,) = snapshot.gpus
    assert (gpu.index, gpu.name, gpu.uuid, gpu.pci_bus_id) == (0, "NVIDIA H200", IDLE_UUID, BUS_ID)
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (0.0, 143771.0)
    assert (gpu.utilization_pct, gpu.memory_utilization_pct) == (0.0, 0.0)
    assert (gpu.power_w, gpu.power_limit_w) == (129.32, 700.0)  # the 1 s average, as power.draw
    assert (gpu.sm_clock_mhz, gpu.sm_clock_max_mhz) == (570.0, 1980.0)
    assert (gpu.memory_clock_mhz, gpu.memory_clock_max_mhz) == (3201.0, 3201.0)
    assert gpu.pstate == "P0"
    assert gpu.throttle_reasons == ("gpu-idle",)
    assert gpu.pcie == PcieLink(gen=5, width=16, max_gen=5, max_width=16)
    assert (gpu.persistence_mode, gpu.compute_mode, gpu.mig_mode) == (True, "Default", False)
    assert gpu.ecc == EccCounts(0, 0, 0, 0)
    assert gpu.remap == RowRemap(correctable=0, uncorrectable=0, pending=False, failure=False)
    assert gpu.recovery_action == "none"
    assert snapshot.processes == ()


def test_xml_h200_has_no_fan_reading() -> None:
    (gpu,) = parse_xml(fixture("h200-q.xml"), "h200", 0.0).gpus
    assert gpu.fan_pct is None  # "N/A": a passively cooled card, not a stopped fan


def test_xml_loaded_h200() -> None:
    snapshot = parse_xml(fixture("h200-q-loaded.xml"), "h200", 0.0)
    (gpu,) = snapshot.gpus
    assert gpu.uuid == LOADED_UUID
    assert (gpu.serial, gpu.vbios_version) == ("1653924041834", "96.00.A5.00.1A")
    assert (gpu.utilization_pct, gpu.memory_utilization_pct) == (100.0, 23.0)
    assert gpu.memory_used_mib == 1011.0
    assert (gpu.power_w, gpu.power_limit_w) == (691.70, 700.0)
    assert gpu.sm_clock_mhz == 1440.0
    assert gpu.throttle_reasons == ("sw-power-cap",)
    assert snapshot.processes == (PYTHON3,)


def test_xml_slowdown_temperature_from_tlimit_margins() -> None:
    """The 580 driver gives margins to T.Limit: 70 C now, 13 C below T.Limit, slowdown at -2,
    shutdown at -8."""
    (gpu,) = parse_xml(fixture("h200-q-loaded.xml"), "h200", 0.0).gpus
    assert (gpu.temperature_c, gpu.slowdown_temperature_c) == (70.0, 85.0)
    assert gpu.shutdown_temperature_c == 91.0


def test_the_idle_h200s_margins_give_nvmls_thresholds() -> None:
    """Idle (35 C, 52 C below T.Limit) the margins give what NVML's thresholds gave on the same
    H200: slowdown 89 C, shutdown 95 C."""
    (gpu,) = parse_xml(fixture("h200-q.xml"), "h200", 0.0).gpus
    assert (gpu.slowdown_temperature_c, gpu.shutdown_temperature_c) == (89.0, 95.0)


@pytest.mark.parametrize("name", ["h200-q-loaded.xml", "h200-q-loaded.txt"])
def test_power_range_and_application_clocks_of_the_h200(name: str) -> None:
    (gpu,) = parse_dump(fixture(name), "h200", 0.0).gpus
    assert (gpu.power_limit_min_w, gpu.power_limit_max_w) == (200.0, 700.0)
    assert (gpu.power_limit_default_w, gpu.power_limit_w) == (700.0, 700.0)
    assert (gpu.sm_clock_application_mhz, gpu.memory_clock_application_mhz) == (1980.0, 3201.0)


@pytest.mark.parametrize(
    ("name", "tx", "rx"),
    [
        ("h200-q.xml", 888.0, 492.0),
        ("h200-q-loaded.xml", 6862.0, 15676.0),
        ("h200-q-loaded.txt", 7712.0, 15966.0),
    ],
)
def test_pcie_throughput_of_the_h200(name: str, tx: float, rx: float) -> None:
    """nvidia-smi's "Tx/Rx Throughput" (XML tx_util, rx_util), KB/s as printed."""
    (gpu,) = parse_dump(fixture(name), "h200", 0.0).gpus
    assert (gpu.pcie_tx_kib_s, gpu.pcie_rx_kib_s) == (tx, rx)


# An older driver's layout (R470-R525 era tag names), written from that documented layout: the
# throttle reasons under their old name, power_readings, an absolute slowdown temperature and
# single/double bit ECC totals. Not captured output.
OLDER_XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v11.dtd">
<nvidia_smi_log>
  <driver_version>470.223.02</driver_version>
  <cuda_version>11.4</cuda_version>
  <gpu id="00000000:3B:00.0">
    <product_name>NVIDIA A100-SXM4-40GB</product_name>
    <fan_speed>N/A</fan_speed>
    <clocks_throttle_reasons>
      <clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle>
      <clocks_throttle_reason_hw_slowdown>Active</clocks_throttle_reason_hw_slowdown>
      <clocks_throttle_reason_hw_thermal_slowdown>Active</clocks_throttle_reason_hw_thermal_slowdown>
    </clocks_throttle_reasons>
    <ecc_mode><current_ecc>Enabled</current_ecc></ecc_mode>
    <ecc_errors>
      <volatile>
        <single_bit><device_memory>3</device_memory><total>5</total></single_bit>
        <double_bit><device_memory>1</device_memory><total>1</total></double_bit>
      </volatile>
    </ecc_errors>
    <temperature>
      <gpu_temp>91 C</gpu_temp>
      <gpu_temp_slow_threshold>88 C</gpu_temp_slow_threshold>
    </temperature>
    <power_readings>
      <power_draw>398.12 W</power_draw>
      <power_limit>400.00 W</power_limit>
      <enforced_power_limit>350.00 W</enforced_power_limit>
    </power_readings>
  </gpu>
</nvidia_smi_log>
"""


def test_xml_older_tag_names() -> None:
    (gpu,) = parse_xml(OLDER_XML, "a100", 0.0).gpus
    assert gpu.pci_bus_id == "00000000:3B:00.0"  # from the <gpu id=...> when <pci> is absent
    assert gpu.throttle_reasons == ("hw-slowdown", "hw-thermal")
    assert (gpu.temperature_c, gpu.slowdown_temperature_c) == (91.0, 88.0)
    assert (gpu.power_w, gpu.power_limit_w) == (398.12, 350.0)  # the enforced limit
    assert gpu.ecc == EccCounts(volatile_corrected=5, volatile_uncorrected=1)


def test_xml_ecc_disabled_is_none() -> None:
    text = fixture("h200-q.xml").replace(
        "<current_ecc>Enabled</current_ecc>", "<current_ecc>Disabled</current_ecc>"
    )
    (gpu,) = parse_xml(text, "h200", 0.0).gpus
    assert gpu.ecc is None


def test_xml_lost_gpu() -> None:
    """Readings that answer with NVML's "GPU is lost" make a lost GPU, not a row of Nones."""
    text = fixture("h200-q.xml")
    text = text.replace("<gpu_util>0 %</gpu_util>", "<gpu_util>GPU is lost</gpu_util>")
    text = text.replace("<total>143771 MiB</total>", "<total>GPU is lost</total>")
    (gpu,) = parse_xml(text, "h200", 0.0).gpus
    assert gpu.lost
    assert (gpu.uuid, gpu.pci_bus_id, gpu.temperature_c) == (IDLE_UUID, BUS_ID, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<nvidia_smi_log><gpu></nvidia_smi_log>", "not well-formed XML (mismatched tag"),
        ("<gpu_log></gpu_log>", "its root is <gpu_log>"),
        ("", "not well-formed XML"),
    ],
)
def test_xml_malformed(text: str, message: str) -> None:
    with pytest.raises(SmiParseError, match=re.escape(message)) as caught:
        parse_xml(text, "h200", 0.0)
    assert "\n" not in str(caught.value)


def test_xml_entities_refused() -> None:
    laughs = (
        '<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [\n <!ENTITY a "aaaaaaaaaa">\n'
        ' <!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">\n]>\n'
        "<nvidia_smi_log><driver_version>&b;</driver_version></nvidia_smi_log>"
    )
    with pytest.raises(SmiParseError, match="refusing XML with ENTITY declarations"):
        parse_xml(laughs, "h200", 0.0)


def test_xml_bad_number_is_na_with_a_note_naming_the_field() -> None:
    text = fixture("h200-q.xml").replace("<gpu_util>0 %</gpu_util>", "<gpu_util>lots</gpu_util>")
    snapshot = parse_xml(text, "h200", 0.0)
    (gpu,) = snapshot.gpus
    assert gpu.utilization_pct is None
    assert (
        gpu.memory_total_mib
        == parse_xml(fixture("h200-q.xml"), "h200", 0.0).gpus[0].memory_total_mib
    )
    assert snapshot.bad_values == 1
    assert snapshot.bad_value_notes == ("GPU 0 utilization/gpu_util: 'lots' is not a number",)


# --- -q text -------------------------------------------------------------------------------------


def test_q_text_matches_the_xml_of_the_same_moment() -> None:
    """-q and -q -x were captured in the same second; the readings that did not move agree."""
    text = parse_q_text(fixture("h200-q-loaded.txt"), "h200", 0.0)
    xml = parse_xml(fixture("h200-q-loaded.xml"), "h200", 0.0)
    (t,), (x,) = text.gpus, xml.gpus
    moved = {"power_w", "sm_clock_mhz", "pcie_tx_kib_s", "pcie_rx_kib_s"}
    steady = [f.name for f in dataclasses.fields(GpuState) if f.name not in moved]
    assert {f: getattr(t, f) for f in steady} == {f: getattr(x, f) for f in steady}
    assert (t.power_w, t.sm_clock_mhz) == (690.83, 1485.0)  # these moved between the two
    assert (t.pcie_tx_kib_s, x.pcie_tx_kib_s) == (7712.0, 6862.0)  # 20 ms samples
    assert text.processes == (PYTHON3,)
    assert (text.driver_version, text.cuda_version) == ("580.159.04", "13.0")


def test_q_text_performance_section_only() -> None:
    """-q -d PERFORMANCE,...: the fields it holds, the others None."""
    (gpu,) = parse_q_text(fixture("h200-q-perf.txt"), "h200", 0.0).gpus
    assert gpu.pci_bus_id == BUS_ID  # from the "GPU 00000000:00:06.0" line
    assert (gpu.pstate, gpu.throttle_reasons) == ("P0", ("sw-power-cap",))
    assert (gpu.power_w, gpu.temperature_c, gpu.slowdown_temperature_c) == (690.11, 70.0, 85.0)
    assert (gpu.name, gpu.memory_total_mib, gpu.utilization_pct, gpu.ecc) == (None,) * 4


def test_q_text_without_banner() -> None:
    with pytest.raises(SmiParseError, match="no 'NVSMI LOG' banner"):
        parse_q_text("Product Name : NVIDIA H200\n", "h200", 0.0)


# --- either --------------------------------------------------------------------------------------


def test_dump_tells_the_formats_apart() -> None:
    assert parse_dump(fixture("h200-q-loaded.xml"), "h", 0.0).processes == (PYTHON3,)
    assert parse_dump(fixture("h200-q-loaded.txt"), "h", 0.0).processes == (PYTHON3,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (fixture("h200-default.txt"), "neither nvidia-smi -q -x XML nor -q text: it starts with"),
        ("\n  \n", "the dump is empty"),
    ],
)
def test_dump_of_something_else(text: str, message: str) -> None:
    with pytest.raises(SmiParseError, match=message):
        parse_dump(text, "h", 0.0)


# --- --query-gpu / --query-compute-apps CSV ------------------------------------------------------


def test_query_gpu_csv_with_header_and_units() -> None:
    (gpu,) = parse_query_gpu_csv(fixture("h200-query-gpu.csv"))
    assert (gpu.index, gpu.name, gpu.uuid, gpu.pci_bus_id) == (0, "NVIDIA H200", IDLE_UUID, BUS_ID)
    assert (gpu.utilization_pct, gpu.memory_used_mib, gpu.memory_total_mib) == (0.0, 0.0, 143771.0)
    assert (gpu.temperature_c, gpu.power_w, gpu.power_limit_w) == (34.0, 124.83, 700.0)
    assert (gpu.sm_clock_mhz, gpu.memory_clock_mhz, gpu.sm_clock_max_mhz) == (570.0, 3201.0, 1980.0)
    assert gpu.fan_pct is None  # "[N/A]"
    assert gpu.throttle_reasons == ("gpu-idle",)  # 0x0000000000000001
    assert gpu.pcie == PcieLink(gen=5, width=16, max_gen=5, max_width=16)
    assert gpu.ecc == EccCounts(volatile_uncorrected=0)
    assert (gpu.pstate, gpu.mig_mode) == ("P0", False)


def test_query_gpu_csv_without_header_or_units() -> None:
    text = fixture("h200-query-gpu-loaded-noheader-nounits.csv")
    (gpu,) = parse_query_gpu_csv(text, NOHEADER_FIELDS)
    assert (gpu.uuid, gpu.utilization_pct, gpu.memory_used_mib) == (LOADED_UUID, 99.0, 1011.0)
    assert (gpu.memory_total_mib, gpu.temperature_c, gpu.power_w) == (143771.0, 70.0, 689.92)
    assert (gpu.sm_clock_mhz, gpu.throttle_reasons) == (1485.0, ("sw-power-cap",))


def test_query_gpu_csv_without_header_needs_fields() -> None:
    with pytest.raises(SmiParseError, match=r"CSV without a header line .*name its fields"):
        parse_query_gpu_csv(fixture("h200-query-gpu-loaded-noheader-nounits.csv"))


def test_query_gpu_csv_missing_values_are_none_never_zero() -> None:
    text = (
        "index, fan.speed [%], power.draw [W], temperature.gpu, pcie.link.gen.current, "
        "ecc.errors.uncorrected.volatile.total, clocks_event_reasons.active, persistence_mode\n"
        "3, [N/A], [Not Supported], N/A, [Unknown Error], [N/A], [Not Supported], [N/A]\n"
    )
    (gpu,) = parse_query_gpu_csv(text)
    assert gpu.index == 3
    assert (gpu.fan_pct, gpu.power_w, gpu.temperature_c) == (None, None, None)
    assert (gpu.pcie, gpu.ecc, gpu.throttle_reasons, gpu.persistence_mode) == (None,) * 4


def test_query_gpu_fields_all_parse() -> None:
    text = ", ".join(QUERY_GPU_FIELDS) + "\n" + ", ".join(["[N/A]"] * len(QUERY_GPU_FIELDS))
    text = text.replace("[N/A]", "1", 1)  # index
    (gpu,) = parse_query_gpu_csv(text)
    assert gpu.index == 1 and gpu.name is None and gpu.ecc is None and gpu.pcie is None


def test_query_gpu_csv_malformed() -> None:
    with pytest.raises(SmiParseError, match="CSV row 1 has 3 values for 2 fields"):
        parse_query_gpu_csv("index, utilization.gpu [%]\n0, 45 %, 3\n")


@pytest.mark.parametrize(
    ("text", "note"),
    [
        (
            "index, utilization.gpu [%], power.draw [W]\n0, busy, 80 W\n",
            "GPU row 0 utilization.gpu: 'busy' is not a number",
        ),
        (
            "index, clocks_event_reasons.active, power.draw [W]\n0, 0xZZ, 80 W\n",
            "GPU row 0 clocks_event_reasons.active: '0xZZ' is not a bit mask",
        ),
    ],
)
def test_query_gpu_csv_value_that_is_not_one_is_na_alone(text: str, note: str) -> None:
    notes: list[str] = []
    (gpu,) = parse_query_gpu_csv(text, notes=notes)
    assert (gpu.utilization_pct, gpu.throttle_reasons, gpu.power_w) == (None, None, 80.0)
    assert notes == [note]


def test_compute_apps_csv() -> None:
    gpus = parse_xml(fixture("h200-q-loaded.xml"), "h200", 0.0).gpus
    processes = parse_compute_apps_csv(fixture("h200-compute-apps.csv"), gpu_index_map(gpus))
    assert processes == [PYTHON3]


def test_compute_apps_csv_by_bus_id() -> None:
    text = f"pid, process_name, gpu_bus_id, used_gpu_memory [MiB]\n77, python, {BUS_ID}, [N/A]\n"
    (process,) = parse_compute_apps_csv(text, {BUS_ID: 2})
    assert (process.pid, process.gpu, process.used_memory_mib) == (77, 2, None)


def test_compute_apps_csv_on_a_gpu_not_read() -> None:
    with pytest.raises(SmiParseError, match="process '552' is on GPU 'GPU-175817c4"):
        parse_compute_apps_csv(fixture("h200-compute-apps.csv"), {})


# --- topo -m -------------------------------------------------------------------------------------


def test_topo_m_one_gpu() -> None:
    topology = parse_topo_m(fixture("h200-topo-m.txt"))  # with the colour codes nvidia-smi writes
    assert topology == Topology(matrix=(("X",),), cpu_affinity=("0-15",), numa_affinity=(0,))


# An 8-GPU DGX-style system, written from the layout NVIDIA documents for DGX H100 `topo -m`
# (tab-separated: GPU columns, NIC columns, the affinities with an empty cell before "GPU NUMA
# ID", the legend, then the NIC legend); not captured output. The last two GPUs' NUMA affinity
# is N/A, as a VM that hides its NUMA nodes prints it.
def dgx_row(gpu: int, nics: str, affinity: str) -> str:
    """A GPU's row: NV18 to every other GPU, then its NIC cells and its affinity cells."""
    cells = ["NV18"] * 8 + nics.split()
    cells[gpu] = " X "
    return "\t".join([f"GPU{gpu}", *cells, *affinity.split(" ")])


def nic_row(nic: int, gpus: str) -> str:
    cells = gpus.split() + ["SYS"] * 4
    cells[8 + nic] = " X "
    return "\t".join([f"NIC{nic}", *cells])


SOCKET0, SOCKET1 = "0-55,112-167 0  N/A", "56-111,168-223 1  N/A"  # "  ": the empty cell
DGX_TOPO = "\n".join(
    [
        "\t".join(["", *(f"GPU{g}" for g in range(8)), "NIC0", "NIC1", "NIC2", "NIC3"])
        + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID",
        dgx_row(0, "PXB SYS SYS SYS", SOCKET0),
        dgx_row(1, "PXB SYS SYS SYS", SOCKET0),
        dgx_row(2, "SYS PXB SYS SYS", SOCKET0),
        dgx_row(3, "SYS PXB SYS SYS", SOCKET0),
        dgx_row(4, "SYS SYS PXB SYS", SOCKET1),
        dgx_row(5, "SYS SYS PXB SYS", SOCKET1),
        dgx_row(6, "SYS SYS SYS PXB", "56-111,168-223 N/A  N/A"),
        dgx_row(7, "SYS SYS SYS PXB", "56-111,168-223 N/A  N/A"),
        nic_row(0, "PXB PXB SYS SYS SYS SYS SYS SYS"),
        nic_row(1, "SYS SYS PXB PXB SYS SYS SYS SYS"),
        nic_row(2, "SYS SYS SYS SYS PXB PXB SYS SYS"),
        nic_row(3, "SYS SYS SYS SYS SYS SYS PXB PXB"),
        "",
        "Legend:",
        "",
        "  X    = Self",
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
        "",
        "NIC Legend:",
        "",
        "  NIC0: mlx5_0",
        "  NIC1: mlx5_1",
    ]
)


def test_topo_m_dgx_with_nics() -> None:
    topology = parse_topo_m(DGX_TOPO)
    assert topology.gpu_count == 8
    assert all(len(row) == 8 for row in topology.matrix)  # the NIC columns are left out
    assert topology.link(0, 0) == "X" and topology.link(2, 7) == "NV18"
    assert topology.cpu_affinity == ("0-55,112-167",) * 4 + ("56-111,168-223",) * 4
    assert topology.numa_affinity == (0, 0, 0, 0, 1, 1, None, None)
    assert topology.best_sets(2, limit=1)[0][1] == "NV18"


def test_topo_m_pasted_from_a_terminal() -> None:
    """Tabs expanded to spaces, as text copied from a terminal: columns 2+ spaces apart."""
    assert parse_topo_m(DGX_TOPO.expandtabs(8)) == parse_topo_m(DGX_TOPO)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NVML: Unable to find a GPU\n", "no GPU0, GPU1... header"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-15\n", "2 GPU rows|1 GPU rows"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \nGPU1\tNV4\t X \n", "row GPU0 has 1 links for 2"),
    ],
)
def test_topo_m_malformed(text: str, message: str) -> None:
    with pytest.raises(SmiParseError, match=message):
        parse_topo_m(text)


# --- SmiSource -----------------------------------------------------------------------------------


class FakeSmi:
    """A runner that answers as nvidia-smi would, with the captured outputs."""

    def __init__(self, code: int = 0, stdout: str = "", error: OSError | None = None) -> None:
        self.code, self.stdout, self.error = code, stdout, error
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        self.calls.append(tuple(argv))
        if self.error is not None:
            raise self.error
        if self.code:
            return self.code, self.stdout, ""
        if tuple(argv[1:]) == ("topo", "-m"):
            return 0, fixture("h200-topo-m.txt"), ""
        return 0, fixture("h200-q-loaded.xml"), ""


def test_source_reads_the_dump_and_the_topology_once() -> None:
    runner = FakeSmi()
    source = SmiSource(host="gpu-07", runner=runner, clock=lambda: 1234.0)
    first = source.read("gpu-07")
    second = source.read("gpu-07")
    assert source.hosts == ("gpu-07",)
    assert (first.host, first.time, first.source) == ("gpu-07", 1234.0, "nvidia-smi")
    assert first.processes == (PYTHON3,)
    assert first.topology == second.topology == parse_topo_m(fixture("h200-topo-m.txt"))
    assert runner.calls.count(("nvidia-smi", "topo", "-m")) == 1
    assert runner.calls.count(("nvidia-smi", "-q", "-x")) == 2
    assert source.backfill("gpu-07", 60) == []


def test_source_host_defaults_to_this_host() -> None:
    import socket

    assert SmiSource(runner=FakeSmi()).hosts == (socket.gethostname(),)


@pytest.mark.parametrize(
    ("code", "stdout", "cause"),
    [
        (
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
            "exited with 9 (NVIDIA driver not loaded): NVIDIA-SMI has failed because",
        ),
        (12, "", "exited with 12 (NVML library not found)"),
        (
            15,
            "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n",
            "exited with 15 (a GPU fell off the bus): Unable to determine the device handle",
        ),
        (137, "", "exited with 137 (killed by signal 9)"),
    ],
)
def test_source_exit_codes(code: int, stdout: str, cause: str) -> None:
    source = SmiSource(host="gpu-07", runner=FakeSmi(code, stdout))
    with pytest.raises(SourceError) as caught:
        source.read("gpu-07")
    message = str(caught.value)
    assert message.startswith("gpu-07: nvidia-smi -q -x ")
    assert cause in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (FileNotFoundError(2, "No such file or directory"), "gpu-07: nvidia-smi not found"),
        (
            subprocess.TimeoutExpired(["nvidia-smi"], 2.5),
            "gpu-07: nvidia-smi -q -x gave no answer within 2.5 s (a GPU that fell off the bus",
        ),
        (PermissionError(13, "Permission denied"), "gpu-07: cannot run nvidia-smi"),
    ],
)
def test_source_cannot_run(error: Exception, cause: str) -> None:
    source = SmiSource(host="gpu-07", timeout=2.5, runner=FakeSmi(error=error))
    with pytest.raises(SourceError, match=re.escape(cause)):
        source.read("gpu-07")


def test_source_unreadable_output() -> None:
    source = SmiSource(host="gpu-07", runner=lambda argv, timeout: (0, "<oops", ""))
    with pytest.raises(SourceError, match="gpu-07: unreadable nvidia-smi -q -x output: not well"):
        source.read("gpu-07")


def test_source_keeps_the_reading_when_topo_fails() -> None:
    def runner(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        return (0, fixture("h200-q.xml"), "") if "-x" in argv else (4, "", "Permission denied")

    assert SmiSource(host="gpu-07", runner=runner).read("gpu-07").topology is None


def test_source_reads_only_its_host() -> None:
    with pytest.raises(SourceError, match="other-host: nvidia-smi reads only this host"):
        SmiSource(host="gpu-07", runner=FakeSmi()).read("other-host")


def test_source_without_nvidia_smi_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real subprocess path, where nvidia-smi is not installed."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SourceError, match="nvidia-smi not found"):
        SmiSource(host="gpu-07").read("gpu-07")


def test_run_command_times_out_without_hanging() -> None:
    assert run_command([sys.executable, "-c", "print('ok')"], 10.0) == (0, "ok\n", "")
    with pytest.raises(subprocess.TimeoutExpired):
        run_command([sys.executable, "-c", "import time; time.sleep(30)"], 0.3)


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi and a GPU")
def test_source_on_a_real_gpu() -> None:
    snapshot = SmiSource(timeout=30.0).read(SmiSource().hosts[0])
    assert snapshot.gpus and all(g.name and g.memory_total_mib for g in snapshot.gpus)
    assert snapshot.topology is not None
    assert snapshot.topology.gpu_count == len(snapshot.gpus)
