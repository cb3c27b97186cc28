"""Every path that carries GPU readings, held to the one field table (`gpuconsole.core.fields`).

Each path's reader (or writer and reader) is run on a full reading or on the real dumps of
tests/fixtures/nvidia-smi/, and each field of the table must come out, or the table must say why
that path cannot carry it. `missing` is the check; `test_a_field_added_to_one_path_only_fails`
shows it failing for a field that only one path knows.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from nvml_standin import StandinLibrary, h200, in_mig_mode, mig_device

from gpuconsole.core import fields
from gpuconsole.core.fields import FIELDS, Field
from gpuconsole.core.model import (
    EccCounts,
    GpuState,
    HostSnapshot,
    MigInstance,
    PcieLink,
    RowRemap,
)
from gpuconsole.fleet.record import codec
from gpuconsole.telemetry import dcgm, prometheus
from gpuconsole.telemetry.agent import GPU_KEYS, Nvml, SimGpus
from gpuconsole.telemetry.smi import QUERY_GPU_FIELDS, parse_dump, parse_query_gpu_csv, read_dump
from gpuconsole.telemetry.wire import decode_nvml

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"

# A value of each kind, as a full reading holds it.
_TEXTS = {"pstate": "P0", "compute_mode": "Default", "recovery_action": "gpu-reset"}


def _sample(spec: Field) -> Any:
    if spec.kind in ("number", "whole"):
        assert spec.bounds is not None, spec.name
        low, high = spec.bounds
        value = low + 1 if high - low > 2 else low
        return float(value) if spec.kind == "number" else int(value)
    return {
        "text": "x",
        "code": _TEXTS.get(spec.name),
        "flag": True,
        "reasons": ("sw-power-cap",),
        "instances": (MigInstance(1, 0, "1g.18gb", 16384.0, 10.0, "MIG-x"),),
        "lost": False,
    }[spec.kind]


def full_gpu() -> GpuState:
    """A GPU with every field of the table given a value in its range."""
    own: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {"ecc": {}, "remap": {}, "pcie": {}}
    for spec in FIELDS:
        target = own if spec.part is None else parts[spec.part]
        target[spec.attribute] = _sample(spec)
    own["index"] = 0
    own["memory_used_mib"] = own["memory_total_mib"]
    return GpuState(
        **own,
        ecc=EccCounts(**parts["ecc"]),
        remap=RowRemap(**parts["remap"]),
        pcie=PcieLink(**parts["pcie"]),
    )


def value_of(gpu: GpuState, name: str) -> Any:
    part, _, attribute = name.rpartition(".")
    holder = getattr(gpu, part) if part else gpu
    return None if holder is None else getattr(holder, attribute)


def present(value: Any) -> bool:
    return value is not None and value != ()


_STRUCTURE = ("index", "lost")
"""Not readings a path may lack: every GPU has its place, and a path that loses it says so."""


def missing(path: str, read: Iterable[str], table: Iterable[Field] = FIELDS) -> list[str]:
    """The fields of ``table`` that ``path`` did not yield (``read``) although the table does not
    say why it cannot, and those it yielded although the table says it cannot."""
    got = set(read)
    problems = []
    for spec in table:
        if path in spec.absent and spec.name in got:
            problems.append(
                f"{spec.name}: {path} reads it, yet the table says {spec.absent[path]!r}"
            )
        elif path not in spec.absent and spec.name not in got and spec.name not in _STRUCTURE:
            problems.append(f"{spec.name}: {path} neither reads it nor says why not")
    return problems


def read_fields(gpus: Iterable[GpuState]) -> set[str]:
    """The table's fields that any of ``gpus`` has a value for."""
    return {spec.name for gpu in gpus for spec in FIELDS if present(value_of(gpu, spec.name))}


# --- the table itself ----------------------------------------------------------------------------


def test_the_table_has_every_field_of_the_model_once() -> None:
    names = [spec.name for spec in FIELDS]
    assert len(names) == len(set(names))
    assert set(names) == set(fields.gpu_field_names())


def test_every_number_has_a_unit_and_a_range_and_every_absence_a_known_path() -> None:
    for spec in FIELDS:
        assert set(spec.absent) <= set(fields.PATHS), spec.name
        if spec.kind in ("number", "whole"):
            assert spec.bounds is not None and spec.bounds[0] < spec.bounds[1], spec.name
        if spec.kind == "number":
            assert spec.unit, spec.name


def test_a_full_reading_passes_the_boundary_unchanged() -> None:
    from gpuconsole.core.untrusted import vetted

    snapshot = HostSnapshot("h", 1.0, (full_gpu(),))
    assert vetted(snapshot) is snapshot


# --- NVML: the one reader, in this process and in the agent on a host ---------------------------


def test_the_nvml_reader_sends_and_the_decoder_reads_every_field() -> None:
    """Two GPUs answering every call: one with a fan, one in MIG mode (no utilization then)."""
    fanned, partitioned = h200(0), h200(1)
    fanned["nvmlDeviceGetFanSpeed"] = 40
    partitioned["nvmlDeviceGetFanSpeed"] = 40
    in_mig_mode(partitioned)
    library = StandinLibrary([fanned, partitioned])
    library.migs[1] = [mig_device(1, "3g.71gb", 71_424, 30_000)]
    entries, listed = Nvml(library).read()
    sent = {key for entry in entries for key in entry}
    keys = {spec.wire_key if spec.part is None else spec.part for spec in FIELDS}
    assert sent == keys == set(GPU_KEYS)
    gpus, _, notes = decode_nvml(entries, listed)
    assert notes == []
    assert missing(fields.NVML, read_fields(gpus)) == []


def test_the_agents_simulated_gpus_send_every_key_an_nvml_one_does() -> None:
    """Simulated H100s lack what a real one does (tests/fixtures/h100): no fan, no page
    retirement, no MIG instances outside MIG mode."""
    gpus, _ = SimGpus(3, "h").read(1_767_225_600.0)
    assert all(set(gpu) == set(GPU_KEYS) for gpu in gpus)
    decoded, _, notes = decode_nvml(gpus, [])
    assert notes == []
    lacking = {"fan_pct", "retired_pages_pending", "mig_instances"}
    assert read_fields(decoded) == {spec.name for spec in FIELDS} - lacking


# --- query-gpu: the agent's smi mode, its -lms stream, saved CSV -------------------------------

_RAW = {"number": "12", "whole": "3", "text": "x", "flag": "Enabled", "reasons": "0x4"}
_RAW_CODES = {"pstate": "P0", "compute_mode": "Default"}


def test_query_gpu_reads_every_field_it_is_asked_for() -> None:
    by_column = {spec.query_gpu: spec for spec in FIELDS if spec.query_gpu}
    assert set(QUERY_GPU_FIELDS) == set(by_column)
    cells = [_RAW_CODES.get(by_column[c].name) or _RAW[by_column[c].kind] for c in QUERY_GPU_FIELDS]
    text = ", ".join(QUERY_GPU_FIELDS) + "\n" + ", ".join(cells) + "\n"
    notes: list[str] = []
    gpus = parse_query_gpu_csv(text, notes=notes)
    assert notes == []
    assert missing(fields.QUERY_GPU, read_fields(gpus)) == []


# --- the dumps: every path the table names is found in a real dump --------------------------------


def _dumps(suffixes: tuple[str, ...]) -> list[HostSnapshot]:
    read = []
    for path in sorted(FIXTURES.iterdir()):
        if path.suffix in suffixes and not path.name.startswith("h200-q-perf"):
            try:
                read.append(parse_dump(read_dump(path), host="h", time=0.0))
            except ValueError:
                continue  # a dump refused as cut off: tests/test_field_fixtures.py says which
    return read


@pytest.mark.parametrize(
    ("path", "suffixes"), [(fields.Q_XML, (".xml",)), (fields.Q_TEXT, (".txt",))]
)
def test_the_dumps_read_every_field_somewhere_in_the_real_ones(
    path: str, suffixes: tuple[str, ...]
) -> None:
    snapshots = _dumps(suffixes)
    assert len(snapshots) >= 3
    got = read_fields(gpu for snapshot in snapshots for gpu in snapshot.gpus)
    assert missing(path, got) == []


# --- Prometheus: what the exporter writes, the Prometheus source reads back ---------------------


def test_prometheus_carries_what_the_table_says_both_ways() -> None:
    gpu = full_gpu()
    written = {m.field: m.value(gpu) for m in dcgm.BY_FIELD.values()}
    values = {key: value for key, value in written.items() if value is not None}
    labels = {"modelName": gpu.name, "UUID": gpu.uuid, "pci_bus_id": gpu.pci_bus_id}
    back = prometheus._gpu(gpu.index, values, {}, labels)
    got = {
        spec.name
        for spec in FIELDS
        if present(value_of(back, spec.name))
        and value_of(back, spec.name) == value_of(gpu, spec.name)
    }
    assert missing(fields.PROMETHEUS, got) == []
    keys = {spec.prometheus for spec in FIELDS if spec.prometheus}
    assert keys - set(dcgm.BY_FIELD) <= {"gpu", "modelName", "UUID", "pci_bus_id"}


# --- the recording keeps every field ------------------------------------------------------------


def test_the_recording_gives_back_every_field() -> None:
    snapshot = HostSnapshot("h", 1_767_225_600.0, (full_gpu(),), source="nvml")
    row = codec.HostEncoder().encode(snapshot)
    back = codec.Decoder(json.loads(json.dumps(codec.schema()))).keyframe("h", row.t, row.data)
    assert back.gpus == snapshot.gpus


# --- the check can fail ---------------------------------------------------------------------------


def _with(spec: Field) -> tuple[Field, ...]:
    return (*FIELDS, spec)


@pytest.mark.parametrize(
    ("added", "path", "read", "problem"),
    [
        (
            Field("power_peak_w", "W", "number", (0.0, 1.0), q_xml=("power/peak",)),
            fields.QUERY_GPU,
            lambda: {spec.name for spec in FIELDS if fields.QUERY_GPU not in spec.absent},
            "power_peak_w: query-gpu neither reads it nor says why not",
        ),
        (
            Field("power_peak_w", "W", "number", (0.0, 1.0), absent={fields.NVML: "none"}),
            fields.NVML,
            lambda: (
                {spec.name for spec in FIELDS if fields.NVML not in spec.absent} | {"power_peak_w"}
            ),
            "power_peak_w: nvml reads it, yet the table says 'none'",
        ),
    ],
)
def test_a_field_added_to_one_path_only_fails(
    added: Field, path: str, read: Callable[[], set[str]], problem: str
) -> None:
    assert missing(path, read(), _with(added)) == [problem]
    assert dataclasses.replace(added).name == "power_peak_w"
