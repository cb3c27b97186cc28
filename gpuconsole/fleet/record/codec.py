"""The compact encoding of one host's reading: one row per host per tick.

A row is a keyframe (the whole reading) or a delta: only the values that differ from the host's
latest keyframe, which is at most ``KEYFRAME_EVERY_S`` older. Deltas refer to the keyframe, not to
the row before them, so any reading decodes from two rows and a lost or deleted row harms no
other. Values are JSON (a float that is a whole number is written as an integer and read back as
a float), compressed with zlib. The field names of every class are kept in the recording
(`schema`), so a recording made before a field was added still decodes: fields it lacks take
their defaults, fields the code no longer has are dropped.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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

KEYFRAME_EVERY_S = 60.0
"""A keyframe at least this often: a delta never refers further back."""

_CLASSES: tuple[type, ...] = (
    GpuState,
    EccCounts,
    RowRemap,
    PcieLink,
    MigInstance,
    SlurmJob,
    KubePod,
    ProcessLoad,
    GpuProcess,
    XidEvent,
    SchedulerNode,
)
_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _CLASSES
}
_MAX_EXACT = float(1 << 53)


def schema() -> dict[str, list[str]]:
    """The field names of every encoded class, in the order rows list them."""
    return {cls.__name__: list(names) for cls, names in _NAMES.items()}


def _wire(value: Any) -> Any:
    """A value as JSON holds it: dataclasses as lists of their fields, whole floats as ints."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < _MAX_EXACT else value
    if isinstance(value, tuple):
        return [_wire(item) for item in value]
    names = _NAMES.get(type(value))
    if names is not None:
        return [_wire(getattr(value, name)) for name in names]
    return value


_GPU_NAMES = _NAMES[GpuState]


def _vector(gpu: GpuState) -> list[Any]:
    return [_wire(getattr(gpu, name)) for name in _GPU_NAMES]


def _topology(topology: Topology | None) -> list[Any] | None:
    if topology is None:
        return None
    return [_wire(topology.matrix), _wire(topology.cpu_affinity), _wire(topology.numa_affinity)]


def _pack(data: Mapping[str, Any]) -> bytes:
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode())


def to_ms(t: float) -> int:
    """Row times are whole milliseconds."""
    return round(t * 1000)


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One encoded reading: its time, its keyframe's time (its own for a keyframe), the data."""

    t: int
    key: int
    data: bytes

    @property
    def is_keyframe(self) -> bool:
        return self.t == self.key


# The parts of a reading other than its GPUs and topology, as rows key them.
_HEADER = (
    ("d", "driver_version"),
    ("c", "cuda_version"),
    ("s", "source"),
    ("p", "processes"),
    ("x", "xid_events"),
    ("b", "bad_values"),
    ("n", "bad_value_notes"),
    ("o", "node"),
)


class _Keyframe:
    __slots__ = ("indices", "snapshot", "t")

    def __init__(self, t: int, snapshot: HostSnapshot) -> None:
        self.t = t
        self.snapshot = snapshot
        self.indices = [g.index for g in snapshot.gpus]


def _gpu_changes(now: GpuState, then: GpuState) -> list[Any]:
    """``[position, value, ...]`` of the fields that differ (compared before encoding: cheaper)."""
    changed: list[Any] = []
    for position, name in enumerate(_GPU_NAMES):
        value = getattr(now, name)
        if value != getattr(then, name):
            changed += (position, _wire(value))
    return changed


class HostEncoder:
    """Encodes one host's readings in time order, keeping the keyframe deltas refer to."""

    def __init__(self, keyframe_every_s: float = KEYFRAME_EVERY_S) -> None:
        self._every_ms = round(keyframe_every_s * 1000)
        self._key: _Keyframe | None = None

    def encode(self, snapshot: HostSnapshot) -> Row:
        t = to_ms(snapshot.time)
        key = self._key
        if (
            key is None
            or t - key.t >= self._every_ms
            or t <= key.t
            or key.indices != [g.index for g in snapshot.gpus]
            or key.snapshot.topology != snapshot.topology
        ):
            self._key = _Keyframe(t, snapshot)
            body = {code: _wire(getattr(snapshot, name)) for code, name in _HEADER}
            body["g"] = [_vector(g) for g in snapshot.gpus]
            body["t"] = _topology(snapshot.topology)
            return Row(t, t, _pack(body))
        then = key.snapshot
        delta: dict[str, Any] = {
            "g": [_gpu_changes(a, b) for a, b in zip(snapshot.gpus, then.gpus, strict=True)]
        }
        for code, name in _HEADER:
            value = getattr(snapshot, name)
            if value != getattr(then, name):
                delta[code] = _wire(value)
        return Row(t, key.t, _pack(delta))


# --- decoding -------------------------------------------------------------------------------------

MAX_ROW_BYTES = 4 << 20
"""The most one row may hold, stored and inflated: far above any real reading (an 8-GPU host's
keyframe is about 3 KiB). A longer row is refused unread, and a row is never inflated past it (a
zlib bomb stops there)."""


class RowError(ValueError):
    """A row that cannot be decoded; the message says what is wrong, in one line."""


Decode = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _as_float(value: Any) -> Any:
    """A whole number read back as the float it was; any other value is left for `vetted`
    to judge (a string, a number too large for a float)."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return value
    return value


def _items(value: Any, what: str) -> list[Any]:
    """``value`` as the list a row holds there (None: empty); RowError when it is no list."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise RowError(f"{what}: {type(value).__name__}, not a list")
    return value


def _options(hint: Any) -> tuple[Any, ...]:
    """The members of ``X | None`` (or the hint itself)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(hint) if a is not type(None))
    return (hint,)


class Decoder:
    """Decodes rows written with ``recorded`` (the schema stored in the recording).

    The row's shape is checked here (an object, lists where lists belong, a value for every
    field): a row that does not fit raises `RowError`. The values themselves are taken as they
    are; `gpuconsole.core.untrusted.vetted` judges them.
    """

    def __init__(self, recorded: Mapping[str, Sequence[str]]) -> None:
        self._builders: dict[type, Callable[[Any], Any]] = {}
        for cls in _CLASSES:
            self._builders[cls] = self._builder(cls, recorded.get(cls.__name__, _NAMES[cls]))
        hints = typing.get_type_hints(GpuState)
        self._gpu_fields: list[tuple[str, Decode] | None] = [
            (name, self._field_decoder(hints[name])) if name in hints else None
            for name in recorded.get("GpuState", _GPU_NAMES)
        ]
        """Per recorded position of a GPU's values: its field and decoder (None: unknown)."""

    def _field_decoder(self, hint: Any) -> Decode:
        options = _options(hint)
        if len(options) != 1:
            return _identity
        (kind,) = options
        if kind is float:
            return _as_float
        if kind in _NAMES:
            return lambda value, cls=kind: None if value is None else self._builders[cls](value)
        if typing.get_origin(kind) is tuple:
            (item, *_) = typing.get_args(kind)
            if item in _NAMES:
                return lambda value, cls=item: tuple(
                    self._builders[cls](v) for v in _items(value, cls.__name__)
                )
            return lambda value: None if value is None else tuple(_items(value, "a list"))
        return _identity

    def _builder(self, cls: type, recorded: Sequence[str]) -> Callable[[Any], Any]:
        hints = typing.get_type_hints(cls)
        names = _NAMES[cls]
        what = cls.__name__
        if tuple(recorded) == names:  # the common case: positional, converting only where needed
            conversions = [
                (position, decode)
                for position, name in enumerate(names)
                if (decode := self._field_decoder(hints[name])) is not _identity
            ]

            def build_positional(values: Any) -> Any:
                if not isinstance(values, list) or len(values) != len(names):
                    raise RowError(f"{what}: not a list of {len(names)} values")
                values = list(values)
                for position, decode in conversions:
                    values[position] = decode(values[position])
                return cls(*values)

            return build_positional
        plan = [
            (position, name, self._field_decoder(hints[name]))
            for position, name in enumerate(recorded)
            if name in names
        ]

        def build(values: Any) -> Any:
            if not isinstance(values, list):
                raise RowError(f"{what}: {type(values).__name__}, not a list")
            given = {
                name: decode(values[position])
                for position, name, decode in plan
                if position < len(values)
            }
            try:
                return cls(**given)
            except TypeError:  # a field without a default the row has no value for
                raise RowError(f"{what}: {len(values)} values lack a required field") from None

        return build

    @staticmethod
    def unpack(data: object) -> dict[str, Any]:
        """A row's data as the JSON object it holds; RowError when it holds none."""
        if not isinstance(data, bytes):
            raise RowError(f"the data is {type(data).__name__}, not bytes")
        if len(data) > MAX_ROW_BYTES:
            raise RowError(f"{len(data)} bytes, more than a row may hold ({MAX_ROW_BYTES})")
        inflater = zlib.decompressobj()
        try:
            text = inflater.decompress(data, MAX_ROW_BYTES)
        except zlib.error as error:
            raise RowError(f"not zlib data ({error})") from None
        if inflater.unconsumed_tail:
            raise RowError(f"inflates past {MAX_ROW_BYTES} bytes")
        if not inflater.eof or inflater.unused_data:
            raise RowError("truncated zlib data" if not inflater.eof else "bytes after the data")
        try:
            raw = json.loads(text)
        except RecursionError:
            raise RowError("JSON nested too deep") from None
        except ValueError as error:  # also text that is not UTF-8
            raise RowError(f"not JSON ({error})") from None
        if not isinstance(raw, dict):
            raise RowError(f"JSON {type(raw).__name__}, not an object")
        return raw

    def keyframe(self, host: str, t: int, data: bytes) -> HostSnapshot:
        """A keyframe row's reading."""
        raw = self.unpack(data)
        if "g" not in raw:
            raise RowError("no GPUs in the keyframe")
        return HostSnapshot(
            host=host,
            time=t / 1000,
            gpus=tuple(self._builders[GpuState](g) for g in _items(raw["g"], "GPUs")),
            processes=self._processes(raw.get("p")),
            topology=_topology_of(raw.get("t")),
            driver_version=raw.get("d"),
            cuda_version=raw.get("c"),
            xid_events=self._xids(raw.get("x")),
            source=raw.get("s") or "recording",
            bad_values=raw.get("b", 0),
            bad_value_notes=tuple(_items(raw.get("n"), "bad-value notes")),
            node=self._node(raw.get("o")),
        )

    def delta(self, base: HostSnapshot, t: int, data: bytes) -> HostSnapshot:
        """A delta row's reading: its keyframe's (``base``), with the values the delta changes.

        Only the changed fields are decoded; the rest of each GPU is the keyframe's.
        """
        raw = self.unpack(data)
        changed = _items(raw.get("g"), "GPUs")
        if len(changed) != len(base.gpus):
            raise RowError(f"changes for {len(changed)} GPUs, the keyframe has {len(base.gpus)}")
        gpus = [
            self._changed(state, _items(changes, "GPU changes"))
            for state, changes in zip(base.gpus, changed, strict=True)
        ]
        return dataclasses.replace(
            base,
            time=t / 1000,
            gpus=tuple(gpus),
            processes=self._processes(raw["p"]) if "p" in raw else base.processes,
            xid_events=self._xids(raw["x"]) if "x" in raw else base.xid_events,
            driver_version=raw.get("d", base.driver_version),
            cuda_version=raw.get("c", base.cuda_version),
            source=raw.get("s", base.source),
            bad_values=raw.get("b", base.bad_values),
            bad_value_notes=tuple(_items(raw["n"], "bad-value notes"))
            if "n" in raw
            else base.bad_value_notes,
            node=self._node(raw["o"]) if "o" in raw else base.node,
        )

    def _changed(self, state: GpuState, changes: list[Any]) -> GpuState:
        """``state`` with ``[position, value, ...]`` applied (positions this code does not know
        are fields it no longer has: dropped)."""
        if not changes:
            return state
        if len(changes) % 2:
            raise RowError("GPU changes: a position without a value")
        fields = self._gpu_fields
        updates = {}
        for i in range(0, len(changes), 2):
            position = changes[i]
            if isinstance(position, bool) or not isinstance(position, int) or position < 0:
                raise RowError(f"GPU changes: position {position!r:.40}")
            field = fields[position] if position < len(fields) else None
            if field is not None:
                updates[field[0]] = field[1](changes[i + 1])
        return dataclasses.replace(state, **updates)

    def _processes(self, values: Any) -> tuple[GpuProcess, ...]:
        return tuple(self._builders[GpuProcess](p) for p in _items(values, "processes"))

    def _node(self, value: Any) -> SchedulerNode | None:
        return None if value is None else self._builders[SchedulerNode](value)

    def _xids(self, values: Any) -> tuple[XidEvent, ...]:
        return tuple(self._builders[XidEvent](x) for x in _items(values, "XID events"))


def _topology_of(value: Any) -> Topology | None:
    if value is None:
        return None
    parts = _items(value, "topology")
    if len(parts) != 3:
        raise RowError(f"topology: {len(parts)} parts, not 3")
    matrix, cpus, numa = parts
    rows = tuple(tuple(_items(row, "topology row")) for row in _items(matrix, "topology"))
    return Topology(rows, tuple(_items(cpus, "CPU affinity")), tuple(_items(numa, "NUMA affinity")))
