"""The Slurm job of each GPU process: found by the agent on the host (cgroup path, environment,
squeue), carried in its readings, decoded by the console into `GpuProcess.job`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm import Slurm
from test_wire import greeted, line, nvml_gpu, nvml_process, reading, smi_reading

from gpuconsole.core.model import SlurmJob
from gpuconsole.telemetry.agent import (
    SQUEUE_FORMAT,
    SlurmJobs,
    jobs_of,
    parse_squeue,
    slurm_job_id,
)
from gpuconsole.telemetry.wire import AgentStream, AgentTick, agent_script

MISSING_PID = 4_194_305
"""Above Linux's largest pid_max: no /proc entry, so no environment to read."""
WAIT_S = 15.0


# --- the job id from the cgroup path or the environment ------------------------------------------


@pytest.mark.parametrize(
    ("cgroup", "job"),
    [
        ("12:memory:/slurm/uid_1000/job_123/step_0/task_0\n", 123),
        ("4:devices:/slurm_node7/uid_0/job_42/step_batch\n", 42),
        ("0::/system.slice/slurmstepd.scope/job_123/step_batch/user/task_0\n", 123),
        ("0::/system.slice/node7_slurmstepd.scope/job_9/step_0/user/task_0\n", 9),
        ("0::/slurm/uid_1000/job_4294967295\n", 4294967295),
        ("2:cpu:/\n0::/system.slice/slurmstepd.scope/job_7\n", 7),
    ],
)
def test_the_job_id_comes_from_slurms_cgroup_path(cgroup: str, job: int) -> None:
    assert slurm_job_id(MISSING_PID, cgroup) == job


@pytest.mark.parametrize(
    "cgroup",
    [
        "",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/docker-4f3c2b1a.scope\n",
        "0::/slurm/uid_1000/job_0/step_0\n",  # not a positive id
        "0::/slurm/uid_1000/job_4294967296\n",  # 2**32
        "0::/slurm/uid_1000/job_0123/step_0\n",  # Slurm writes no leading zero
        "0::/slurm/uid_1000/job_12x/step_0\n",
        "0::/slurm/uid_1000/job_\u0661\u0662/step_0\n",  # Arabic-Indic digits
        "0::/slurm/job_123/step_0\n",  # no uid_N
        "0::/home/alice/job_123\n",
        "0::/system.slice/slurmstepd.scope/step_0/job_5\n",
    ],
)
def test_a_path_that_is_not_a_jobs_gives_none(cgroup: str) -> None:
    assert slurm_job_id(MISSING_PID, cgroup) is None


def own_child(environment: dict[str, str]) -> subprocess.Popen[bytes]:
    """A child with ``environment``, once it has exec'd (before, /proc shows ours)."""
    child = subprocess.Popen(["sleep", "30"], env={"PATH": os.defpath, **environment})
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{child.pid}/cmdline").read_bytes().startswith(b"sleep"):
        assert time.monotonic() < deadline, "the child did not exec"
        time.sleep(0.01)
    return child


@pytest.mark.parametrize(
    ("environment", "job"),
    [
        ({"SLURM_JOB_ID": "8812"}, 8812),
        ({"SLURM_JOB_ID": "not-a-job"}, None),
        ({"SLURM_JOB_ID": "0"}, None),
        ({"SLURM_JOB_ID": "99999999999"}, None),
        ({"SLURM_JOB_IDX": "5", "NOT_SLURM_JOB_ID": "6"}, None),
        (  # beyond the 256 KiB read (one variable holds at most 128 KiB)
            {**{f"PAD{n}": "x" * 100_000 for n in range(3)}, "SLURM_JOB_ID": "77"},
            None,
        ),
    ],
)
def test_without_a_slurm_cgroup_the_environment_says(
    environment: dict[str, str], job: int | None
) -> None:
    child = own_child(environment)
    try:
        assert slurm_job_id(child.pid, "0::/user.slice/user-0.slice\n") == job
    finally:
        child.kill()
        child.wait()


def test_the_cgroup_path_wins_over_the_environment() -> None:
    child = own_child({"SLURM_JOB_ID": "5"})
    try:
        assert slurm_job_id(child.pid, "0::/system.slice/slurmstepd.scope/job_6/step_0\n") == 6
    finally:
        child.kill()
        child.wait()


def well_formed_jobs(cgroup: str) -> set[int]:
    """Every job id that a Slurm job path in ``cgroup`` names, found the long way round."""
    jobs = set()
    for text in cgroup.splitlines():
        parts = text.split(":", 2)[-1].split("/")
        for at, part in enumerate(parts):
            match = re.fullmatch("job_([1-9][0-9]*)", part)
            if match is None or int(match[1]) >= 2**32 or at == 0:
                continue
            v2 = re.fullmatch(r"(.+_)?slurmstepd\.scope", parts[at - 1])
            v1 = at >= 2 and re.fullmatch("uid_[0-9]+", parts[at - 1])
            if v2 or (v1 and re.fullmatch("slurm(_.+)?", parts[at - 2])):
                jobs.add(int(match[1]))
    return jobs


_pieces = st.sampled_from(
    [
        *("slurm", "slurm_n1", "uid_0", "uid_x", "job_12", "job_0", "job_007", "job_4294967296"),
        *("slurmstepd.scope", "n1_slurmstepd.scope", "step_0", "", "system.slice", "0::", "\n"),
    ]
)
_cgroups = st.lists(_pieces | st.text(max_size=12), max_size=10).map("/".join) | st.text()


@settings(max_examples=300, deadline=None)
@given(cgroup=_cgroups)
def test_any_text_gives_none_or_the_id_of_a_well_formed_job_path(cgroup: str) -> None:
    job = slurm_job_id(MISSING_PID, cgroup)  # never raises
    assert job is None or job in well_formed_jobs(cgroup)


# --- squeue's rows -------------------------------------------------------------------------------


def row(job: int, name: str, state: str = "RUNNING") -> str:
    return "\x1f".join([str(job), "alice", "gpu", "2026-01-01T00:00:00", "1-00:00:00", state, name])


def test_squeue_rows_keep_a_job_name_whatever_it_holds() -> None:
    output = row(5, "a\x1fb, c") + "\n" + row(6, "", "PENDING") + "\n"
    assert parse_squeue(output, {5, 6, 7}) == {
        5: {
            "job_id": 5,
            "user": "alice",
            "partition": "gpu",
            "start": "2026-01-01T00:00:00",
            "time_limit": "1-00:00:00",
            "state": "RUNNING",
            "name": "a\x1fb, c",
        },
        6: {**parse_squeue(row(6, "x"), {6})[6], "name": None, "state": "PENDING"},
    }


def test_a_job_name_cannot_forge_another_jobs_row() -> None:
    forged = row(5, "x\n" + row(6, "forged").replace("alice", "root"))
    output = forged + "\n" + row(6, "real") + "\n" + row(8, "not asked") + "\nnoise\n"
    assert set(parse_squeue(output, {5, 6})) == {5}


def test_long_texts_are_clipped() -> None:
    (job,) = parse_squeue(row(5, "n" * 10_000), {5}).values()
    assert len(job["name"]) == 4096 and job["name"].endswith("...")  # type: ignore[arg-type]


def test_without_squeue_nothing_is_asked(tmp_path: Path) -> None:
    jobs = SlurmJobs(env={"PATH": str(tmp_path)})
    assert jobs.lookup({5}) == {} and jobs.lookup({5}) == {}
    assert jobs_of([{"pid": 1, "slurm_job": 5}, {"pid": 2, "slurm_job": None}], jobs) == []


def test_a_hung_squeue_delays_no_lookup_and_is_killed(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    squeue = tmp_path / "squeue"
    squeue.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec sleep 60\n')
    squeue.chmod(0o755)
    jobs = SlurmJobs(env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=3.0, first_wait=0.1)
    began = time.monotonic()
    assert jobs.lookup({3, 1, 2}) == {} and jobs.lookup({1, 2, 3}) == {}
    assert time.monotonic() - began < 2.0  # the first wait, not squeue's timeout
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not calls.exists():
        time.sleep(0.05)
    time.sleep(3.5)  # past the timeout: killed, and its jobs not asked again until stale
    assert jobs.lookup({1, 2, 3}) == {}
    time.sleep(0.2)
    assert calls.read_text().splitlines() == [f"-h -j 1,2,3 -o {SQUEUE_FORMAT}"]
    assert not any(
        p.info["cmdline"] == ["sleep", "60"] and p.ppid() == os.getpid()
        for p in psutil.process_iter(["cmdline"])
    )


def test_a_new_jobs_first_lookup_has_squeues_answer(tmp_path: Path) -> None:
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/sh\nprintf '%s\\n' '{row(7, 'llama-ft')}'\n")
    squeue.chmod(0o755)
    jobs = SlurmJobs(env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, first_wait=WAIT_S)
    assert jobs.lookup({7})[7]["name"] == "llama-ft"


# --- a real Slurm job ----------------------------------------------------------------------------


def job_process(job: int, command: list[str]) -> psutil.Process:
    """The process of ``job`` that runs ``command``, once it does."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            try:
                if process.info["cmdline"] == command and process.environ().get(
                    "SLURM_JOB_ID"
                ) == str(job):
                    return process
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no process of job {job} runs {command}")


def test_a_real_jobs_process_carries_its_job(slurm: Slurm) -> None:
    job = slurm.submit("llama-ft", "sleep 120")
    process = job_process(job, ["sleep", "120"])
    cgroup = Path(f"/proc/{process.pid}/cgroup").read_text()
    assert slurm_job_id(process.pid, cgroup) == job

    jobs = SlurmJobs(env=slurm.env)
    entry = {"pid": process.pid, "slurm_job": job}
    deadline = time.monotonic() + WAIT_S
    while not (known := jobs_of([entry], jobs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    (info,) = known
    assert info["job_id"] == job
    assert (info["name"], info["user"], info["partition"], info["state"]) == (
        "llama-ft",
        "root",
        "debug",
        "RUNNING",
    )
    assert info["start"] and info["time_limit"] == "UNLIMITED"


# --- the agent's readings ------------------------------------------------------------------------


def test_every_sim_reading_carries_jobs(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_bytes(agent_script())
    agent = subprocess.Popen(
        [sys.executable, "-u", str(script), "--mode", "sim", "--gpus", "2", "--interval", "0.1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert agent.stdout is not None
        lines = [json.loads(agent.stdout.readline()) for _ in range(3)]
    finally:
        agent.kill()
        agent.wait()
    readings = [message for message in lines if message["type"] == "reading"]
    assert readings and all(message["jobs"] == [] for message in readings)
    assert all(p["slurm_job"] is None for message in readings for p in message["processes"])


# --- decoding ------------------------------------------------------------------------------------

LLAMA = {
    "job_id": 4242,
    "name": "llama-ft",
    "user": "alice",
    "partition": "gpu",
    "start": "2026-01-01T00:00:00",
    "time_limit": "1-00:00:00",
    "state": "RUNNING",
}
LLAMA_JOB = SlurmJob(
    4242, "llama-ft", "alice", "gpu", "2026-01-01T00:00:00", "1-00:00:00", "RUNNING"
)


@pytest.fixture
def stream() -> AgentStream:
    return AgentStream("rack1-node7", lambda: 1_767_225_600.0)


def test_a_reading_gives_each_process_its_job(stream: AgentStream) -> None:
    processes = [
        nvml_process(pid=552, slurm_job=4242),
        nvml_process(pid=553, slurm_job=77),  # squeue has not said yet: the id alone
        nvml_process(pid=554, slurm_job=None),
        nvml_process(pid=555),  # an agent from before Slurm jobs
    ]
    unnamed = {**LLAMA, "job_id": 9}
    event = greeted(stream).feed(reading(processes=processes, jobs=[LLAMA, unnamed]))
    assert isinstance(event, AgentTick)
    assert [p.job for p in event.snapshot.processes] == [
        LLAMA_JOB,
        SlurmJob(77, None, None, None, None, None, None),
        None,
        None,
    ]
    assert event.snapshot.bad_values == 0


def test_an_smi_reading_joins_the_job_by_pid(stream: AgentStream) -> None:
    processes = [{"pid": 552, "user": "bob", "command": "python3 -m bench", "slurm_job": 4242}]
    event = greeted(stream, "smi").feed(smi_reading(processes=processes, jobs=[LLAMA]))
    assert isinstance(event, AgentTick)
    (process,) = event.snapshot.processes
    assert (process.pid, process.user, process.job) == (552, "bob", LLAMA_JOB)


def test_a_reading_without_jobs_decodes_as_before(stream: AgentStream) -> None:
    event = greeted(stream).feed(reading())
    assert isinstance(event, AgentTick)
    assert event.snapshot.processes[0].job is None and event.snapshot.bad_values == 0


@pytest.mark.parametrize(
    ("jobs", "reason"),
    [
        ("all", "jobs is 'all', not a list"),
        ([[4242]], "a Slurm job is not an object"),
        ([{**LLAMA, "job_id": "4242"}], "job_id is '4242', not a whole number"),
        ([{**LLAMA, "job_id": None}], "a Slurm job has no job_id"),
        ([{**LLAMA, "name": ["llama"]}], "name is ['llama'], not a string"),
        ([LLAMA, {**LLAMA, "name": "other"}], "Slurm job 4242 is listed twice"),
    ],
)
def test_a_malformed_jobs_entry_costs_only_itself(
    stream: AgentStream, jobs: object, reason: str
) -> None:
    processes = [nvml_process(slurm_job=4242)]
    event = greeted(stream).feed(reading(processes=processes, jobs=jobs))
    assert isinstance(event, AgentTick) and stream.malformed == 0
    assert event.snapshot.gpus[0].name == "NVIDIA H200"
    assert event.snapshot.bad_values == 1
    assert any(reason in note for note in event.snapshot.bad_value_notes)
    job = event.snapshot.processes[0].job
    assert job is not None and job.job_id == 4242  # its first entry, or at least its id


def test_a_process_with_an_impossible_job_id_has_no_job(stream: AgentStream) -> None:
    event = greeted(stream).feed(reading(processes=[nvml_process(slurm_job=-1)], jobs=[LLAMA]))
    assert isinstance(event, AgentTick)
    assert event.snapshot.processes[0].job is None and event.snapshot.bad_values == 1


def test_a_job_id_of_the_wrong_type_is_na_for_that_process_alone(stream: AgentStream) -> None:
    """As any other value of the wrong type: the process keeps its row, its job is N/A, and
    the reading says which value was bad."""
    event = greeted(stream).feed(reading(processes=[nvml_process(slurm_job="4242")]))
    assert isinstance(event, AgentTick) and stream.malformed == 0
    assert event.snapshot.processes[0].job is None
    assert event.snapshot.bad_values == 1
    assert "slurm_job" in event.snapshot.bad_value_notes[0]


def test_job_texts_are_made_visible_and_cut(stream: AgentStream) -> None:
    hostile = {**LLAMA, "name": "x\x1b]0;owned\x07" + "n" * 10_000, "user": "\u202eecila"}
    event = greeted(stream).feed(reading(processes=[nvml_process(slurm_job=4242)], jobs=[hostile]))
    assert isinstance(event, AgentTick)
    job = event.snapshot.processes[0].job
    assert job is not None and job.name is not None and job.user is not None
    assert "\x1b" not in job.name and "\x07" not in job.name and len(job.name) <= 4096
    assert "\u202e" not in job.user


_json_values = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)


@settings(max_examples=200, deadline=None)
@given(
    jobs=_json_values
    | st.lists(
        _json_values
        | st.fixed_dictionaries(
            {},
            optional={key: _json_values for key in (*LLAMA, "job_id")},
        ),
        max_size=4,
    ),
    job_id=_json_values,
)
def test_any_jobs_field_keeps_the_reading(jobs: object, job_id: object) -> None:
    stream = AgentStream("gpu-node-07", lambda: 1_767_225_600.0)
    greeted(stream, "nvml")
    text = line(
        "reading",
        seq=1,
        time=1.0,
        gpus=[nvml_gpu()],
        processes=[nvml_process(slurm_job=4242)],
        jobs=jobs,
    )
    event = stream.feed(text)  # never raises, and a bad jobs field never drops the reading
    assert isinstance(event, AgentTick)
    other = stream.feed(
        line("reading", seq=2, time=1.0, gpus=[], processes=[nvml_process(slurm_job=job_id)])
    )
    assert other is not None or stream.malformed == 1
