"""The alert rules' expression language: a condition over one GPU's readings.

A condition reads like Python and like PromQL: ``temperature_c >= 85``,
``power_w >= power_limit_w * 0.98``, ``memory_used_pct > 80 and utilization_pct < 5``.
Allowed: the readings below, numbers, ``+ - * /``, parentheses, comparisons (chains like
``80 < temperature_c < 90`` too), ``and`` and ``or``. Every comparison involves a reading.

The same condition is evaluated by the console on snapshots and translated to PromQL over
dcgm-exporter's metrics for Prometheus, so both fire on the same readings:

- a reading that is missing (None in the console, no series in Prometheus) makes its comparison
  false, never zero;
- the value an alert reports is that of the left operand of the first comparison that holds,
  which is the sample value PromQL's filtering comparison keeps;
- a host-scoped condition compares each reading's mean over the host's GPUs
  (``avg by (Hostname) (...)`` in PromQL).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from gpuconsole.model import GpuState, HostSnapshot
from gpuconsole.prom import dcgm

GpuReading = Callable[[GpuState, HostSnapshot], float | None]


class ExprError(ValueError):
    """A condition that cannot be used; the message says what is wrong, in one line."""


@dataclass(frozen=True, slots=True)
class Reading:
    """A value a condition can name: how the console reads it and how PromQL selects it."""

    name: str
    meaning: str
    read: GpuReading
    promql: str
    compound: bool = False
    """The PromQL is an expression of several metrics (needs parentheses inside others)."""


def _field(name: str) -> GpuReading:
    getter = dcgm.BY_FIELD[name].value
    return lambda gpu, _snapshot: getter(gpu)


def _metric(name: str) -> str:
    return dcgm.BY_FIELD[name].name


def _total(gpu: GpuState, _snapshot: HostSnapshot) -> float | None:
    return gpu.memory_total_mib


def _used_pct(gpu: GpuState, _snapshot: HostSnapshot) -> float | None:
    fraction = gpu.memory_fraction
    return None if fraction is None else fraction * 100.0


def _xid(gpu: GpuState, snapshot: HostSnapshot) -> float | None:
    return dcgm.last_xid(snapshot, gpu.index)


_USED, _FREE = _metric("memory_used_mib"), _metric("memory_free_mib")

_READINGS = (
    Reading("utilization_pct", "GPU utilization, %", _field("utilization_pct"), ""),
    Reading(
        "memory_utilization_pct", "memory controller busy, %", _field("memory_utilization_pct"), ""
    ),
    Reading("memory_used_mib", "GPU memory used, MiB", _field("memory_used_mib"), ""),
    Reading("memory_free_mib", "GPU memory free, MiB", _field("memory_free_mib"), ""),
    Reading("memory_total_mib", "GPU memory, MiB", _total, f"{_USED} + {_FREE}", True),
    Reading(
        "memory_used_pct",
        "GPU memory used, % of the total",
        _used_pct,
        f"{_USED} / ({_USED} + {_FREE}) * 100",
        True,
    ),
    Reading("temperature_c", "GPU temperature, °C", _field("temperature_c"), ""),
    Reading(
        "slowdown_temperature_c",
        "the GPU's slowdown temperature, °C",
        _field("slowdown_temperature_c"),
        "",
    ),
    Reading("power_w", "power draw, W", _field("power_w"), ""),
    Reading("power_limit_w", "enforced power limit, W", _field("power_limit_w"), ""),
    Reading("sm_clock_mhz", "SM clock, MHz", _field("sm_clock_mhz"), ""),
    Reading("sm_clock_max_mhz", "maximum SM clock, MHz", _field("sm_clock_max_mhz"), ""),
    Reading("memory_clock_mhz", "memory clock, MHz", _field("memory_clock_mhz"), ""),
    Reading(
        "ecc_uncorrected", "uncorrectable ECC errors since boot", _field("ecc_uncorrected"), ""
    ),
    Reading("ecc_corrected", "correctable ECC errors since boot", _field("ecc_corrected"), ""),
    Reading("remap_pending", "1 while an HBM row remap is pending", _field("remap_pending"), ""),
    Reading("remap_failure", "1 when an HBM row remap failed", _field("remap_failure"), ""),
    Reading("pcie_gen", "PCIe link generation", _field("pcie_gen"), ""),
    Reading("pcie_width", "PCIe link width", _field("pcie_width"), ""),
    Reading("pcie_max_gen", "PCIe maximum link generation", _field("pcie_max_gen"), ""),
    Reading("pcie_max_width", "PCIe maximum link width", _field("pcie_max_width"), ""),
    Reading("xid", "the last XID error (0 when none)", _xid, dcgm.XID_METRIC),
)
READINGS: dict[str, Reading] = {
    reading.name: (
        reading
        if reading.promql
        else Reading(reading.name, reading.meaning, reading.read, _metric(reading.name))
    )
    for reading in _READINGS
}

Lookup = Callable[[str], float | None]
"""A reading's value by name, for one GPU (or one host's mean)."""
Value = Callable[[Lookup], float | None]
Test = Callable[[Lookup], float | None]
"""A compiled condition: the reported value when it holds, None when it does not."""

_COMPARE: Mapping[type, tuple[str, Callable[[float, float], bool]]] = {
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
}
_ARITHMETIC: Mapping[type, tuple[str, Callable[[float, float], float]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
}


@dataclass(frozen=True, slots=True)
class Condition:
    """A parsed condition: its text, the readings it names, and how to test it."""

    text: str
    readings: frozenset[str]
    test: Test
    _tree: ast.expr

    def promql(self, host_label: str = dcgm.HOST_LABEL, host_scope: bool = False) -> str:
        """The condition as PromQL over dcgm-exporter's metrics."""
        return _PromQL(host_label if host_scope else None).condition(self._tree)


def parse(text: str) -> Condition:
    """Parse and check a condition; `ExprError` says what is wrong with it."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise ExprError(f"not a valid condition ({error.msg}): {text!r}") from None
    names: set[str] = set()
    test = _compile_condition(tree, names)
    return Condition(text.strip(), frozenset(names), test, tree)


def _compile_condition(node: ast.expr, names: set[str]) -> Test:
    if isinstance(node, ast.BoolOp):
        parts = [_compile_condition(value, names) for value in node.values]
        return _all(parts) if isinstance(node.op, ast.And) else _any(parts)
    if isinstance(node, ast.Compare):
        return _compile_compare(node, names)
    raise ExprError(
        f"{_source(node)!r} is not a condition: compare a reading (e.g. temperature_c >= 85), "
        "join comparisons with 'and' / 'or'"
    )


def _all(parts: list[Test]) -> Test:
    def test(lookup: Lookup) -> float | None:
        first = None
        for part in parts:
            value = part(lookup)
            if value is None:
                return None
            if first is None:
                first = value
        return first

    return test


def _any(parts: list[Test]) -> Test:
    def test(lookup: Lookup) -> float | None:
        for part in parts:
            value = part(lookup)
            if value is not None:
                return value
        return None

    return test


def _compile_compare(node: ast.Compare, names: set[str]) -> Test:
    operands = [node.left, *node.comparators]
    for left, right in pairwise(operands):
        if not (_names_in(left) or _names_in(right)):
            raise ExprError(f"{_source(left)!r} and {_source(right)!r}: compare a reading")
    for op in node.ops:
        if type(op) not in _COMPARE:
            raise ExprError(f"{type(op).__name__!r} comparisons are not supported")
    checks = [_COMPARE[type(op)][1] for op in node.ops]
    values = [_compile_value(operand, names) for operand in operands]

    def test(lookup: Lookup) -> float | None:
        left = values[0](lookup)
        first = left
        for check, value in zip(checks, values[1:], strict=True):
            right = value(lookup)
            if left is None or right is None or not check(left, right):
                return None
            left = right
        return first

    return test


def _compile_value(node: ast.expr, names: set[str]) -> Value:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        constant = float(node.value)
        return lambda _lookup: constant
    if isinstance(node, ast.Name):
        if node.id not in READINGS:
            raise ExprError(f"unknown reading {node.id!r} (readings: {', '.join(READINGS)})")
        names.add(node.id)
        name = node.id
        return lambda lookup: lookup(name)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _compile_value(node.operand, names)
        return lambda lookup: _negate(inner(lookup))
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left = _compile_value(node.left, names)
        right = _compile_value(node.right, names)
        apply = _ARITHMETIC[type(node.op)][1]
        return lambda lookup: _arithmetic(apply, left(lookup), right(lookup))
    raise ExprError(
        f"{_source(node)!r} is not allowed: use readings, numbers, + - * / and parentheses"
    )


def _negate(value: float | None) -> float | None:
    return None if value is None else -value


def _arithmetic(
    apply: Callable[[float, float], float], left: float | None, right: float | None
) -> float | None:
    if left is None or right is None:
        return None
    try:
        return apply(left, right)
    except ZeroDivisionError:
        return None  # PromQL gives ±Inf or NaN, which no threshold of ours matches


def _names_in(node: ast.expr) -> bool:
    return any(isinstance(child, ast.Name) for child in ast.walk(node))


def _source(node: ast.expr) -> str:
    return ast.unparse(node)


class _PromQL:
    """Renders a checked condition tree as PromQL; ``host_label`` set: host-scoped means."""

    def __init__(self, host_label: str | None) -> None:
        self._host_label = host_label

    def condition(self, node: ast.expr) -> str:
        if isinstance(node, ast.BoolOp):
            joiner = " and " if isinstance(node.op, ast.And) else " or "
            return joiner.join(f"({self.condition(value)})" for value in node.values)
        assert isinstance(node, ast.Compare)
        operands = [node.left, *node.comparators]
        parts = [
            f"{self.value(left)} {_COMPARE[type(op)][0]} {self.value(right)}"
            for op, (left, right) in zip(node.ops, pairwise(operands), strict=True)
        ]
        return parts[0] if len(parts) == 1 else " and ".join(f"({part})" for part in parts)

    def value(self, node: ast.expr) -> str:
        if isinstance(node, ast.Constant):
            return _number(float(node.value))
        if isinstance(node, ast.Name):
            return self._reading(READINGS[node.id])
        if isinstance(node, ast.UnaryOp):
            return f"-{self.value(node.operand)}"
        assert isinstance(node, ast.BinOp)
        symbol = _ARITHMETIC[type(node.op)][0]
        return f"({self.value(node.left)} {symbol} {self.value(node.right)})"

    def _reading(self, reading: Reading) -> str:
        if self._host_label is not None:
            return f"avg by ({self._host_label}) ({reading.promql})"
        return f"({reading.promql})" if reading.compound else reading.promql


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)
