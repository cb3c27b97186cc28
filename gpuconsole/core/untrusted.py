"""The boundary where data from outside becomes the model.

Whoever has a shell on a watched GPU node chooses its process names and command lines; a dump or a
recording a ticket brings may have been written by anyone. So every `HostSnapshot` a source builds
from such data passes `vetted` before anything shows, stores or judges it:

- text is made visible: control characters (C0, DEL, C1) and the bidirectional overrides become
  printable stand-ins (``\\x1b`` shows as ``␛``, a newline as ``␊``, ``\\x9b`` as ``\\x9b``), so an
  escape sequence or a forged line can never reach a terminal as one; and it is cut to a bound;
- numbers are range-checked: a value no GPU can report (negative memory, ECC −5, 10³⁰⁸ °C, a GPU
  index of 10¹⁸, a field of the wrong type) becomes ``None`` — shown as N/A, never a finding — and
  is counted in the snapshot's ``bad_values`` with a short note of what it was.

The ranges are wide on purpose: they refuse the impossible, not the unusual (an H200 at 95 °C is a
finding for the health rules, not a bad value).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from gpuconsole.core.fields import INDEX, MAX_GPUS, MEMORY_MIB, PERCENT, bounded
from gpuconsole.core.model import (
    EccCounts,
    GpuProcess,
    GpuState,
    HostSnapshot,
    KubePod,
    MigInstance,
    PcieLink,
    ProcessLoad,
    RowRemap,
    SchedulerNode,
    SlurmJob,
    Topology,
    XidEvent,
)

MAX_TEXT_CHARS = 4096
"""Strings from outside (names, command lines, messages) are cut to this many characters."""
MAX_PROCESSES = 4096
"""Processes kept per reading; the rest are counted as left out."""
MAX_TOPOLOGY_GPUS = 32
"""The largest topology matrix accepted: best-set search is combinatorial in its size."""
MAX_NOTES = 5
"""How many bad values a snapshot describes; all of them are counted."""
MAX_NAME_CHARS = 253
"""Names of owners (a pod, its namespace and container, a Docker container, a scheduler's node)
are cut to this: Kubernetes' longest name (a DNS subdomain), longer than Docker's and Slurm's."""


class _Ranges:
    """Numeric fields of one model class: the range a real reading falls in, and whether it must
    be a whole number; read together (one attrgetter) because most readings pass them all."""

    __slots__ = ("checks", "get", "names")

    def __init__(self, numbers: dict[str, tuple[tuple[float, float], bool]]) -> None:
        self.names = tuple(numbers)
        self.checks = tuple(numbers.values())
        fetch = operator.attrgetter(*self.names)
        self.get: Callable[[Any], tuple[Any, ...]] = (
            fetch if len(self.names) > 1 else (lambda obj: (fetch(obj),))
        )


_GPU_NUMBERS = _Ranges(bounded())
_GPU_TEXTS = (
    "name",
    "uuid",
    "pci_bus_id",
    "serial",
    "vbios_version",
    "pstate",
    "recovery_action",
    "compute_mode",
)
_GPU_FLAGS = ("persistence_mode", "mig_mode", "retired_pages_pending")
_ECC_NUMBERS = _Ranges(bounded("ecc"))
_REMAP_NUMBERS = _Ranges(bounded("remap"))
_PCIE_NUMBERS = _Ranges(bounded("pcie"))
_MIG_NUMBERS = _Ranges(
    {
        "compute_instance_id": (INDEX, True),
        "memory_total_mib": (MEMORY_MIB, False),
        "memory_used_mib": (MEMORY_MIB, False),
    }
)
_TIME = (0.0, float(1 << 34))  # seconds since the epoch: 1970 … the year 2514
_PROCESS_NUMBERS = _Ranges(
    {
        "used_memory_mib": (MEMORY_MIB, False),
        "mig_instance": (INDEX, True),
        "started": (_TIME, False),
    }
)
_LOAD_NUMBERS = _Ranges({f.name: (PERCENT, False) for f in dataclasses.fields(ProcessLoad)})
_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
"""A pod's uid: a UUID, or a static pod's 32-hex manifest hash."""
_SLURM_JOB_ID = (1, (1 << 32) - 1)
_PID = (1, (1 << 32) - 1)  # Linux's pid_max is at most 2**22; Windows pids are 32-bit

UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
"""C0 controls, DEL, C1 controls, the line and paragraph separators, the bidirectional
formatting characters (the "Trojan Source" overrides, CVE-2021-42574), and lone surrogates (a
JSON "\\ud800" decodes to one, and no UTF-8 output can write it): what text from outside may
not hold as it is."""


def stand_in(match: re.Match[str]) -> str:
    """The visible stand-in of one unsafe character (a regex match of it)."""
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # Unicode's Control Pictures: ␀ … ␟ (␛ for ESC, ␊ for LF)
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` with every control and bidirectional-override character made visible, cut to
    ``limit`` characters (an ellipsis marks the cut)."""
    if len(text) <= limit and not UNSAFE.search(text):
        return text
    text = UNSAFE.sub(stand_in, text[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(value: object) -> str:
    """A value from outside as a bad-value note quotes it: short, and safe to print."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**12:
        if value.bit_length() > 10_000:  # str() of an int past 4300 digits raises
            return f"a number of about {round(value.bit_length() * math.log10(2))} digits"
        return f"a {len(str(abs(value)))}-digit number"
    return visible(repr(value), 40)


class _Vetting:
    """One snapshot's checks: each rejected value is counted and the first few described."""

    def __init__(self) -> None:
        self.count = 0
        self.notes: list[str] = []

    def bad(self, where: str, value: object, what: str = "out of range") -> None:
        self.count += 1
        if len(self.notes) < MAX_NOTES:
            self.notes.append(f"{where} {shown(value)} {what}")

    def text(self, where: str, value: object, limit: int = MAX_TEXT_CHARS) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            self.bad(where, value, "is not text")
            return None
        return visible(value, limit)

    def number(self, where: str, value: object, bounds: tuple[float, float], whole: bool) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.bad(where, value, "is not a number")
            return None
        if whole and isinstance(value, float):
            if not value.is_integer():
                self.bad(where, value, "is not a whole number")
                return None
            value = int(value)
        low, high = bounds
        if not low <= value <= high:  # NaN and the infinities fail this too; no int overflows
            self.bad(where, value)
            return None
        return value

    def flag(self, where: str, value: object) -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        self.bad(where, value, "is not true or false")
        return None

    def fields(self, obj: Any, where: str, ranges: _Ranges) -> dict[str, Any]:
        """The changed numeric fields of ``obj`` (a model dataclass), empty when all pass."""
        changes = {}
        for name, value, (bounds, whole) in zip(
            ranges.names, ranges.get(obj), ranges.checks, strict=True
        ):
            kind = type(value)
            if value is None or (
                (kind is int or (kind is float and not whole)) and bounds[0] <= value <= bounds[1]
            ):
                continue  # the usual case, without building the label (NaN fails the range)
            checked = self.number(f"{where} {name}", value, bounds, whole)
            if checked is not value:
                changes[name] = checked
        return changes

    def texts(
        self, obj: Any, where: str, names: tuple[str, ...], limit: int = MAX_TEXT_CHARS
    ) -> dict[str, Any]:
        changes = {}
        for name in names:
            value = getattr(obj, name)
            if value is None or (
                type(value) is str and len(value) <= limit and not UNSAFE.search(value)
            ):
                continue
            checked = self.text(f"{where} {name}", value, limit)
            if checked is not value:
                changes[name] = checked
        return changes

    def part(
        self,
        obj: Any,
        kind: type,
        where: str,
        numbers: _Ranges,
        flags: tuple[str, ...] = (),
    ) -> Any:
        """A nested reading (ECC counts, a PCIe link...): itself, a checked copy, or None."""
        if obj is None:
            return None
        if not isinstance(obj, kind):
            self.bad(where, obj, "is not a reading")
            return None
        changes = self.fields(obj, where, numbers)
        for name in flags:  # RowRemap's pending and failure
            value = getattr(obj, name)
            if self.flag(f"{where} {name}", value) is not value:
                changes[name] = None
        return dataclasses.replace(obj, **changes) if changes else obj


def vetted(snapshot: HostSnapshot, known: HostSnapshot | None = None) -> HostSnapshot:
    """``snapshot`` with its text made visible and its impossible values N/A, counted.

    Returns ``snapshot`` itself when everything passes, so a clean reading costs no copy.
    ``known``: a reading that passed already (a recording's keyframe) whose parts ``snapshot``
    shares (the very GPU objects, the process tuple...): those are not checked again.
    """
    vet = _Vetting()
    changes: dict[str, Any] = {}
    _text_fields(vet, snapshot, changes)
    if not (isinstance(snapshot.time, int | float) and _TIME[0] <= snapshot.time <= _TIME[1]):
        # A reading needs a time; one that has none usable is taken as not at all readable.
        raise ValueError(f"{visible(str(snapshot.host), 80)}: reading time {shown(snapshot.time)}")
    passed = {id(gpu) for gpu in known.gpus} if known is not None else set()
    gpus = _gpus(vet, snapshot.gpus, passed)
    if gpus is not None:
        changes["gpus"] = gpus
    if known is None or snapshot.processes is not known.processes:
        processes = _processes(vet, snapshot.processes)
        if processes is not None:
            changes["processes"] = processes
    if known is None or snapshot.topology is not known.topology:
        topology = _topology(vet, snapshot.topology)
        if topology is not snapshot.topology:
            changes["topology"] = topology
    if known is None or snapshot.xid_events is not known.xid_events:
        xid_events = _xids(vet, snapshot.xid_events)
        if xid_events is not None:
            changes["xid_events"] = xid_events
    if known is None or snapshot.node is not known.node:
        node = _node(vet, snapshot.node)
        if node is not snapshot.node:
            changes["node"] = node
    if vet.count:
        changes["bad_values"] = changes.get("bad_values", snapshot.bad_values) + vet.count
        notes = changes.get("bad_value_notes", snapshot.bad_value_notes)
        changes["bad_value_notes"] = (notes + tuple(vet.notes))[:MAX_NOTES]
    return dataclasses.replace(snapshot, **changes) if changes else snapshot


def _text_fields(vet: _Vetting, snapshot: HostSnapshot, changes: dict[str, Any]) -> None:
    host = vet.text("host name", snapshot.host, 255)
    if host != snapshot.host:
        changes["host"] = host or "?"
    for name in ("driver_version", "cuda_version"):
        value = getattr(snapshot, name)
        checked = vet.text(name, value, 64)
        if checked is not value:
            changes[name] = checked
    source = vet.text("source", snapshot.source, 64)
    if source != snapshot.source:
        changes["source"] = source or "?"
    # What an earlier boundary counted (a recording keeps it): a count, and a few short texts.
    count = snapshot.bad_values
    if type(count) is not int or not 0 <= count < 1 << 31:
        vet.bad("bad-value count", count)
        count = 0
    notes = snapshot.bad_value_notes
    kept = tuple(vet.text("bad-value note", n, 200) or "?" for n in notes[:MAX_NOTES])
    if count is not snapshot.bad_values or not _same(kept, notes):
        changes.update(bad_values=count, bad_value_notes=kept)


def _gpus(
    vet: _Vetting, gpus: tuple[GpuState, ...], passed: set[int]
) -> tuple[GpuState, ...] | None:
    """The checked GPUs, or None when every one passed as it was (those whose id is in
    ``passed`` did already)."""
    kept: list[GpuState] = []
    seen: set[int] = set()
    changed = False
    for gpu in gpus:
        index = vet.number("GPU index", getattr(gpu, "index", None), INDEX, True)
        if not isinstance(gpu, GpuState) or index is None or index in seen:
            if isinstance(gpu, GpuState) and index in seen:
                vet.bad("GPU index", index, "repeated")
            changed = True  # a GPU with no usable index cannot be shown: left out, counted
            continue
        if len(kept) == MAX_GPUS:
            vet.bad("GPUs", len(gpus), f"reported (kept {MAX_GPUS})")
            changed = True
            break
        seen.add(index)
        checked = gpu if id(gpu) in passed else _gpu(vet, gpu)
        changed = changed or checked is not gpu
        kept.append(checked)
    return tuple(kept) if changed else None


def _gpu(vet: _Vetting, gpu: GpuState) -> GpuState:
    where = f"GPU {gpu.index}"
    changes = vet.fields(gpu, where, _GPU_NUMBERS)
    changes.update(vet.texts(gpu, where, _GPU_TEXTS))
    for name in _GPU_FLAGS:
        value = getattr(gpu, name)
        if vet.flag(f"{where} {name}", value) is not value:
            changes[name] = None
    if not isinstance(gpu.lost, bool):
        vet.bad(f"{where} lost", gpu.lost, "is not true or false")
        changes["lost"] = bool(gpu.lost)
    used = changes.get("memory_used_mib", gpu.memory_used_mib)
    total = changes.get("memory_total_mib", gpu.memory_total_mib)
    if used is not None and total is not None and used > total * 1.01 + 1:
        vet.bad(f"{where} memory_used_mib", used, f"above memory_total_mib {total:.0f}")
        changes["memory_used_mib"] = None
    reasons = _reasons(vet, where, gpu.throttle_reasons)
    if reasons is not gpu.throttle_reasons:
        changes["throttle_reasons"] = reasons
    for name, kind, numbers, flags in (
        ("ecc", EccCounts, _ECC_NUMBERS, ()),
        ("remap", RowRemap, _REMAP_NUMBERS, ("pending", "failure")),
        ("pcie", PcieLink, _PCIE_NUMBERS, ()),
    ):
        value = getattr(gpu, name)
        if value is None:
            continue
        checked = vet.part(value, kind, f"{where} {name}", numbers, flags)
        if checked is not value:
            changes[name] = checked
    instances = _mig(vet, where, gpu.mig_instances)
    if instances is not None:
        changes["mig_instances"] = instances
    return dataclasses.replace(gpu, **changes) if changes else gpu


def _plain(items: tuple[Any, ...], limit: int) -> bool:
    """Whether every item is text of at most ``limit`` characters with nothing to make visible."""
    return all(type(item) is str and len(item) <= limit for item in items) and not UNSAFE.search(
        "".join(items)
    )


def _reasons(vet: _Vetting, where: str, reasons: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if reasons is None:
        return None
    if not isinstance(reasons, tuple):
        vet.bad(f"{where} throttle_reasons", reasons, "is not a list")
        return None
    if len(reasons) <= 32 and _plain(reasons, 64):
        return reasons
    return tuple(vet.text(f"{where} throttle reason", r, 64) or "?" for r in reasons[:32])


def _mig(
    vet: _Vetting, where: str, instances: tuple[MigInstance, ...]
) -> tuple[MigInstance, ...] | None:
    kept, changed = [], False
    for instance in instances[:MAX_GPUS]:
        gi = vet.number(
            f"{where} MIG instance id", getattr(instance, "gpu_instance_id", None), INDEX, True
        )
        if not isinstance(instance, MigInstance) or gi is None:
            changed = True
            continue
        changes = vet.fields(instance, f"{where} MIG {gi}", _MIG_NUMBERS)
        changes.update(vet.texts(instance, f"{where} MIG {gi}", ("profile", "uuid")))
        kept.append(dataclasses.replace(instance, **changes) if changes else instance)
        changed = changed or bool(changes)
    changed = changed or len(instances) > MAX_GPUS
    return tuple(kept) if changed else None


def _processes(vet: _Vetting, processes: tuple[GpuProcess, ...]) -> tuple[GpuProcess, ...] | None:
    kept, changed = [], False
    for process in processes:
        if len(kept) == MAX_PROCESSES:
            vet.bad("processes", len(processes), f"reported (kept {MAX_PROCESSES})")
            changed = True
            break
        checked = _process(vet, process)
        changed = changed or checked is not process
        if checked is not None:
            kept.append(checked)
    return tuple(kept) if changed else None


def _process(vet: _Vetting, process: GpuProcess) -> GpuProcess | None:
    if not isinstance(process, GpuProcess):
        vet.bad("a process", process, "is not a process")
        return None
    pid = vet.number("process pid", process.pid, _PID, True)
    gpu = vet.number(f"process {pid} GPU", process.gpu, INDEX, True)
    if pid is None or gpu is None:
        return None  # a process that cannot be told apart or placed is left out, counted
    where = f"process {pid}"
    changes = vet.fields(process, where, _PROCESS_NUMBERS)
    changes.update(vet.texts(process, where, ("user", "command", "container")))
    changes.update(vet.texts(process, where, ("container_name",), MAX_NAME_CHARS))
    for name, check in (("job", _job), ("pod", _pod), ("load", _load)):
        value = getattr(process, name)
        checked = check(vet, where, value)
        if checked is not value:
            changes[name] = checked
    kind = vet.text(f"{where} kind", process.kind, 32)
    if kind != process.kind:
        changes["kind"] = kind or "compute"
    if pid is not process.pid or gpu is not process.gpu:  # a whole float becomes an int
        changes.update(pid=pid, gpu=gpu)
    return dataclasses.replace(process, **changes) if changes else process


_SLURM_TEXTS = tuple(f.name for f in dataclasses.fields(SlurmJob) if f.name != "job_id")


def _job(vet: _Vetting, where: str, job: SlurmJob | None) -> SlurmJob | None:
    """A process's Slurm job with its texts made safe; none where it is not one, or its id is
    not a job id (Slurm's are 32-bit)."""
    if job is None:
        return None
    if not isinstance(job, SlurmJob):
        vet.bad(f"{where} job", job, "is not a Slurm job")
        return None
    if vet.number(f"{where} job id", job.job_id, _SLURM_JOB_ID, True) is None:
        return None
    changes = vet.texts(job, f"{where} job {job.job_id}", _SLURM_TEXTS)
    return dataclasses.replace(job, **changes) if changes else job


def _pod(vet: _Vetting, where: str, pod: KubePod | None) -> KubePod | None:
    """A process's pod with its names made safe and cut; none where it is not one, or its uid
    is not a pod's uid."""
    if pod is None:
        return None
    if not isinstance(pod, KubePod):
        vet.bad(f"{where} pod", pod, "is not a pod")
        return None
    if not (isinstance(pod.uid, str) and _POD_UID.fullmatch(pod.uid)):
        vet.bad(f"{where} pod uid", pod.uid, "is not a pod's uid")
        return None
    names = ("namespace", "name", "container")
    changes = vet.texts(pod, f"{where} pod {pod.uid}", names, MAX_NAME_CHARS)
    return dataclasses.replace(pod, **changes) if changes else pod


def _load(vet: _Vetting, where: str, load: ProcessLoad | None) -> ProcessLoad | None:
    """A process's share of its GPU, each percentage out of 0 … 100 N/A."""
    return vet.part(load, ProcessLoad, f"{where} load", _LOAD_NUMBERS)


def _node(vet: _Vetting, node: SchedulerNode | None) -> SchedulerNode | None:
    """The host's scheduler node with its texts made safe and cut; none where it is not one or
    lacks a name or a state."""
    if node is None:
        return None
    if not isinstance(node, SchedulerNode):
        vet.bad("scheduler node", node, "is not a node")
        return None
    required = ("scheduler", "name", "state")
    changes = vet.texts(node, "scheduler node", required, MAX_NAME_CHARS)
    changes.update(vet.texts(node, "scheduler node", ("reason",)))
    missing = [name for name in required if not changes.get(name, getattr(node, name))]
    for name in missing:
        if getattr(node, name) in (None, ""):  # any other value was counted as not text
            vet.bad(f"scheduler node {name}", getattr(node, name), "is missing")
    if missing:
        return None  # a node without a name or a state says nothing
    return dataclasses.replace(node, **changes) if changes else node


def _topology(vet: _Vetting, topology: Topology | None) -> Topology | None:
    if topology is None:
        return None
    matrix = getattr(topology, "matrix", None)
    size = len(matrix) if isinstance(matrix, tuple) else -1
    if (
        not isinstance(topology, Topology)
        or not 0 <= size <= MAX_TOPOLOGY_GPUS
        or not all(isinstance(row, tuple) and len(row) == size for row in matrix)
    ):
        vet.bad("topology", f"{max(size, 0)} rows", "is not a square matrix of at most 32 GPUs")
        return None
    if all(_plain(row, 16) for row in matrix):
        cells = matrix  # the usual case: one search per row
    else:
        cells = tuple(tuple(vet.text("topology cell", c, 16) or "?" for c in row) for row in matrix)
    cpus = tuple(vet.text("topology CPU affinity", c, 256) for c in topology.cpu_affinity[:size])
    numa = tuple(
        vet.number("topology NUMA node", n, (0, 1 << 16), True)
        for n in topology.numa_affinity[:size]
    )
    if (
        all(map(_same, cells, matrix))
        and _same(cpus, topology.cpu_affinity)
        and _same(numa, topology.numa_affinity)
    ):
        return topology
    return Topology(cells, cpus, numa)


def _same(checked: tuple[Any, ...], original: tuple[Any, ...]) -> bool:
    """Whether checking kept every item as it was (the very objects: 0.0 became 0 otherwise)."""
    return len(checked) == len(original) and all(map(operator.is_, checked, original))


def _xids(vet: _Vetting, events: tuple[XidEvent, ...]) -> tuple[XidEvent, ...] | None:
    kept, changed = [], False
    for event in events[:MAX_PROCESSES]:
        if not isinstance(event, XidEvent):
            vet.bad("an XID event", event, "is not an event")
            changed = True
            continue
        xid = vet.number("XID", event.xid, (0, 1 << 16), True)
        gpu = vet.number(f"XID {xid} GPU", event.gpu, INDEX, True)
        time = vet.number(f"XID {xid} time", event.time, _TIME, False)
        if xid is None or time is None or (event.gpu is not None and gpu is None):
            changed = True
            continue
        message = vet.text(f"XID {xid} message", event.message) or ""
        checked = XidEvent(xid, gpu, time, message)
        changed = changed or checked != event
        kept.append(checked if checked != event else event)
    changed = changed or len(events) > MAX_PROCESSES
    return tuple(kept) if changed else None
