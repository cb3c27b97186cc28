"""NVIDIA dcgm-exporter's metric and label names, and how each maps to a `GpuState` field.

One table serves the exporter (which writes these names), the Prometheus source (which reads
them back, under either spelling), the exported alert rules and the Grafana dashboard.

Where the names come from:

- The classic names and their units are those of dcgm-exporter's shipped collector file
  (NVIDIA/dcgm-exporter, ``etc/default-counters.csv``: ``DCGM_FI_DEV_GPU_UTIL`` "GPU utilization
  (in %)", ``DCGM_FI_DEV_FB_USED`` "Framebuffer memory used (in MiB)", ``DCGM_FI_DEV_XID_ERRORS``
  "Value of the last XID error encountered", ...) and of DCGM's field header
  (NVIDIA/DCGM ``dcgmlib/dcgm_fields.h``) for the fields that file leaves commented out (ECC,
  PCIe link, throttle reasons, power limit). The labels ``gpu, UUID, pci_bus_id, device,
  modelName, Hostname`` are what dcgm-exporter attaches to every GPU metric.
- DCGM 4.6 renamed fields and kept the old names as deprecated aliases of the same field id and
  unit (NVIDIA/go-dcgm ``pkg/dcgm/alias_resolution_test.go``,
  ``TestAliasResolution_DCGM46RenamedFieldsResolve``: ``DCGM_FI_DEV_GPU_TEMP`` →
  ``DCGM_FI_DEV_GPU_TEMP_CELSIUS``, ``DCGM_FI_DEV_POWER_USAGE`` → ``DCGM_FI_DEV_BOARD_POWER_WATTS``,
  ``DCGM_FI_DEV_XID_ERRORS`` → ``DCGM_FI_DEV_XID_ERROR``; DCGM's Python bindings
  ``dcgm_fields.py`` of that release for the others below). dcgm-exporter 4.8.3 (DCGM 4.6.0)
  renamed the ``Hostname`` label to ``hostname`` (its release notes, #655).
- dcgm-exporter 4.9.0 (DCGM 4.7) switched its default metrics to the new names and, for some, to
  base units: utilization as a 0-1 ratio, memory in bytes, clocks in hertz (release notes of
  4.9.0; the hertz fields: NVIDIA/go-dcgm ``pkg/dcgm/base_unit_fields_test.go``). ``factor``
  converts such a metric back to the classic unit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuconsole.model import THROTTLE_REASON_BITS, GpuState, HostSnapshot

GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
"""The labels dcgm-exporter puts on every GPU metric, in its order."""
HOST_LABELS = ("Hostname", "hostname")
"""The host's label: classic dcgm-exporter, then 4.8.3 and later."""
HOST_LABEL = "Hostname"

MIB = 1024.0 * 1024.0


def reason_mask(reasons: tuple[str, ...] | None) -> float | None:
    """The bit mask of clock-event reasons (None when the GPU does not report them)."""
    if reasons is None:
        return None
    return float(sum(bit for bit, code in THROTTLE_REASON_BITS.items() if code in reasons))


def reasons_of(mask: float) -> tuple[str, ...]:
    bits = int(mask)
    return tuple(code for bit, code in THROTTLE_REASON_BITS.items() if bits & bit)


Getter = Callable[[GpuState], float | None]


@dataclass(frozen=True, slots=True)
class DcgmMetric:
    """One dcgm-exporter metric: its classic name, its help text, the `GpuState` value it
    carries, and the newer names that carry the same reading (with the factor to the classic
    unit)."""

    field: str
    """The console's name for the reading (used by the source and the rule language)."""
    name: str
    help: str
    value: Getter
    renamed: tuple[tuple[str, float], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *(name for name, _ in self.renamed))


def _ecc(attribute: str) -> Getter:
    return lambda g: _number(getattr(g.ecc, attribute)) if g.ecc is not None else None


def _remap(attribute: str) -> Getter:
    return lambda g: _number(getattr(g.remap, attribute)) if g.remap is not None else None


def _pcie(attribute: str) -> Getter:
    return lambda g: _number(getattr(g.pcie, attribute)) if g.pcie is not None else None


def _number(value: float | bool | None) -> float | None:
    return None if value is None else float(value)


def memory_free_mib(gpu: GpuState) -> float | None:
    if gpu.memory_used_mib is None or gpu.memory_total_mib is None:
        return None
    return max(gpu.memory_total_mib - gpu.memory_used_mib, 0.0)


METRICS: tuple[DcgmMetric, ...] = (
    DcgmMetric(
        "utilization_pct",
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %).",
        lambda g: g.utilization_pct,
        (("DCGM_FI_DEV_GPU_UTIL_RATIO", 100.0),),
    ),
    DcgmMetric(
        "memory_utilization_pct",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        lambda g: g.memory_utilization_pct,
    ),
    DcgmMetric(
        "memory_used_mib",
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        lambda g: g.memory_used_mib,
    ),
    DcgmMetric(
        "memory_free_mib",
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        memory_free_mib,
    ),
    DcgmMetric(
        "temperature_c",
        "DCGM_FI_DEV_GPU_TEMP",
        "GPU temperature (in C).",
        lambda g: g.temperature_c,
        (("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0),),
    ),
    DcgmMetric(
        "slowdown_temperature_c",
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        "Slowdown temperature (in C).",
        lambda g: g.slowdown_temperature_c,
        (("DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS", 1.0),),
    ),
    DcgmMetric(
        "power_w",
        "DCGM_FI_DEV_POWER_USAGE",
        "Power draw (in W).",
        lambda g: g.power_w,
        (("DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0),),
    ),
    DcgmMetric(
        "power_limit_w",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "Power limit the driver enforces (in W).",
        lambda g: g.power_limit_w,
        (
            ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", 1.0),
            ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1.0),
            ("DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS", 1.0),
        ),
    ),
    DcgmMetric(
        "sm_clock_mhz",
        "DCGM_FI_DEV_SM_CLOCK",
        "SM clock frequency (in MHz).",
        lambda g: g.sm_clock_mhz,
        (("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e-6),),
    ),
    DcgmMetric(
        "sm_clock_max_mhz",
        "DCGM_FI_DEV_MAX_SM_CLOCK",
        "Maximum SM clock frequency (in MHz).",
        lambda g: g.sm_clock_max_mhz,
        (("DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ", 1e-6),),
    ),
    DcgmMetric(
        "memory_clock_mhz",
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        lambda g: g.memory_clock_mhz,
        (("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 1e-6),),
    ),
    DcgmMetric(
        "memory_clock_max_mhz",
        "DCGM_FI_DEV_MAX_MEM_CLOCK",
        "Maximum memory clock frequency (in MHz).",
        lambda g: g.memory_clock_max_mhz,
        (("DCGM_FI_DEV_MEMORY_MAX_CLOCK_HERTZ", 1e-6),),
    ),
    DcgmMetric(
        "throttle_mask",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Active clock-event (throttle) reasons, as NVML's bit mask.",
        lambda g: reason_mask(g.throttle_reasons),
        (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0),),
    ),
    DcgmMetric(
        "ecc_corrected",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Single-bit volatile ECC errors since the driver loaded.",
        _ecc("volatile_corrected"),
    ),
    DcgmMetric(
        "ecc_uncorrected",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Double-bit volatile ECC errors since the driver loaded.",
        _ecc("volatile_uncorrected"),
    ),
    DcgmMetric(
        "ecc_corrected_aggregate",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Single-bit persistent ECC errors over the GPU's life.",
        _ecc("aggregate_corrected"),
    ),
    DcgmMetric(
        "ecc_uncorrected_aggregate",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Double-bit persistent ECC errors over the GPU's life.",
        _ecc("aggregate_uncorrected"),
    ),
    DcgmMetric(
        "remap_uncorrectable",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors.",
        _remap("uncorrectable"),
        (("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", 1.0),),
    ),
    DcgmMetric(
        "remap_correctable",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors.",
        _remap("correctable"),
        (("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", 1.0),),
    ),
    DcgmMetric(
        "remap_failure",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed.",
        _remap("failure"),
        (("DCGM_FI_DEV_ROW_REMAP_FAILED", 1.0),),
    ),
    DcgmMetric(
        "remap_pending",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "Whether remapping of rows is pending.",
        _remap("pending"),
    ),
    DcgmMetric(
        "pcie_gen",
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "PCIe current link generation.",
        _pcie("gen"),
    ),
    DcgmMetric(
        "pcie_width",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "PCIe current link width.",
        _pcie("width"),
    ),
    DcgmMetric(
        "pcie_max_gen",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "PCIe maximum link generation.",
        _pcie("max_gen"),
    ),
    DcgmMetric(
        "pcie_max_width",
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "PCIe maximum link width.",
        _pcie("max_width"),
    ),
    DcgmMetric(
        "persistence_mode",
        "DCGM_FI_DEV_PERSISTENCE_MODE",
        "Persistence mode (1 enabled, 0 disabled).",
        lambda g: _number(g.persistence_mode),
        (("DCGM_FI_DEV_GPU_PERSISTENCE_MODE", 1.0),),
    ),
)
"""Every GPU metric the exporter writes, in the order it writes them."""

XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
XID_RENAMED = "DCGM_FI_DEV_XID_ERROR"
XID_HELP = "Value of the last XID error encountered."
MEMORY_CAPACITY_BYTES = "DCGM_FI_DEV_FB_CAPACITY_BYTES"
"""dcgm-exporter 4.9 collects total GPU memory in bytes by default."""

BY_FIELD: dict[str, DcgmMetric] = {metric.field: metric for metric in METRICS}

# The console's own metrics, beside dcgm-exporter's.
FINDINGS_METRIC = "gpuconsole_findings"
HOST_STATE_METRIC = "gpuconsole_host_state"
HOST_LAST_READING_METRIC = "gpuconsole_host_last_reading_timestamp_seconds"


def last_xid(snapshot: HostSnapshot, gpu: int) -> float:
    """The most recent XID reported for ``gpu``, 0 when none (dcgm-exporter's convention)."""
    latest = None
    for event in snapshot.xid_events:
        if event.gpu == gpu and (latest is None or event.time >= latest.time):
            latest = event
    return 0.0 if latest is None else float(latest.xid)
