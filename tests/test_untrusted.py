"""The boundary where readings from outside become the model (`gpuconsole.core.untrusted`), and the
guards on what reaches a terminal: properties over every input, and the issue's cases."""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path

import pytest
from hostile import UNSAFE, unsafe_texts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from gpuconsole.core.untrusted import (
    MAX_GPUS,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    shown,
    vetted,
    visible,
)
from gpuconsole.rules.health import evaluate
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.prometheus import PrometheusSource
from gpuconsole.telemetry.smi import parse_dump
from gpuconsole.ui.terminal.diff import ScreenDiff
from gpuconsole.ui.terminal.plain import GuardedStream, printable

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text as a hostile host writes it: escapes, controls, bidi overrides, ordinary letters.
hostile_text = st.text(
    alphabet=st.sampled_from(
        list("\x1b\x07\x9b\x9c\x9d\n\r\t\x00\x7f\u202e\u2066\u2028[]];:\\P_^X0123456789abc ")
    )
    | st.characters(),
    max_size=80,
)
anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
)


@PROPERTY
@given(text=hostile_text, limit=st.integers(1, 200))
def test_visible_text_holds_no_control_and_keeps_its_bound(text: str, limit: int) -> None:
    shown = visible(text, limit)
    assert not UNSAFE.search(shown)
    assert len(shown) <= limit
    assert visible(shown, len(shown)) == shown  # visible text stays as it is


@PROPERTY
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp"))))
def test_ordinary_text_passes_unchanged(text: str) -> None:
    assert visible(text, len(text) + 1) == text


def test_the_stand_ins_say_what_was_there() -> None:
    assert visible("a\x1b]52;c;QQ==\x07b\nc\x9bd\u202ee") == "a␛]52;c;QQ==␇b␊c\\x9bd\\u202ee"
    assert visible("x" * 10, 5) == "xxxx…"


def gpu_states() -> st.SearchStrategy[GpuState]:
    """GPUs whose every field may be anything a broken host or a doctored file could send."""
    fields = {f.name: anything for f in dataclasses.fields(GpuState)}
    fields["index"] = st.integers(-5, 2000) | st.integers() | anything
    fields["ecc"] = st.none() | st.builds(EccCounts, *(anything,) * 4) | anything
    fields["remap"] = st.none() | st.builds(RowRemap, *(anything,) * 4)
    fields["pcie"] = st.none() | st.builds(PcieLink, *(anything,) * 4)
    fields["throttle_reasons"] = st.none() | st.tuples(hostile_text) | anything
    fields["mig_instances"] = st.lists(st.builds(MigInstance, *(anything,) * 6), max_size=2).map(
        tuple
    )
    return st.builds(GpuState, **fields)


snapshots = st.builds(
    HostSnapshot,
    host=hostile_text,
    time=st.floats(0, 2e9),
    gpus=st.lists(gpu_states(), max_size=4).map(tuple),
    processes=st.lists(st.builds(GpuProcess, *(anything,) * 8), max_size=4).map(tuple),
    topology=st.none()
    | st.builds(
        Topology,
        st.lists(st.lists(hostile_text, max_size=3).map(tuple), max_size=3).map(tuple),
        st.lists(anything, max_size=3).map(tuple),
        st.lists(anything, max_size=3).map(tuple),
    ),
    driver_version=anything,
    cuda_version=anything,
    xid_events=st.lists(st.builds(XidEvent, *(anything,) * 4), max_size=3).map(tuple),
    source=hostile_text,
    bad_values=st.integers(0, 10) | anything,
    bad_value_notes=st.lists(anything, max_size=7).map(tuple),
)

NUMBER_RANGES = {
    "utilization_pct": (0, 100),
    "memory_used_mib": (0, 1 << 24),
    "memory_total_mib": (0, 1 << 24),
    "temperature_c": (-50, 200),
    "power_w": (0, 10_000),
    "sm_clock_mhz": (0, 20_000),
}


@PROPERTY
@given(snapshot=snapshots)
def test_a_vetted_reading_holds_only_visible_text_and_possible_values(
    snapshot: HostSnapshot,
) -> None:
    clean = vetted(snapshot)
    assert unsafe_texts(clean) == []
    indices = [g.index for g in clean.gpus]
    assert len(set(indices)) == len(indices) and all(0 <= i < MAX_GPUS for i in indices)
    for gpu in clean.gpus:
        for name, (low, high) in NUMBER_RANGES.items():
            value = getattr(gpu, name)
            assert value is None or (
                not isinstance(value, bool) and math.isfinite(value) and low <= value <= high
            ), (name, value)
        if gpu.ecc is not None:
            counts = dataclasses.astuple(gpu.ecc)
            assert all(c is None or (type(c) is int and c >= 0) for c in counts)
    for process in clean.processes:
        assert type(process.pid) is int and process.pid >= 1
        assert type(process.gpu) is int and 0 <= process.gpu < MAX_GPUS
    assert vetted(clean) is clean  # nothing is left to take out
    evaluate(clean)  # the health rules read every vetted reading without failing


def test_a_clean_reading_is_not_copied() -> None:
    reading = HostSnapshot("gpu01", 1.0, (GpuState(0, name="NVIDIA H200", temperature_c=40.0),))
    assert vetted(reading) is reading


def test_the_issues_readings_are_na_and_counted_never_findings() -> None:
    reading = HostSnapshot(
        "gpu01",
        1.0,
        (
            GpuState(0, memory_used_mib=-5.0, memory_total_mib=143771.0),
            GpuState(1, ecc=EccCounts(volatile_uncorrected=-5)),
            GpuState(2, temperature_c=1e308),
            GpuState(10**18, name="a GPU nobody has"),
            GpuState(3, memory_used_mib=5e11 * 143771, memory_total_mib=143771.0),
        ),
    )
    clean = vetted(reading)
    assert [g.index for g in clean.gpus] == [0, 1, 2, 3]
    assert clean.gpus[0].memory_used_mib is None
    assert clean.gpus[1].ecc == EccCounts()
    assert clean.gpus[2].temperature_c is None
    assert clean.gpus[3].memory_used_mib is None  # not "500000000000 % used"
    assert clean.bad_values == 5
    assert [f.code for f in evaluate(clean)] == ["bad-value-from-host"]
    assert "a 19-digit number" in " ".join(clean.bad_value_notes)


def test_a_huge_number_is_described_not_written_out() -> None:
    assert shown(10**18) == "a 19-digit number"
    assert shown(-(10**400)) == "a 401-digit number"
    assert shown(10**5000) == "a number of about 5000 digits"  # str() would raise here
    quoted = shown("\x1b]0;x\x07" * 20)
    assert quoted.startswith("'\\x1b]0;x\\x07") and len(quoted) <= 40


def test_text_from_outside_is_bounded() -> None:
    reading = HostSnapshot(
        "h", 1.0, (GpuState(0),), (GpuProcess(7, 0, 1.0, command="x" * (MAX_TEXT_CHARS * 3)),)
    )
    assert len(vetted(reading).processes[0].command or "") == MAX_TEXT_CHARS


def test_a_topology_that_is_not_square_is_left_out() -> None:
    topology = Topology((("X", "NV18"), ("NV18",)))
    clean = vetted(HostSnapshot("h", 1.0, (GpuState(0), GpuState(1)), topology=topology))
    assert clean.topology is None and clean.bad_values == 1


@PROPERTY
@given(text=hostile_text)
def test_printed_text_holds_no_control_but_newline_and_tab(text: str) -> None:
    out = io.StringIO()
    GuardedStream(out).write(text)  # type: ignore[arg-type]
    written = out.getvalue()
    assert written == printable(text)
    assert all(c in "\n\t" or not (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F) for c in written)


# Pieces of terminal output: Textual's own sequences, and what a host might have smuggled.
pieces = st.sampled_from(
    [
        "gpu",
        " ",
        "\x1b[1;1H",
        "\x1b[31m",
        "\x1b[0m",
        "\x1b]8;id=1;https://x\x1b\\",
        "\x1b]8;;\x1b\\",
        "\x1b]0;owned\x07",
        "\x1b]52;c;SE9TVElMRQ==\x07",
        "\x1b]2;t\x1b\\",
        "\x1bPq#0~\x1b\\",
        "\x1b_Ga=T\x1b\\",
        "\x9b2J",
        "\x9d0;x\x9c",
        "\x1b]0;never",
        "\x1b",
        "]",
        "\x07",
        "\x1b[4h",
        "\x1b[4l",
        "\n",
    ]
)


@PROPERTY
@given(chunks=st.lists(st.lists(pieces, max_size=12).map("".join), max_size=6))
def test_the_filter_lets_no_foreign_sequence_out(chunks: list[str]) -> None:
    diff = ScreenDiff(20, 4)
    out = "".join(diff.feed(chunk) for chunk in chunks)
    # (OSC 52 is Textual's own copy_to_clipboard; content cannot reach it: see strips.py)
    for foreign in ("\x1b]0;", "\x1b]2;", "\x1bP", "\x1b_"):
        assert foreign not in out
    assert not any("\x80" <= c <= "\x9f" for c in out)


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia-smi"


@pytest.mark.parametrize("name", ["h200-q.xml", "h200-q-loaded.xml", "h200-q-loaded.txt"])
def test_a_real_h200_dump_has_no_bad_values(name: str) -> None:
    snapshot = parse_dump((FIXTURES / name).read_text(), "h200", 1.0)
    assert snapshot.gpus and snapshot.bad_values == 0, snapshot.bad_value_notes


def test_what_a_known_reading_shares_is_not_checked_again_what_changed_is() -> None:
    keyframe = vetted(HostSnapshot("h", 1.0, (GpuState(0, temperature_c=40.0), GpuState(1))))
    changed = GpuState(1, temperature_c=1e308)
    delta = dataclasses.replace(keyframe, time=2.0, gpus=(keyframe.gpus[0], changed))
    checked = vetted(delta, keyframe)
    assert checked.gpus[0] is keyframe.gpus[0]
    assert checked.gpus[1].temperature_c is None and checked.bad_values == 1


# --- Prometheus's answers: what its exporters wrote, in labels and values -------------------------

_label_values = hostile_text | st.sampled_from(["0", "1", "7", "gpu-a01", "9" * 400]) | anything
_metric_names = st.sampled_from(
    ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
     "DCGM_FI_DEV_XID_ERRORS", "gpuconsole_host_state", "up"]
)  # fmt: skip
_samples = st.builds(
    lambda good, junk: [*good, *junk],
    st.lists(
        st.fixed_dictionaries(
            {
                "metric": st.fixed_dictionaries(
                    {"__name__": _metric_names, "Hostname": hostile_text | _label_values},
                    optional={
                        "gpu": _label_values,
                        "modelName": _label_values,
                        "state": _label_values,
                    },
                ),
                "value": st.tuples(st.floats(0, 2e9), st.sampled_from(["1", "85", "-5", "1e308"]))
                | anything,
            }
        ),
        min_size=1,
        max_size=5,
    ),
    st.lists(anything | st.fixed_dictionaries({"metric": anything}), max_size=2),
)


class _Answers:
    """A Prometheus API that answers every query with the same samples."""

    url = "http://127.0.0.1:9090"

    def __init__(self, samples: list[object]) -> None:
        self.samples = samples

    def query(self, promql: str, at: float) -> list[object]:
        return [
            s for s in self.samples if isinstance(s, dict) and isinstance(s.get("metric"), dict)
        ]


@PROPERTY
@given(samples=_samples)
def test_any_prometheus_answer_reads_as_data_or_a_reason(samples: list[object]) -> None:
    try:
        source = PrometheusSource("http://127.0.0.1:9090", api=_Answers(samples), clock=lambda: 1e9)
    except SourceError:
        return  # no GPU metric among them: said in one line
    assert unsafe_texts(source.hosts) == []
    for host in source.hosts:
        try:
            snapshot = source.read(host)
        except SourceError as error:
            assert "\n" not in str(error)
            continue
        assert unsafe_texts(snapshot) == [] and snapshot.host == host


def test_a_slurm_job_name_reaches_no_terminal_as_an_escape_and_a_bad_id_is_dropped() -> None:
    job = SlurmJob(7, "\x1b]52;c;cm0gLXJm\x07evil", "bob\x1b[2J", None, None, None, None)
    process = GpuProcess(1, 0, 10.0, job=job)
    forged = GpuProcess(2, 0, 10.0, job=SlurmJob(1 << 40, "x", None, None, None, None, None))
    snapshot = vetted(HostSnapshot("h", 0.0, (GpuState(0),), processes=(process, forged)))
    kept, dropped = snapshot.processes
    assert kept.job is not None and kept.job.job_id == 7
    assert "\x1b" not in (kept.job.name or "") + (kept.job.user or "")
    assert dropped.job is None and snapshot.bad_values == 1


POD_UIDS = ("5f1c2e9a-7b3d-4c8e-9a61-2d4f8b0c7e13", "33d556edd3ae8ef21980288cef77ae8b")
"""A pod uid's two forms: a UUID, and a static pod's 32-hex manifest hash."""
owned_processes = st.builds(
    GpuProcess,
    pid=st.integers(1, 5),
    gpu=st.just(0),
    used_memory_mib=st.just(1.0),
    pod=st.none()
    | st.builds(KubePod, st.sampled_from(POD_UIDS) | anything, anything, anything, anything)
    | anything,
    container_name=anything,
    started=anything,
    load=st.none() | st.builds(ProcessLoad, anything, anything, anything, anything) | anything,
)


@PROPERTY
@given(
    processes=st.lists(owned_processes, max_size=3).map(tuple),
    node=st.none() | st.builds(SchedulerNode, anything, anything, anything, anything) | anything,
)
def test_owners_loads_and_nodes_are_vetted_to_safe_text_and_possible_values(
    processes: tuple[GpuProcess, ...], node: object
) -> None:
    clean = vetted(HostSnapshot("h", 1.0, (GpuState(0),), processes=processes, node=node))
    assert unsafe_texts(clean) == []
    for process in clean.processes:
        pod, load = process.pod, process.load
        assert pod is None or (isinstance(pod, KubePod) and pod.uid in POD_UIDS)
        if pod is not None:
            names = (pod.namespace, pod.name, pod.container)
            assert all(n is None or (type(n) is str and len(n) <= MAX_NAME_CHARS) for n in names)
        shares = () if load is None else dataclasses.astuple(load)
        assert load is None or isinstance(load, ProcessLoad)
        assert all(s is None or (type(s) in (int, float) and 0 <= s <= 100) for s in shares)
        assert process.started is None or 0 <= process.started <= 2**34
        name = process.container_name
        assert name is None or (type(name) is str and len(name) <= MAX_NAME_CHARS)
    if clean.node is not None:
        texts = (clean.node.scheduler, clean.node.name, clean.node.state)
        assert all(type(t) is str and 0 < len(t) <= MAX_NAME_CHARS for t in texts)
    assert vetted(clean) is clean  # nothing is left to take out


@given(st.lists(st.characters(categories=("Cs",)) | st.characters(), max_size=50).map("".join))
def test_visible_text_can_always_be_written_as_utf8(text: str) -> None:
    """A lone surrogate (JSON's "\\ud800") would make printing or --json raise; made visible,
    any text writes."""
    shown = visible(text)
    shown.encode("utf-8")
    assert not UNSAFE.search(shown)
