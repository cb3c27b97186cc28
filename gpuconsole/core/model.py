"""Immutable snapshot types: what every telemetry source produces and every screen renders.

A field the GPU or the source cannot report is ``None`` (shown as "N/A"), never ``0``: an H200 has
no fan, a VM may hide its NUMA node, and a lost GPU reports nothing at all.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import NamedTuple


class Severity(IntEnum):
    """How bad a finding is; ordered so that ``max()`` gives the worst."""

    INFO = 0
    WARNING = 1
    CRITICAL = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class HostState(str, Enum):
    """Where a host's reading stream stands (the same words appear in JSON output)."""

    CONNECTING = "connecting"
    LIVE = "live"
    STALE = "stale"
    DOWN = "down"
    AUTH_FAILED = "auth-failed"
    HOST_KEY_MISMATCH = "host-key-mismatch"
    HOST_KEY_UNKNOWN = "host-key-unknown"
    HOST_KEY_REVOKED = "host-key-revoked"
    REFUSED = "refused"
    """The console will not connect as the host's ssh config asks (a keyword it does not act
    on), or ssh itself refuses that config: the reason names the keyword, file and line."""
    NO_DRIVER = "no-driver"
    """Logged in, but the agent cannot read GPUs (no driver, no nvidia-smi): it says why."""
    AGENT_ERROR = "agent-error"
    """Logged in, but no line the agent sent could be read for the connect timeout (another
    protocol version, garbage in its place): the reason is the first such line's."""


# Clock-event ("throttle") reasons, in NVML's terms, spelled as stable kebab-case codes.
THROTTLE_REASONS: dict[str, str] = {
    "gpu-idle": "GPU idle",
    "applications-clocks": "application clocks setting",
    "sw-power-cap": "software power cap",
    "hw-slowdown": "hardware slowdown",
    "sync-boost": "sync boost",
    "sw-thermal": "software thermal slowdown",
    "hw-thermal": "hardware thermal slowdown",
    "hw-power-brake": "hardware power brake",
    "display-clocks": "display clock setting",
}

# NVML's nvmlClocksEventReason* bits (DCGM's DCGM_CLOCKS_EVENT_REASON_* are the same), as
# `nvidia-smi --query-gpu=clocks_event_reasons.active` and dcgm-exporter print the mask.
THROTTLE_REASON_BITS: dict[int, str] = {
    0x001: "gpu-idle",
    0x002: "applications-clocks",
    0x004: "sw-power-cap",
    0x008: "hw-slowdown",
    0x010: "sync-boost",
    0x020: "sw-thermal",
    0x040: "hw-thermal",
    0x080: "hw-power-brake",
    0x100: "display-clocks",
}

# Reasons that mean the GPU runs slower than it could for a cause worth an admin's attention.
SLOWDOWN_REASONS = frozenset({"hw-slowdown", "sw-thermal", "hw-thermal", "hw-power-brake"})


@dataclass(frozen=True, slots=True)
class PcieLink:
    """PCIe link generation and width, as trained now and at the most the pair supports."""

    gen: int | None
    width: int | None
    max_gen: int | None
    max_width: int | None

    @property
    def degraded_width(self) -> bool:
        return self.width is not None and self.max_width is not None and self.width < self.max_width

    @property
    def degraded_gen(self) -> bool:
        return self.gen is not None and self.max_gen is not None and self.gen < self.max_gen


@dataclass(frozen=True, slots=True)
class EccCounts:
    """ECC error counts since the driver loaded (volatile) and over the GPU's life (aggregate)."""

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None


@dataclass(frozen=True, slots=True)
class RowRemap:
    """HBM row remapping state (Ampere and later)."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID error reported by the driver."""

    xid: int
    gpu: int | None
    time: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """The Slurm job a process runs in, as ``squeue`` told the host's agent; a field squeue
    left empty is None."""

    job_id: int
    name: str | None
    user: str | None
    partition: str | None
    start: str | None
    """When the job started, as squeue prints it (``2026-01-01T00:00:00``)."""
    time_limit: str | None
    """The job's time limit as squeue prints it (``1-00:00:00``, ``UNLIMITED``)."""
    state: str | None

    @property
    def short(self) -> str:
        """'job 41327 llama-ft': what a process list's owner column shows."""
        return f"job {self.job_id}" + (f" {self.name}" if self.name else "")

    @property
    def described(self) -> str:
        """'job 41327 (alice, llama-ft)': what a triage row or a bundle says it affects."""
        known = ", ".join(text for text in (self.user, self.name) if text)
        return f"job {self.job_id}" + (f" ({known})" if known else "")


@dataclass(frozen=True, slots=True)
class KubePod:
    """The Kubernetes pod a process runs in: its uid from the process's cgroup, its namespace,
    name and container from the kubelet's log layout on the host, where they could be found."""

    uid: str
    namespace: str | None = None
    name: str | None = None
    container: str | None = None

    @property
    def short(self) -> str:
        """'pod infer/llama-13b-7d9f': what a process list's owner column shows."""
        if self.name is None:
            return f"pod {self.uid[:8]}"
        return f"pod {self.namespace}/{self.name}" if self.namespace else f"pod {self.name}"

    @property
    def described(self) -> str:
        """'pod infer/llama-13b-7d9f (server)': what a triage row or a bundle says it affects."""
        return self.short + (f" ({self.container})" if self.container else "")


@dataclass(frozen=True, slots=True)
class ProcessLoad:
    """What a process used of its GPU over NVML's last sampling period, in percent (NVML's
    process utilization samples); None for what the GPU does not sample."""

    sm_pct: float | None = None
    memory_pct: float | None = None
    """The memory controller's busy time, as nvidia-smi pmon's ``mem`` column."""
    encoder_pct: float | None = None
    decoder_pct: float | None = None


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    pid: int
    gpu: int
    used_memory_mib: float | None
    user: str | None = None
    command: str | None = None
    kind: str = "compute"
    container: str | None = None
    """'docker:<id>', 'containerd:<id>' or 'k8s-pod:<uid>' where the process runs in one."""
    mig_instance: int | None = None
    """The GPU instance id when the GPU is in MIG mode."""
    job: SlurmJob | None = None
    """The Slurm job the process runs in, where it runs in one and squeue could say."""
    pod: KubePod | None = None
    """The Kubernetes pod it runs in, where its cgroup names one."""
    container_name: str | None = None
    """Its container's name as the runtime calls it (Docker's socket), where it could say."""
    started: float | None = None
    """When the process started, seconds since the epoch on the host's clock."""
    load: ProcessLoad | None = None
    """Its share of the GPU, where the GPU samples processes (NVML)."""

    @property
    def owner(self) -> str | None:
        """Whose work it is, in a few words: its Slurm job, else its pod, else its container
        (by name where the runtime gave one), else None."""
        if self.job is not None:
            return self.job.short
        if self.pod is not None:
            return self.pod.short
        return self.container_name or self.container

    @property
    def owner_described(self) -> str | None:
        """Whose work it is, as a triage row says it: "job 41327 (alice, llama-ft)"."""
        if self.job is not None:
            return self.job.described
        if self.pod is not None:
            return self.pod.described
        named = self.container_name or self.container
        return named and f"container {named}"


def affected(processes: Iterable[GpuProcess], gpu: int | None) -> tuple[str, ...]:
    """Whose work a problem on ``gpu`` (every GPU, for a host-wide one) affects, each once."""
    owners = (p.owner_described for p in processes if gpu is None or p.gpu == gpu)
    return tuple(dict.fromkeys(owner for owner in owners if owner))


@dataclass(frozen=True, slots=True)
class SchedulerNode:
    """The host as its scheduler sees it: its Slurm node's state as ``scontrol show node``
    says it (``IDLE``, ``MIXED+DRAIN``, ``DOWN+NOT_RESPONDING``), and the reason an admin gave."""

    scheduler: str
    name: str
    state: str
    reason: str | None = None

    @property
    def out_of_service(self) -> bool:
        """Drained or draining: no new work lands on it."""
        return "DRAIN" in self.state.upper().split("+")

    @property
    def described(self) -> str:
        """'drained (reason: bad GPU 3)', 'draining', 'idle': what the fleet screen shows."""
        base = self.state.upper().split("+")[0]
        if not self.out_of_service:
            return base.lower()
        # As sinfo puts it: a draining node still runs jobs, a drained one runs none.
        words = "draining" if base in ("ALLOCATED", "MIXED", "COMPLETING") else "drained"
        return words + (f" (reason: {self.reason})" if self.reason else "")


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG GPU instance (with its compute instance) of a GPU in MIG mode.

    NVML reports no utilization per MIG instance, so there is no such field here: screens show
    N/A rather than a 0 that would read as "idle".
    """

    gpu_instance_id: int
    compute_instance_id: int | None
    profile: str | None
    memory_total_mib: float | None
    memory_used_mib: float | None = None
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU's reading at one instant."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None
    """The board's serial number, where NVML gives it (datacenter boards)."""
    vbios_version: str | None = None
    utilization_pct: float | None = None
    memory_utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None
    slowdown_temperature_c: float | None = None
    shutdown_temperature_c: float | None = None
    """Where the GPU shuts itself down to save the hardware, °C."""
    power_w: float | None = None
    power_limit_w: float | None = None
    power_limit_min_w: float | None = None
    """The lowest power limit an admin may set, W."""
    power_limit_max_w: float | None = None
    """The highest power limit an admin may set, W."""
    power_limit_default_w: float | None = None
    """The power limit the board comes with, W."""
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    sm_clock_application_mhz: float | None = None
    """The SM clock the GPU runs work at, its boost aside (nvidia-smi's "Applications Clocks",
    Graphics): the default unless an admin set it with ``nvidia-smi -ac``, MHz."""
    memory_clock_mhz: float | None = None
    memory_clock_max_mhz: float | None = None
    memory_clock_application_mhz: float | None = None
    """The memory clock of the application clocks, MHz."""
    pstate: str | None = None
    fan_pct: float | None = None
    throttle_reasons: tuple[str, ...] | None = None
    ecc: EccCounts | None = None
    remap: RowRemap | None = None
    retired_pages_pending: bool | None = None
    """A page retirement (pre-Ampere ECC pages) waits for a GPU reset or reboot to take effect."""
    recovery_action: str | None = None
    pcie: PcieLink | None = None
    pcie_tx_kib_s: float | None = None
    """What the GPU sends over its PCIe link, KiB/s, sampled over 20 ms (NVML and nvidia-smi
    say "KB/s"; NVML's documentation does not say which kilo, and this takes it as 1024). The
    NVML reader samples it once every 5 s and carries the sample between (its PCIE_SAMPLE_S)."""
    pcie_rx_kib_s: float | None = None
    """What the GPU receives over its PCIe link, KiB/s, sampled as ``pcie_tx_kib_s`` is."""
    persistence_mode: bool | None = None
    compute_mode: str | None = None
    mig_mode: bool | None = None
    mig_instances: tuple[MigInstance, ...] = ()
    lost: bool = False
    """True when the GPU stopped answering (fallen off the bus): every reading is then None."""

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return self.memory_used_mib / self.memory_total_mib

    @property
    def slowdowns(self) -> tuple[str, ...]:
        """The active clock-event reasons that slow the GPU down for a reason worth reporting."""
        return tuple(r for r in self.throttle_reasons or () if r in SLOWDOWN_REASONS)


# Link kinds as `nvidia-smi topo -m` prints them, best-connected first. NV# (NVLink with # links)
# beats every PCIe path; among PCIe paths, fewer hops and no CPU interconnect are better.
PCIE_LINK_RANK: dict[str, int] = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
LINK_LEGEND: dict[str, str] = {
    "X": "self",
    "SYS": "through PCIe and the interconnect between NUMA nodes (e.g. QPI/UPI)",
    "NODE": "through PCIe and the interconnect between host bridges within a NUMA node",
    "PHB": "through PCIe and a PCIe host bridge (typically the CPU)",
    "PXB": "through several PCIe bridges, without a host bridge",
    "PIX": "through at most one PCIe bridge",
    "NV#": "through a bonded set of # NVLinks",
}


def nvlink_count(link: str) -> int:
    """How many NVLinks a topology cell like ``NV18`` names; 0 for a PCIe path."""
    return int(link[2:]) if link.startswith("NV") and link[2:].isdigit() else 0


def link_cost(link: str) -> float:
    """Lower is better: any NVLink beats PCIe, more NVLinks beat fewer."""
    links = nvlink_count(link)
    if links:
        return 1.0 / (links + 1)
    return float(PCIE_LINK_RANK.get(link, 6))


MAX_PAIRS_RANKED = 1_000_000
"""The most GPU pairs one `Topology.best_sets` call weighs (about 0.2 s of CPython): the ranking is
exhaustive, and C(n, k) outgrows it past 16 GPUs (8 of 16 is 12,870 sets, 8 of 24 is 735,471)."""


class TooManySets(ValueError):
    """Ranking every ``k``-set of the GPUs would weigh more than `MAX_PAIRS_RANKED` pairs."""


class GpuSet(NamedTuple):
    """Some GPUs and their weakest link: the worst-connected pair among them."""

    gpus: tuple[int, ...]
    weakest: str


def _link_order(link: str) -> tuple[float, str]:
    """`link_cost`, with the label itself breaking ties (``NV1``/``NV01``, unknown labels)."""
    return (link_cost(link), link)


@dataclass(frozen=True, slots=True)
class Topology:
    """The GPU × GPU connection matrix with each GPU's CPU and NUMA affinity."""

    matrix: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[str | None, ...] = ()
    numa_affinity: tuple[int | None, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.matrix)

    def link(self, a: int, b: int) -> str:
        return self.matrix[a][b]

    def best_sets(self, k: int, limit: int = 3, leave_out: Collection[int] = ()) -> list[GpuSet]:
        """The ``limit`` best-connected sets of ``k`` GPUs, none of ``leave_out``, best first.

        Each set carries its weakest link, the worst of its pairs (a collective runs at the
        slowest link's pace). Sets are ranked by that link, then sets on one NUMA node before
        sets spanning several (host-side traffic stays local), then by the sum of `link_cost`
        over their pairs, then by their GPU indices. A pair's link is the worse of its two cells,
        should the matrix not be symmetric. Empty when ``k`` is below 2 or above the GPUs left;
        `TooManySets` when the exhaustive ranking would weigh more than `MAX_PAIRS_RANKED` pairs.
        """
        excluded = set(leave_out)
        gpus = [i for i in range(self.gpu_count) if i not in excluded]
        if not 2 <= k <= len(gpus) or limit < 1:
            return []
        sets = math.comb(len(gpus), k)
        if sets * k * (k - 1) // 2 > MAX_PAIRS_RANKED:
            raise TooManySets(f"{k} of {len(gpus)} GPUs: {sets:,} sets, too many to rank")
        links = {(a, b): self._pair_link(a, b) for a, b in itertools.combinations(gpus, 2)}
        labels = sorted(set(links.values()), key=_link_order)
        rank = {label: r for r, label in enumerate(labels)}
        n = self.gpu_count
        ranks, costs = [[0] * n for _ in range(n)], [[0.0] * n for _ in range(n)]
        for (a, b), link in links.items():
            ranks[a][b], costs[a][b] = rank[link], link_cost(link)
        places = [self._place(i) for i in range(self.gpu_count)]
        scored = []
        for combo in itertools.combinations(gpus, k):
            pairs = list(itertools.combinations(combo, 2))
            weakest = max(ranks[a][b] for a, b in pairs)
            total = math.fsum(costs[a][b] for a, b in pairs)
            where = {places[i] for i in combo}
            not_local = len(where) > 1 or None in where
            scored.append((weakest, not_local, total, combo))
        return [GpuSet(combo, labels[w]) for w, _, _, combo in heapq.nsmallest(limit, scored)]

    def spans_numa(self, gpus: Collection[int]) -> bool:
        """Whether ``gpus`` sit on more than one NUMA node, as far as the host says where they
        sit (a GPU whose place is unknown counts on none)."""
        return len({self._place(i) for i in gpus} - {None}) > 1

    def _pair_link(self, a: int, b: int) -> str:
        return max(self.link(a, b), self.link(b, a), key=_link_order)

    def _place(self, gpu: int) -> tuple[str, int | str] | None:
        """Where ``gpu`` sits on the host side: its NUMA node, else (a VM, an older driver) its CPU
        affinity, else None (unknown). GPUs share a NUMA node when their places are equal."""
        numa = self.numa_affinity[gpu] if gpu < len(self.numa_affinity) else None
        if numa is not None:
            return ("numa", numa)
        cpus = self.cpu_affinity[gpu] if gpu < len(self.cpu_affinity) else None
        return None if cpus is None else ("cpus", cpus)


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """Everything read from one host at one instant."""

    host: str
    time: float
    gpus: tuple[GpuState, ...]
    processes: tuple[GpuProcess, ...] = ()
    topology: Topology | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    xid_events: tuple[XidEvent, ...] = ()
    source: str = "sim"
    bad_values: int = 0
    """How many values the host sent that no GPU can report (shown as N/A; see `untrusted`)."""
    bad_value_notes: tuple[str, ...] = ()
    """What the first few of them were, e.g. ``GPU 0 temperature_c 1e+308 out of range``."""
    attached_gpus: int | None = None
    """How many GPUs the host has, where a saved dump holds fewer (``nvidia-smi -q -i 0,1``)."""
    node: SchedulerNode | None = None
    """The host's Slurm node, where it is one."""

    def gpu(self, index: int) -> GpuState | None:
        return next((g for g in self.gpus if g.index == index), None)

    def processes_on(self, index: int) -> tuple[GpuProcess, ...]:
        return tuple(p for p in self.processes if p.gpu == index)


@dataclass(frozen=True, slots=True)
class Finding:
    """A problem found in readings, with a stable code and what to do about it."""

    severity: Severity
    code: str
    message: str
    remediation: str
    host: str = ""
    gpu: int | None = None

    @property
    def where(self) -> str:
        return self.host if self.gpu is None else f"{self.host} GPU {self.gpu}"


def worst(findings: Iterable[Finding]) -> Finding | None:
    """The most severe finding (the first of equals), or None."""
    ranked = sorted(findings, key=lambda f: -f.severity)
    return ranked[0] if ranked else None


@dataclass(frozen=True, slots=True)
class Report:
    """What an action produced for one host: a title and its findings."""

    host: str
    title: str
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def severity(self) -> Severity:
        return max((f.severity for f in self.findings), default=Severity.INFO)
