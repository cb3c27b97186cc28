"""NVIDIA dcgm-exporter's metric and label names, their units, and how each maps to a `GpuState`
field: the one home of these names.

One table serves the exporter, the exported alert rules and the Grafana dashboard (which each
write or select one generation of names, or both: `DEFAULT_GENERATION` unless told otherwise) and
the Prometheus source (which reads every spelling back).

Two generations of names:

- **classic**: dcgm-exporter up to 4.8 and the console's own exporter. Names and units are those
  of dcgm-exporter's shipped collector file (NVIDIA/dcgm-exporter ``etc/default-counters.csv``, at
  tag ``4.5.3-4.8.2``: ``DCGM_FI_DEV_GPU_UTIL`` "GPU utilization (in %)", ``DCGM_FI_DEV_FB_USED``
  "Framebuffer memory used (in MiB)", ``DCGM_FI_DEV_SM_CLOCK`` "(in MHz)", ...) and of DCGM's field
  header (NVIDIA/DCGM ``dcgmlib/dcgm_fields.h``) for the fields that file leaves commented out
  (ECC, PCIe link, clock-event reasons, power limit).
- **4.9**: dcgm-exporter 4.9.0 (DCGM 4.7) renamed "the 23 default and profiling-preset fields that
  DCGM 4.7 deprecates to their new DCGM 4.7 names", eleven of them to base units (clocks in hertz,
  utilization as a 0-1 ratio, GPU memory in bytes), renamed the driver-version label from
  ``DCGM_FI_DRIVER_VERSION`` to ``DCGM_FI_SYSTEM_DRIVER_VERSION``, and collects
  ``DCGM_FI_DEV_FB_CAPACITY_BYTES`` by default (its release notes, GitHub release ``4.9.0``;
  4.10.0 renamed only profiling fields the console does not read). The new names are DCGM's own:
  the deprecated-alias table at the end of ``dcgmlib/dcgm_fields.h`` (DCGM 4.6.0:
  ``DCGM_FI_DEV_GPU_TEMP`` → ``DCGM_FI_DEV_GPU_TEMP_CELSIUS``, ``DCGM_FI_DEV_POWER_USAGE`` →
  ``DCGM_FI_DEV_BOARD_POWER_WATTS``, ``DCGM_FI_DEV_XID_ERRORS`` → ``DCGM_FI_DEV_XID_ERROR``,
  ``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS`` → ``DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL``, ...),
  NVIDIA/go-dcgm ``pkg/dcgm/base_unit_fields_test.go`` for the hertz fields, and DCGM 4.7's field
  identifiers for the ratio and byte fields (``DCGM_FI_DEV_GPU_UTIL_RATIO`` 1613 and
  ``DCGM_FI_DEV_MEMORY_UTIL_RATIO`` 1614, doubles 0.0-1.0; ``DCGM_FI_DEV_FB_CAPACITY_BYTES``,
  ``_FB_FREE_BYTES``, ``_FB_USED_BYTES`` 1625-1627). The stored copy of dcgm-exporter's repository
  ends before 4.9.0, so its 4.9 collector file itself could not be read. DCGM 4.6's header still
  gave ``DCGM_FI_DEV_GPU_UTIL_RATIO`` to field 203, a percentage; 4.7 made it the ratio, which is
  how it is read here.

Labels (NVIDIA/dcgm-exporter ``internal/pkg/rendermetrics/render_metrics.go``): ``gpu, UUID,
pci_bus_id, device, modelName``, then the host, ``Hostname`` before 4.8.3 and ``hostname`` since
(#655), then the collector file's label fields (``DCGM_FI_DRIVER_VERSION``; 4.9:
``DCGM_FI_SYSTEM_DRIVER_VERSION``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuconsole.core.model import THROTTLE_REASON_BITS, GpuState, HostSnapshot

CLASSIC = "classic"
CURRENT = "4.9"
GENERATIONS = (CLASSIC, CURRENT)
"""dcgm-exporter's generations of metric names; `CURRENT` is its current release's."""
BOTH = "both"
CHOICES = (*GENERATIONS, BOTH)
"""What ``--dcgm-exporter`` takes: one generation of names, or both."""
DEFAULT_GENERATION = CURRENT
"""The names ``gpuconsole exporter`` serves and ``rules export`` and ``grafana export`` read
unless ``--dcgm-exporter`` says otherwise: one default for the three, so that the rules and the
dashboard exported with their defaults read what the exporter serves with its own, and, being
dcgm-exporter's current release's, what a fleet that runs it serves too."""


def generations_of(choice: str) -> tuple[str, ...]:
    """The generations a `CHOICES` value names, in `GENERATIONS` order."""
    return GENERATIONS if choice == BOTH else (choice,)


GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
"""The labels dcgm-exporter puts first on every GPU metric, in its order (the host follows)."""
HOST_LABELS = ("Hostname", "hostname")
"""The host's label, in `GENERATIONS` order: dcgm-exporter before 4.8.3, then 4.8.3 and later
(the classic names carried either)."""
HOST_LABEL = HOST_LABELS[0]
"""The classic host label, which the console's alerts sent to Alertmanager carry."""
DRIVER_LABELS = ("DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION")
"""The driver-version label, in `GENERATIONS` order: classic, then dcgm-exporter 4.9."""


def labels_written(generations: Sequence[str]) -> tuple[str, str]:
    """The host and driver-version labels of a dcgm-exporter that writes ``generations``: the
    newest one's. With both generations, 4.9's: the classic names were written with ``hostname``
    too (4.8.3, 4.8.4), and one label set for either name lets PromQL's ``or`` keep one series
    per GPU."""
    newest = max(GENERATIONS.index(generation) for generation in generations)
    return HOST_LABELS[newest], DRIVER_LABELS[newest]


MIB = 1024.0 * 1024.0


@dataclass(frozen=True, slots=True)
class Dialect:
    """How a fleet's dcgm-exporter names things, for the PromQL written for it: the generations
    of metric names it writes and the label(s) that name the host."""

    generations: tuple[str, ...]
    host_labels: tuple[str, ...]

    @classmethod
    def of(cls, generation: str, host_label: str | None = None) -> Dialect:
        """``generation``: one of `CHOICES`. Without a ``host_label``, the labels those releases
        write: 4.9 writes ``hostname``; the classic names span releases that wrote ``Hostname``
        (up to 4.8.2) and ``hostname`` (4.8.3, 4.8.4), so both are used."""
        generations = generations_of(generation)
        if host_label is not None:
            return cls(generations, (host_label,))
        if generations == (CURRENT,):
            return cls(generations, (labels_written(generations)[0],))
        return cls(generations, HOST_LABELS)

    @property
    def host_by(self) -> str:
        """The host labels as a PromQL grouping (a series carries one of them)."""
        return ", ".join(self.host_labels)

    def host_matchers(self, pattern: str) -> str:
        """A selector's matchers for hosts matching ``pattern``; with two host labels, a series
        matches when the one it carries matches (the other is empty)."""
        if len(self.host_labels) == 1:
            return f'{{{self.host_labels[0]}=~"{pattern}"}}'
        return "{" + ",".join(f'{label}=~"{pattern}|"' for label in self.host_labels) + "}"


CLASSIC_DIALECT = Dialect((CLASSIC,), (HOST_LABEL,))
"""Classic names, ``Hostname``: dcgm-exporter up to 4.8.2, and the default of the functions that
write PromQL (the commands pass `DEFAULT_GENERATION`'s)."""


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
class Unit:
    """How a metric's value converts to the console's unit: ``value * multiply / divide``."""

    multiply: float = 1.0
    divide: float = 1.0

    def convert(self, value: float) -> float:
        return value * self.multiply / self.divide

    def written(self, value: float) -> float:
        """A value in the console's unit, in this one (as an exporter writes it)."""
        return value * self.divide / self.multiply

    def promql(self, selector: str) -> str:
        """``selector`` in the console's unit, parenthesized when converted."""
        if self.multiply != 1.0:
            return f"({selector} * {_number(self.multiply)})"
        if self.divide != 1.0:
            return f"({selector} / {_number(self.divide)})"
        return selector


SAME = Unit()
PERCENT_OF_RATIO = Unit(multiply=100.0)
MHZ_OF_HERTZ = Unit(divide=1e6)
MIB_OF_BYTES = Unit(divide=MIB)


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


@dataclass(frozen=True, slots=True)
class DcgmMetric:
    """One dcgm-exporter metric: its classic name, its help text, the `GpuState` value it
    carries, its name in dcgm-exporter 4.9 (with the unit conversion back and, where the unit
    changed, its help text), and whether dcgm-exporter collects it by default."""

    field: str
    """The console's name for the reading (used by the source and the rule language)."""
    name: str
    """The classic name, in the classic unit (the console's)."""
    help: str
    value: Getter
    current: str = ""
    """The name dcgm-exporter 4.9 gives it ("" when unchanged), in `unit`."""
    unit: Unit = SAME
    default: bool = False
    """In dcgm-exporter's default collector file (4.8 and 4.9 alike); a field outside it is
    read only when the fleet's collector file adds it."""
    aliases: tuple[tuple[str, Unit], ...] = ()
    """Further names that carry the reading, read by the source after the two above."""
    current_help: str = ""
    """The help text under 4.9's name ("" when `help` holds: same unit)."""

    @property
    def current_name(self) -> str:
        return self.current or self.name

    def spellings(self) -> tuple[tuple[str, Unit], ...]:
        """Every name of the reading with its unit: classic first, then 4.9's, then aliases."""
        names = [(self.name, SAME)]
        if self.current:
            names.append((self.current, self.unit))
        return (*names, *self.aliases)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.spellings())

    def written(self, generations: Sequence[str]) -> tuple[tuple[str, str, Unit], ...]:
        """The names an exporter of ``generations`` writes the reading under, each with its help
        text and unit: one per generation, one in all where 4.9 kept the classic name. A field
        outside dcgm-exporter's defaults is written as DCGM 4.7 names it, like the others."""
        classic = (self.name, self.help, SAME)
        current = (self.current_name, self.current_help or self.help, self.unit)
        named = {CLASSIC: classic, CURRENT: current}
        return tuple({named[g][0]: named[g] for g in generations}.values())

    def spelled(self, generations: Sequence[str]) -> tuple[tuple[str, Unit], ...]:
        """The names PromQL for ``generations`` selects: a default field's name in each of them;
        both names for a field outside the defaults, whose spelling is the choice of the
        collector file that adds it."""
        if not self.current:
            return ((self.name, SAME),)
        chosen = [g for g in GENERATIONS if g in generations or not self.default]
        named = {CLASSIC: (self.name, SAME), CURRENT: (self.current, self.unit)}
        return tuple(named[g] for g in chosen)

    def selector(self, generations: Sequence[str], matchers: str = "") -> str:
        """PromQL for the reading in the console's unit: one name, or several joined by ``or``
        (where a GPU has series under both, the first name's win)."""
        parts = [unit.promql(f"{name}{matchers}") for name, unit in self.spelled(generations)]
        return parts[0] if len(parts) == 1 else f"({' or '.join(parts)})"


def _ecc(attribute: str) -> Getter:
    return lambda g: _value(getattr(g.ecc, attribute)) if g.ecc is not None else None


def _remap(attribute: str) -> Getter:
    return lambda g: _value(getattr(g.remap, attribute)) if g.remap is not None else None


def _pcie(attribute: str) -> Getter:
    return lambda g: _value(getattr(g.pcie, attribute)) if g.pcie is not None else None


def _value(value: float | bool | None) -> float | None:
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
        "DCGM_FI_DEV_GPU_UTIL_RATIO",
        PERCENT_OF_RATIO,
        default=True,
        current_help="GPU utilization (ratio, 0-1).",
    ),
    DcgmMetric(
        "memory_utilization_pct",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        lambda g: g.memory_utilization_pct,
        "DCGM_FI_DEV_MEMORY_UTIL_RATIO",
        PERCENT_OF_RATIO,
        default=True,
        current_help="Memory utilization (ratio, 0-1).",
    ),
    DcgmMetric(
        "memory_used_mib",
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        lambda g: g.memory_used_mib,
        "DCGM_FI_DEV_FB_USED_BYTES",
        MIB_OF_BYTES,
        default=True,
        current_help="Framebuffer memory used (in bytes).",
    ),
    DcgmMetric(
        "memory_free_mib",
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        memory_free_mib,
        "DCGM_FI_DEV_FB_FREE_BYTES",
        MIB_OF_BYTES,
        default=True,
        current_help="Framebuffer memory free (in bytes).",
    ),
    DcgmMetric(
        "temperature_c",
        "DCGM_FI_DEV_GPU_TEMP",
        "GPU temperature (in C).",
        lambda g: g.temperature_c,
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
        default=True,
    ),
    DcgmMetric(
        "slowdown_temperature_c",
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        "Slowdown temperature (in C).",
        lambda g: g.slowdown_temperature_c,
        "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS",
    ),
    DcgmMetric(
        "power_w",
        "DCGM_FI_DEV_POWER_USAGE",
        "Power draw (in W).",
        lambda g: g.power_w,
        "DCGM_FI_DEV_BOARD_POWER_WATTS",
        default=True,
    ),
    DcgmMetric(
        "power_limit_w",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "Power limit the driver enforces (in W).",
        lambda g: g.power_limit_w,
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
        # The limit the administrator asked for: the enforced one unless something lowers it.
        aliases=(
            ("DCGM_FI_DEV_POWER_MGMT_LIMIT", SAME),
            ("DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS", SAME),
        ),
    ),
    DcgmMetric(
        "sm_clock_mhz",
        "DCGM_FI_DEV_SM_CLOCK",
        "SM clock frequency (in MHz).",
        lambda g: g.sm_clock_mhz,
        "DCGM_FI_DEV_SM_CLOCK_HERTZ",
        MHZ_OF_HERTZ,
        default=True,
        current_help="SM clock frequency (in Hz).",
    ),
    DcgmMetric(
        "sm_clock_max_mhz",
        "DCGM_FI_DEV_MAX_SM_CLOCK",
        "Maximum SM clock frequency (in MHz).",
        lambda g: g.sm_clock_max_mhz,
        "DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ",
        MHZ_OF_HERTZ,
        current_help="Maximum SM clock frequency (in Hz).",
    ),
    DcgmMetric(
        "memory_clock_mhz",
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        lambda g: g.memory_clock_mhz,
        "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
        MHZ_OF_HERTZ,
        default=True,
        current_help="Memory clock frequency (in Hz).",
    ),
    DcgmMetric(
        "memory_clock_max_mhz",
        "DCGM_FI_DEV_MAX_MEM_CLOCK",
        "Maximum memory clock frequency (in MHz).",
        lambda g: g.memory_clock_max_mhz,
        "DCGM_FI_DEV_MEMORY_MAX_CLOCK_HERTZ",
        MHZ_OF_HERTZ,
        current_help="Maximum memory clock frequency (in Hz).",
    ),
    DcgmMetric(
        "throttle_mask",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Active clock-event (throttle) reasons, as NVML's bit mask.",
        lambda g: reason_mask(g.throttle_reasons),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
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
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
        default=True,
    ),
    DcgmMetric(
        "remap_correctable",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors.",
        _remap("correctable"),
        "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
        default=True,
    ),
    DcgmMetric(
        "remap_failure",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed.",
        _remap("failure"),
        "DCGM_FI_DEV_ROW_REMAP_FAILED",
        default=True,
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
        lambda g: _value(g.persistence_mode),
        "DCGM_FI_DEV_GPU_PERSISTENCE_MODE",
    ),
)
"""Every GPU metric the exporter writes, in the order it writes them."""

XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
XID_HELP = "Value of the last XID error encountered."
XID = DcgmMetric(
    "xid",
    XID_METRIC,
    XID_HELP,
    lambda _g: None,  # a host's events, not a GPU's state: `last_xid` reads it from the snapshot
    "DCGM_FI_DEV_XID_ERROR",
    default=True,
)
MEMORY_TOTAL = DcgmMetric(
    "memory_total_mib",
    "DCGM_FI_DEV_FB_TOTAL",
    "Framebuffer memory total (in MiB).",
    lambda g: g.memory_total_mib,
    "DCGM_FI_DEV_FB_CAPACITY_BYTES",
    MIB_OF_BYTES,
)
"""Read, not written: dcgm-exporter 4.9 collects the capacity by default, classic releases
collect neither (the total is then used + free)."""

BY_FIELD: dict[str, DcgmMetric] = {m.field: m for m in (*METRICS, XID, MEMORY_TOTAL)}
BY_NAME: dict[str, DcgmMetric] = {m.name: m for m in BY_FIELD.values()}
"""Each metric by its classic name."""

_CLASSIC_NAME = re.compile(r"\bDCGM_FI_[A-Z0-9_]+\b")


def in_generations(promql: str, generations: Sequence[str]) -> str:
    """``promql`` written over classic names (as the rule language renders a condition), with
    each of them replaced by its `DcgmMetric.selector` for ``generations``."""

    def spell(match: re.Match[str]) -> str:
        metric = BY_NAME.get(match.group())
        return match.group() if metric is None else metric.selector(generations)

    return _CLASSIC_NAME.sub(spell, promql)


def outside_defaults(promql: str) -> list[DcgmMetric]:
    """The metrics a classic-name PromQL expression reads that dcgm-exporter does not collect
    by default, in the order it names them."""
    found = (BY_NAME.get(name) for name in _CLASSIC_NAME.findall(promql))
    return list({m.field: m for m in found if m is not None and not m.default}.values())


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
