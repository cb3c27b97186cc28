"""The console's side of the agent protocol: the start command, and lines turned into events
(or counted as malformed, never raising)."""

from __future__ import annotations

import ast
import dataclasses
import json
import shlex
import subprocess
import sys

import pytest
from hostile import unsafe_texts
from hypothesis import given, settings
from hypothesis import strategies as st
from smi_captures import NOHEADER_FIELDS, fixture

from gpuconsole.core.clock import ManualClock
from gpuconsole.core.model import EccCounts, GpuProcess, PcieLink, RowRemap
from gpuconsole.telemetry.smi.query import QUERY_COMPUTE_APPS_FIELDS, QUERY_GPU_FIELDS
from gpuconsole.telemetry.wire import (
    AGENT_MARKER,
    MAX_LINE_CHARS,
    MAX_TEXT_CHARS,
    AgentError,
    AgentStream,
    AgentTick,
    Hello,
    Reply,
    agent_command,
    agent_script,
    encode_command,
)

LOADED_UUID = "GPU-175817c4-01e6-602d-8cec-942989c1e518"
DOCKER_ID = "4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"
DOCKER_CGROUP = f"0::/system.slice/docker-{DOCKER_ID}.scope\n"
HOST_TIME = 1_767_225_000.5
NOW = 1_767_225_600.0


def line(kind: str, **fields: object) -> str:
    return json.dumps({"v": 2, "type": kind, **fields}) + "\n"


def hello(mode: str = "nvml", **fields: object) -> str:
    values: dict[str, object] = {
        "agent_pid": 4242,
        "hostname": "gpu-node-07",
        "mode": mode,
        "python": "3.8.10",
        "driver": "580.159.04",
        "cuda": "13.0",
        "topology": fixture("h200-topo-m.txt"),
    }
    return line("hello", **{**values, **fields})


def nvml_gpu(**fields: object) -> dict[str, object]:
    gpu: dict[str, object] = {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": LOADED_UUID,
        "pci_bus_id": "00000000:00:06.0",
        "utilization_pct": 99,
        "memory_utilization_pct": 61,
        "memory_used_mib": 1011.0,
        "memory_total_mib": 143771.0,
        "temperature_c": 70,
        "slowdown_temperature_c": 87,
        "power_w": 689.92,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1485,
        "sm_clock_max_mhz": 1980,
        "memory_clock_mhz": 3201,
        "memory_clock_max_mhz": 3201,
        "pstate": 0,
        "fan_pct": None,
        "throttle_mask": 0x21,
        "ecc": {
            "volatile_corrected": 0,
            "volatile_uncorrected": 2,
            "aggregate_corrected": 5,
            "aggregate_uncorrected": 2,
        },
        "remap": {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False},
        "pcie": {"gen": 5, "width": 8, "max_gen": 5, "max_width": 16},
        "persistence_mode": True,
        "compute_mode": 3,
        "mig_mode": False,
        "lost": False,
    }
    return {**gpu, **fields}


def nvml_process(**fields: object) -> dict[str, object]:
    process: dict[str, object] = {
        "pid": 552,
        "gpu": 0,
        "used_memory_mib": 1002.0,
        "user": "alice",
        "command": "python3 train.py --epochs 3",
        "cgroup": DOCKER_CGROUP,
        "start_time": 123456,
        "kind": "compute",
    }
    return {**process, **fields}


def reading(**fields: object) -> str:
    values: dict[str, object] = {
        "seq": 1,
        "time": HOST_TIME,
        "gpus": [nvml_gpu()],
        "processes": [nvml_process()],
    }
    return line("reading", **{**values, **fields})


@pytest.fixture
def stream() -> AgentStream:
    return AgentStream("rack1-node7", ManualClock(NOW))


def greeted(stream: AgentStream, mode: str = "nvml") -> AgentStream:
    assert isinstance(stream.feed(hello(mode)), Hello)
    return stream


# --- the start command ---------------------------------------------------------------------------


def test_agent_script_imports_only_the_standard_library() -> None:
    tree = ast.parse(agent_script())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
        )
    }
    assert "json" in imported and "ctypes" in imported
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_agent_command_is_one_shell_line_with_the_fallback() -> None:
    command = agent_command(38_000, 0.5, "smi", 4, timeout=2.5)
    assert "\n" not in command
    subprocess.run(["bash", "-n", "-c", command], check=True)
    words = shlex.split(command)
    assert words[:6] == ["if", "command", "-v", "python3", ">/dev/null", "2>&1;"]
    python = words.index("python3", 4)
    bootstrap = words[python + 3]
    assert bootstrap == (
        'import sys;exec(compile(sys.stdin.buffer.read(38000),"gpuconsole-agent","exec"))'
    )
    arguments = words[python + 4 : words.index("else")]
    assert arguments[0] == AGENT_MARKER
    assert arguments[1:9] == [
        "--interval",
        "0.5",
        "--mode",
        "smi",
        "--gpus",
        "4",
        "--timeout",
        "2.5",
    ]
    assert arguments[10] == ",".join(QUERY_GPU_FIELDS)
    assert arguments[12].rstrip(";") == ",".join(QUERY_COMPUTE_APPS_FIELDS)
    fallback = words[words.index("else") + 1 :]
    assert fallback == [
        "exec",
        "nvidia-smi",
        "--query-gpu=" + ",".join(QUERY_GPU_FIELDS),
        "--format=csv,noheader,nounits",
        "-lms",
        "500;",
        "fi",
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((100, 0.01), "interval 0.01 s is outside"),
        ((100, 1.0, "cuda"), "mode 'cuda' is not one of"),
        ((100, 1.0, "sim", 0), "0 simulated GPUs"),
        ((0, 1.0), "script length 0"),
    ],
)
def test_agent_command_refuses_what_the_agent_would(arguments: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        agent_command(*arguments)


def test_a_command_is_one_json_line_with_the_version() -> None:
    encoded = encode_command({"cmd": "signal", "id": 3, "pid": 9, "command": "a\nb"})
    assert encoded.endswith(b"\n") and encoded.count(b"\n") == 1
    assert json.loads(encoded) == {"v": 2, "cmd": "signal", "id": 3, "pid": 9, "command": "a\nb"}


# --- hello, error, reply -------------------------------------------------------------------------


def test_hello(stream: AgentStream) -> None:
    event = stream.feed(hello())
    assert isinstance(event, Hello)
    assert (event.agent_pid, event.hostname, event.mode) == (4242, "gpu-node-07", "nvml")
    assert (event.driver_version, event.cuda_version) == ("580.159.04", "13.0")
    assert event.topology is not None and event.topology.matrix == (("X",),)
    assert stream.mode == "nvml" and stream.malformed == 0


def test_hello_with_unreadable_topology_keeps_the_rest(stream: AgentStream) -> None:
    event = stream.feed(hello(topology="nvidia-smi: command failed"))
    assert isinstance(event, Hello) and event.topology is None
    assert event.driver_version == "580.159.04"


def test_error_and_reply(stream: AgentStream) -> None:
    error = stream.feed(line("error", time=HOST_TIME, message="nvidia-smi  timed\tout"))
    assert error == AgentError("nvidia-smi timed out")
    reply = stream.feed(line("reply", id=7, ok=True, message="sent TERM to pid 552"))
    assert reply == Reply(7, True, "sent TERM to pid 552")


# --- readings ------------------------------------------------------------------------------------


def test_nvml_reading_maps_codes_to_the_models_words(stream: AgentStream) -> None:
    event = greeted(stream).feed(reading())
    assert isinstance(event, AgentTick)
    assert event.sent_at == HOST_TIME
    snapshot = event.snapshot
    assert (snapshot.host, snapshot.time, snapshot.source) == ("rack1-node7", NOW, "agent-nvml")
    assert (snapshot.driver_version, snapshot.cuda_version) == ("580.159.04", "13.0")
    assert snapshot.topology is not None and snapshot.topology.gpu_count == 1
    (gpu,) = snapshot.gpus
    assert (gpu.index, gpu.name, gpu.uuid) == (0, "NVIDIA H200", LOADED_UUID)
    assert (gpu.utilization_pct, gpu.temperature_c, gpu.power_w) == (99.0, 70.0, 689.92)
    assert gpu.pstate == "P0"
    assert gpu.throttle_reasons == ("gpu-idle", "sw-thermal")
    assert gpu.compute_mode == "Exclusive_Process"
    assert gpu.fan_pct is None
    assert gpu.ecc == EccCounts(0, 2, 5, 2)
    assert gpu.remap == RowRemap(correctable=0, uncorrectable=1, pending=True, failure=False)
    assert gpu.pcie == PcieLink(gen=5, width=8, max_gen=5, max_width=16)
    assert gpu.pcie.degraded_width
    assert (gpu.persistence_mode, gpu.mig_mode, gpu.lost) == (True, False, False)
    assert snapshot.processes == (
        GpuProcess(
            pid=552,
            gpu=0,
            used_memory_mib=1002.0,
            user="alice",
            command="python3 train.py --epochs 3",
            kind="compute",
            container=f"docker:{DOCKER_ID[:12]}",
        ),
    )


def test_unsupported_fields_are_none_and_a_lost_gpu_is_lost(stream: AgentStream) -> None:
    lost = {"index": 1, "lost": True, "ecc": None, "pcie": {"gen": None}}
    unsupported = nvml_gpu(pstate=32, throttle_mask=None, compute_mode=None, ecc=None)
    event = greeted(stream).feed(reading(gpus=[lost, unsupported], processes=[]))
    assert isinstance(event, AgentTick)
    first, second = event.snapshot.gpus  # in index order
    assert (first.index, second.index) == (0, 1)
    assert (first.pstate, first.throttle_reasons, first.compute_mode, first.ecc) == (None,) * 4
    assert second.lost and second.name is None and second.pcie is None and second.ecc is None


def test_long_strings_are_cut(stream: AgentStream) -> None:
    event = greeted(stream).feed(reading(gpus=[nvml_gpu(name="H" * 10_000)]))
    assert isinstance(event, AgentTick)
    assert event.snapshot.gpus[0].name == "H" * MAX_TEXT_CHARS


def smi_reading(**fields: object) -> str:
    apps = fixture("h200-compute-apps.csv").splitlines()[1:]  # as noheader prints it
    values: dict[str, object] = {
        "seq": 4,
        "time": HOST_TIME,
        "gpu_csv": fixture("h200-query-gpu-loaded-noheader-nounits.csv"),
        "gpu_fields": list(NOHEADER_FIELDS),
        "apps_csv": "\n".join(apps) + "\n",
        "apps_fields": list(QUERY_COMPUTE_APPS_FIELDS),
        "processes": [
            {"pid": 552, "user": "bob", "command": "python3 -m bench", "cgroup": DOCKER_CGROUP}
        ],
    }
    return line("reading", **{**values, **fields})


def test_smi_reading_parses_the_h200_capture(stream: AgentStream) -> None:
    event = greeted(stream, "smi").feed(smi_reading())
    assert isinstance(event, AgentTick)
    assert event.snapshot.source == "agent-smi"
    (gpu,) = event.snapshot.gpus
    assert (gpu.uuid, gpu.utilization_pct, gpu.power_w) == (LOADED_UUID, 99.0, 689.92)
    assert gpu.throttle_reasons == ("sw-power-cap",)
    (process,) = event.snapshot.processes
    assert (process.pid, process.gpu, process.used_memory_mib) == (552, 0, 1002.0)
    assert (process.user, process.command) == ("bob", "python3 -m bench")
    assert process.container == f"docker:{DOCKER_ID[:12]}"


def test_smi_reading_without_proc_details_keeps_the_process_name(stream: AgentStream) -> None:
    event = greeted(stream, "smi").feed(smi_reading(processes=[]))
    assert isinstance(event, AgentTick)
    (process,) = event.snapshot.processes
    assert (process.command, process.user, process.container) == ("python3", None, None)


# --- malformed lines -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "field", "note"),
    [
        (
            {"utilization_pct": "99"},
            "utilization_pct",
            "a GPU utilization_pct is '99', not a number",
        ),
        ({"power_w": True}, "power_w", "a GPU power_w is True, not a number"),
        ({"pstate": 0.5}, "pstate", "a GPU pstate is 0.5, not a whole number"),
        ({"ecc": [0, 1]}, "ecc", "a GPU ecc is not an object"),
        ({"mig_instances": [{"name": "x"}]}, "mig_instances", "a MIG instance has no gpu_inst"),
        # codes outside what NVML gives are N/A, never a word or a finding
        ({"recovery_action": 2**80}, "recovery_action", "a GPU recovery_action is 1208925"),
        ({"throttle_mask": -1}, "throttle_reasons", "a GPU throttle_mask is -1, not within 0"),
        ({"pstate": 99}, "pstate", "a GPU pstate is 99, not within 0 ... 32"),
    ],
)
def test_a_field_of_the_wrong_type_is_na_alone(
    stream: AgentStream, entry: dict[str, object], field: str, note: str
) -> None:
    event = greeted(stream).feed(reading(gpus=[nvml_gpu(**entry)]))
    assert isinstance(event, AgentTick), stream.last_malformed
    (gpu,) = event.snapshot.gpus
    whole = greeted(AgentStream("rack1-node7", ManualClock(NOW))).feed(reading())
    assert isinstance(whole, AgentTick)
    assert getattr(gpu, field) in (None, ())
    assert (
        dataclasses.replace(gpu, **{field: getattr(whole.snapshot.gpus[0], field)})
        == (whole.snapshot.gpus[0])
    )
    assert event.snapshot.bad_values == 1
    assert event.snapshot.bad_value_notes[0].startswith(note)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"v": 2, "type": "hello"', "not JSON"),
        ("[1, 2, 3]", "the line is not an object"),
        ('{"v": 2, "type": "error", "message": NaN}', "not JSON"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
        (line("error", message="m").replace('"v": 2', '"v": 1'), "protocol version 1, not 2"),
        (line("error", message="m").replace('"v": 2', '"v": "2"'), "v is '2', not a whole"),
        (line("error", message="m").replace('"v": 2, ', ""), "the line has no v"),
        (line("goodbye"), "unknown type 'goodbye'"),
        (line("error", time=HOST_TIME), "the line has no message"),
        (line("reply", id=1, ok="yes", message="m"), "ok is 'yes', not true or false"),
        (hello(mode="cuda"), "hello mode is 'cuda'"),
        (hello(agent_pid="4242"), "agent_pid is '4242', not a whole number"),
        (reading(gpus=[{"name": "no index"}]), "a GPU has no index"),
        (reading(gpus="all"), "gpus is 'all', not a list"),
        (reading(processes=[nvml_process(pid=None)]), "a process has no pid"),
        (reading(time="now"), "time is 'now', not a number"),
        (reading(seq=None), "the line has no seq"),
        (smi_reading(gpu_csv="0, GPU-x, H200\n"), "CSV row 1 has 3 values for 11 fields"),
        (smi_reading(gpu_fields="index,name"), "gpu_fields is 'index,name', not a list"),
        (smi_reading(apps_csv="552, python3, GPU-unknown, 10\n"), "process '552' is on GPU"),
        ("x" * (MAX_LINE_CHARS + 1), f"a line of {MAX_LINE_CHARS + 1} characters"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the driver", "neither JSON"),
    ],
)
def test_malformed_lines_are_counted_with_a_reason(
    stream: AgentStream, text: str, reason: str
) -> None:
    greeted(stream, "smi" if "gpu_csv" in text else "nvml")
    assert stream.feed(text) is None
    assert stream.malformed == 1
    assert stream.last_malformed is not None and reason in stream.last_malformed
    assert "\n" not in stream.last_malformed and len(stream.last_malformed) < 300


def test_a_reading_before_the_hello_is_malformed(stream: AgentStream) -> None:
    assert stream.feed(reading()) is None
    assert stream.malformed == 1 and "before the hello" in (stream.last_malformed or "")


def test_blank_lines_are_not_counted(stream: AgentStream) -> None:
    assert stream.feed("\n") is None and stream.feed("   ") is None
    assert stream.malformed == 0


def test_the_stream_goes_on_after_a_malformed_line(stream: AgentStream) -> None:
    greeted(stream)
    assert stream.feed("{garbage") is None
    assert isinstance(stream.feed(reading()), AgentTick)
    assert stream.malformed == 1


# --- the no-python3 fallback: nvidia-smi -lms rows -----------------------------------------------


def csv_row(index: int, utilization: int) -> str:
    """A row of the fallback's fields: H200 values where the capture has them, else [N/A]."""
    known = {
        "index": str(index),
        "name": "NVIDIA H200",
        "uuid": f"GPU-175817c4-01e6-602d-8cec-94298{index:07d}",
        "utilization.gpu": str(utilization),
        "memory.used": "1011",
        "memory.total": "143771",
        "temperature.gpu": "70",
        "power.draw": "689.92",
        "power.limit": "700.00",
        "pstate": "P0",
        "clocks_event_reasons.active": "0x0000000000000004",
    }
    return ", ".join(known.get(name, "[N/A]") for name in QUERY_GPU_FIELDS) + "\n"


def test_smi_stream_rows_make_a_reading_per_tick(stream: AgentStream) -> None:
    assert stream.feed(csv_row(0, 10)) is None
    assert stream.feed(csv_row(1, 20)) is None
    assert stream.mode == "smi-stream"
    first = stream.feed(csv_row(0, 30))  # index 0 again: the first tick is complete
    assert isinstance(first, AgentTick) and first.sent_at is None
    assert [gpu.utilization_pct for gpu in first.snapshot.gpus] == [10.0, 20.0]
    assert (first.snapshot.source, first.snapshot.time) == ("smi-stream", NOW)
    second = stream.feed(csv_row(1, 40))  # two GPUs known: complete without waiting
    assert isinstance(second, AgentTick)
    assert [gpu.utilization_pct for gpu in second.snapshot.gpus] == [30.0, 40.0]
    assert second.snapshot.gpus[0].power_w == 689.92
    assert second.snapshot.gpus[0].throttle_reasons == ("sw-power-cap",)
    assert stream.feed("Unable to determine the device handle for GPU 1: Unknown Error") is None
    assert stream.malformed == 1
    assert stream.feed(csv_row(0, 50)) is None
    assert isinstance(stream.feed(csv_row(1, 60)), AgentTick)


def test_smi_stream_of_one_gpu(stream: AgentStream) -> None:
    assert stream.feed(csv_row(0, 10)) is None
    events = [stream.feed(csv_row(0, utilization)) for utilization in (20, 30, 40)]
    utilizations = [
        event.snapshot.gpus[0].utilization_pct for event in events if isinstance(event, AgentTick)
    ]
    assert utilizations == [20.0, 30.0, 40.0]


# --- whatever an agent (or what answers in its place) sends ---------------------------------------

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(alphabet=st.sampled_from(list("\x1b]52;c\x07\n\x9b\u202eab0 ")) | st.characters()),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_hostile_text = st.text(alphabet=st.sampled_from(list("\x1b]52;c\x07\n\x9b\u202eab0 ")))
_gpu_entries = st.fixed_dictionaries(
    {"index": st.integers(0, 7) | st.integers()},
    optional={
        key: _json_values | _hostile_text
        for key in ("name", "uuid", "temperature_c", "memory_used_mib", "memory_total_mib",
                    "ecc", "pcie", "remap", "throttle_mask", "pstate", "lost", "power_w")
    },
)  # fmt: skip
_process_entries = st.fixed_dictionaries(
    {"pid": st.integers(1, 1 << 22) | st.integers(), "gpu": st.integers(0, 7)},
    optional={
        key: _json_values | _hostile_text
        for key in ("used_memory_mib", "user", "command", "cgroup", "kind")
    },
)


@settings(max_examples=200, deadline=None)
@given(
    gpus=st.lists(_gpu_entries, max_size=3),
    processes=st.lists(_process_entries, max_size=3),
    noise=st.text(max_size=40),
)
def test_any_line_is_an_event_or_counted_and_a_reading_holds_only_data(
    gpus: list[dict[str, object]], processes: list[dict[str, object]], noise: str
) -> None:
    stream = AgentStream("gpu-node-07", clock=lambda: 1_767_225_600.0)
    stream.feed(hello("sim", topology=None))
    for text in (
        line("reading", seq=1, time=1.0, gpus=gpus, processes=processes),
        noise,
        line("error", time=1.0, message=noise),
    ):
        event = stream.feed(text)  # never raises, whatever the line holds
        if isinstance(event, AgentTick):
            assert unsafe_texts(event.snapshot) == []
            assert all(0 <= g.index < 1024 for g in event.snapshot.gpus)
        elif isinstance(event, AgentError):
            assert unsafe_texts(event.message) == []
    assert unsafe_texts(stream.last_malformed or "") == []
