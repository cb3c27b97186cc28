"""The alert rules' expression language: a condition over one GPU's readings.

A condition reads like Python and like PromQL: ``temperature_c >= 85``,
``power_w >= power_limit_w * 0.98``, ``memory_used_pct > 80 and utilization_pct < 5``.
Allowed: the readings below, numbers (``85``, ``0.98``, ``1e3``), ``+ - * /``, a leading minus,
parentheses, comparisons (chains like ``80 < temperature_c < 90`` too), ``and`` and ``or``.
Every comparison involves a reading. The parser is the console's own, not Python's: it takes only
this language, and a condition longer than `MAX_CONDITION_CHARS` or nested deeper than
`MAX_DEPTH` is refused before any work grows with it.

The same condition is evaluated by the console on snapshots and translated to PromQL over
dcgm-exporter's metrics for Prometheus, so both fire on the same readings (each point below is
checked against promtool 2.42 by ``tests/test_hostile_alerts.py``):

- a reading that is missing (None in the console, no series in Prometheus) makes its comparison
  false, never zero;
- arithmetic is IEEE 754 float64, as Go's: ``x / 0`` is +Inf or -Inf by the signs, ``0 / 0`` is
  NaN, and a comparison with NaN is false but ``!=``, which holds;
- a leading minus binds as tightly as ``*`` and ``/`` (PromQL's ``unary_expr ... %prec MUL``),
  so ``-x / 0`` is ``(-x) / 0``: -Inf for a positive x;
- a number must fit a float64: PromQL refuses ``1e400`` ("error parsing number ... value out of
  range"), and so does the console;
- the value an alert reports is the sample PromQL's filtering comparison keeps: that of the
  comparison's left operand, or of its right one when the left holds no reading (PromQL keeps
  the vector's value in ``80 < x``); for ``and`` / ``or``, that of the first comparison that holds;
- a host-scoped condition compares each reading's mean over the host's GPUs
  (``avg by (Hostname) (...)`` in PromQL).
"""

from __future__ import annotations

import contextlib
import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise

from gpuconsole.core.model import GpuState, HostSnapshot
from gpuconsole.telemetry import dcgm

MAX_CONDITION_CHARS = 1000
"""The longest condition accepted; a real one is under 200 characters."""
MAX_DEPTH = 32
"""How deep a condition may nest (operators, parentheses, minus signs). Parsing, testing and
the PromQL are recursive; this bounds them far below Python's recursion limit."""
MAX_SHOWN_CHARS = 60
"""An error message quotes at most this much of a value it names."""


class ExprError(ValueError):
    """A condition that cannot be used; the message says what is wrong, in one line."""


def shown(value: object) -> str:
    """``value`` as an error message quotes it: its repr, which is one printable line, of at most
    `MAX_SHOWN_CHARS` of it, so that a hostile megabyte is named, not echoed."""
    if isinstance(value, str) and len(value) > MAX_SHOWN_CHARS:
        return f"{value[:MAX_SHOWN_CHARS]!r}… ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else f"{text[:MAX_SHOWN_CHARS]}…"


GpuReading = Callable[[GpuState, HostSnapshot], float | None]


@dataclass(frozen=True, slots=True)
class Quantity:
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
    Quantity("utilization_pct", "GPU utilization, %", _field("utilization_pct"), ""),
    Quantity(
        "memory_utilization_pct", "memory controller busy, %", _field("memory_utilization_pct"), ""
    ),
    Quantity("memory_used_mib", "GPU memory used, MiB", _field("memory_used_mib"), ""),
    Quantity("memory_free_mib", "GPU memory free, MiB", _field("memory_free_mib"), ""),
    Quantity("memory_total_mib", "GPU memory, MiB", _total, f"{_USED} + {_FREE}", True),
    Quantity(
        "memory_used_pct",
        "GPU memory used, % of the total",
        _used_pct,
        f"{_USED} / ({_USED} + {_FREE}) * 100",
        True,
    ),
    Quantity("temperature_c", "GPU temperature, °C", _field("temperature_c"), ""),
    Quantity(
        "slowdown_temperature_c",
        "the GPU's slowdown temperature, °C",
        _field("slowdown_temperature_c"),
        "",
    ),
    Quantity("power_w", "power draw, W", _field("power_w"), ""),
    Quantity("power_limit_w", "enforced power limit, W", _field("power_limit_w"), ""),
    Quantity("sm_clock_mhz", "SM clock, MHz", _field("sm_clock_mhz"), ""),
    Quantity("sm_clock_max_mhz", "maximum SM clock, MHz", _field("sm_clock_max_mhz"), ""),
    Quantity("memory_clock_mhz", "memory clock, MHz", _field("memory_clock_mhz"), ""),
    Quantity(
        "ecc_uncorrected", "uncorrectable ECC errors since boot", _field("ecc_uncorrected"), ""
    ),
    Quantity("ecc_corrected", "correctable ECC errors since boot", _field("ecc_corrected"), ""),
    Quantity("remap_pending", "1 while an HBM row remap is pending", _field("remap_pending"), ""),
    Quantity("remap_failure", "1 when an HBM row remap failed", _field("remap_failure"), ""),
    Quantity("pcie_gen", "PCIe link generation", _field("pcie_gen"), ""),
    Quantity("pcie_width", "PCIe link width", _field("pcie_width"), ""),
    Quantity("pcie_max_gen", "PCIe maximum link generation", _field("pcie_max_gen"), ""),
    Quantity("pcie_max_width", "PCIe maximum link width", _field("pcie_max_width"), ""),
    Quantity("xid", "the last XID error (0 when none)", _xid, dcgm.XID_METRIC),
)
READINGS: dict[str, Quantity] = {
    reading.name: (
        reading
        if reading.promql
        else Quantity(reading.name, reading.meaning, reading.read, _metric(reading.name))
    )
    for reading in _READINGS
}

Lookup = Callable[[str], float | None]
"""A reading's value by name, for one GPU (or one host's mean)."""
Value = Callable[[Lookup], float | None]
Test = Callable[[Lookup], float | None]
"""A compiled condition: the reported value when it holds, None when it does not."""

_COMPARE: Mapping[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
_KEYWORDS = frozenset({"and", "or", "not", "in", "is"})
_UNSUPPORTED = frozenset({"**", "^", "%"})
_ALLOWED = "use readings, numbers, + - * / and parentheses"
_TOKEN = re.compile(
    r"(?P<space>[ \t\r\n]+)"
    r"|(?P<number>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\*\*|>=|<=|==|!=|[-+*/()<>^%])"
)
"""PromQL's whitespace, and numbers and names in ASCII only (Python's ``\\d`` takes any digit)."""


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    """"number", "name", "op" or "end"."""
    text: str
    start: int


@dataclass(frozen=True, slots=True)
class _Node:
    """A node of a parsed condition."""

    kind: str
    """"number", "reading", "negate", "arithmetic", "compare", "logic" or "not"."""
    text: str
    """The source it was parsed from, for error messages."""
    depth: int
    children: tuple[_Node, ...] = ()
    ops: tuple[str, ...] = ()
    """The operator of an arithmetic or logic node; a comparison's, one per pair of operands."""
    value: float = 0.0
    """A number's value (never negative: a minus sign is a "negate" node)."""


@dataclass(frozen=True, slots=True)
class Condition:
    """A parsed condition: its text, the readings it names, and how to test it."""

    text: str
    readings: frozenset[str]
    test: Test
    _tree: _Node

    def promql(self, host_label: str = dcgm.HOST_LABEL, host_scope: bool = False) -> str:
        """The condition as PromQL over dcgm-exporter's metrics."""
        return _PromQL(host_label if host_scope else None).condition(self._tree)


def parse(text: str) -> Condition:
    """Parse and check a condition; `ExprError` says what is wrong with it."""
    text = text.strip()
    if len(text) > MAX_CONDITION_CHARS:
        raise ExprError(
            f"longer than {MAX_CONDITION_CHARS} characters ({len(text)}): {shown(text)}"
        )
    tree = _Parser(text).condition()
    names: set[str] = set()
    test = _compile_condition(tree, names)
    return Condition(text, frozenset(names), test, tree)


def _scan(text: str) -> Iterator[_Token]:
    """The tokens of ``text``, lazily: an error is raised where the parser gets to it."""
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise ExprError(f"{shown(text[position])} is not allowed: {_ALLOWED}")
        kind = match.lastgroup or ""
        if kind != "space":
            yield _Token(kind, match.group(), position)
        position = match.end()
    yield _Token("end", "", position)


class _Parser:
    """Recursive descent, lowest precedence first: ``or``, ``and``, ``not``, comparisons,
    ``+ -``, ``* /``, a leading minus, then numbers, readings and parentheses."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._tokens = _scan(text)
        self._next = next(self._tokens)
        self._nesting = 0
        self._end = 0
        """Where the last token taken ends."""

    def condition(self) -> _Node:
        node = self._disjunction()
        if self._next.kind != "end":
            raise self._unexpected(self._next)
        return node

    def _take(self) -> _Token:
        token = self._next
        if token.kind != "end":
            self._end = token.start + len(token.text)
            self._next = next(self._tokens)
        return token

    def _at(self, kind: str, *texts: str) -> bool:
        return self._next.kind == kind and self._next.text in texts

    def _node(
        self,
        kind: str,
        start: int,
        *children: _Node,
        ops: tuple[str, ...] = (),
        value: float = 0.0,
    ) -> _Node:
        """A node over the source from ``start`` to the last token taken."""
        depth = 1 + max((child.depth for child in children), default=0)
        if depth > MAX_DEPTH:
            raise self._too_deep()
        return _Node(kind, self._text[start : self._end], depth, children, ops, value)

    @contextlib.contextmanager
    def _nested(self) -> Iterator[None]:
        self._nesting += 1
        if self._nesting > MAX_DEPTH:
            raise self._too_deep()
        try:
            yield
        finally:
            self._nesting -= 1

    def _too_deep(self) -> ExprError:
        return ExprError(f"nested more than {MAX_DEPTH} deep: {shown(self._text)}")

    def _unexpected(self, token: _Token) -> ExprError:
        if token.text in _UNSUPPORTED:
            return ExprError(f"{token.text!r} is not allowed: {_ALLOWED}")
        what = "end" if token.kind == "end" else f"{shown(token.text)} at {token.start + 1}"
        return ExprError(f"not a valid condition (unexpected {what}): {shown(self._text)}")

    def _disjunction(self) -> _Node:
        return self._joined("or", self._conjunction)

    def _conjunction(self) -> _Node:
        return self._joined("and", self._negation)

    def _joined(self, word: str, part: Callable[[], _Node]) -> _Node:
        start = self._next.start
        parts = [part()]
        while self._at("name", word):
            self._take()
            parts.append(part())
        if len(parts) == 1:
            return parts[0]
        return self._node("logic", start, *parts, ops=(word,))

    def _negation(self) -> _Node:
        if not self._at("name", "not"):
            return self._comparison()
        start = self._take().start
        with self._nested():
            operand = self._negation()
        return self._node("not", start, operand)

    def _comparison(self) -> _Node:
        start = self._next.start
        operands = [self._sum()]
        ops = []
        while self._at("op", *_COMPARE) or self._at("name", "in", "is"):
            op = self._take().text
            if op not in _COMPARE:
                raise ExprError(f"{op!r} comparisons are not supported")
            ops.append(op)
            operands.append(self._sum())
        if not ops:
            return operands[0]
        return self._node("compare", start, *operands, ops=tuple(ops))

    def _sum(self) -> _Node:
        return self._arithmetic(("+", "-"), self._term)

    def _term(self) -> _Node:
        return self._arithmetic(("*", "/"), self._unary)

    def _arithmetic(self, ops: tuple[str, ...], operand: Callable[[], _Node]) -> _Node:
        start = self._next.start
        node = operand()
        while self._at("op", *ops):
            op = self._take().text
            node = self._node("arithmetic", start, node, operand(), ops=(op,))
        return node

    def _unary(self) -> _Node:
        if not self._at("op", "-"):
            return self._primary()
        start = self._take().start
        with self._nested():
            operand = self._unary()
        return self._node("negate", start, operand)

    def _primary(self) -> _Node:
        token = self._take()
        if token.kind == "number":
            return self._node("number", token.start, value=_number_value(token.text))
        if token.kind == "name" and token.text not in _KEYWORDS:
            if self._at("op", "("):
                raise ExprError(f"{shown(token.text + '(…)')} is not allowed: {_ALLOWED}")
            return self._node("reading", token.start)
        if token.kind == "op" and token.text == "(":
            with self._nested():
                node = self._disjunction()
            if not self._at("op", ")"):
                raise self._unexpected(self._next)
            self._take()
            return node
        raise self._unexpected(token)


def _number_value(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ExprError(
            f"number {shown(text)} is out of range for a float64 (PromQL: value out of range)"
        )
    return value


def _compile_condition(node: _Node, names: set[str]) -> Test:
    if node.kind == "logic":
        parts = [_compile_condition(part, names) for part in node.children]
        return _all(parts) if node.ops == ("and",) else _any(parts)
    if node.kind == "compare":
        return _compile_compare(node, names)
    raise ExprError(
        f"{shown(node.text)} is not a condition: compare a reading (e.g. temperature_c >= 85), "
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


def _compile_compare(node: _Node, names: set[str]) -> Test:
    operands = node.children
    for left, right in pairwise(operands):
        if not (_reads(left) or _reads(right)):
            raise ExprError(f"{shown(left.text)} and {shown(right.text)}: compare a reading")
    checks = [_COMPARE[op] for op in node.ops]
    values = [_compile_value(operand, names) for operand in operands]
    kept = 0 if _reads(operands[0]) else 1

    def test(lookup: Lookup) -> float | None:
        results = [value(lookup) for value in values]
        for check, (left, right) in zip(checks, pairwise(results), strict=True):
            if left is None or right is None or not check(left, right):
                return None
        return results[kept]

    return test


def _compile_value(node: _Node, names: set[str]) -> Value:
    if node.kind == "number":
        constant = node.value
        return lambda _lookup: constant
    if node.kind == "reading":
        if node.text not in READINGS:
            raise ExprError(f"unknown reading {shown(node.text)} (readings: {', '.join(READINGS)})")
        names.add(node.text)
        name = node.text
        return lambda lookup: lookup(name)
    if node.kind == "negate":
        inner = _compile_value(node.children[0], names)
        return lambda lookup: _negate(inner(lookup))
    if node.kind == "arithmetic":
        left = _compile_value(node.children[0], names)
        right = _compile_value(node.children[1], names)
        apply = _ARITHMETIC[node.ops[0]]
        return lambda lookup: _arithmetic(apply, left(lookup), right(lookup))
    raise ExprError(f"{shown(node.text)} is not allowed: {_ALLOWED}")


def _negate(value: float | None) -> float | None:
    return None if value is None else -value


def _divide(left: float, right: float) -> float:
    """IEEE 754 division, which Go's float64 and so PromQL do and Python's ``/`` does not: a
    division by zero (or by -0) is ±Inf by the signs, and NaN for 0 / 0 or NaN / 0."""
    if right != 0:
        return left / right
    if left == 0 or math.isnan(left):
        return math.nan
    return math.copysign(math.inf, left) * math.copysign(1.0, right)


_ARITHMETIC: Mapping[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _divide,
}


def _arithmetic(
    apply: Callable[[float, float], float], left: float | None, right: float | None
) -> float | None:
    return None if left is None or right is None else apply(left, right)


def _reads(node: _Node) -> bool:
    """Whether a value holds a reading (a vector in PromQL), not only numbers (a scalar)."""
    return node.kind == "reading" or any(_reads(child) for child in node.children)


class _PromQL:
    """Renders a checked condition tree as PromQL; ``host_label`` set: host-scoped means."""

    def __init__(self, host_label: str | None) -> None:
        self._host_label = host_label

    def condition(self, node: _Node) -> str:
        if node.kind == "logic":
            joiner = f" {node.ops[0]} "
            return joiner.join(f"({self.condition(part)})" for part in node.children)
        parts = [
            f"{self.value(left)} {op} {self.value(right)}"
            for op, (left, right) in zip(node.ops, pairwise(node.children), strict=True)
        ]
        return parts[0] if len(parts) == 1 else " and ".join(f"({part})" for part in parts)

    def value(self, node: _Node) -> str:
        if node.kind == "number":
            return _number(node.value)
        if node.kind == "reading":
            return self._reading(READINGS[node.text])
        if node.kind == "negate":
            return f"-{self.value(node.children[0])}"
        left, right = node.children
        return f"({self.value(left)} {node.ops[0]} {self.value(right)})"

    def _reading(self, reading: Quantity) -> str:
        if self._host_label is not None:
            return f"avg by ({self._host_label}) ({reading.promql})"
        return f"({reading.promql})" if reading.compound else reading.promql


def _number(value: float) -> str:
    """A number as PromQL reads it back: digits for a whole one below 10¹⁵, else Python's
    shortest repr (``1e+300``), which PromQL's lexer also takes."""
    return str(int(value)) if value.is_integer() and value < 1e15 else repr(value)
