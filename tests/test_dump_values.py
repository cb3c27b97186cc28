"""What nvidia-smi writes instead of a number costs that one field: any value of a real dump
replaced by any such string, or by garbage, changes only the fields the field table reads from
that place (and those computed from it), never the rest, and never refuses the dump."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuconsole.core.fields import FIELDS, Q_TEXT, Q_XML
from gpuconsole.core.model import GpuState
from gpuconsole.telemetry.smi import parse_q_text, parse_xml

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
XML = (FIXTURES / "h200-q-loaded.xml").read_text()
TEXT = (FIXTURES / "h200-q-loaded.txt").read_text()

NOT_A_NUMBER = (
    "N/A",
    "[N/A]",
    "[Not Supported]",
    "[Unknown Error]",
    "[Insufficient Permissions]",
    "Requested functionality has been deprecated",
    "Not available in WDDM driver model",
    "N/A in WDDM mode",
    "[GPU is lost]",
    "abc %",
    "12..5 W",
    "0xZZ",
    "Enabled?",
)
GARBAGE = (
    st.text(
        alphabet=st.characters(categories=("L", "N", "P", "S", "Zs"), exclude_characters="\x85"),
        min_size=1,
        max_size=24,
    )
    .map(str.strip)
    .filter(bool)
)
REPLACEMENTS = st.sampled_from(NOT_A_NUMBER) | GARBAGE

# Readings computed from or checked against others: the thresholds from the temperature and its
# T.Limit margins (drivers that print margins), the ECC counts only where ECC is on, the memory
# used only where it fits in the total.
_THRESHOLDS = ("slowdown_temperature_c", "shutdown_temperature_c")
_ECC = tuple(f.name for f in FIELDS if f.part == "ecc")


def _key(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.casefold()).strip("_")


def _covers(pattern: str, path: list[str]) -> bool:
    """Whether a table path (``a/*/b``) is the place ``path`` names, or a section above it."""
    steps = [_key(step) for step in pattern.split("/")]
    if len(steps) > len(path):
        return False
    return all(s == "*" or s == p for s, p in zip(steps, path, strict=False))


def allowed(path: list[str], format_: str) -> set[str]:
    """The fields that a value at ``path`` (section keys from the GPU down) may change."""
    attribute = "q_xml" if format_ == Q_XML else "q_text"
    fields = {f.name for f in FIELDS if any(_covers(p, path) for p in getattr(f, attribute))}
    leaf = path[-1]
    if "temperature_c" in fields or "tlimit" in leaf or "t_limit" in leaf:
        fields.update(_THRESHOLDS)
    if path[0] == "ecc_mode":
        fields.update(_ECC)
    if "memory_total_mib" in fields:
        fields.add("memory_used_mib")
    return fields


def value_of(gpu: GpuState, name: str) -> object:
    part, _, attribute = name.rpartition(".")
    holder = getattr(gpu, part) if part else gpu
    return None if holder is None else getattr(holder, attribute)


def changed(before: GpuState, after: GpuState) -> set[str]:
    return {f.name for f in FIELDS if value_of(before, f.name) != value_of(after, f.name)}


# --- XML -----------------------------------------------------------------------------------------


def _xml_leaves() -> list[list[str]]:
    root = ET.fromstring(XML.split("\n", 2)[2])
    gpu = root.find("gpu")
    assert gpu is not None
    leaves: list[list[str]] = []

    def walk(element: ET.Element, path: list[str]) -> None:
        for child in element:
            here = [*path, _key(child.tag)]
            if len(child):
                walk(child, here)
            elif (child.text or "").strip():
                leaves.append(here)

    walk(gpu, [])
    return leaves


XML_LEAVES = _xml_leaves()


def _xml_with(path: list[str], text: str) -> str:
    root = ET.fromstring(XML.split("\n", 2)[2])
    element = root.find("gpu")
    for step in path:
        assert element is not None
        element = next(child for child in element if _key(child.tag) == step)
    assert element is not None
    element.text = text
    return ET.tostring(root, encoding="unicode")


@settings(max_examples=300, deadline=None)
@given(leaf=st.sampled_from(XML_LEAVES), replacement=REPLACEMENTS)
def test_any_xml_value_replaced_changes_its_fields_alone(leaf: list[str], replacement: str) -> None:
    before = parse_xml(XML, "h", 0.0)
    after = parse_xml(_xml_with(leaf, replacement), "h", 0.0)
    assert len(after.gpus) == len(before.gpus)
    assert changed(before.gpus[0], after.gpus[0]) <= allowed(leaf, Q_XML), leaf


# --- -q text -------------------------------------------------------------------------------------


def _text_values() -> Iterator[tuple[int, list[str]]]:
    """(line number, section keys from the GPU down) of each ``key : value`` line of GPU 0."""
    stack: list[tuple[int, str]] = []
    in_gpu = False
    for number, line in enumerate(TEXT.splitlines()):
        content = line.strip()
        if not content:
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            in_gpu = content.startswith("GPU ")
            stack = []
            continue
        key, colon, value = content.partition(" : ")
        key = key.strip() if colon else content
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, _key(key)))
        if in_gpu and colon and value.strip():
            yield number, [step for _, step in stack]


TEXT_VALUES = list(_text_values())


def _text_with(number: int, text: str) -> str:
    lines = TEXT.splitlines()
    key, _, _ = lines[number].partition(" : ")
    lines[number] = f"{key} : {text}"
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None)
@given(place=st.sampled_from(TEXT_VALUES), replacement=REPLACEMENTS)
def test_any_text_value_replaced_changes_its_fields_alone(
    place: tuple[int, list[str]], replacement: str
) -> None:
    number, path = place
    before = parse_q_text(TEXT, "h", 0.0)
    after = parse_q_text(_text_with(number, replacement), "h", 0.0)
    assert len(after.gpus) == len(before.gpus)
    assert changed(before.gpus[0], after.gpus[0]) <= allowed(path, Q_TEXT), path


def test_the_deprecated_application_clocks_are_na_and_nothing_else() -> None:
    """Drivers 590 and later write this under Applications Clocks (telegraf's v13 dumps too)."""
    text = re.sub(
        r"(Applications Clocks\n\s+Graphics\s+: )1980 MHz",
        r"\1Requested functionality has been deprecated",
        TEXT,
    )
    assert text != TEXT
    before, after = parse_q_text(TEXT, "h", 0.0), parse_q_text(text, "h", 0.0)
    assert changed(before.gpus[0], after.gpus[0]) == {"sm_clock_application_mhz"}
    assert after.bad_values == before.bad_values  # a known way of saying "no value"
