"""Hostile nvidia-smi output: every parser reads it or raises `SmiParseError` with one line.

The parsers read what a watched host prints and what a ticket attaches, so their input is
anyone's. Each property feeds a parser text (arbitrary, real outputs cut and spliced, or built
from the format's own keys and tags with hostile values) and accepts two outcomes only: a result,
or the module's own error with a one-line message. The worst inputs found are kept as named
cases, parsed in a child process under a generous wall-clock bound, so a parser that would take
hours fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smi_captures import FIXTURES, NOHEADER_FIELDS

from gpuconsole.telemetry.smi import (
    QUERY_COMPUTE_APPS_FIELDS,
    QUERY_GPU_FIELDS,
    SmiParseError,
    parse_compute_apps_csv,
    parse_dump,
    parse_q_text,
    parse_query_gpu_csv,
    parse_topo_m,
    parse_xml,
    read_dump,
)
from gpuconsole.telemetry.smi.dump import _TEXT_PATHS, _XML_PATHS, _key_value
from gpuconsole.telemetry.smi.values import MAX_DEPTH, MAX_ENTRIES, MAX_OUTPUT_SIZE

UUID = "GPU-175817c4-01e6-602d-8cec-942989c1e518"
CHILD_BOUND_S = 120
"""Wall-clock bound for the worst cases together; each takes well under a second when the parsers
are linear, and hours with a quadratic regex or an unbounded tree."""

Parser = Callable[[str], Any]
PARSERS: dict[str, Parser] = {
    "xml": lambda text: parse_xml(text, "h", 0.0),
    "q": lambda text: parse_q_text(text, "h", 0.0),
    "dump": lambda text: parse_dump(text, "h", 0.0),
    "query-gpu": parse_query_gpu_csv,
    "query-gpu-noheader": lambda text: parse_query_gpu_csv(text, NOHEADER_FIELDS),
    "compute-apps": lambda text: parse_compute_apps_csv(text, {UUID: 0}),
    "compute-apps-noheader": lambda text: parse_compute_apps_csv(
        text, {UUID: 0}, QUERY_COMPUTE_APPS_FIELDS
    ),
    "topo": parse_topo_m,
}
SAMPLES = {
    "xml": "h200-q-loaded.xml",
    "q": "h200-q-loaded.txt",
    "dump": "h200-q.xml",
    "query-gpu": "h200-query-gpu.csv",
    "query-gpu-noheader": "h200-query-gpu-loaded-noheader-nounits.csv",
    "compute-apps": "h200-compute-apps.csv",
    "compute-apps-noheader": "h200-compute-apps.csv",
    "topo": "h200-topo-m.txt",
}
HOSTILE_VALUES = (
    "N/A",
    "[Not Supported]",
    "GPU is lost",
    "Enabled",
    "Disabled",
    "0x0000000000000001",
    "0x" + "f" * 5000,
    "9" * 5000,
    "1e309",
    "-1",
    "nan",
    "inf",
    "16x",
    "700.00 W",
    "-2 C",
    "\x1b]52;c;aGk=\x07",
    "\x00",
    "\ud800",
    "a\u202eb",
    "C+G",
)


def settled(parse: Parser, text: str) -> None:
    """Parse; the only failure allowed is SmiParseError with a one-line message."""
    try:
        parse(text)
    except SmiParseError as error:
        message = str(error)
        assert message.strip(), "an empty message"
        assert "\n" not in message and "\r" not in message, message


def sample(name: str) -> str:
    return (FIXTURES / SAMPLES[name]).read_text(encoding="utf-8")


values = st.one_of(
    st.sampled_from(HOSTILE_VALUES),
    st.text(max_size=24),
    st.integers().map(str),
    st.floats().map(str),
)


@st.composite
def spliced(draw: st.DrawFn, name: str) -> str:
    """A real output with a stretch replaced by arbitrary text or a hostile value."""
    text = sample(name)
    start = draw(st.integers(0, len(text)))
    end = draw(st.integers(start, min(len(text), start + 400)))
    return text[:start] + draw(st.one_of(values, st.text(max_size=200))) + text[end:]


@st.composite
def line_edits(draw: st.DrawFn, name: str) -> str:
    """A real output with lines dropped, repeated, reindented or given hostile values."""
    lines = sample(name).splitlines()
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(("drop", "repeat", "indent", "value")))
        if edit == "drop":
            del lines[at]
        elif edit == "repeat":
            lines[at:at] = [lines[at]] * draw(st.integers(1, 50))
        elif edit == "indent":
            lines[at] = " " * draw(st.integers(0, 80)) + lines[at].lstrip()
        else:
            key = lines[at].partition(":")[0]
            lines[at] = f"{key}: {draw(values)}"
        if not lines:
            break
    return "\n".join(lines)


def _xml_tags() -> list[str]:
    tags = {"gpu", "processes", "process_info", "pid", "type", "process_name", "used_memory"}
    for paths in _XML_PATHS.values():
        for path in paths:
            tags.update(path.split("/"))
    return sorted(tags)


XML_TAGS = _xml_tags()


@st.composite
def xml_element(draw: st.DrawFn, depth: int = 0) -> ET.Element:
    element = ET.Element(draw(st.sampled_from(XML_TAGS)))
    if draw(st.booleans()):
        element.set("id", draw(values).replace("\x00", ""))
    element.text = draw(values)
    if depth < 6:
        element.extend(draw(st.lists(xml_element(depth + 1), max_size=4)))
    return element


@st.composite
def xml_dumps(draw: st.DrawFn) -> str:
    root = ET.Element("nvidia_smi_log")
    for tag in ("driver_version", "cuda_version"):
        ET.SubElement(root, tag).text = draw(values)
    for _ in range(draw(st.integers(0, 3))):
        gpu = ET.SubElement(root, "gpu", id=draw(values))
        gpu.extend(draw(st.lists(xml_element(), max_size=8)))
    try:
        return ET.tostring(root, encoding="unicode")
    except ValueError:  # a value XML cannot hold (a NUL): the spliced cases carry those
        return "<nvidia_smi_log/>"


TEXT_KEYS = sorted({part for paths in _TEXT_PATHS.values() for p in paths for part in p.split("/")})


@st.composite
def q_texts(draw: st.DrawFn) -> str:
    lines = ["==============NVSMI LOG==============", f"Driver Version : {draw(values)}"]
    for _ in range(draw(st.integers(0, 3))):
        lines.append(f"GPU 00000000:{draw(st.integers(0, 255)):02X}:00.0")
        for _ in range(draw(st.integers(0, 30))):
            indent = " " * (4 * draw(st.integers(1, 6)))
            key = draw(st.one_of(st.sampled_from(TEXT_KEYS), st.text(max_size=12)))
            if draw(st.booleans()):
                lines.append(f"{indent}{key}")
            else:
                lines.append(f"{indent}{key} : {draw(values)}")
    return "\n".join(lines)


@st.composite
def csv_texts(draw: st.DrawFn) -> str:
    fields = draw(st.lists(st.sampled_from((*QUERY_GPU_FIELDS, "pid", "gpu_uuid")), min_size=1))
    units = [f"{f} [{draw(st.sampled_from(('MiB', '%', 'W', 'MHz')))}]" for f in fields]
    rows = [", ".join(draw(st.sampled_from((fields, units))))]
    for _ in range(draw(st.integers(0, 4))):
        rows.append(", ".join(draw(values).replace("\n", " ") for _ in fields))
    return "\n".join(rows)


@st.composite
def topo_texts(draw: st.DrawFn) -> str:
    size = draw(st.integers(1, 5))
    names = [f"GPU{i}" for i in range(size)]
    header = "\t" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    cells = st.one_of(st.sampled_from(("X", "NV18", "SYS", "PIX", "")), values)
    rows = [
        "\t".join([name, *(draw(cells) for _ in range(size + 3))])
        for name in draw(st.lists(st.sampled_from(names), max_size=size + 1))
    ]
    return "\n".join([header, *rows, "", "Legend:"])


fuzz = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


@pytest.mark.parametrize("name", sorted(PARSERS))
@fuzz
@given(text=st.text())
def test_arbitrary_text(name: str, text: str) -> None:
    settled(PARSERS[name], text)


@pytest.mark.parametrize("name", sorted(PARSERS))
@fuzz
@given(data=st.data())
def test_spliced_real_output(name: str, data: st.DataObject) -> None:
    settled(PARSERS[name], data.draw(spliced(name)))


@pytest.mark.parametrize("name", sorted(PARSERS))
@fuzz
@given(data=st.data())
def test_edited_lines_of_real_output(name: str, data: st.DataObject) -> None:
    settled(PARSERS[name], data.draw(line_edits(name)))


@fuzz
@given(text=xml_dumps())
def test_xml_built_from_the_dump_tags(text: str) -> None:
    settled(PARSERS["xml"], text)
    settled(PARSERS["dump"], text)


@fuzz
@given(text=q_texts())
def test_q_text_built_from_the_dump_labels(text: str) -> None:
    settled(PARSERS["q"], text)
    settled(PARSERS["dump"], text)


@fuzz
@given(text=csv_texts())
def test_csv_built_from_the_query_fields(text: str) -> None:
    for name in ("query-gpu", "query-gpu-noheader", "compute-apps", "compute-apps-noheader"):
        settled(PARSERS[name], text)


@fuzz
@given(text=topo_texts())
def test_topo_built_from_gpu_labels(text: str) -> None:
    settled(PARSERS["topo"], text)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_real_outputs_still_parse(name: str) -> None:
    PARSERS[name](sample(name))


def test_the_check_can_fail() -> None:
    """`settled` lets only SmiParseError through, and only with one line."""
    with pytest.raises(KeyError):
        settled(lambda _text: {}["x"], "")
    with pytest.raises(AssertionError):
        settled(lambda _text: (_ for _ in ()).throw(SmiParseError("two\nlines")), "")


# --- entities, depth, size: the named worst cases ------------------------------------------------

BILLION_LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [\n<!ENTITY l0 "lol">\n'
    + "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">\n' for i in range(1, 10))
    + "]>\n<nvidia_smi_log><driver_version>&l9;</driver_version></nvidia_smi_log>\n"
)


def test_entity_declarations_are_refused_before_parsing() -> None:
    with pytest.raises(SmiParseError, match="ENTITY"):
        parse_xml(BILLION_LAUGHS, "h", 0.0)
    with pytest.raises(SmiParseError, match="ENTITY"):
        parse_dump(BILLION_LAUGHS, "h", 0.0)


def test_this_pythons_expat_would_expand_entities_up_to_its_own_limit() -> None:
    """Why the refusal is ours: xml.etree expands internal entities; only expat's amplification
    limit (expat >= 2.4) stops a billion laughs, after megabytes, and one entity smaller than
    that limit is expanded in full."""
    small = '<!DOCTYPE a [<!ENTITY e "' + "x" * 1000 + '">]><a>&e;&e;&e;</a>'
    assert len(ET.fromstring(small).text or "") == 3000
    with pytest.raises(ET.ParseError):
        ET.fromstring(BILLION_LAUGHS)


def test_an_internal_dtd_subset_is_refused() -> None:
    text = '<!DOCTYPE nvidia_smi_log [<!ATTLIST gpu id CDATA "x">]><nvidia_smi_log/>'
    with pytest.raises(SmiParseError, match="internal DTD subset"):
        parse_xml(text, "h", 0.0)


def test_nvidia_smis_own_doctype_is_read() -> None:
    assert 'SYSTEM "nvsmi_device_v' in sample("xml")
    assert len(parse_xml(sample("xml"), "h", 0.0).gpus) == 1


def _deep_xml(depth: int) -> str:
    return "<nvidia_smi_log><gpu>" + "<a>" * depth + "</a>" * depth + "</gpu></nvidia_smi_log>"


def _deep_text(depth: int) -> str:
    lines = [f"{' ' * i}level {i}" for i in range(depth)]
    return "==============NVSMI LOG==============\nGPU 00000000:18:00.0\n" + "\n".join(lines)


def test_nesting_deeper_than_the_bound_is_refused() -> None:
    for text, parse in (
        (_deep_xml(MAX_DEPTH + 1), parse_xml),
        (_deep_text(MAX_DEPTH + 2), parse_q_text),
    ):
        with pytest.raises(SmiParseError, match=f"deeper than {MAX_DEPTH}"):
            parse(text, "h", 0.0)
    parse_xml(_deep_xml(MAX_DEPTH - 3), "h", 0.0)
    parse_q_text(_deep_text(MAX_DEPTH - 3), "h", 0.0)


def test_more_entries_than_the_bound_are_refused() -> None:
    xml = "<nvidia_smi_log>" + "<a/>" * MAX_ENTRIES + "</nvidia_smi_log>"
    text = "==============NVSMI LOG==============\n" + "a : b\n" * (MAX_ENTRIES + 1)
    csv = "index\n" + "0\n" * (MAX_ENTRIES + 1)
    for parse, what in ((parse_xml, xml), (parse_q_text, text)):
        with pytest.raises(SmiParseError, match="entries"):
            parse(what, "h", 0.0)
    with pytest.raises(SmiParseError, match="rows"):
        parse_query_gpu_csv(csv)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_text_over_the_size_bound_is_refused_unread(name: str) -> None:
    with pytest.raises(SmiParseError, match="MiB"):
        PARSERS[name](" " * (MAX_OUTPUT_SIZE + 1))


WORST_CASES: dict[str, tuple[str, str]] = {
    # a -q value with a long run of inner spaces: quadratic for a lazy key/value regex
    "q-inner-spaces": ("q", "==============NVSMI LOG==============\na: x" + " " * 500_000 + "y\n"),
    # many DOCTYPE openings without '>' or '[': quadratic for an unanchored DOCTYPE regex
    "xml-doctypes": ("xml", "<!DOCTYPE" * 200_000),
    # one GPU section with every entry at its top: each field lookup scans them all
    "xml-flat-gpu": ("xml", "<nvidia_smi_log><gpu>" + "<a/>" * 150_000 + "</gpu></nvidia_smi_log>"),
    "q-flat-gpu": ("q", _deep_text(2) + "\n" + "   a : b\n" * 150_000),
    "csv-long-field": ("query-gpu", "index\n" + '"' + "9" * 1_000_000 + '"\n'),
    "csv-nul": ("query-gpu", "index, name\n0, a\x00b\n"),
    "topo-wide": ("topo", "\t" + "\t".join(f"GPU{i}" for i in range(3000)) + "\n"),
    # GPU sections by the hundred thousand: ~0.2 ms each to read
    "xml-many-gpus": ("xml", "<nvidia_smi_log>" + "<gpu/>" * 150_000 + "</nvidia_smi_log>"),
    "q-many-gpus": ("q", "=NVSMI LOG=\n" + "GPU 00000000:18:00.0\n" * 150_000),
}

CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_hostile_dumps import PARSERS, WORST_CASES, settled
for name, (parser, text) in WORST_CASES.items():
    settled(PARSERS[parser], text)
    print(json.dumps(name), flush=True)
"""


def test_worst_cases_settle_in_bounded_time() -> None:
    """In a child process, so that a parser that would run for hours is stopped and fails."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", CHILD, str(Path(__file__).parent)],
            capture_output=True,
            text=True,
            timeout=CHILD_BOUND_S,
        )
    except subprocess.TimeoutExpired as expired:
        done = [json.loads(line) for line in (expired.stdout or b"").decode().splitlines()]
        pytest.fail(f"still parsing after {CHILD_BOUND_S} s; settled: {done}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert [json.loads(line) for line in result.stdout.splitlines()] == list(WORST_CASES)


# --- reading a saved dump: bounded whatever the path is ------------------------------------------


def test_a_file_over_the_bound_is_refused_by_its_size_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.xml"
    with big.open("wb") as file:
        file.truncate(1 << 30)  # sparse: 1 GiB of zeros that takes no disk
    with pytest.raises(SmiParseError) as refused:
        read_dump(big)
    assert str(refused.value) == (
        "1.0 GiB, larger than the 8.0 MiB a dump may be (nvidia-smi -q -x of 8 GPUs is ~220 KB)"
    )


def test_a_file_at_the_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / "at-bound.txt"
    path.write_bytes(b" " * MAX_OUTPUT_SIZE)
    assert len(read_dump(path)) == MAX_OUTPUT_SIZE
    path.write_bytes(b" " * (MAX_OUTPUT_SIZE + 1))
    with pytest.raises(SmiParseError, match="larger than"):
        read_dump(path)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_device_is_read_to_the_bound_only(device: str) -> None:
    with pytest.raises(SmiParseError, match=r"it holds more than the 8\.0 MiB a dump may be"):
        read_dump(Path(device))


def test_a_fifo_is_read_to_the_bound_only(tmp_path: Path) -> None:
    fifo = tmp_path / "dump.fifo"
    os.mkfifo(fifo)
    written = []

    def write() -> None:  # four times the bound at most, then it stops by itself
        chunk = b"a" * (1 << 20)
        try:
            with fifo.open("wb") as pipe:
                for _ in range(4 * MAX_OUTPUT_SIZE // len(chunk)):
                    pipe.write(chunk)
                    written.append(len(chunk))
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with pytest.raises(SmiParseError, match="it holds more than"):
        read_dump(fifo)
    writer.join(timeout=60)
    assert sum(written) < 4 * MAX_OUTPUT_SIZE  # the reader let go: the writer saw a broken pipe


def test_a_fifo_holding_a_dump_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "dump.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=(sample("xml"),), daemon=True)
    writer.start()
    assert len(parse_dump(read_dump(fifo), "h", 0.0).gpus) == 1
    writer.join(timeout=60)


def test_bytes_that_are_not_utf8_read_as_replacement_characters(tmp_path: Path) -> None:
    """A process on the host may be named with any bytes: the dump is still read."""
    path = tmp_path / "latin1.txt"
    path.write_bytes(sample("q").replace("python3", "pyth\xe9n").encode("latin-1"))
    snapshot = parse_dump(read_dump(path), "h", 0.0)
    assert [p.command for p in snapshot.processes] == ["pyth\ufffdn"]


def test_utf16_or_binary_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "utf16.xml"
    path.write_text(sample("xml"), encoding="utf-16")
    with pytest.raises(SmiParseError, match="NUL byte at offset 3"):
        read_dump(path)


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: tmp / "missing.xml",
        lambda tmp: tmp,
    ],
    ids=["missing", "directory"],
)
def test_a_path_that_cannot_be_read_is_an_oserror(tmp_path: Path, make: Callable) -> None:
    with pytest.raises(OSError):
        read_dump(make(tmp_path))


REPLACED_KEY_VALUE = re.compile(r"(?P<key>[^:]*?\S)\s*:(?:\s+(?P<value>.*?))?\s*")
"""The regex `_key_value` replaced (quadratic in a value's inner spaces): the oracle for it."""


@fuzz
@given(line=st.text(alphabet=" \t\u00a0\u3000:aZ0.[]", max_size=40))
def test_the_key_value_split_agrees_with_the_regex_it_replaced(line: str) -> None:
    content = line.strip()
    match = REPLACED_KEY_VALUE.fullmatch(content)
    expected = (match["key"], match["value"] or "") if match else (content, "")
    assert _key_value(content) == expected
