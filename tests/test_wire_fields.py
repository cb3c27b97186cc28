"""Issue 35: any JSON value in any field of an agent's reading gives a reading with that field
alone N/A (with a note naming it), or, for the few fields that place the reading (its version,
type, tick, time and lists, a GPU's index, a process's pid and GPU), a clear one-line reason.
Never an exception.

The reading is the real agent's (its sim mode), with one field replaced.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from smi_captures import NOHEADER_FIELDS, fixture

from gpuconsole.core.fields import FIELDS
from gpuconsole.core.model import HostSnapshot
from gpuconsole.telemetry.agent import SimGpus
from gpuconsole.telemetry.smi.query import QUERY_COMPUTE_APPS_FIELDS
from gpuconsole.telemetry.wire import AgentStream, AgentTick

NOW = 1_767_225_600.0
HOST_TIME = NOW - 0.5

_gpus, _processes = SimGpus(1, "gpu-node-07").read(HOST_TIME)
_processes[0].update(
    slurm_job=41327,
    mig_instance=None,
    pod={"uid": "0b5e9f1c-2d3a-4b5c-8d9e-0f1a2b3c4d5e", "namespace": "ml", "name": "t-0"},
)
BASE_LINE: dict[str, object] = {
    "v": 2,
    "type": "reading",
    "seq": 1,
    "time": HOST_TIME,
    "gpus": _gpus,
    "processes": _processes,
    "jobs": [
        {
            "job_id": 41327,
            "name": "llama-ft",
            "user": "alice",
            "partition": "gpu",
            "start": "2026-01-01T00:00:00",
            "time_limit": "1-00:00:00",
            "state": "RUNNING",
        }
    ],
    "node": {"scheduler": "slurm", "name": "gpu-node-07", "state": "MIXED", "reason": None},
}
HELLO = {"v": 2, "type": "hello", "mode": "sim", "agent_pid": 7, "hostname": "gpu-node-07"}

PLACING = {("line", key) for key in ("v", "type", "seq", "time", "gpus", "processes")} | {
    ("gpu", "index"),
    ("process", "pid"),
    ("process", "gpu"),
}
"""The fields without which a reading cannot be placed: these may cost the line."""

GPU_ATTRIBUTES = {
    key: {spec.part or spec.name for spec in FIELDS if spec.wire_key == key or spec.part == key}
    for key in _gpus[0]
}
"""Each key of a GPU entry, and the `GpuState` attributes it fills."""
PROCESS_ATTRIBUTES = {
    "used_memory_mib": {"used_memory_mib"},
    "user": {"user"},
    "command": {"command"},
    "kind": {"kind"},
    "cgroup": {"container"},
    "mig_instance": {"mig_instance"},
    "slurm_job": {"job"},
    "pod": {"pod"},
    "container_name": {"container_name"},
    "started": {"started"},
    "load": {"load"},
    "start_time": set(),  # only checked: older consoles read it
}
"""Each key of a process entry, and the `GpuProcess` attributes it fills."""

WHERES = sorted(
    {("line", key) for key in BASE_LINE}
    | {("gpu", key) for key in _gpus[0]}
    | {("process", key) for key in _processes[0]}
)

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([-1, 0, 2**63, 2**64, 10**308, 10**309, -(10**400)])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def decoded(where: str, key: str, value: object) -> tuple[AgentStream, AgentTick | None]:
    line = copy.deepcopy(BASE_LINE)
    entry = {"line": line, "gpu": line["gpus"][0], "process": line["processes"][0]}[where]  # type: ignore[index]
    entry[key] = value
    stream = AgentStream("gpu-node-07", clock=lambda: NOW)
    stream.feed(json.dumps(HELLO))
    event = stream.feed(json.dumps(line))  # nothing it holds may raise
    assert event is None or isinstance(event, AgentTick)
    return stream, event


BASE = decoded("line", "seq", 1)[1]


def without(snapshot: HostSnapshot, where: str, key: str) -> HostSnapshot:
    """``snapshot`` with what ``key`` fills put back as the unchanged reading has it, and its
    notes left out: what must then equal the unchanged reading."""
    assert BASE is not None
    base = BASE.snapshot
    changes: dict[str, object] = {"bad_values": 0, "bad_value_notes": ()}
    if where == "gpu":
        back = {a: getattr(base.gpus[0], a) for a in GPU_ATTRIBUTES[key]}
        changes["gpus"] = (dataclasses.replace(snapshot.gpus[0], **back),)
    elif where == "process" or key == "jobs":
        names = {"jobs"} if key == "jobs" else PROCESS_ATTRIBUTES[key]
        back = {a: getattr(base.processes[0], a) for a in names if a != "jobs"}
        back |= {"job": base.processes[0].job} if key == "jobs" else {}
        changes["processes"] = (dataclasses.replace(snapshot.processes[0], **back),)
    elif key == "node":
        changes["node"] = base.node
    return dataclasses.replace(snapshot, **changes)


def assert_the_unchanged_reading_is_read_whole() -> None:
    """What the property compares with: the agent's reading, every part of it read."""
    assert BASE is not None
    snapshot = BASE.snapshot
    assert snapshot.bad_values == 0, snapshot.bad_value_notes
    assert snapshot.processes[0].job is not None and snapshot.processes[0].pod is not None
    assert snapshot.node is not None and snapshot.gpus[0].ecc is not None
    assert all(GPU_ATTRIBUTES[key] for key in _gpus[0] if key != "index")
    assert set(PROCESS_ATTRIBUTES) == set(_processes[0]) - {"pid", "gpu"}


@settings(max_examples=600, deadline=None)
@given(where=st.sampled_from(WHERES), value=_json_values)
@example(where=("gpu", "memory_total_mib"), value=0)  # below the memory used: see below
def test_any_value_in_any_field_is_that_field_na_or_one_line_why(
    where: tuple[str, str], value: object
) -> None:
    assert_the_unchanged_reading_is_read_whole()
    stream, event = decoded(*where, value)
    if event is None:
        reason = stream.last_malformed
        assert reason and "\n" not in reason and len(reason) < 300, reason
        assert where in PLACING, f"{where} {value!r} cost the whole reading: {reason}"
        return
    snapshot = event.snapshot
    if where in PLACING:
        return
    assert BASE is not None
    if where == ("gpu", "memory_total_mib") and snapshot.gpus[0].memory_used_mib is None:
        # untrusted's one rule across fields: memory used above the total is N/A, and its note
        # names the total too.
        used = BASE.snapshot.gpus[0].memory_used_mib
        total = snapshot.gpus[0].memory_total_mib
        assert used is not None and total is not None and used > total
        gpu = dataclasses.replace(snapshot.gpus[0], memory_used_mib=used)
        snapshot = dataclasses.replace(snapshot, gpus=(gpu,))
    assert without(snapshot, *where) == BASE.snapshot, "more than the one field changed"
    notes = snapshot.bad_value_notes
    assert snapshot.bad_values >= len(notes)
    assert all(note and "\n" not in note for note in notes)
    assert all(any(name in note.lower() for name in names_of(*where)) for note in notes), notes


def names_of(where: str, key: str) -> set[str]:
    """What a note about ``key`` may call it, in lower case: the key, or the attribute it fills
    as the range checks name it ("job id", "memory used"), or one of its entries ("a MIG
    instance")."""
    attributes = {"gpu": GPU_ATTRIBUTES, "process": PROCESS_ATTRIBUTES}.get(where, {})
    words = {key, key.removesuffix("s"), *attributes.get(key, ())}
    words |= {"slurm job"} if key == "jobs" else {"job id"} if key == "slurm_job" else set()
    return words | {word.replace("_", " ") for word in words}


WRONG_TYPES = [
    (("process", "used_memory_mib"), "lots", "a process used_memory_mib is 'lots', not a"),
    (("process", "user"), 1000, "a process user is 1000, not a string"),
    (("process", "command"), ["python"], "a process command is ['python'], not a string"),
    (("process", "kind"), True, "a process kind is True, not a string"),
    (("process", "cgroup"), {}, "a process cgroup is {}, not a string"),
    (("process", "mig_instance"), "1", "a process mig_instance is '1', not a whole number"),
    (("process", "start_time"), 1.5, "a process start_time is 1.5, not a whole number"),
    (("process", "slurm_job"), "41327", "a process slurm_job is '41327', not a whole"),
    (("gpu", "memory_used_mib"), 10**309, "a GPU memory_used_mib is 1000000000"),
]


@pytest.mark.parametrize(
    ("where", "value", "note"),
    WRONG_TYPES,
    ids=[f"{where}-{key}" for (where, key), _, _ in WRONG_TYPES],
)
def test_a_value_of_the_wrong_type_is_na_alone_with_a_note(
    where: tuple[str, str], value: object, note: str
) -> None:
    stream, event = decoded(*where, value)
    assert event is not None, stream.last_malformed
    assert event.snapshot.bad_values == 1
    assert event.snapshot.bad_value_notes[0].startswith(note), event.snapshot.bad_value_notes
    gpu, process = event.snapshot.gpus[0], event.snapshot.processes[0]
    attributes = GPU_ATTRIBUTES if where[0] == "gpu" else PROCESS_ATTRIBUTES
    owner = gpu if where[0] == "gpu" else process
    for attribute in attributes[where[1]]:
        assert getattr(owner, attribute) in (None, "compute"), attribute  # kind's default


@pytest.mark.parametrize(
    ("extra", "note"),
    [
        ({"pid": "552", "user": "bob"}, "a process pid is '552', not a whole number"),
        ({"pid": 552, "user": ["bob"]}, "a process user is ['bob'], not a string"),
        ({"pid": 552, "command": 7}, "a process command is 7, not a string"),
        ({"pid": 552, "cgroup": 0}, "a process cgroup is 0, not a string"),
    ],
    ids=["pid", "user", "command", "cgroup"],
)
def test_in_smi_mode_a_process_detail_of_the_wrong_type_costs_only_itself(
    extra: dict[str, object], note: str
) -> None:
    """smi mode: nvidia-smi's CSV says which processes there are; what the agent read of each
    in /proc only adds to them, so a detail that cannot be read leaves nvidia-smi's word."""
    line = {
        "v": 2,
        "type": "reading",
        "seq": 4,
        "time": HOST_TIME,
        "gpu_csv": fixture("h200-query-gpu-loaded-noheader-nounits.csv"),
        "gpu_fields": list(NOHEADER_FIELDS),
        "apps_csv": fixture("h200-compute-apps.csv").split("\n", 1)[1],
        "apps_fields": list(QUERY_COMPUTE_APPS_FIELDS),
        "processes": [extra],
    }
    stream = AgentStream("gpu-node-07", clock=lambda: NOW)
    stream.feed(json.dumps({**HELLO, "mode": "smi"}))
    event = stream.feed(json.dumps(line))
    assert isinstance(event, AgentTick), stream.last_malformed
    (process,) = event.snapshot.processes
    assert (process.pid, process.gpu, process.used_memory_mib) == (552, 0, 1002.0)
    assert process.command  # nvidia-smi's process name where the agent's is N/A
    assert event.snapshot.bad_values == 1
    assert event.snapshot.bad_value_notes[0].startswith(note), event.snapshot.bad_value_notes
