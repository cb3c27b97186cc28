"""The one table of what a GPU reading is: every field of `GpuState` once, with its unit, its
valid range, and how each path that carries GPU readings reads or writes it.

The paths:

- ``nvml``: the NVML reader, one for this host and every SSH host (the agent's ctypes reader,
  `gpuconsole.telemetry.agent.NvmlDevice`, run in-process by ``NvmlSource`` and on a host by the
  agent): the NVML call, and the agent's wire key (docs/agent-protocol.md), which is the field's
  own name, nested for a part (``ecc`` → ``volatile_corrected``).
- ``query-gpu``: nvidia-smi's ``--query-gpu`` column: the agent's ``smi`` mode, its ``-lms``
  stream where the host has no python3, and saved ``--query-gpu`` CSV.
- ``q-text`` and ``q-xml``: the paths in a saved ``nvidia-smi -q`` text and ``-q -x`` XML dump;
  the first that holds a value wins.
- ``prometheus``: dcgm-exporter's metric (`gpuconsole.telemetry.dcgm` holds its classic and 4.9
  names and units, keyed by the name given here), written by ``gpuconsole exporter`` and read
  back by the Prometheus source.
- the recording stores every field of `GpuState` by its name (``gpuconsole.fleet.record.codec``).

Where a path cannot carry a field, ``absent`` says why, in a few words. The readers take their
names from this table (`paths_of`), `gpuconsole.core.untrusted` its ranges, and
``tests/test_field_conformance.py`` holds every path to it: each reader yields every field on a
real or full input, or the table says why not. A new field is one row here, and that test fails
until every path reads it or says why it cannot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuconsole.core.model import EccCounts, GpuState, PcieLink, RowRemap

NVML = "nvml"
QUERY_GPU = "query-gpu"
Q_TEXT = "q-text"
Q_XML = "q-xml"
PROMETHEUS = "prometheus"
PATHS = (NVML, QUERY_GPU, Q_TEXT, Q_XML, PROMETHEUS)

MAX_GPUS = 1024
"""GPU indices run 0 … MAX_GPUS - 1; a host reporting more GPUs keeps the first MAX_GPUS."""

# The ranges a real reading falls in; a value outside is N/A for that field alone.
PERCENT = (0.0, 100.0)
MEMORY_MIB = (0.0, float(1 << 24))  # 16 TiB: far above any GPU's memory


def gib(mib: float) -> str:
    """GPU memory as every screen, message and subcommand writes it: in GiB, whole from 10 GiB,
    with a tenth below (``35``, ``0.5``); the unit follows the figure (``GiB``, ``G`` in a cell
    too narrow for it)."""
    return f"{mib / 1024:.0f}" if mib >= 10 * 1024 else f"{mib / 1024:.1f}"


TEMPERATURE_C = (-50.0, 200.0)
POWER_W = (0.0, 10_000.0)
CLOCK_MHZ = (0.0, 20_000.0)
FAN_PCT = (0.0, 200.0)  # NVML documents that fan speed "may exceed 100%" (nvmlDeviceGetFanSpeed)
PCIE_KIB_S = (0.0, float(1 << 30))  # 1 TiB/s: PCIe 8.0 ×32, the most PCIE_GEN and _WIDTH allow
ERROR_COUNT = (0, 1 << 48)  # ECC counters are 64-bit; a real one never nears 2**48
REMAPPED_ROWS = (0, 1 << 20)
PCIE_GEN = (1, 8)
PCIE_WIDTH = (1, 32)
INDEX = (0, MAX_GPUS - 1)
# The numbers NVML gives for a code, as the agent sends them: the P-state (0-15, 32 unknown), an
# enumeration (a recovery action, a compute mode; a newer driver may add values), the clock-event
# reasons' 64-bit mask. A number outside is N/A, never a word or a reason.
NVML_PSTATE = (0, 32)
NVML_ENUM = (0, 255)
REASON_MASK = (0, (1 << 64) - 1)

NOT_IN_QUERY = "nvidia-smi --query-gpu has no such column"
NOT_EXPORTED = "dcgm-exporter has no such metric"


@dataclass(frozen=True, slots=True)
class Field:
    """One reading of a GPU and the names each path gives it."""

    name: str
    """The `GpuState` attribute; ``part.attribute`` for a part (``ecc.volatile_corrected``)."""
    unit: str
    kind: str
    """``text``, ``number``, ``whole``, ``flag``, ``reasons`` (clock-event reasons), ``code``
    (a word for NVML's number), ``instances`` (MIG instances) or ``lost``."""
    bounds: tuple[float, float] | None = None
    """The range of a valid reading: of the number itself, or of NVML's number for a code."""
    nvml: str = ""
    """The NVML call the reader makes."""
    wire: str = ""
    """The agent's key for it where that is not its attribute's name."""
    query_gpu: str = ""
    q_text: tuple[str, ...] = ()
    q_xml: tuple[str, ...] = ()
    prometheus: str = ""
    """The key of its metric in `gpuconsole.telemetry.dcgm.BY_FIELD`."""
    absent: Mapping[str, str] = field(default_factory=dict)
    """Path → why that path cannot carry the field."""

    @property
    def part(self) -> str | None:
        """``ecc`` for ``ecc.volatile_corrected``; None for a field of `GpuState` itself."""
        return self.name.partition(".")[0] if "." in self.name else None

    @property
    def attribute(self) -> str:
        return self.name.rpartition(".")[2]

    @property
    def wire_key(self) -> str:
        """Its key in an nvml-mode entry of the agent (in its part's object, for a part)."""
        return self.wire or self.attribute


def _n(name: str, unit: str, bounds: tuple[float, float], **paths: object) -> Field:
    return Field(name, unit, "number", bounds, **paths)  # type: ignore[arg-type]


FIELDS: tuple[Field, ...] = (
    Field(
        "index",
        "",
        "whole",
        INDEX,
        nvml="nvmlDeviceGetHandleByIndex_v2",
        query_gpu="index",
        prometheus="gpu",
    ),
    Field(
        "name",
        "",
        "text",
        nvml="nvmlDeviceGetName",
        query_gpu="name",
        q_text=("Product Name",),
        q_xml=("product_name",),
        prometheus="modelName",
    ),
    Field(
        "uuid",
        "",
        "text",
        nvml="nvmlDeviceGetUUID",
        query_gpu="uuid",
        q_text=("GPU UUID",),
        q_xml=("uuid",),
        prometheus="UUID",
    ),
    Field(
        "pci_bus_id",
        "",
        "text",
        nvml="nvmlDeviceGetPciInfo_v3",
        query_gpu="pci.bus_id",
        q_text=("PCI/Bus Id",),
        q_xml=("pci/pci_bus_id",),
        prometheus="pci_bus_id",
    ),
    Field(
        "serial",
        "",
        "text",
        nvml="nvmlDeviceGetSerial",
        query_gpu="serial",
        q_text=("Serial Number",),
        q_xml=("serial",),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    Field(
        "vbios_version",
        "",
        "text",
        nvml="nvmlDeviceGetVbiosVersion",
        query_gpu="vbios_version",
        q_text=("VBIOS Version",),
        q_xml=("vbios_version",),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    _n(
        "utilization_pct",
        "%",
        PERCENT,
        nvml="nvmlDeviceGetUtilizationRates",
        query_gpu="utilization.gpu",
        q_text=("Utilization/GPU",),
        q_xml=("utilization/gpu_util",),
        prometheus="utilization_pct",
    ),
    _n(
        "memory_utilization_pct",
        "%",
        PERCENT,
        nvml="nvmlDeviceGetUtilizationRates",
        query_gpu="utilization.memory",
        q_text=("Utilization/Memory",),
        q_xml=("utilization/memory_util",),
        prometheus="memory_utilization_pct",
    ),
    _n(
        "memory_used_mib",
        "MiB",
        MEMORY_MIB,
        nvml="nvmlDeviceGetMemoryInfo_v2",
        query_gpu="memory.used",
        q_text=("FB Memory Usage/Used",),
        q_xml=("fb_memory_usage/used",),
        prometheus="memory_used_mib",
    ),
    _n(
        "memory_total_mib",
        "MiB",
        MEMORY_MIB,
        nvml="nvmlDeviceGetMemoryInfo_v2",
        query_gpu="memory.total",
        q_text=("FB Memory Usage/Total",),
        q_xml=("fb_memory_usage/total",),
        prometheus="memory_total_mib",
    ),
    _n(
        "temperature_c",
        "°C",
        TEMPERATURE_C,
        nvml="nvmlDeviceGetTemperature",
        query_gpu="temperature.gpu",
        q_text=("Temperature/GPU Current Temp",),
        q_xml=("temperature/gpu_temp",),
        prometheus="temperature_c",
    ),
    _n(
        "slowdown_temperature_c",
        "°C",
        TEMPERATURE_C,
        nvml="nvmlDeviceGetTemperatureThreshold",
        q_text=("Temperature/GPU Slowdown Temp",),
        q_xml=("temperature/gpu_temp_slow_threshold",),
        prometheus="slowdown_temperature_c",
        absent={QUERY_GPU: NOT_IN_QUERY},
    ),
    _n(
        "shutdown_temperature_c",
        "°C",
        TEMPERATURE_C,
        nvml="nvmlDeviceGetTemperatureThreshold",
        q_text=("Temperature/GPU Shutdown Temp",),
        q_xml=("temperature/gpu_temp_max_threshold",),
        absent={QUERY_GPU: NOT_IN_QUERY, PROMETHEUS: "dcgm-exporter's default set has none"},
    ),
    _n(
        "power_w",
        "W",
        POWER_W,
        nvml="nvmlDeviceGetPowerUsage",
        query_gpu="power.draw",
        q_text=(
            "GPU Power Readings/Average Power Draw",
            "GPU Power Readings/Power Draw",
            "Power Readings/Power Draw",
            "GPU Power Readings/Instantaneous Power Draw",
        ),
        q_xml=(
            "gpu_power_readings/average_power_draw",
            "gpu_power_readings/power_draw",
            "power_readings/power_draw",
            "gpu_power_readings/instant_power_draw",
        ),
        prometheus="power_w",
    ),
    _n(
        "power_limit_w",
        "W",
        POWER_W,
        nvml="nvmlDeviceGetEnforcedPowerLimit",
        query_gpu="power.limit",
        q_text=(
            "GPU Power Readings/Current Power Limit",
            "GPU Power Readings/GPU Ceiling Power Limit/Current Power Limit",
            "Power Readings/Enforced Power Limit",
            "Power Readings/Power Limit",
        ),
        q_xml=(
            "gpu_power_readings/current_power_limit",
            # driver 610 nests the limits under "GPU Ceiling Power Limit" (text); its XML tag is
            # not in any dump found, so any one section below the readings is looked in
            "gpu_power_readings/*/current_power_limit",
            "power_readings/enforced_power_limit",
            "power_readings/power_limit",
        ),
        prometheus="power_limit_w",
    ),
    _n(
        "power_limit_min_w",
        "W",
        POWER_W,
        nvml="nvmlDeviceGetPowerManagementLimitConstraints",
        query_gpu="power.min_limit",
        q_text=("GPU Power Readings/Min Power Limit", "Power Readings/Min Power Limit"),
        q_xml=("gpu_power_readings/min_power_limit", "power_readings/min_power_limit"),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    _n(
        "power_limit_max_w",
        "W",
        POWER_W,
        nvml="nvmlDeviceGetPowerManagementLimitConstraints",
        query_gpu="power.max_limit",
        q_text=("GPU Power Readings/Max Power Limit", "Power Readings/Max Power Limit"),
        q_xml=("gpu_power_readings/max_power_limit", "power_readings/max_power_limit"),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    _n(
        "power_limit_default_w",
        "W",
        POWER_W,
        nvml="nvmlDeviceGetPowerManagementDefaultLimit",
        query_gpu="power.default_limit",
        q_text=(
            "GPU Power Readings/Default Power Limit",
            "GPU Power Readings/GPU Ceiling Power Limit/Default Power Limit",
            "Power Readings/Default Power Limit",
        ),
        q_xml=(
            "gpu_power_readings/default_power_limit",
            "gpu_power_readings/*/default_power_limit",
            "power_readings/default_power_limit",
        ),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    _n(
        "sm_clock_mhz",
        "MHz",
        CLOCK_MHZ,
        nvml="nvmlDeviceGetClockInfo",
        query_gpu="clocks.current.sm",
        q_text=("Clocks/SM",),
        q_xml=("clocks/sm_clock",),
        prometheus="sm_clock_mhz",
    ),
    _n(
        "sm_clock_max_mhz",
        "MHz",
        CLOCK_MHZ,
        nvml="nvmlDeviceGetMaxClockInfo",
        query_gpu="clocks.max.sm",
        q_text=("Max Clocks/SM",),
        q_xml=("max_clocks/sm_clock",),
        prometheus="sm_clock_max_mhz",
    ),
    _n(
        "sm_clock_application_mhz",
        "MHz",
        CLOCK_MHZ,
        nvml="nvmlDeviceGetApplicationsClock",
        # nvidia-smi gives the application clocks of the graphics domain, which is the SM's
        query_gpu="clocks.applications.graphics",
        q_text=("Applications Clocks/Graphics",),
        q_xml=("applications_clocks/graphics_clock",),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    _n(
        "memory_clock_mhz",
        "MHz",
        CLOCK_MHZ,
        nvml="nvmlDeviceGetClockInfo",
        query_gpu="clocks.current.memory",
        q_text=("Clocks/Memory",),
        q_xml=("clocks/mem_clock",),
        prometheus="memory_clock_mhz",
    ),
    _n(
        "memory_clock_max_mhz",
        "MHz",
        CLOCK_MHZ,
        nvml="nvmlDeviceGetMaxClockInfo",
        query_gpu="clocks.max.memory",
        q_text=("Max Clocks/Memory",),
        q_xml=("max_clocks/mem_clock",),
        prometheus="memory_clock_max_mhz",
    ),
    _n(
        "memory_clock_application_mhz",
        "MHz",
        CLOCK_MHZ,
        nvml="nvmlDeviceGetApplicationsClock",
        query_gpu="clocks.applications.memory",
        q_text=("Applications Clocks/Memory",),
        q_xml=("applications_clocks/mem_clock",),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    Field(
        "pstate",
        "",
        "code",
        NVML_PSTATE,
        nvml="nvmlDeviceGetPerformanceState",
        query_gpu="pstate",
        q_text=("Performance State",),
        q_xml=("performance_state",),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    _n(
        "fan_pct",
        "%",
        FAN_PCT,
        nvml="nvmlDeviceGetFanSpeed",
        query_gpu="fan.speed",
        q_text=("Fan Speed",),
        q_xml=("fan_speed",),
        absent={PROMETHEUS: "dcgm-exporter's default set has none"},
    ),
    Field(
        "throttle_reasons",
        "",
        "reasons",
        REASON_MASK,
        nvml="nvmlDeviceGetCurrentClocksEventReasons",
        wire="throttle_mask",
        query_gpu="clocks_event_reasons.active",
        q_text=("Clocks Event Reasons", "Clocks Throttle Reasons"),
        q_xml=("clocks_event_reasons", "clocks_throttle_reasons"),
        prometheus="throttle_mask",
    ),
    *(
        Field(
            f"ecc.{kind}_{fix}",
            "errors",
            "whole",
            ERROR_COUNT,
            nvml="nvmlDeviceGetTotalEccErrors",
            query_gpu=f"ecc.errors.{fix}.{kind}.total",
            q_text=(f"ECC Errors/{kind.title()}",),
            q_xml=(f"ecc_errors/{kind}",),
            prometheus=metric,
        )
        for kind, fix, metric in (
            ("volatile", "corrected", "ecc_corrected"),
            ("volatile", "uncorrected", "ecc_uncorrected"),
            ("aggregate", "corrected", "ecc_corrected_aggregate"),
            ("aggregate", "uncorrected", "ecc_uncorrected_aggregate"),
        )
    ),
    *(
        Field(
            f"remap.{name}",
            unit,
            kind,
            bounds,
            nvml="nvmlDeviceGetRemappedRows",
            q_text=(f"Remapped Rows/{text}",),
            q_xml=(f"remapped_rows/{xml}",),
            prometheus=f"remap_{name}",
            absent={QUERY_GPU: "nvidia-smi gives it by --query-remapped-rows alone"},
        )
        for name, unit, kind, bounds, text, xml in (
            (
                "correctable",
                "rows",
                "whole",
                REMAPPED_ROWS,
                "Correctable Error",
                "remapped_row_corr",
            ),
            (
                "uncorrectable",
                "rows",
                "whole",
                REMAPPED_ROWS,
                "Uncorrectable Error",
                "remapped_row_unc",
            ),
            ("pending", "", "flag", None, "Pending", "remapped_row_pending"),
            ("failure", "", "flag", None, "Remapping Failure Occurred", "remapped_row_failure"),
        )
    ),
    Field(
        "retired_pages_pending",
        "",
        "flag",
        nvml="nvmlDeviceGetRetiredPagesPendingStatus",
        query_gpu="retired_pages.pending",
        q_text=("Retired Pages/Pending Page Blacklist",),
        q_xml=("retired_pages/pending_retirement", "retired_pages/pending_blacklist"),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    Field(
        "recovery_action",
        "",
        "code",
        NVML_ENUM,
        nvml="nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)",
        q_text=("GPU Recovery Action",),
        q_xml=("gpu_recovery_action",),
        absent={QUERY_GPU: NOT_IN_QUERY, PROMETHEUS: NOT_EXPORTED},
    ),
    *(
        Field(
            f"pcie.{name}",
            "",
            "whole",
            bounds,
            nvml=call,
            query_gpu=f"pcie.link.{column}",
            q_text=(f"PCI/GPU Link Info/{text}",),
            q_xml=(f"pci/pci_gpu_link_info/{xml}",),
            prometheus=f"pcie_{name}",
        )
        for name, bounds, call, column, text, xml in (
            (
                "gen",
                PCIE_GEN,
                "nvmlDeviceGetCurrPcieLinkGeneration",
                "gen.current",
                "PCIe Generation/Current",
                "pcie_gen/current_link_gen",
            ),
            (
                "width",
                PCIE_WIDTH,
                "nvmlDeviceGetCurrPcieLinkWidth",
                "width.current",
                "Link Width/Current",
                "link_widths/current_link_width",
            ),
            (
                "max_gen",
                PCIE_GEN,
                "nvmlDeviceGetMaxPcieLinkGeneration",
                "gen.max",
                "PCIe Generation/Max",
                "pcie_gen/max_link_gen",
            ),
            (
                "max_width",
                PCIE_WIDTH,
                "nvmlDeviceGetMaxPcieLinkWidth",
                "width.max",
                "Link Width/Max",
                "link_widths/max_link_width",
            ),
        )
    ),
    *(
        _n(
            f"pcie_{way}_kib_s",
            "KiB/s",
            PCIE_KIB_S,
            nvml="nvmlDeviceGetPcieThroughput",
            q_text=(f"PCI/{way.title()} Throughput",),
            q_xml=(f"pci/{way}_util",),
            absent={
                QUERY_GPU: "nvidia-smi gives it by dmon -s t alone",
                PROMETHEUS: "dcgm-exporter's default set has none",
            },
        )
        for way in ("tx", "rx")
    ),
    Field(
        "persistence_mode",
        "",
        "flag",
        nvml="nvmlDeviceGetPersistenceMode",
        query_gpu="persistence_mode",
        q_text=("Persistence Mode",),
        q_xml=("persistence_mode",),
        prometheus="persistence_mode",
    ),
    Field(
        "compute_mode",
        "",
        "code",
        NVML_ENUM,
        nvml="nvmlDeviceGetComputeMode",
        query_gpu="compute_mode",
        q_text=("Compute Mode",),
        q_xml=("compute_mode",),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    Field(
        "mig_mode",
        "",
        "flag",
        nvml="nvmlDeviceGetMigMode",
        query_gpu="mig.mode.current",
        q_text=("MIG Mode/Current",),
        q_xml=("mig_mode/current_mig",),
        absent={PROMETHEUS: NOT_EXPORTED},
    ),
    Field(
        "mig_instances",
        "",
        "instances",
        nvml="nvmlDeviceGetMigDeviceHandleByIndex",
        q_text=("MIG Devices",),
        q_xml=("mig_devices",),
        absent={
            QUERY_GPU: NOT_IN_QUERY,
            PROMETHEUS: "dcgm-exporter labels MIG devices, the console reads whole GPUs",
        },
    ),
    # Where a GPU that stopped answering shows so: NVML's GPU_IS_LOST, a dump's "GPU is lost" at
    # both these places, dcgm-exporter's XID 79 alone. A --query-gpu row of one reads N/A in
    # every column: that path cannot tell it from a GPU that reports nothing.
    Field(
        "lost",
        "",
        "lost",
        nvml="NVML_ERROR_GPU_IS_LOST",
        q_text=("Utilization/GPU", "FB Memory Usage/Total"),
        q_xml=("utilization/gpu_util", "fb_memory_usage/total"),
        prometheus="xid",
    ),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}


def gpu_field_names() -> tuple[str, ...]:
    """Every reading of `GpuState` as this table names it: its own fields, and each field of
    its parts (ECC counts, row remapping, the PCIe link) as ``part.attribute``."""
    parts = {"ecc": EccCounts, "remap": RowRemap, "pcie": PcieLink}
    names: list[str] = []
    for f in dataclasses.fields(GpuState):
        kind = parts.get(f.name)
        if kind is None:
            names.append(f.name)
        else:
            names.extend(f"{f.name}.{sub.name}" for sub in dataclasses.fields(kind))
    return tuple(names)


def paths_of(path: str) -> dict[str, tuple[str, ...]]:
    """``q-text`` or ``q-xml``: each field's paths in that dump format, by field name."""
    attribute = {Q_TEXT: "q_text", Q_XML: "q_xml"}[path]
    return {f.name: getattr(f, attribute) for f in FIELDS if getattr(f, attribute)}


def bounded(part: str | None = None) -> dict[str, tuple[tuple[float, float], bool]]:
    """The numeric fields of `GpuState` (``part`` None) or of one of its parts, by attribute:
    (range, whether the value is a whole number), for `gpuconsole.core.untrusted`."""
    return {
        f.attribute: (f.bounds, f.kind == "whole")
        for f in FIELDS
        if f.kind in ("number", "whole") and f.part == part and f.name != "index"
    }
