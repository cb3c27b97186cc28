"""nvidia-smi's ``-q -x`` XML and ``-q`` text dumps read into a `HostSnapshot`: both are read
into one tree of entries, then each GPU's section through its format's paths. `parse_dump` also
takes a ``--query-gpu`` CSV with its header line (`gpuconsole.telemetry.smi.query`).

The tree is bounded as it is built (`MAX_ENTRIES`, `MAX_DEPTH`) and its text by `MAX_OUTPUT_SIZE`;
`read_dump` reads a saved dump within that size, whatever the file is.
"""

from __future__ import annotations

import os
import re
import stat
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpuconsole.core.fields import FIELDS, Q_TEXT, Q_XML, paths_of
from gpuconsole.core.model import (
    THROTTLE_REASONS,
    EccCounts,
    GpuProcess,
    GpuState,
    HostSnapshot,
    MigInstance,
    PcieLink,
    RowRemap,
)
from gpuconsole.core.untrusted import MAX_GPUS, MAX_NOTES, vetted
from gpuconsole.telemetry.smi.query import is_query_header, parse_query_gpu_dump
from gpuconsole.telemetry.smi.values import (
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_OUTPUT_SIZE,
    SmiParseError,
    _flag,
    _folded,
    _integer,
    _kebab,
    _missing,
    _number,
    _process,
    _text,
    check_size,
    size_text,
)

T = TypeVar("T")


# --- the tree that -q text and -q -x XML both read into -----------------------------------------


def _norm(key: str) -> str:
    """A label or tag as a lookup key: "GPU T.Limit Temp" -> ``gpu_t_limit_temp``."""
    return re.sub(r"[^a-z0-9]+", "_", key.casefold()).strip("_")


@dataclass
class _Node:
    """One entry of a dump: a key, its value (``""`` for a section) and what it contains."""

    key: str
    value: str
    label: str = ""
    children: list[_Node] = field(default_factory=list)

    def find(self, path: str) -> _Node | None:
        """The entry at ``path`` ("Clocks/SM" or "clocks/sm_clock"): the first match each step.

        A ``*`` step stands for any one section, for a value that a driver moved one level down
        under a section whose name is not known in every format.
        """
        part, _, rest = path.partition("/")
        if part == "*":
            found = (child.find(rest) for child in self.children if child.children)
            return next(filter(None, found), None)
        key = _norm(part)
        child = next((child for child in self.children if child.key == key), None)
        if child is None or not rest:
            return child
        return child.find(rest)

    def raw(self, path: str) -> str | None:
        node = self.find(path)
        return None if node is None else node.value

    def descendants(self) -> Iterator[_Node]:
        for child in self.children:
            yield child
            yield from child.descendants()


def _check_tree(entries: int, depth: int) -> None:
    """SmiParseError once a tree being built passes `MAX_ENTRIES` entries or `MAX_DEPTH` levels."""
    if entries > MAX_ENTRIES:
        raise SmiParseError(f"more than {MAX_ENTRIES} entries: not a dump of one host")
    if depth > MAX_DEPTH:
        raise SmiParseError(f"nested deeper than {MAX_DEPTH} levels: not an nvidia-smi dump")


class _BoundedTreeBuilder(ET.TreeBuilder):
    """xml.etree's tree builder, stopped by `_check_tree` as the parser reads: a crafted dump is
    refused before its tree fills memory."""

    def __init__(self) -> None:
        super().__init__()
        self._entries = 0
        self._depth = 0

    def start(self, tag: str, attrs: dict[str, str]) -> ET.Element:
        self._entries += 1
        self._depth += 1
        _check_tree(self._entries, self._depth)
        return super().start(tag, attrs)

    def end(self, tag: str) -> ET.Element:
        self._depth -= 1
        return super().end(tag)


def _from_element(element: ET.Element) -> _Node:
    return _Node(
        key=_norm(element.tag),
        value=(element.text or "").strip(),
        label=element.tag,
        children=[_from_element(child) for child in element],
    )


_BANNER = "NVSMI LOG"
_KEY = re.compile(r"(?P<key>[^:]*?\S)\s*:(?=\s|\Z)")
"""A ``-q`` line's key and the colon after it, which whitespace or the line's end follows (so
"GPU 00000000:18:00.0" is a section label). The value is the rest, stripped: the lazy value
group of the regex this replaced made a value's inner spaces cost quadratic time."""


def _key_value(content: str) -> tuple[str, str]:
    """A stripped ``-q`` line as (key, value): ``Key : value``, ``Key :``, else a section label."""
    match = _KEY.match(content)
    if match is None:
        return content, ""
    return match["key"], content[match.end() :].strip()


def _text_tree(text: str) -> _Node:
    """``-q`` text as a tree, nested by indentation; sections are lines without ``key : value``."""
    if _BANNER not in text[:1000]:
        raise SmiParseError(f"not nvidia-smi -q text: no {_BANNER!r} banner at the top")
    root = _Node("", "")
    stack: list[tuple[int, _Node]] = [(-1, root)]
    entries = 0
    for line in text.splitlines():
        content = line.strip()
        if not content or _BANNER in content:
            continue
        key, value = _key_value(content)
        indent = len(line) - len(line.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        entries += 1
        _check_tree(entries, len(stack))
        node = _Node(_norm(key), value, label=key)
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


# --- one GPU's section, read through a format's paths -------------------------------------------

# Where each reading sits, per format; the first path that holds a value wins. The fields' own
# paths are the field table's; beside them, what a reading is computed from.
_XML_PATHS: dict[str, tuple[str, ...]] = {
    **paths_of(Q_XML),
    "tlimit_margin_c": ("temperature/gpu_temp_tlimit",),
    "slowdown_margin_c": ("temperature/gpu_temp_slow_tlimit_threshold",),
    "shutdown_margin_c": ("temperature/gpu_temp_max_tlimit_threshold",),
    "ecc_mode": ("ecc_mode/current_ecc",),
}
_TEXT_PATHS: dict[str, tuple[str, ...]] = {
    **paths_of(Q_TEXT),
    "tlimit_margin_c": ("Temperature/GPU T.Limit Temp",),
    "slowdown_margin_c": ("Temperature/GPU Slowdown T.Limit Temp",),
    "shutdown_margin_c": ("Temperature/GPU Shutdown T.Limit Temp",),
    "ecc_mode": ("ECC Mode/Current",),
}
_THRESHOLDS = ("slowdown_temperature_c", "shutdown_temperature_c")
_NUMBER_FIELDS = tuple(
    f.name for f in FIELDS if f.kind == "number" and f.part is None and f.name not in _THRESHOLDS
)
"""The plain numbers of a GPU's section; its thresholds are read by `_threshold`."""


# NVML's error strings that nvidia-smi prints in place of the readings of a GPU that is gone.
_LOST_MARKS = frozenset({"gpu is lost", "unknown error"})


@dataclass(frozen=True)
class _Gpu:
    """One GPU's section of a dump, read through its format's paths."""

    node: _Node
    paths: Mapping[str, tuple[str, ...]]
    index: int
    bus_id: str | None
    """The bus id that heads the section (the XML ``id``, the text's ``GPU <bus id>`` line)."""
    notes: list[str]
    """The dump's bad values so far: what nvidia-smi wrote instead of a value, one line each."""

    def section(self, key: str) -> _Node | None:
        return next(filter(None, map(self.node.find, self.paths[key])), None)

    def value(self, key: str) -> str | None:
        values = (self.node.raw(path) for path in self.paths[key])
        return next((v for v in values if not _missing(v)), None)

    def parse(self, text: str | None, parser: Callable[[str | None], T], where: str) -> T | None:
        """``text`` read by ``parser``; None, with a note, where it is not what the field holds
        (``Requested functionality has been deprecated``, ``abc %``): that field alone is N/A."""
        try:
            return parser(text)
        except ValueError as error:
            note = f"GPU {self.index} {where}: {error}"
            if note not in self.notes:  # a value read twice (the temperature) is one bad value
                self.notes.append(note)
            return None

    def read(self, key: str, parser: Callable[[str | None], T]) -> T | None:
        return self.parse(self.value(key), parser, self.paths[key][0])

    @property
    def lost(self) -> bool:
        """Its utilization and memory both read as NVML's "GPU is lost" (or "Unknown Error")."""
        marks = (
            self.node.raw(self.paths[key][0]) for key in ("utilization_pct", "memory_total_mib")
        )
        return all(mark is not None and _folded(mark) in _LOST_MARKS for mark in marks)


def _gpu_state(gpu: _Gpu) -> GpuState:
    identity = {
        "name": gpu.read("name", _text),
        "uuid": gpu.read("uuid", _text),
        "serial": gpu.read("serial", _text),
        "vbios_version": gpu.read("vbios_version", _text),
        "pci_bus_id": gpu.read("pci_bus_id", _text) or _text(gpu.bus_id),
    }
    if gpu.lost:
        return GpuState(gpu.index, **identity, lost=True)
    numbers = {key: gpu.read(key, _number) for key in _NUMBER_FIELDS}
    return GpuState(
        gpu.index,
        **identity,
        **numbers,
        slowdown_temperature_c=_threshold(gpu, "slowdown"),
        shutdown_temperature_c=_threshold(gpu, "shutdown"),
        pstate=gpu.read("pstate", _text),
        throttle_reasons=_throttle(gpu),
        ecc=_ecc(gpu),
        remap=_remap(gpu),
        retired_pages_pending=gpu.read("retired_pages_pending", _flag),
        recovery_action=gpu.read("recovery_action", _kebab),
        pcie=_pcie(gpu),
        persistence_mode=gpu.read("persistence_mode", _flag),
        compute_mode=gpu.read("compute_mode", _text),
        mig_mode=gpu.read("mig_mode", _flag),
        mig_instances=_mig_instances(gpu),
    )


def _mig_instances(gpu: _Gpu) -> tuple[MigInstance, ...]:
    """The MIG devices a dump lists (XML ``mig_devices/mig_device``, text "MIG Devices/MIG
    Device"): their GPU and compute instance ids and memory. A dump names no profile or UUID."""
    section = gpu.section("mig_instances")
    # driver 590's -q text lists them right under the GPU, without a "MIG Devices" section
    entries = section.children if section else gpu.node.children
    devices = (_mig_instance(gpu, device) for device in entries if device.key == "mig_device")
    return tuple(device for device in devices if device is not None)


def _mig_instance(gpu: _Gpu, device: _Node) -> MigInstance | None:
    """One MIG device; None, with a note, where it names no GPU instance (nothing tells it
    apart from the others)."""
    instance = gpu.parse(device.raw("gpu_instance_id"), _integer, "MIG device GPU instance ID")
    if instance is None:
        gpu.notes.append(f"GPU {gpu.index}: a MIG device without a GPU instance ID")
        return None
    return MigInstance(
        gpu_instance_id=instance,
        compute_instance_id=gpu.parse(
            device.raw("compute_instance_id"), _integer, "MIG device compute instance ID"
        ),
        profile=None,
        memory_total_mib=gpu.parse(
            device.raw("fb_memory_usage/total"), _number, "MIG device FB memory total"
        ),
        memory_used_mib=gpu.parse(
            device.raw("fb_memory_usage/used"), _number, "MIG device FB memory used"
        ),
    )


def _threshold(gpu: _Gpu, kind: str) -> float | None:
    """The temperature at which the GPU starts to slow down (``kind`` "slowdown") or shuts
    down ("shutdown").

    Older drivers print it; newer ones (the H200's 580) print margins to T.Limit instead: the
    current margin and the margin at which the GPU acts. It acts when the margin falls to that
    threshold, which is when the temperature reaches the value returned.
    """
    absolute = gpu.read(f"{kind}_temperature_c", _number)
    if absolute is not None:
        return absolute
    temp = gpu.read("temperature_c", _number)
    margin = gpu.read("tlimit_margin_c", _number)
    threshold = gpu.read(f"{kind}_margin_c", _number)
    if temp is None or margin is None or threshold is None:
        return None
    return temp + margin - threshold


_REASON_KEYS = {
    "gpu_idle": "gpu-idle",
    "idle": "gpu-idle",
    "applications_clocks_setting": "applications-clocks",
    "sw_power_cap": "sw-power-cap",
    "hw_slowdown": "hw-slowdown",
    "sync_boost": "sync-boost",
    "sw_thermal_slowdown": "sw-thermal",
    "hw_thermal_slowdown": "hw-thermal",
    "hw_power_brake_slowdown": "hw-power-brake",
    "display_clocks_setting": "display-clocks",
    "display_clock_setting": "display-clocks",
}
_REASON_PREFIX = re.compile(r"^clocks_(?:event|throttle)_reason_")


def _throttle(gpu: _Gpu) -> tuple[str, ...] | None:
    """The active clock-event reasons in NVML's bit order; None when none is reported.

    The text nests "HW Thermal Slowdown" under "HW Slowdown", hence every descendant.
    """
    section = gpu.section("throttle_reasons")
    states: dict[str, bool | None] = {}
    for node in section.descendants() if section else ():
        code = _REASON_KEYS.get(_REASON_PREFIX.sub("", node.key))
        if code is not None:
            states[code] = gpu.parse(node.value, _flag, node.label)
    if all(state is None for state in states.values()):
        return None
    return tuple(code for code in THROTTLE_REASONS if states.get(code))


def _ecc(gpu: _Gpu) -> EccCounts | None:
    if gpu.read("ecc_mode", _flag) is False:
        return None
    counts = EccCounts(
        *(
            _ecc_total(gpu, key, uncorrectable)
            for key in ("ecc.volatile_corrected", "ecc.aggregate_corrected")
            for uncorrectable in (False, True)
        )
    )
    return None if counts == EccCounts() else counts


def _ecc_total(gpu: _Gpu, key: str, uncorrectable: bool) -> int | None:
    """The sum of the SRAM and DRAM parts (or the older single/double bit total) as given."""
    section = gpu.section(key)
    if section is None:
        return None
    legacy = section.find("double_bit/total" if uncorrectable else "single_bit/total")
    parts = (
        [legacy] if legacy else [n for n in section.children if _ecc_kind(n.key) is uncorrectable]
    )
    counts = [gpu.parse(part.value, _integer, part.label) for part in parts]
    known = [count for count in counts if count is not None]
    return sum(known) if known else None


def _ecc_kind(key: str) -> bool | None:
    """True for an uncorrectable count, False for a correctable one, None for anything else."""
    if "uncorrectable" in key:
        return True
    return False if key.endswith("correctable") else None


def _remap(gpu: _Gpu) -> RowRemap | None:
    remap = RowRemap(
        correctable=gpu.read("remap.correctable", _integer),
        uncorrectable=gpu.read("remap.uncorrectable", _integer),
        pending=gpu.read("remap.pending", _flag),
        failure=gpu.read("remap.failure", _flag),
    )
    return None if remap == RowRemap() else remap


def _pcie(gpu: _Gpu) -> PcieLink | None:
    link = PcieLink(
        gen=gpu.read("pcie.gen", _integer),
        width=gpu.read("pcie.width", _integer),
        max_gen=gpu.read("pcie.max_gen", _integer),
        max_width=gpu.read("pcie.max_width", _integer),
    )
    return None if link == PcieLink(None, None, None, None) else link


def _xml_processes(node: _Node, gpu: int, notes: list[str]) -> list[GpuProcess]:
    section = node.find("processes")
    found = (
        _process(
            gpu,
            info.raw("pid"),
            info.raw("type"),
            info.raw("process_name"),
            info.raw("used_memory"),
            info.raw("gpu_instance_id"),
            notes,
        )
        for info in (section.children if section else ())
        if info.key == "process_info"
    )
    return [process for process in found if process is not None]


def _text_processes(node: _Node, gpu: int, notes: list[str]) -> list[GpuProcess]:
    """-q text lists each process as "GPU instance ID", "Compute instance ID", then "Process ID"
    holding its type, name and memory, all at one level."""
    section = node.find("Processes")
    processes, instance = [], None
    for entry in section.children if section else ():
        if entry.key == "gpu_instance_id":
            instance = entry.value
        elif entry.key == "process_id":
            fields = (entry.raw("Type"), entry.raw("Name"), entry.raw("Used GPU Memory"))
            process = _process(gpu, entry.value, *fields, instance, notes)
            if process is not None:
                processes.append(process)
    return processes


def _snapshot(
    sections: Sequence[tuple[_Node, str | None]],
    paths: Mapping[str, tuple[str, ...]],
    processes_of: Callable[[_Node, int, list[str]], list[GpuProcess]],
    versions: tuple[str | None, str | None],
    attached: int | None,
    host: str,
    time: float,
) -> HostSnapshot:
    """GPUs are numbered in the order the dump lists them, as nvidia-smi numbers them.

    A dump of more GPUs than a host can have is refused before they are read (~0.2 ms each).
    One of fewer GPUs than its "Attached GPUs" line (``-i``) keeps that count in the snapshot.
    """
    if len(sections) > MAX_GPUS:
        raise SmiParseError(
            f"{len(sections)} GPU sections, more than the {MAX_GPUS} a host can have"
        )
    gpus, processes, notes = [], [], []
    for index, (node, bus_id) in enumerate(sections):
        gpu = _gpu_state(_Gpu(node, paths, index, bus_id, notes))
        gpus.append(gpu)
        if not gpu.lost:
            processes += processes_of(node, index, notes)
    snapshot = HostSnapshot(
        host=host,
        time=time,
        gpus=tuple(gpus),
        processes=tuple(processes),
        driver_version=_version(versions[0]),
        cuda_version=_version(versions[1]),
        source="nvidia-smi",
        attached_gpus=attached if attached is not None and attached > len(gpus) else None,
        bad_values=len(notes),
        bad_value_notes=tuple(notes[:MAX_NOTES]),
    )
    return vetted(snapshot)


def _attached(text: str | None) -> int | None:
    """The "Attached GPUs" count; SmiParseError where it is not one."""
    try:
        return _integer(text)
    except ValueError:
        raise SmiParseError(f"Attached GPUs reads {_text(text)!r}, not a count") from None


def _check_complete(count: int, attached: int | None, last_section_whole: bool) -> None:
    """SmiParseError for a dump cut off before its end: no GPU section at all, or fewer than its
    "Attached GPUs" count where the last one is not whole. A whole dump of fewer GPUs is one made
    with ``-i``; a cut-off one is told apart by its last section (`parse_xml`, `parse_q_text`)."""
    if count == 0:
        raise SmiParseError("incomplete: no GPU section (cut off before the first GPU)")
    if attached is not None and count < attached and not last_section_whole:
        raise SmiParseError(
            f"incomplete: it announces {attached} GPUs (Attached GPUs) but holds {count}, "
            "the last one cut off"
        )


_DEPRECATED_TAIL = re.compile(r"\s*\[deprecated;[^\]]*\]?\s*\Z", re.IGNORECASE)
"""Driver 610's note after a version: "616.92 [Deprecated; will be removed in CUDA 14.0. ...]"."""


def _version(text: str | None) -> str | None:
    return None if text is None else _text(_DEPRECATED_TAIL.sub("", text))


# --- -q -x XML, -q text, either ------------------------------------------------------------------


def _has_internal_subset(text: str) -> bool:
    """Whether a ``<!DOCTYPE`` opens a ``[`` before its ``>``; each stretch is scanned once."""
    return any("[" in part.partition(">")[0] for part in text.split("<!DOCTYPE")[1:])


def _xml_root(text: str) -> ET.Element:
    """The dump's element tree; SmiParseError for XML that is not well-formed or not bounded."""
    parser = ET.XMLParser(target=_BoundedTreeBuilder())
    try:
        parser.feed(text)
        return parser.close()
    except ET.ParseError as error:
        raise SmiParseError(f"not well-formed XML ({error})") from None
    except UnicodeEncodeError as error:  # a lone surrogate, as JSON's "\ud800" decodes
        raise SmiParseError(f"not text: {error.reason} at character {error.start}") from None


_XML_ATTACHED = re.compile(r"<attached_gpus>\s*(\d{1,4})\s*</attached_gpus>")


def _cut_off_hint(text: str) -> str:
    """For XML that does not parse: how many GPUs it announces and how many sections begin,
    which tells a dump cut off mid-GPU (the usual cause) from one that is not nvidia-smi's."""
    attached = _XML_ATTACHED.search(text[:4096])
    if attached is None:
        return ""
    begun = text.count("<gpu id=")
    return f"; cut off? it announces {attached[1]} GPUs and {begun} GPU sections begin"


def parse_xml(text: str, host: str, time: float) -> HostSnapshot:
    """An ``nvidia-smi -q -x`` dump as a snapshot of ``host`` at ``time``.

    nvidia-smi names an external DTD (``nvsmi_device_v13.dtd``), which is not fetched. A DOCTYPE
    with an internal subset or any ENTITY declaration is refused: nvidia-smi writes neither, and
    xml.etree expands internal entities (only expat's amplification limit, after megabytes, stops
    a "billion laughs").
    """
    check_size(text, "the XML")
    if "<!ENTITY" in text or _has_internal_subset(text):
        raise SmiParseError(
            "refusing XML with ENTITY declarations or an internal DTD subset "
            "(nvidia-smi writes neither)"
        )
    try:
        root = _xml_root(text)
    except SmiParseError as error:
        raise SmiParseError(f"{error}{_cut_off_hint(text)}") from None
    if root.tag != "nvidia_smi_log":
        raise SmiParseError(f"not an nvidia-smi -q -x dump: its root is <{root.tag}>")
    sections = [(_from_element(gpu), gpu.get("id")) for gpu in root.iterfind("gpu")]
    versions = (
        root.findtext("kmd_version") or root.findtext("driver_version"),
        root.findtext("cuda_version"),
    )
    attached = _attached(root.findtext("attached_gpus"))
    # XML that parses is whole: a cut-off dump fails as XML first (`_xml_root`)
    _check_complete(len(sections), attached, last_section_whole=True)
    return _snapshot(sections, _XML_PATHS, _xml_processes, versions, attached, host, time)


_GPU_SECTION = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")


def parse_q_text(text: str, host: str, time: float) -> HostSnapshot:
    """A plain ``nvidia-smi -q`` dump (also ``-q -d ...``: the fields it holds) as a snapshot."""
    check_size(text, "the text")
    root = _text_tree(text)
    sections = [
        (node, match[1]) for node in root.children if (match := _GPU_SECTION.fullmatch(node.label))
    ]
    versions = (root.raw("KMD Version") or root.raw("Driver Version"), root.raw("CUDA Version"))
    attached = _attached(root.raw("Attached GPUs"))
    # a full -q section lists its "Processes"; a -q -d dump (no such entry) must hold every GPU
    last = sections[-1][0] if sections else None
    last_whole = last is not None and last.find("Processes") is not None
    _check_complete(len(sections), attached, last_whole)
    if last is not None and not last_whole and last.find("Product Name") is not None:
        # a full -q section (it names its product) cut off before its "Processes"
        raise SmiParseError(
            f"incomplete: GPU {len(sections) - 1}'s section is cut off before its end"
        )
    return _snapshot(sections, _TEXT_PATHS, _text_processes, versions, attached, host, time)


def parse_dump(text: str, host: str, time: float) -> HostSnapshot:
    """A saved dump, ``-q -x`` XML, ``-q`` text or ``--query-gpu`` CSV with its header line,
    told apart by how it starts."""
    check_size(text, "the dump")
    head = text.lstrip("\ufeff \t\r\n")
    first_line = head.partition("\n")[0].strip()
    if head.startswith("<"):
        return parse_xml(head, host, time)
    if _BANNER in first_line:
        return parse_q_text(head, host, time)
    if is_query_header(first_line):
        return parse_query_gpu_dump(head, host, time)
    if not first_line:
        raise SmiParseError("the dump is empty")
    raise SmiParseError(
        f"neither nvidia-smi -q -x XML nor -q text: it starts with {first_line[:60]!r}"
    )


_SIZE_BOUND = (
    f"the {size_text(MAX_OUTPUT_SIZE)} a dump may be (nvidia-smi -q -x of 8 GPUs is ~220 KB)"
)


def read_dump(path: Path) -> str:
    """A saved dump's text, never more than `MAX_OUTPUT_SIZE` bytes read, whatever ``path`` is: a
    file whose size says it is too large is refused unread, and a pipe or device (``/dev/zero``)
    is read one byte past the bound at most.

    OSError when it cannot be read; SmiParseError when it is too large or not text. Bytes that are
    not UTF-8 become U+FFFD (a process name on the host can hold any bytes); a NUL byte, which no
    dump holds, means UTF-16 or binary.
    """
    with path.open("rb") as dump:
        status = os.fstat(dump.fileno())
        if stat.S_ISREG(status.st_mode) and status.st_size > MAX_OUTPUT_SIZE:
            raise SmiParseError(f"{size_text(status.st_size)}, larger than {_SIZE_BOUND}")
        data = dump.read(MAX_OUTPUT_SIZE + 1)
    if len(data) > MAX_OUTPUT_SIZE:
        raise SmiParseError(f"it holds more than {_SIZE_BOUND}")
    nul = data.find(b"\0")
    if nul >= 0:
        raise SmiParseError(f"not a text dump: a NUL byte at offset {nul} (UTF-16, or binary)")
    return data.decode("utf-8", errors="replace")
