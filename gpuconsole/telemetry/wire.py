"""The console's side of the agent protocol (docs/agent-protocol.md): the remote command that
starts the agent, and `AgentStream`, which turns the agent's lines into typed events.

Every line is checked before it is believed: a line that is not what the protocol says is
counted, with one line saying why, and dropped; nothing an agent (or whatever answers in its
place) prints can raise here.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from gpuconsole.core.clock import Clock, wall_clock
from gpuconsole.core.fields import FIELDS, Field
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
)
from gpuconsole.core.untrusted import MAX_NOTES, MAX_TEXT_CHARS, vetted, visible
from gpuconsole.telemetry.agent import checked_interval
from gpuconsole.telemetry.containers import container_of
from gpuconsole.telemetry.nvml.mapping import (
    compute_mode_name,
    mig_profile,
    pstate_name,
    recovery_action_name,
    throttle_codes,
)
from gpuconsole.telemetry.smi.query import (
    QUERY_COMPUTE_APPS_FIELDS,
    QUERY_GPU_FIELDS,
    gpu_index_map,
    parse_compute_apps_csv,
    parse_query_gpu_csv,
)
from gpuconsole.telemetry.smi.topo import parse_topo_m
from gpuconsole.telemetry.smi.values import SmiParseError

PROTOCOL_VERSION = 2
AGENT_MARKER = "gpuconsole-agent"
MODES = ("auto", "nvml", "smi", "sim")
MAX_LINE_CHARS = 1 << 20
"""The longest line accepted; a longer one is dropped as malformed."""
DEFAULT_SMI_TIMEOUT_S = 5.0

_AGENT_PATH = Path(__file__).with_name("agent.py")
_AGENT_MODES = {"nvml", "smi", "sim"}
_EXCERPT = 80
_FLOAT_MAX = sys.float_info.max


def agent_script() -> bytes:
    """The agent's source, sent over the channel's stdin."""
    return _AGENT_PATH.read_bytes()


def agent_command(
    script_length: int,
    interval: float,
    mode: str = "auto",
    gpus: int = 8,
    timeout: float = DEFAULT_SMI_TIMEOUT_S,
) -> str:
    """The one-line remote command: the agent under the host's python3, or, where there is no
    python3, nvidia-smi streaming its CSV (``-lms``). ``timeout`` bounds each nvidia-smi call."""
    if script_length <= 0:
        raise ValueError(f"script length {script_length} is not a size")
    checked_interval(interval)
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if not 1 <= gpus <= 1024:
        raise ValueError(f"{gpus} simulated GPUs is outside 1 ... 1024")
    if not 0 < timeout <= 600:
        raise ValueError(f"nvidia-smi timeout {timeout:g} s is outside 0 ... 600 s")
    bootstrap = (
        f'import sys;exec(compile(sys.stdin.buffer.read({script_length}),"{AGENT_MARKER}","exec"))'
    )
    gpu_fields = ",".join(QUERY_GPU_FIELDS)
    arguments = [
        AGENT_MARKER,
        "--interval",
        f"{interval:g}",
        "--mode",
        mode,
        "--gpus",
        str(gpus),
        "--timeout",
        f"{timeout:g}",
        "--gpu-fields",
        gpu_fields,
        "--apps-fields",
        ",".join(QUERY_COMPUTE_APPS_FIELDS),
    ]
    python = shlex.join(["exec", "python3", "-u", "-c", bootstrap, *arguments])
    stream = shlex.join(
        [
            "exec",
            "nvidia-smi",
            f"--query-gpu={gpu_fields}",
            "--format=csv,noheader,nounits",
            "-lms",
            str(max(1, round(interval * 1000))),
        ]
    )
    return f"if command -v python3 >/dev/null 2>&1; then {python}; else {stream}; fi"


def encode_command(command: Mapping[str, object]) -> bytes:
    """One command for the agent's stdin, e.g. ``{"cmd": "interval", "seconds": 2}``, as a
    newline-terminated JSON line carrying the protocol version."""
    return (json.dumps({"v": PROTOCOL_VERSION, **command}, separators=(",", ":")) + "\n").encode()


# --- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """The agent's first line: who it is and what it reads with."""

    agent_pid: int | None
    hostname: str | None
    mode: str
    driver_version: str | None
    cuda_version: str | None
    topology: Topology | None


@dataclass(frozen=True, slots=True)
class AgentTick:
    """One tick's reading; ``sent_at`` is the host's clock, the snapshot's time the console's."""

    snapshot: HostSnapshot
    sent_at: float | None


@dataclass(frozen=True, slots=True)
class AgentError:
    """A tick without a reading, and why."""

    message: str


@dataclass(frozen=True, slots=True)
class Reply:
    """The agent's answer to the command sent with ``request_id``."""

    request_id: int
    ok: bool
    message: str


Event: TypeAlias = Hello | AgentTick | AgentError | Reply


# --- checked access to one JSON object -----------------------------------------------------------


class _Malformed(ValueError):
    """A line that does not follow the protocol; the message says how."""


def _shown(value: object) -> str:
    """A value from the host as a reason quotes it: at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Fields:
    """One JSON object's fields, each read with its type checked; ``where`` names the object in
    the reasons given."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise _Malformed(f"{where} is not an object")
        self._data = data
        self._where = where

    def _get(self, key: str, required: bool) -> object:
        value = self._data.get(key)
        if value is None and required:
            raise _Malformed(f"{self._where} has no {key}")
        return value

    def _wrong(self, key: str, value: object, meaning: str) -> _Malformed:
        return _Malformed(f"{self._where} {key} is {_shown(value)}, not {meaning}")

    def number(self, key: str, required: bool = False) -> float | None:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._wrong(key, value, "a number")
        if isinstance(value, int) and not -_FLOAT_MAX <= value <= _FLOAT_MAX:
            raise self._wrong(key, value, "a finite number")  # float() would overflow
        if not math.isfinite(value):
            raise self._wrong(key, value, "a finite number")
        return float(value)

    def integer(
        self, key: str, required: bool = False, bounds: tuple[float, float] | None = None
    ) -> int | None:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong(key, value, "a whole number")
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            raise self._wrong(key, value, f"within {bounds[0]:g} ... {bounds[1]:g}")
        return value

    def text(self, key: str, required: bool = False, limit: int = MAX_TEXT_CHARS) -> str | None:
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self._wrong(key, value, "a string")
        return value[:limit]

    def flag(self, key: str, required: bool = False) -> bool | None:
        value = self._get(key, required)
        if value is not None and not isinstance(value, bool):
            raise self._wrong(key, value, "true or false")
        return value

    def required_integer(self, key: str) -> int:
        value = self.integer(key, required=True)
        assert value is not None
        return value

    def required_text(self, key: str, limit: int = MAX_TEXT_CHARS) -> str:
        value = self.text(key, required=True, limit=limit)
        assert value is not None
        return value

    def has(self, key: str) -> bool:
        return key in self._data

    def fields(self, key: str) -> _Fields | None:
        value = self._get(key, False)
        return None if value is None else _Fields(value, f"{self._where} {key}")

    def list_of(self, key: str) -> list[object]:
        value = self._get(key, True)
        if not isinstance(value, list):
            raise self._wrong(key, value, "a list")
        return value

    def names(self, key: str) -> list[str]:
        names = self.list_of(key)
        if not all(isinstance(name, str) for name in names):
            raise _Malformed(f"{self._where} {key} is not a list of strings")
        return names  # type: ignore[return-value]


# --- the stream ----------------------------------------------------------------------------------


class AgentStream:
    """One agent run's lines, in order, as events; malformed lines are counted and dropped.

    Where the host has no python3, nvidia-smi's ``-lms`` CSV arrives instead (mode
    ``smi-stream``): one row per GPU per tick, in index order. A reading is complete when a row's
    index is not above the previous row's (a new tick began) or, once the first tick told how
    many GPUs there are, as soon as that many rows came: only the first reading waits a tick.
    """

    def __init__(self, host: str, clock: Clock = wall_clock) -> None:
        self.host = host
        self._clock = clock
        self.malformed = 0
        self.last_malformed: str | None = None
        self.mode: str | None = None
        self._hello: Hello | None = None
        self._rows: list[GpuState] = []
        self._notes: list[str] = []
        """The bad values of the rows in ``_rows``."""
        self._gpu_count: int | None = None

    def feed(self, line: str) -> Event | None:
        """The event one line carries, or None (a malformed line, or a CSV row of a tick not
        complete yet)."""
        try:
            if len(line) > MAX_LINE_CHARS:
                raise _Malformed(f"a line of {len(line)} characters (at most {MAX_LINE_CHARS})")
            text = line.strip()
            if not text:
                return None
            if text.startswith(("{", "[")):
                return self._message(text)
            return self._csv_row(text)
        except _Malformed as error:
            self.malformed += 1
            excerpt = line.strip()[:_EXCERPT]
            self.last_malformed = visible(f"{error}: {excerpt!r}")
            return None

    # --- JSON lines ----------------------------------------------------------------------------

    def _message(self, text: str) -> Event:
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError) as error:
            raise _Malformed(f"not JSON ({str(error)[:60]})") from None
        line = _Fields(data, "the line")
        version = line.required_integer("v")
        if version != PROTOCOL_VERSION:
            raise _Malformed(
                f"protocol version {_shown(version)}, not {PROTOCOL_VERSION} (the console's)"
            )
        kind = line.required_text("type")
        if kind == "hello":
            return self._hello_of(line)
        if kind == "reading":
            return self._reading_of(line)
        if kind == "error":
            line.number("time")
            return AgentError(visible(" ".join(line.required_text("message").split())))
        if kind == "reply":
            return Reply(
                line.required_integer("id"),
                bool(line.flag("ok", required=True)),
                visible(line.required_text("message")),
            )
        raise _Malformed(f"unknown type {kind!r}")

    def _hello_of(self, line: _Fields) -> Hello:
        mode = line.required_text("mode")
        if mode not in _AGENT_MODES:
            raise _Malformed(f"hello mode is {mode!r}, not nvml, smi or sim")
        line.text("python")
        topology_text = line.text("topology", limit=MAX_LINE_CHARS)
        hello = Hello(
            agent_pid=line.integer("agent_pid"),
            hostname=line.text("hostname"),
            mode=mode,
            driver_version=line.text("driver"),
            cuda_version=line.text("cuda"),
            topology=_topology(topology_text),
        )
        self._hello, self.mode = hello, mode
        return hello

    def _reading_of(self, line: _Fields) -> AgentTick:
        hello = self._hello
        if hello is None:
            raise _Malformed("a reading before the hello")
        line.required_integer("seq")
        sent_at = line.number("time", required=True)
        extras = [_Fields(entry, "a process") for entry in line.list_of("processes")]
        notes: list[str] = []
        jobs = _Jobs(line, notes)
        if line.has("gpu_csv"):
            gpus, processes = _smi_reading(line, extras, jobs, notes)
        else:
            gpus = [_gpu(_Fields(entry, "a GPU"), notes) for entry in line.list_of("gpus")]
            processes = [_process(entry, jobs, notes) for entry in extras]
        node = _added(notes, lambda: _node(line.fields("node")))
        snapshot = HostSnapshot(
            host=self.host,
            time=self._clock(),
            gpus=tuple(sorted(gpus, key=lambda gpu: gpu.index)),
            processes=tuple(processes),
            topology=hello.topology,
            driver_version=hello.driver_version,
            cuda_version=hello.cuda_version,
            source=f"agent-{hello.mode}",
            bad_values=len(notes),
            bad_value_notes=tuple(notes[:MAX_NOTES]),
            node=node,
        )
        return AgentTick(vetted(snapshot), sent_at)

    # --- the no-python3 fallback: nvidia-smi -lms CSV rows --------------------------------------

    def _csv_row(self, text: str) -> AgentTick | None:
        notes: list[str] = []
        try:
            rows = parse_query_gpu_csv(text, QUERY_GPU_FIELDS, notes)
        except (SmiParseError, csv.Error) as error:
            raise _Malformed(f"neither JSON nor a row of nvidia-smi's CSV ({error})") from None
        if len(rows) != 1 or any(note.startswith("GPU row 0 index:") for note in notes):
            raise _Malformed("neither JSON nor a row of nvidia-smi's CSV")
        (gpu,) = rows
        self.mode = "smi-stream"
        reading = None
        if self._rows and gpu.index <= self._rows[-1].index:
            self._gpu_count = self._gpu_count or len(self._rows)
            reading = self._stream_reading()
        self._rows.append(gpu)
        self._notes += notes
        if self._gpu_count is not None and len(self._rows) >= self._gpu_count:
            # On a one-GPU host this row completes a tick just as the previous one was closed:
            # the newer reading is the one worth passing on.
            reading = self._stream_reading()
        return reading

    def _stream_reading(self) -> AgentTick:
        gpus, self._rows = tuple(self._rows), []
        notes, self._notes = self._notes, []
        snapshot = HostSnapshot(
            self.host,
            self._clock(),
            gpus,
            source="smi-stream",
            bad_values=len(notes),
            bad_value_notes=tuple(notes[:MAX_NOTES]),
        )
        return AgentTick(vetted(snapshot), None)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _topology(text: str | None) -> Topology | None:
    """The hello's ``topo -m`` text read; None where there is none or it cannot be read (the
    readings are worth having without it)."""
    if text is None:
        return None
    try:
        return parse_topo_m(text)
    except (SmiParseError, ValueError, IndexError):
        return None


_CODES: dict[str, Callable[[int | None], str | None]] = {
    "pstate": pstate_name,
    "compute_mode": compute_mode_name,
    "recovery_action": recovery_action_name,
}
"""The fields the agent sends as NVML's numbers, each with the word the model holds."""
_PARTS = {"ecc": EccCounts, "remap": RowRemap, "pcie": PcieLink}


def _value(entry: _Fields, spec: Field, key: str) -> object:
    """One field of an nvml- or sim-mode entry as the field table says it is sent."""
    if spec.kind == "text":
        return entry.text(key)
    if spec.kind == "number":
        return entry.number(key)
    if spec.kind == "whole":
        return entry.integer(key)
    if spec.kind == "flag":
        return entry.flag(key)
    if spec.kind == "code":
        return _CODES[spec.name](entry.integer(key, bounds=spec.bounds))
    if spec.kind == "reasons":
        mask = entry.integer(key, bounds=spec.bounds)
        return None if mask is None else throttle_codes(mask)
    if spec.kind == "instances":
        return tuple(_mig(_Fields(item, "a MIG instance")) for item in entry.list_of(key))
    raise AssertionError(f"{spec.name}: no wire reading for kind {spec.kind}")


def _gpu(gpu: _Fields, notes: list[str]) -> GpuState:
    """An nvml- or sim-mode GPU entry, every field of the field table read alone: one that is not
    what the protocol says is N/A, with a note in ``notes``; NVML's codes become the model's
    words. An entry without an index cannot be placed: the reading is malformed."""
    values: dict[str, Any] = {"index": gpu.required_integer("index")}
    parts: dict[str, dict[str, Any]] = {part: {} for part in _PARTS}
    sections = {part: _added(notes, lambda part=part: gpu.fields(part)) for part in _PARTS}
    for spec in FIELDS:
        if spec.name in ("index", "lost") or (spec.part is None and not gpu.has(spec.wire_key)):
            continue
        if spec.part is None:
            values[spec.name] = _added(notes, lambda spec=spec: _value(gpu, spec, spec.wire_key))
            continue
        section = sections[spec.part]
        if section is not None:
            parts[spec.part][spec.attribute] = _added(
                notes, lambda spec=spec, section=section: _value(section, spec, spec.wire_key)
            )
    for part, kind in _PARTS.items():
        reading = kind(**{f.name: None for f in dataclasses.fields(kind)} | parts[part])
        values[part] = None if all(v is None for v in parts[part].values()) else reading
    if values.get("mig_instances") is None:
        values["mig_instances"] = ()
    values["lost"] = bool(_added(notes, lambda: gpu.flag("lost")))
    return GpuState(**values)


def _mig(instance: _Fields) -> MigInstance:
    """A MIG instance: its ids, memory and UUID, and the profile from its device's name."""
    return MigInstance(
        gpu_instance_id=instance.required_integer("gpu_instance_id"),
        compute_instance_id=instance.integer("compute_instance_id"),
        profile=mig_profile(instance.text("name")),
        memory_total_mib=instance.number("memory_total_mib"),
        memory_used_mib=instance.number("memory_used_mib"),
        uuid=instance.text("uuid"),
    )


def decode_nvml(
    gpus: list[object], processes: list[object]
) -> tuple[list[GpuState], list[GpuProcess], list[str]]:
    """The NVML reader's GPUs and processes (`gpuconsole.telemetry.agent.Nvml.read`, in this
    process or on a host through the agent) as the model's, and the notes of the values that
    were not what the protocol says (each N/A alone). `NvmlSource` decodes through this, so the
    local host and an SSH host read the same fields the same way. ValueError for an entry that
    cannot be placed (a GPU without an index, a process without a pid), which the reader never
    sends."""
    notes: list[str] = []
    try:
        states = [_gpu(_Fields(entry, "a GPU"), notes) for entry in gpus]
        jobs = _Jobs(_Fields({}, "the reading"), notes)  # this host's owners are attached apart
        found = [_process(_Fields(entry, "a process"), jobs, notes) for entry in processes]
    except _Malformed as error:
        raise ValueError(str(error)) from None
    return states, found, notes


def _container(process: _Fields) -> str | None:
    cgroup = process.text("cgroup", limit=MAX_LINE_CHARS)
    return None if cgroup is None else container_of(cgroup)


_T = TypeVar("_T")


def _added(notes: list[str], read: Callable[[], _T]) -> _T | None:
    """What ``read`` decodes of one value of a reading (a GPU's field, a process's, its owners,
    the node), or None with a note of why where it cannot: a value costs only itself, never the
    reading."""
    try:
        return read()
    except _Malformed as error:
        notes.append(str(error))
        return None


class _Jobs:
    """A reading's ``jobs`` by id, for its processes to name (an older agent sends none).

    Slurm's details are an addition to a reading, not the reading: an entry that cannot be read
    costs only itself, counted in the snapshot's bad values with a note of why in ``notes``,
    and the processes in that job keep the job id alone."""

    def __init__(self, line: _Fields, notes: list[str]) -> None:
        self._jobs: dict[int, SlurmJob] = {}
        entries = _added(notes, lambda: line.list_of("jobs") if line.has("jobs") else [])
        for entry in entries or ():
            try:
                job = _slurm_job(_Fields(entry, "a Slurm job"))
            except _Malformed as error:
                notes.append(str(error))
                continue
            if job.job_id in self._jobs:
                notes.append(f"Slurm job {job.job_id} is listed twice")
                continue
            self._jobs[job.job_id] = job

    def of(self, process: _Fields) -> SlurmJob | None:
        """The job the process entry names in ``slurm_job``: as ``jobs`` describes it, or only
        its id where squeue has not (yet) told the agent about it."""
        job_id = process.integer("slurm_job")
        if job_id is None:
            return None
        return self._jobs.get(job_id) or SlurmJob(job_id, None, None, None, None, None, None)


def _slurm_job(job: _Fields) -> SlurmJob:
    """One ``jobs`` entry; `vetted` checks its id's range and makes its texts safe."""
    texts = (job.text(f.name) or None for f in dataclasses.fields(SlurmJob)[1:])
    return SlurmJob(job.required_integer("job_id"), *texts)


def _pod(pod: _Fields | None) -> KubePod | None:
    """A process's ``pod``: its uid, and what the kubelet's logs named of it."""
    if pod is None:
        return None
    names = (pod.text(name) or None for name in ("namespace", "name", "container"))
    return KubePod(pod.required_text("uid"), *names)


def _load(load: _Fields | None) -> ProcessLoad | None:
    """A process's ``load``; `vetted` checks each percentage's range."""
    if load is None:
        return None
    return ProcessLoad(*(load.number(f.name) for f in dataclasses.fields(ProcessLoad)))


def _node(node: _Fields | None) -> SchedulerNode | None:
    """A reading's ``node``: the host's scheduler node and its state."""
    if node is None:
        return None
    texts = (node.required_text(name) for name in ("scheduler", "name", "state"))
    return SchedulerNode(*texts, reason=node.text("reason") or None)


def _owned(process: _Fields, jobs: _Jobs, notes: list[str]) -> dict[str, Any]:
    """What a process entry says of whose work it is, and since when: its job, pod and
    container name, and its start in seconds since the epoch (``start_time``, in clock ticks
    since boot, is only checked: older consoles read it)."""
    _added(notes, lambda: process.integer("start_time"))
    return {
        "job": _added(notes, lambda: jobs.of(process)),
        "pod": _added(notes, lambda: _pod(process.fields("pod"))),
        "container_name": _added(notes, lambda: process.text("container_name") or None),
        "started": _added(notes, lambda: process.number("started")),
    }


def _process(process: _Fields, jobs: _Jobs, notes: list[str]) -> GpuProcess:
    """An nvml- or sim-mode process entry: its pid and GPU place it (without them the reading
    is malformed); any other value that is not what the protocol says is N/A alone, noted."""
    return GpuProcess(
        pid=process.required_integer("pid"),
        gpu=process.required_integer("gpu"),
        used_memory_mib=_added(notes, lambda: process.number("used_memory_mib")),
        user=_added(notes, lambda: process.text("user")),
        command=_added(notes, lambda: process.text("command")),
        kind=_added(notes, lambda: process.text("kind")) or "compute",
        container=_added(notes, lambda: _container(process)),
        mig_instance=_added(notes, lambda: process.integer("mig_instance")),
        load=_added(notes, lambda: _load(process.fields("load"))),
        **_owned(process, jobs, notes),
    )


def _smi_reading(
    line: _Fields, extras: list[_Fields], jobs: _Jobs, notes: list[str]
) -> tuple[list[GpuState], list[GpuProcess]]:
    """An smi-mode reading: nvidia-smi's CSV parsed as a local nvidia-smi's would be, its
    processes joined by pid with what the agent read in /proc."""
    gpu_csv = line.required_text("gpu_csv", limit=MAX_LINE_CHARS)
    apps_csv = line.required_text("apps_csv", limit=MAX_LINE_CHARS)
    try:
        gpus = parse_query_gpu_csv(gpu_csv, line.names("gpu_fields"), notes)
        apps = parse_compute_apps_csv(
            apps_csv, gpu_index_map(gpus), line.names("apps_fields"), notes
        )
    except (SmiParseError, csv.Error) as error:
        raise _Malformed(f"unreadable nvidia-smi CSV ({error})") from None
    by_pid: dict[int, _Fields] = {}
    for extra in extras:  # one whose pid cannot be read joins no process: nvidia-smi's stay
        pid = _added(notes, lambda extra=extra: extra.required_integer("pid"))
        if pid is not None:
            by_pid[pid] = extra
    processes = []
    for app in apps:
        extra = by_pid.get(app.pid)
        if extra is not None:
            app = replace(
                app,
                user=_added(notes, lambda extra=extra: extra.text("user")),
                command=_added(notes, lambda extra=extra: extra.text("command")) or app.command,
                container=_added(notes, lambda extra=extra: _container(extra)),
                **_owned(extra, jobs, notes),
            )
        processes.append(app)
    return gpus, processes
