"""A snapshot written as ``nvidia-smi -q -x`` XML: a simulated fault as the dump an admin
attaches to a ticket, and what ``gpuconsole triage`` reads back on the demo.

The layout follows the output captured on an NVIDIA H200 with driver 580
(``tests/fixtures/nvidia-smi/h200-q-loaded.xml``): the same tags, nesting, order and unit
formatting ("45 %", "81559 MiB", "700.00 W", "16x", "N/A"), limited to the tags that
`gpuconsole.telemetry.smi.parse_xml` reads, so that parsing the dump gives back every GPU field
the XML carries. Not carried: the host name (the reader names it), MIG instances, a process's
user, container and Slurm job, XID events (nvidia-smi does not report them: they are in the
kernel log) and the topology (``topo -m`` is a separate command).

Some values are written the way that driver writes them rather than as the model holds them: the
slowdown and shutdown temperatures as margins to T.Limit (the H200 starts slowing down 2 °C past
T.Limit), so that a GPU without a temperature or a slowdown temperature has no shutdown
temperature either, and the ECC counts as DRAM counts with the SRAM parts N/A. A lost GPU keeps
its identity and reads "GPU is lost" (NVML's error string) in place of its readings.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from gpuconsole.core.model import EccCounts, GpuProcess, GpuState, HostSnapshot, PcieLink

_PROLOGUE = '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
_NA = "N/A"
_LOST = "GPU is lost"
_SLOWDOWN_MARGIN_C = -2.0
"""Where slowdown starts, as a margin to T.Limit (the captured H200's value)."""

Field = tuple[str, str]
"""A path below the ``<gpu>`` element and the text of the leaf there."""

# clocks_event_reason_<tag>, in the captured order, and the code each one stands for.
_REASON_TAGS = (
    ("gpu_idle", "gpu-idle"),
    ("applications_clocks_setting", "applications-clocks"),
    ("sw_power_cap", "sw-power-cap"),
    ("hw_slowdown", "hw-slowdown"),
    ("hw_thermal_slowdown", "hw-thermal"),
    ("hw_power_brake_slowdown", "hw-power-brake"),
    ("sync_boost", "sync-boost"),
    ("sw_thermal_slowdown", "sw-thermal"),
    ("display_clocks_setting", "display-clocks"),
)
_RECOVERY_TEXT = {
    "none": "None",
    "reset": "Reset",
    "reboot": "Reboot",
    "drain-p2p": "Drain P2P",
    "drain-and-reset": "Drain and Reset",
}
_PROCESS_TYPES = {"compute": "C", "graphics": "G", "compute+graphics": "C+G"}


def dump_xml(snapshot: HostSnapshot) -> str:
    """``snapshot`` as the XML ``nvidia-smi -q -x`` would print for it."""
    root = ET.Element("nvidia_smi_log")
    for path, text in _host_fields(snapshot):
        _put(root, path, text)
    for gpu in snapshot.gpus:
        element = ET.SubElement(root, "gpu", id=gpu.pci_bus_id or _NA)
        for path, text in _lost_fields(gpu) if gpu.lost else _gpu_fields(gpu):
            _put(element, path, text)
        if not gpu.lost:
            _put_processes(element, snapshot.processes_on(gpu.index))
    ET.indent(root, space="\t")
    return _PROLOGUE + ET.tostring(root, encoding="unicode", short_empty_elements=False) + "\n"


def _put(parent: ET.Element, path: str, text: str) -> None:
    """Set the leaf at ``path`` below ``parent``, making the elements on the way as needed."""
    *branches, leaf = path.split("/")
    for tag in branches:
        child = parent.find(tag)
        parent = child if child is not None else ET.SubElement(parent, tag)
    ET.SubElement(parent, leaf).text = text


def _host_fields(snapshot: HostSnapshot) -> list[Field]:
    return [
        ("timestamp", time.asctime(time.gmtime(snapshot.time))),
        ("driver_version", snapshot.driver_version or _NA),
        ("cuda_version", snapshot.cuda_version or _NA),
        ("attached_gpus", str(len(snapshot.gpus))),
    ]


def _lost_fields(gpu: GpuState) -> list[Field]:
    return [
        ("product_name", gpu.name or _NA),
        ("serial", gpu.serial or _NA),
        ("uuid", gpu.uuid or _NA),
        ("vbios_version", gpu.vbios_version or _NA),
        ("pci/pci_bus_id", gpu.pci_bus_id or _NA),
        ("fb_memory_usage/total", _LOST),
        ("fb_memory_usage/used", _LOST),
        ("utilization/gpu_util", _LOST),
        ("utilization/memory_util", _LOST),
        ("temperature/gpu_temp", _LOST),
    ]


def _gpu_fields(gpu: GpuState) -> list[Field]:
    return [
        ("product_name", gpu.name or _NA),
        ("persistence_mode", _flag(gpu.persistence_mode)),
        ("mig_mode/current_mig", _flag(gpu.mig_mode)),
        ("serial", gpu.serial or _NA),
        ("uuid", gpu.uuid or _NA),
        ("vbios_version", gpu.vbios_version or _NA),
        ("gpu_recovery_action", _recovery(gpu.recovery_action)),
        *_pci_fields(gpu),
        ("fan_speed", _quantity(gpu.fan_pct, " %")),
        ("performance_state", gpu.pstate or _NA),
        *_reason_fields(gpu.throttle_reasons),
        ("fb_memory_usage/total", _quantity(gpu.memory_total_mib, " MiB")),
        ("fb_memory_usage/used", _quantity(gpu.memory_used_mib, " MiB")),
        ("compute_mode", gpu.compute_mode or _NA),
        ("utilization/gpu_util", _quantity(gpu.utilization_pct, " %")),
        ("utilization/memory_util", _quantity(gpu.memory_utilization_pct, " %")),
        *_ecc_fields(gpu.ecc),
        ("retired_pages/pending_retirement", _flag(gpu.retired_pages_pending, "Yes", "No")),
        *_remap_fields(gpu),
        *_temperature_fields(gpu),
        ("gpu_power_readings/average_power_draw", _watts(gpu.power_w)),
        ("gpu_power_readings/current_power_limit", _watts(gpu.power_limit_w)),
        ("gpu_power_readings/default_power_limit", _watts(gpu.power_limit_default_w)),
        ("gpu_power_readings/min_power_limit", _watts(gpu.power_limit_min_w)),
        ("gpu_power_readings/max_power_limit", _watts(gpu.power_limit_max_w)),
        ("clocks/sm_clock", _quantity(gpu.sm_clock_mhz, " MHz")),
        ("clocks/mem_clock", _quantity(gpu.memory_clock_mhz, " MHz")),
        ("applications_clocks/graphics_clock", _quantity(gpu.sm_clock_application_mhz, " MHz")),
        ("applications_clocks/mem_clock", _quantity(gpu.memory_clock_application_mhz, " MHz")),
        ("max_clocks/sm_clock", _quantity(gpu.sm_clock_max_mhz, " MHz")),
        ("max_clocks/mem_clock", _quantity(gpu.memory_clock_max_mhz, " MHz")),
    ]


def _pci_fields(gpu: GpuState) -> list[Field]:
    link = gpu.pcie or PcieLink(None, None, None, None)
    info = "pci/pci_gpu_link_info"
    return [
        ("pci/pci_bus_id", gpu.pci_bus_id or _NA),
        (f"{info}/pcie_gen/max_link_gen", _quantity(link.max_gen)),
        (f"{info}/pcie_gen/current_link_gen", _quantity(link.gen)),
        (f"{info}/link_widths/max_link_width", _quantity(link.max_width, "x")),
        (f"{info}/link_widths/current_link_width", _quantity(link.width, "x")),
        ("pci/tx_util", _quantity(gpu.pcie_tx_kib_s, " KB/s")),
        ("pci/rx_util", _quantity(gpu.pcie_rx_kib_s, " KB/s")),
    ]


def _reason_fields(reasons: tuple[str, ...] | None) -> list[Field]:
    if reasons is None:
        return [("clocks_event_reasons", _NA)]
    return [
        (
            f"clocks_event_reasons/clocks_event_reason_{tag}",
            "Active" if code in reasons else "Not Active",
        )
        for tag, code in _REASON_TAGS
    ]


def _ecc_fields(ecc: EccCounts | None) -> list[Field]:
    counts = ecc or EccCounts()
    fields = [("ecc_mode/current_ecc", _NA if ecc is None else "Enabled")]
    for scope, corrected, uncorrected in (
        ("volatile", counts.volatile_corrected, counts.volatile_uncorrected),
        ("aggregate", counts.aggregate_corrected, counts.aggregate_uncorrected),
    ):
        base = f"ecc_errors/{scope}"
        fields += [
            (f"{base}/sram_correctable", _NA),
            (f"{base}/sram_uncorrectable_parity", _NA),
            (f"{base}/sram_uncorrectable_secded", _NA),
            (f"{base}/dram_correctable", _quantity(corrected)),
            (f"{base}/dram_uncorrectable", _quantity(uncorrected)),
        ]
    return fields


def _remap_fields(gpu: GpuState) -> list[Field]:
    remap = gpu.remap
    if remap is None:
        return [("remapped_rows", _NA)]
    return [
        ("remapped_rows/remapped_row_corr", _quantity(remap.correctable)),
        ("remapped_rows/remapped_row_unc", _quantity(remap.uncorrectable)),
        ("remapped_rows/remapped_row_pending", _flag(remap.pending, "Yes", "No")),
        ("remapped_rows/remapped_row_failure", _flag(remap.failure, "Yes", "No")),
    ]


def _temperature_fields(gpu: GpuState) -> list[Field]:
    """The temperature, and the slowdown and shutdown temperatures as the driver gives them:
    margins to T.Limit.

    T.Limit sits ``-_SLOWDOWN_MARGIN_C`` below the slowdown temperature; the current margin is
    how far the GPU is below T.Limit, the shutdown margin how far the shutdown temperature is
    above it (negative, as the driver prints it).
    """
    temp, slowdown, shutdown = (
        gpu.temperature_c,
        gpu.slowdown_temperature_c,
        gpu.shutdown_temperature_c,
    )
    margin = threshold = shutdown_threshold = None
    if temp is not None and slowdown is not None:
        tlimit = slowdown + _SLOWDOWN_MARGIN_C
        margin, threshold = tlimit - temp, _SLOWDOWN_MARGIN_C
        shutdown_threshold = None if shutdown is None else tlimit - shutdown
    return [
        ("temperature/gpu_temp", _quantity(temp, " C")),
        ("temperature/gpu_temp_tlimit", _quantity(margin, " C")),
        ("temperature/gpu_temp_max_tlimit_threshold", _quantity(shutdown_threshold, " C")),
        ("temperature/gpu_temp_slow_tlimit_threshold", _quantity(threshold, " C")),
    ]


def _put_processes(element: ET.Element, processes: Iterable[GpuProcess]) -> None:
    section = ET.SubElement(element, "processes")
    for process in processes:
        info = ET.SubElement(section, "process_info")
        for tag, text in (
            ("gpu_instance_id", _quantity(process.mig_instance)),
            ("compute_instance_id", _NA),
            ("pid", str(process.pid)),
            ("type", _PROCESS_TYPES.get(process.kind, process.kind)),
            ("process_name", process.command or _NA),
            ("used_memory", _quantity(process.used_memory_mib, " MiB")),
        ):
            ET.SubElement(info, tag).text = text


def _number(value: float) -> str:
    """Whole numbers without a decimal point, as nvidia-smi prints them; others exactly."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _quantity(value: float | None, unit: str = "") -> str:
    return _NA if value is None else _number(value) + unit


def _watts(value: float | None) -> str:
    """Two decimals, as nvidia-smi prints watts, unless that would lose precision."""
    if value is None:
        return _NA
    return f"{value:.2f} W" if round(value, 2) == value else f"{value!r} W"


def _flag(value: bool | None, on: str = "Enabled", off: str = "Disabled") -> str:
    return _NA if value is None else on if value else off


def _recovery(action: str | None) -> str:
    return _NA if action is None else _RECOVERY_TEXT.get(action, action)
