"""nvidia-smi's ``--query-gpu`` and ``--query-compute-apps`` CSV read into GPU states and
processes, and the fields to ask for."""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpuconsole.core.fields import FIELDS
from gpuconsole.core.model import EccCounts, GpuProcess, GpuState, HostSnapshot, PcieLink
from gpuconsole.core.untrusted import MAX_NOTES, vetted
from gpuconsole.telemetry.smi.values import (
    MAX_ENTRIES,
    SmiParseError,
    _flag,
    _integer,
    _number,
    _process,
    _reason_mask,
    _text,
    check_size,
)

# --- CSV -----------------------------------------------------------------------------------------

_PARSERS: dict[str, Callable[[str | None], object]] = {
    "text": _text,
    "code": _text,
    "number": _number,
    "whole": _integer,
    "flag": _flag,
    "reasons": _reason_mask,
}
# --query-gpu column -> (GpuState field, or "ecc."/"pcie." + a field of EccCounts/PcieLink; its
# parser), as the field table names the columns
_GPU_CSV: dict[str, tuple[str, Callable[[str | None], object]]] = {
    f.query_gpu: (f.name, _PARSERS[f.kind]) for f in FIELDS if f.query_gpu and f.kind in _PARSERS
}
# Other names nvidia-smi accepts for the same fields (older drivers or short forms).
_GPU_CSV_ALIASES = {
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.max.mem": "clocks.max.memory",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "enforced.power.limit": "power.limit",
    "clocks.applications.gr": "clocks.applications.graphics",
    "clocks.applications.mem": "clocks.applications.memory",
}
QUERY_GPU_FIELDS: tuple[str, ...] = tuple(_GPU_CSV)
"""The ``--query-gpu`` fields that cover what the model holds and nvidia-smi can give."""
QUERY_COMPUTE_APPS_FIELDS: tuple[str, ...] = ("pid", "process_name", "gpu_uuid", "used_gpu_memory")

_FIELD_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(?:\s*\[[^\]]*\])?")
"""A header cell: a field name as nvidia-smi spells it (``pci.baseClass``), and its unit."""
_KNOWN_FIELDS = frozenset(
    {*_GPU_CSV, *_GPU_CSV_ALIASES, *QUERY_COMPUTE_APPS_FIELDS, "driver_version", "gpu_bus_id"}
)


def _header(cells: Sequence[str]) -> list[str] | None:
    """The field names of a header line; None for a row of values.

    Every cell must read as a field name, and one must be a known field or dotted as most are:
    a row of words ("P0, Default") is values.
    """
    matches = [_FIELD_NAME.fullmatch(cell.strip()) for cell in cells]
    names = [match[1] for match in matches if match]
    if len(names) < len(matches) or not names:
        return None
    if not any("." in name or name.casefold() in _KNOWN_FIELDS for name in names):
        return None
    return names


def is_query_header(line: str) -> bool:
    """Whether ``line`` is the header line ``--query-gpu``/``--query-compute-apps`` CSV starts
    with."""
    return len(line) <= 10_000 and _header(line.split(",")) is not None


def _csv_records(text: str, fields: Sequence[str] | None) -> list[dict[str, str]]:
    """Rows as {field: raw value}; the header line, when there is one, names the fields."""
    rows = _csv_rows(text)
    if not rows:
        return []
    header = _header(rows[0])
    if header is not None:
        fields = header
        rows = rows[1:]
    elif fields is None:
        start = ", ".join(rows[0])[:60]
        raise SmiParseError(
            f"CSV without a header line (it starts with {start!r}): name its fields"
        )
    names = list(fields)
    for number, row in enumerate(rows, 1):
        if len(row) != len(names):
            raise SmiParseError(f"CSV row {number} has {len(row)} values for {len(names)} fields")
    return [dict(zip(names, row, strict=True)) for row in rows]


def _csv_rows(text: str) -> list[list[str]]:
    """The non-empty rows, at most `MAX_ENTRIES` of them."""
    check_size(text, "the CSV")
    rows = []
    try:
        for row in csv.reader(text.splitlines(), skipinitialspace=True):
            if row:
                rows.append(row)
            if len(rows) > MAX_ENTRIES:
                raise SmiParseError(f"CSV of more than {MAX_ENTRIES} rows: not one host's")
    except csv.Error as error:  # a field over csv's own limit (128 KiB)
        raise SmiParseError(f"not nvidia-smi CSV: {error}") from None
    return rows


def parse_query_gpu_csv(
    text: str, fields: Sequence[str] | None = None, notes: list[str] | None = None
) -> list[GpuState]:
    """``--query-gpu=... --format=csv`` (units and header optional) as GPU states.

    Without a header line (``noheader``) ``fields`` names the columns. Fields the model has no
    place for are skipped; a GPU without an ``index`` column is numbered by its row. A value
    that is not what its column holds is N/A, with a note in ``notes``.
    """
    records = _csv_records(text, fields)
    kept = [] if notes is None else notes
    return [_csv_gpu(record, row, kept) for row, record in enumerate(records)]


def _csv_gpu(record: Mapping[str, str], row: int, notes: list[str]) -> GpuState:
    values: dict[str, Any] = {"index": row}
    for name, raw in record.items():
        key = name.casefold()
        spec = _GPU_CSV.get(_GPU_CSV_ALIASES.get(key, key))
        if spec is None:
            continue
        target, parser = spec
        try:
            values[target] = parser(raw)
        except ValueError as error:
            notes.append(f"GPU row {row} {name}: {error}")
            if target == "index":
                values[target] = row
    ecc = EccCounts(**_take(values, "ecc."))
    pcie = replace(PcieLink(None, None, None, None), **_take(values, "pcie."))
    return GpuState(
        **values,
        ecc=None if ecc == EccCounts() else ecc,
        pcie=None if pcie == PcieLink(None, None, None, None) else pcie,
    )


def parse_query_gpu_dump(text: str, host: str, time: float) -> HostSnapshot:
    """A saved ``--query-gpu=... --format=csv`` (its header line names the fields) as a snapshot
    of ``host`` at ``time``; the driver version is read from a ``driver_version`` column."""
    records = _csv_records(text, None)
    if not records:
        raise SmiParseError("a CSV header without GPU rows")
    names = {name.casefold() for name in records[0]}
    if not any(_GPU_CSV_ALIASES.get(name, name) in _GPU_CSV for name in names):
        raise SmiParseError("a CSV of no --query-gpu field this reads: not --query-gpu output")
    notes: list[str] = []
    gpus = tuple(_csv_gpu(record, row, notes) for row, record in enumerate(records))
    drivers = {_text(record.get("driver_version")) for record in records} - {None}
    snapshot = HostSnapshot(
        host=host,
        time=time,
        gpus=gpus,
        driver_version=drivers.pop() if len(drivers) == 1 else None,
        source="nvidia-smi",
        bad_values=len(notes),
        bad_value_notes=tuple(notes[:MAX_NOTES]),
    )
    return vetted(snapshot)


def _take(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Remove the entries under ``prefix`` from ``values``; return them without it."""
    keys = [key for key in values if key.startswith(prefix)]
    return {key.removeprefix(prefix): values.pop(key) for key in keys}


def gpu_index_map(gpus: Iterable[GpuState]) -> dict[str, int]:
    """Each GPU's UUID and PCI bus id -> its index, for `parse_compute_apps_csv`."""
    keys: dict[str, int] = {}
    for gpu in gpus:
        keys.update({key: gpu.index for key in (gpu.uuid, gpu.pci_bus_id) if key})
    return keys


def parse_compute_apps_csv(
    text: str,
    gpu_index: Mapping[str, int],
    fields: Sequence[str] | None = None,
    notes: list[str] | None = None,
) -> list[GpuProcess]:
    """``--query-compute-apps=... --format=csv`` as processes.

    The rows name their GPU by ``gpu_uuid`` or ``gpu_bus_id``; ``gpu_index`` maps either to the
    GPU's index (`gpu_index_map` builds it from the GPUs read).
    """
    indices = {key.casefold(): index for key, index in gpu_index.items()}
    kept = [] if notes is None else notes
    processes = []
    for record in _csv_records(text, fields):
        key = _text(record.get("gpu_uuid")) or _text(record.get("gpu_bus_id"))
        if key is None or key.casefold() not in indices:
            raise SmiParseError(f"process {record.get('pid')!r} is on GPU {key!r}, not one read")
        used = record.get("used_gpu_memory", record.get("used_memory"))
        name = record.get("process_name")
        process = _process(indices[key.casefold()], record.get("pid"), None, name, used, None, kept)
        if process is not None:
            processes.append(process)
    return processes
