"""Each GPU process's load (NVML's process utilization samples), as the agent reads it through
libnvidia-ml and the local source through pynvml: the newest sample of the last second per
process, idle for a process with none, and none at all where the GPU does not sample processes.
The real GPU is the judge in test_process_load_gpu.py (against ``nvidia-smi pmon``)."""

from __future__ import annotations

import ctypes
import os
import time
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_agent import INSUFFICIENT_SIZE, FakeNvmlLibrary
from test_nvml_fake import HOST, FakeNvml, MakeSource, nvml, source  # noqa: F401 (fixtures)

from gpuconsole.core.model import ProcessLoad
from gpuconsole.telemetry import agent as agent_module
from gpuconsole.telemetry.agent import (
    IDLE_LOAD,
    PROCESS_LOAD_WINDOW_S,
    load_window_start,
    newest_loads,
)

NOT_FOUND = 6
OTHER_PID = 999_999


def sample(pid: int, stamp: int, sm: int, mem: int = 0, enc: int = 0, dec: int = 0) -> Any:
    return SimpleNamespace(
        pid=pid, timeStamp=stamp, smUtil=sm, memUtil=mem, encUtil=enc, decUtil=dec
    )


def load(sm: float, mem: float = 0.0, enc: float = 0.0, dec: float = 0.0) -> dict[str, float]:
    return {"sm_pct": sm, "memory_pct": mem, "encoder_pct": enc, "decoder_pct": dec}


# --- the rule ----------------------------------------------------------------------------------

samples_strategy = st.lists(
    st.builds(
        sample,
        pid=st.integers(1, 6),
        stamp=st.integers(0, 2**64 - 1),
        sm=st.integers(0, 2**32 - 1),
        mem=st.integers(0, 2**32 - 1),
    ),
    max_size=40,
)


@given(samples_strategy)
def test_each_process_gets_its_newest_sample(samples: list[Any]) -> None:
    loads = newest_loads(samples)
    assert set(loads) == {s.pid for s in samples}
    for pid, found in loads.items():
        newest = max(s.timeStamp for s in samples if s.pid == pid)
        candidates = [s for s in samples if s.pid == pid and s.timeStamp == newest]
        assert found["sm_pct"] in {float(s.smUtil) for s in candidates}
        assert set(found) == set(IDLE_LOAD)


def test_the_window_is_the_last_second_in_microseconds() -> None:
    assert load_window_start(1_700_000_000.25) == int((1_700_000_000.25 - 1.0) * 1_000_000)
    assert PROCESS_LOAD_WINDOW_S == 1.0


# --- the agent, through libnvidia-ml's calls ---------------------------------------------------


RUNNING = [(os.getpid(), 512 * 1024 * 1024), (OTHER_PID, 2**20)]
"""GPU 0's processes: this test's own, and one that is not on this machine."""


class SamplingLibrary(FakeNvmlLibrary):
    """The stand-in (which refuses process utilization, as a GPU that does not sample
    processes), answering it as ``answer`` says: a list of samples, or an NVML error code."""

    def __init__(self, answer: list[Any] | int) -> None:
        super().__init__(RUNNING)
        self.answer = answer
        self.since: list[int] = []

    def _nvmlDeviceGetProcessUtilization(self, array: Any, count: Any, since: Any) -> int:
        self.since.append(since.value)
        if isinstance(self.answer, int):
            return self.answer
        wanted = len(self.answer)
        if array is None or count._obj.value < wanted:
            count._obj.value = wanted
            return INSUFFICIENT_SIZE
        for slot, given_sample in zip(array, self.answer, strict=False):
            for field, _ in slot._fields_:
                setattr(slot, field, getattr(given_sample, field))
        count._obj.value = wanted
        return 0


def agent_loads(library: FakeNvmlLibrary) -> dict[int, Any]:
    _, processes = agent_module.Nvml(library).read()
    return {p["pid"]: p["load"] for p in processes}


def test_the_agent_sends_each_process_its_newest_sample_and_idle_for_none() -> None:
    now_us = int(time.time() * 1_000_000)
    library = SamplingLibrary(
        [sample(os.getpid(), now_us - 500_000, 30, 10), sample(os.getpid(), now_us, 97, 41, 0, 5)]
    )
    before = time.time()
    loads = agent_loads(library)
    assert loads == {os.getpid(): load(97.0, 41.0, 0.0, 5.0), OTHER_PID: IDLE_LOAD}
    (since,) = set(library.since)
    assert len(library.since) == 2  # asked the size, then asked again with room
    assert load_window_start(before) <= since <= load_window_start(time.time())


def test_no_sample_in_the_window_is_every_process_idle() -> None:
    assert agent_loads(SamplingLibrary(NOT_FOUND)) == dict.fromkeys(
        (os.getpid(), OTHER_PID), IDLE_LOAD
    )


def test_a_gpu_that_does_not_sample_processes_gives_no_load() -> None:
    assert agent_loads(FakeNvmlLibrary(RUNNING)) == {os.getpid(): None, OTHER_PID: None}


def test_samples_fill_the_struct_nvml_defines() -> None:
    """nvmlProcessUtilizationSample_t: unsigned pid, unsigned long long timeStamp, then four
    unsigned percentages (nvml.h)."""
    struct = agent_module._ProcessUtilization
    assert [name for name, _ in struct._fields_] == [
        name for name, _ in pynvml.c_nvmlProcessUtilizationSample_t._fields_
    ]
    assert ctypes.sizeof(struct) == ctypes.sizeof(pynvml.c_nvmlProcessUtilizationSample_t)


# --- the local source, through pynvml -------------------------------------------------------------


def local_load(make: MakeSource) -> ProcessLoad | None:
    snapshot = make().read(HOST)
    (process,) = snapshot.processes
    return process.load


def test_the_local_source_reads_the_same_rule(nvml: FakeNvml, source: MakeSource) -> None:  # noqa: F811
    now_us = int(time.time() * 1_000_000)
    asked: list[int] = []

    def samples(_: Any, since: int) -> list[Any]:
        asked.append(since)
        return [sample(os.getpid(), now_us, 12, 3), sample(os.getpid(), now_us - 1, 99, 99)]

    nvml.gpus[0]["nvmlDeviceGetProcessUtilization"] = samples
    before = time.time()
    assert local_load(source) == ProcessLoad(12.0, 3.0, 0.0, 0.0)
    (since,) = asked
    assert load_window_start(before) <= since <= load_window_start(time.time())


def test_the_local_source_idle_and_unsampled(nvml: FakeNvml, source: MakeSource) -> None:  # noqa: F811
    def none_in_the_window(*_: Any) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    nvml.gpus[0]["nvmlDeviceGetProcessUtilization"] = none_in_the_window
    assert local_load(source) == ProcessLoad(**IDLE_LOAD)
    del nvml.gpus[0]["nvmlDeviceGetProcessUtilization"]
    reader = source()
    for _ in range(3):
        (process,) = reader.read(HOST).processes
        assert process.load is None
    # A GPU that refuses once is not asked again every tick (the refusal is remembered).
    assert nvml.asked["nvmlDeviceGetProcessUtilization"] == 2


@pytest.mark.parametrize("percent", [101, 2**32 - 1])
def test_an_impossible_percentage_is_not_a_reading(
    nvml: FakeNvml,  # noqa: F811
    source: MakeSource,  # noqa: F811
    percent: int,
) -> None:
    now_us = int(time.time() * 1_000_000)
    nvml.gpus[0]["nvmlDeviceGetProcessUtilization"] = [sample(os.getpid(), now_us, percent, 7)]
    snapshot = source().read(HOST)
    (process,) = snapshot.processes
    assert process.load is not None
    assert process.load.sm_pct is None and process.load.memory_pct == 7.0
    assert snapshot.bad_values == 1
