"""Who a GPU process works for, and since when, as the agent finds it on the host with nothing
installed there: its start from /proc, its Kubernetes pod from the kubelet's log directories, its
Docker container's name from Docker's socket, and the host's Slurm node from scontrol; carried in
the agent's readings, decoded by the console, attached to local readings, and made safe at the
boundary.

The parts run for real: processes this test starts (moved into real cgroups named as a kubelet or
Docker names them, where this machine lets a test make cgroups), log directories laid out as the
kubelet lays them out, an HTTP server on a unix socket answering as Docker's API documents, and the
single-node Slurm cluster of tests/slurm.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from docker_api import DockerApi
from hostile import CLEAR, CLIPBOARD, TITLE, unsafe_texts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slurm import Slurm
from standin import write_standin_smi
from test_agent import SCRIPT, RunningAgent
from test_wire import greeted, line, nvml_gpu, nvml_process, reading, smi_reading

from gpuconsole.core.model import GpuProcess, GpuState, HostSnapshot, KubePod, ProcessLoad
from gpuconsole.core.untrusted import MAX_NAME_CHARS, vetted
from gpuconsole.telemetry import agent as agent_module
from gpuconsole.telemetry.agent import (
    DOCKER_TIMEOUT_S,
    MAX_DOCKER_ANSWER,
    DockerNames,
    KubePods,
    Owners,
    SlurmNode,
    docker_name,
    process_details,
    slurm_node,
)
from gpuconsole.telemetry.containers import container_of_pid
from gpuconsole.telemetry.jobs import LocalOwners
from gpuconsole.telemetry.wire import AgentStream, AgentTick, agent_command

WAIT_S = 15.0
MISSING_PID = 4_194_305
"""Above Linux's largest pid_max: no /proc entry."""
CONTAINER_ID = "9d1f3c5e7a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d"
SIDECAR_ID = "1e3d5c7b9a0f2e4d6c8b0a1f3e5d7c9b2a4f6e8d0c1b3a5f7e9d2c4b6a8f0e1d"
UID = "3cae2e45-052c-4b11-80d3-4d7b2d2d3464"


def wait_until(check: Callable[[], object], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def no_slurm() -> SlurmNode:
    """A node asker with no scontrol to ask: the machine running the tests is then no node."""
    return SlurmNode(env={"PATH": "/nonexistent"})


# --- real cgroups -------------------------------------------------------------------------------

_HIERARCHIES = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


def _cgroup_root() -> Path | None:
    """A cgroup hierarchy this test may make cgroups in, or None (not root, or read-only)."""
    if os.geteuid() != 0:
        return None
    for mount in map(Path, _HIERARCHIES):
        probe = mount / f"gpuconsole-probe-{os.getpid()}"
        if not (mount / "cgroup.procs").exists():
            continue
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError:
            continue
        return mount
    return None


@contextlib.contextmanager
def process_in_cgroup(path: str) -> Iterator[subprocess.Popen[bytes]]:
    """A `sleep` moved into a new cgroup at ``path``, as a container runtime moves a container's
    processes: its /proc/PID/cgroup then names the path. Skips where no cgroup can be made."""
    root = _cgroup_root()
    if root is None:
        pytest.skip("cannot make cgroups here (needs root and a writable cgroup hierarchy)")
    made: list[Path] = []
    leaf = root
    for part in path.strip("/").split("/"):
        leaf = leaf / part
        if not leaf.exists():
            leaf.mkdir()
            made.append(leaf)
    child = subprocess.Popen(["sleep", "120"])
    try:
        (leaf / "cgroup.procs").write_text(str(child.pid))
        yield child
    finally:
        child.kill()
        child.wait()
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                directory.rmdir()


def pod_cgroup(uid: str, container_id: str) -> str:
    """The cgroup the kubelet's systemd driver and containerd give a best-effort pod's container."""
    slice_uid = uid.replace("-", "_")
    return (
        "/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{slice_uid}.slice/cri-containerd-{container_id}.scope"
    )


# --- when a process started ----------------------------------------------------------------------


def test_a_process_started_when_psutil_and_the_clock_say() -> None:
    before = time.time()
    child = subprocess.Popen(["sleep", "30"])
    after = time.time()
    try:
        details = process_details(child.pid)
        started = details["started"]
        assert isinstance(started, float)
        # psutil works it out on its own from the same /proc files; the wall clock bounds it
        # within btime's whole second and a clock tick.
        assert started == round(psutil.Process(child.pid).create_time(), 2)
        assert before - 1.5 <= started <= after + 1.5
        assert isinstance(details["start_time"], int)
    finally:
        child.kill()
        child.wait()


def test_a_process_that_is_gone_has_no_start() -> None:
    details = process_details(MISSING_PID)
    assert (details["started"], details["start_time"]) == (None, None)


# --- Kubernetes pods from the kubelet's log layout --------------------------------------------


def kubelet_logs(
    root: Path, namespace: str, pod: str, uid: str, containers: dict[str, str | None]
) -> None:
    """One pod's logs as the kubelet lays them out (kubernetes/kubernetes,
    pkg/kubelet/kuberuntime/helpers.go and legacy.go): ``pods/<namespace>_<pod>_<uid>/<container>/
    0.log`` for each container, and for each running one (an id, not None) the link
    ``containers/<pod>_<namespace>_<container>-<id>.log`` to it, its name cut to 255 bytes with
    ``.log`` kept, as ``logSymlink`` cuts it."""
    links = os.fsencode(root / "containers")
    os.makedirs(links, exist_ok=True)
    for container, container_id in containers.items():
        log = root / "pods" / f"{namespace}_{pod}_{uid}" / container / "0.log"
        log.parent.mkdir(parents=True)
        log.write_text("")
        if container_id is not None:
            name = f"{pod}_{namespace}_{container}-{container_id}".encode()[:251] + b".log"
            os.symlink(log, os.path.join(links, name))


def test_a_pods_names_and_its_containers_come_from_the_logs(tmp_path: Path) -> None:
    kubelet_logs(
        tmp_path,
        "infer",
        "llama-13b-7d9f5",
        UID,
        {"istio-init": None, "server": CONTAINER_ID, "istio-proxy": SIDECAR_ID},
    )
    pods = KubePods(str(tmp_path))
    found = pods.lookup({(UID, CONTAINER_ID), (UID, SIDECAR_ID), (UID, None)})
    assert found[UID, CONTAINER_ID] == {
        "uid": UID,
        "namespace": "infer",
        "name": "llama-13b-7d9f5",
        "container": "server",
    }
    assert found[UID, SIDECAR_ID]["container"] == "istio-proxy"
    # Three containers and no id to pick one by: the pod, not the container.
    assert found[UID, None] == {**found[UID, CONTAINER_ID], "container": None}


def test_a_pod_of_one_container_names_it_without_a_link(tmp_path: Path) -> None:
    kubelet_logs(tmp_path, "batch", "train-0", UID, {"trainer": None})
    (pod,) = KubePods(str(tmp_path)).lookup({(UID, CONTAINER_ID)}).values()
    assert (pod["namespace"], pod["name"], pod["container"]) == ("batch", "train-0", "trainer")


def test_a_long_pod_name_is_found_by_the_link_the_kubelet_cut(tmp_path: Path) -> None:
    long_name = "x" * 200  # its link's name runs past 255 bytes, the id cut off: its directory
    # still fits (ext4 and the kubelet allow no longer file name)
    kubelet_logs(tmp_path, "ns", long_name, UID, {"a": CONTAINER_ID, "b": SIDECAR_ID})
    found = KubePods(str(tmp_path)).lookup({(UID, CONTAINER_ID)})
    assert found[UID, CONTAINER_ID]["container"] == "a"


def test_a_pod_without_logs_is_its_uid_alone(tmp_path: Path) -> None:
    kubelet_logs(tmp_path, "infer", "other", "51b64565-2b17-4d46-83ac-22e398f2f7fb", {"c": None})
    for root in (tmp_path, tmp_path / "absent"):
        (pod,) = KubePods(str(root)).lookup({(UID, CONTAINER_ID)}).values()
        assert pod == {"uid": UID, "namespace": None, "name": None, "container": None}


def test_a_pod_is_looked_up_once_until_it_is_stale(tmp_path: Path) -> None:
    pods = KubePods(str(tmp_path))
    assert pods.lookup({(UID, None)})[UID, None]["name"] is None
    kubelet_logs(tmp_path, "infer", "late", UID, {"c": None})
    assert pods.lookup({(UID, None)})[UID, None]["name"] is None  # remembered for 30 s
    assert KubePods(str(tmp_path), stale_after=0).lookup({(UID, None)})[UID, None]["name"] == (
        "late"
    )


def test_a_scan_stops_at_its_bound_and_its_deadline(tmp_path: Path) -> None:
    for n in range(agent_module.MAX_LOG_ENTRIES + 50):
        (tmp_path / f"ns_p{n}_{n}").mkdir()
    far = time.monotonic() + 60
    assert len(list(agent_module._entries(str(tmp_path), far))) == agent_module.MAX_LOG_ENTRIES
    assert list(agent_module._entries(str(tmp_path), time.monotonic() - 1)) == []


def test_a_process_in_a_pods_cgroup_is_named_after_its_pod(tmp_path: Path) -> None:
    uid = str(uuid.uuid4())
    kubelet_logs(tmp_path, "infer", "llama-13b-7d9f5", uid, {"server": CONTAINER_ID, "x": None})
    with process_in_cgroup(pod_cgroup(uid, CONTAINER_ID)) as child:
        owners = Owners(pods=KubePods(str(tmp_path)), node=no_slurm())
        snapshot = HostSnapshot("here", 1000.0, (GpuState(0),), (GpuProcess(child.pid, 0, 1.0),))
        (process,) = vetted(LocalOwners(owners).attach(snapshot)).processes
    assert process.pod == KubePod(uid, "infer", "llama-13b-7d9f5", "server")
    assert process.owner == "pod infer/llama-13b-7d9f5" and process.job is None


_file_names = st.binary(min_size=1, max_size=100).filter(lambda b: b"/" not in b and b"\0" not in b)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(namespace=_file_names, name=_file_names, container=_file_names)
def test_any_log_directory_name_reaches_the_console_as_safe_text(
    tmp_path_factory: pytest.TempPathFactory, namespace: bytes, name: bytes, container: bytes
) -> None:
    root = tmp_path_factory.mktemp("logs")
    directory = os.path.join(
        os.fsencode(root), b"pods", namespace + b"_" + name + b"_" + UID.encode()
    )
    os.makedirs(os.path.join(directory, container.replace(b".", b"d") or b"c"))
    (pod,) = KubePods(str(root)).lookup({(UID, None)}).values()  # never raises
    json.dumps(pod, ensure_ascii=False).encode()  # text to carry: no lone surrogates
    stream = greeted(AgentStream("gpu-node-07", lambda: 1_767_225_600.0))
    event = stream.feed(reading(processes=[nvml_process(pod=pod)]))
    assert isinstance(event, AgentTick) and stream.malformed == 0
    (process,) = event.snapshot.processes
    assert process.pod is not None and process.pod.uid == UID
    assert unsafe_texts(event.snapshot) == []
    assert all(
        len(text or "") <= MAX_NAME_CHARS for text in (process.pod.namespace, process.pod.name)
    )


# --- Docker's names ------------------------------------------------------------------------------


@pytest.fixture
def docker(tmp_path: Path) -> Iterator[DockerApi]:
    api = DockerApi(tmp_path / "docker.sock").start()
    yield api
    api.stop()


def test_docker_names_a_container_as_docker_ps_does(docker: DockerApi) -> None:
    docker.names[CONTAINER_ID] = "llama-train"
    assert docker_name(str(docker.path), CONTAINER_ID) == "llama-train"
    assert docker_name(str(docker.path), SIDECAR_ID) is None  # 404: no such container
    assert docker.requests == [f"/containers/{CONTAINER_ID}/json", f"/containers/{SIDECAR_ID}/json"]


@pytest.mark.parametrize(
    "answer",
    [
        (500, b'{"message": "server error"}'),
        (200, b"not json"),
        (200, b'["a list"]'),
        (200, b'{"Name": 42}'),
        (200, b'{"Name": ""}'),
        (200, b"\xff\xfe"),
        (200, b"[" * 100_000),
        (200, json.dumps({"Name": "/big", "Pad": "x" * MAX_DOCKER_ANSWER}).encode()),
    ],
)
def test_an_answer_without_a_usable_name_gives_none(
    docker: DockerApi, answer: tuple[int, bytes]
) -> None:
    docker.answer = answer
    assert docker_name(str(docker.path), CONTAINER_ID) is None


def test_a_hung_or_dribbling_docker_costs_one_second_at_most(docker: DockerApi) -> None:
    docker.names[CONTAINER_ID] = "slow"
    for hang, dribble in ((True, None), (False, 0.2)):
        docker.hang, docker.dribble_s = hang, dribble
        began = time.monotonic()
        with pytest.raises(OSError):
            docker_name(str(docker.path), CONTAINER_ID)
        assert time.monotonic() - began < DOCKER_TIMEOUT_S + 0.5


def test_a_lookup_waits_for_docker_a_moment_at_most(docker: DockerApi) -> None:
    docker.hang = True
    names = DockerNames(str(docker.path), first_wait=0.2)
    began = time.monotonic()
    assert names.lookup({CONTAINER_ID}) == {} and names.lookup({CONTAINER_ID}) == {}
    assert time.monotonic() - began < 0.5
    assert docker.requests == [f"/containers/{CONTAINER_ID}/json"]  # one question at a time


def test_without_docker_nothing_is_asked_and_nothing_named(tmp_path: Path) -> None:
    absent = DockerNames(str(tmp_path / "docker.sock"))
    assert absent.lookup({CONTAINER_ID}) == {}
    refusing = tmp_path / "refusing.sock"
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(refusing))  # a socket file nobody listens on: connections are refused
        began = time.monotonic()
        assert DockerNames(str(refusing)).lookup({CONTAINER_ID}) == {}
        assert time.monotonic() - began < 1.0


def test_a_process_in_a_docker_container_gets_its_name_made_safe(docker: DockerApi) -> None:
    docker.names[CONTAINER_ID] = "train" + CLIPBOARD + TITLE + "\u202e" + "n" * 1000
    with process_in_cgroup(f"/system.slice/docker-{CONTAINER_ID}.scope") as child:
        assert container_of_pid(child.pid) == f"docker:{CONTAINER_ID[:12]}"
        owners = Owners(docker=DockerNames(str(docker.path), first_wait=WAIT_S), node=no_slurm())
        snapshot = HostSnapshot("here", 1000.0, (GpuState(0),), (GpuProcess(child.pid, 0, 1.0),))
        (process,) = vetted(LocalOwners(owners).attach(snapshot)).processes
    assert process.container_name is not None and process.container_name.startswith("train")
    assert unsafe_texts(process) == [] and len(process.container_name) <= MAX_NAME_CHARS


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    status=st.sampled_from([200, 200, 200, 404, 500]),
    body=st.binary(max_size=300)
    | st.builds(
        lambda name, extra: json.dumps({"Id": CONTAINER_ID, "Name": name, **extra}).encode(),
        st.text(max_size=300) | st.none() | st.integers(),
        st.dictionaries(st.text(max_size=5), st.text(max_size=20), max_size=3),
    ),
)
def test_any_docker_answer_is_a_name_made_safe_or_none(
    docker: DockerApi, status: int, body: bytes
) -> None:
    docker.answer = (status, body)
    name = docker_name(str(docker.path), CONTAINER_ID)  # never raises: Docker answered
    assert name is None or (isinstance(name, str) and name)
    stream = greeted(AgentStream("gpu-node-07", lambda: 1_767_225_600.0))
    event = stream.feed(reading(processes=[nvml_process(container_name=name)]))
    assert isinstance(event, AgentTick)
    assert unsafe_texts(event.snapshot) == []


# --- the host's Slurm node -----------------------------------------------------------------------

REASON = "GPU 3 fell off the bus NodeName=evil State=IDLE Reason=forged"
"""A reason that tries to forge the fields around it."""


def drain(slurm: Slurm, reason: str = REASON) -> None:
    slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=drain", f"reason={reason}")


def resume(slurm: Slurm) -> None:
    slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume")


def test_the_node_is_drained_and_back_as_scontrol_says(slurm: Slurm) -> None:
    node = SlurmNode(env=slurm.env, stale_after=0.2, first_wait=WAIT_S)
    state = node.state()
    assert state == {"scheduler": "slurm", "name": slurm.node, "state": "IDLE", "reason": None}
    drain(slurm)
    try:
        wait_until(lambda: "DRAIN" in str((node.state() or {}).get("state")).split("+"))
        assert node.state() == {
            "scheduler": "slurm",
            "name": slurm.node,
            "state": "IDLE+DRAIN",
            "reason": REASON,
        }
    finally:
        resume(slurm)
    wait_until(lambda: (node.state() or {}).get("state") == "IDLE")
    assert (node.state() or {})["reason"] is None


def test_a_local_read_says_whether_this_machine_is_drained(slurm: Slurm) -> None:
    snapshot = HostSnapshot("here", 1000.0, (GpuState(0),), (GpuProcess(os.getpid(), 0, 1.0),))

    def read() -> HostSnapshot:
        owners = Owners(env=slurm.env, node=SlurmNode(env=slurm.env, first_wait=WAIT_S))
        return vetted(LocalOwners(owners).attach(snapshot))

    drain(slurm)
    try:
        node = read().node
        assert node is not None and node.out_of_service
        assert (node.name, node.reason) == (slurm.node, REASON)
        assert node.described == f"drained (reason: {REASON})"
    finally:
        resume(slurm)
    node = read().node
    assert node is not None and not node.out_of_service and node.described == "idle"


def test_a_host_slurm_does_not_know_is_no_node(slurm: Slurm) -> None:
    """scontrol says "Node … not found" of the short name; every node is then listed, and none
    has it as its NodeName, NodeHostName or NodeAddr. (Finding a node by those two is
    `test_the_node_line_is_read_up_to_its_reason`: the test cluster's NodeHostName is its
    NodeName and its NodeAddr an IP address, which no short host name is.)"""
    assert SlurmNode(env=slurm.env, host="not-a-node", first_wait=WAIT_S).state() is None
    assert SlurmNode(env=slurm.env, host=f"{slurm.node}.example.org", first_wait=WAIT_S).state()


def test_without_scontrol_the_host_is_no_node() -> None:
    assert no_slurm().state() is None


def test_a_hung_scontrol_delays_no_reading_and_is_killed(tmp_path: Path) -> None:
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nexec sleep 60\n")
    scontrol.chmod(0o755)
    node = SlurmNode(env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=1.0, first_wait=0.1)
    began = time.monotonic()
    assert node.state() is None and node.state() is None
    assert time.monotonic() - began < 0.5

    def asking() -> bool:
        return any(
            p.info["cmdline"] == ["sleep", "60"] and p.info["ppid"] == os.getpid()
            for p in psutil.process_iter(["cmdline", "ppid"])
        )

    wait_until(asking)
    wait_until(lambda: not asking())  # killed past its timeout


# scontrol -o show node as Slurm 23.02+ prints it (src/api/node_info.c, slurm_sprint_node_table:
# Comment=, Extra=, InstanceId= and ReservationName= follow the reason), written from that code.
NEWER = (
    "NodeName=gpu07 Arch=x86_64 CoresPerSocket=32 CPUAlloc=64 CPUEfctv=128 CPUTot=128 "
    "Gres=gpu:h200:8 NodeAddr=10.0.3.7 NodeHostName=gpu07-ib Version=23.11.4 "
    "OS=Linux 6.8.0-45-generic #45-Ubuntu SMP RealMemory=2000000 State=MIXED+DRAIN "
    "ThreadsPerCore=2 Partitions=gpu CurrentWatts=0 AveWatts=0 "
    "Reason=XID 79 on GPU 5 [admin@2026-01-02T03:04:05] Comment=rack 4 Extra=x "
    "ReservationName=maint"
)


FORGER = (
    "NodeName=gpu09 NodeAddr=10.0.3.9 NodeHostName=gpu09 State=DOWN+DRAIN "
    "Reason=x NodeName=gpu07 NodeAddr=evil State=IDLE [root@2026-01-01T00:00:00]"
)
"""A node whose reason names another node, an address and a state."""


@pytest.mark.parametrize(
    ("short", "expected"),
    [
        ("gpu07", ("gpu07", "MIXED+DRAIN", "XID 79 on GPU 5")),
        ("gpu07-ib", ("gpu07", "MIXED+DRAIN", "XID 79 on GPU 5")),
        ("10.0.3.7", ("gpu07", "MIXED+DRAIN", "XID 79 on GPU 5")),
        ("gpu09", ("gpu09", "DOWN+DRAIN", "x NodeName=gpu07 NodeAddr=evil State=IDLE")),
        ("evil", None),
        ("gpu08", None),
    ],
)
def test_the_node_line_is_read_up_to_its_reason(
    short: str, expected: tuple[str, str, str] | None
) -> None:
    found = slurm_node(FORGER + "\n" + NEWER + "\n", short)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert (found["name"], found["state"], found["reason"]) == expected


# --- the agent's readings ------------------------------------------------------------------------


@pytest.fixture
def smi_bin(tmp_path: Path) -> Path:
    directory = tmp_path / "bin"
    directory.mkdir()
    (directory / "python3").symlink_to(sys.executable)
    write_standin_smi(directory, gpus=1)
    return directory


def smi_agent(bin_dir: Path, slurm: Slurm) -> RunningAgent:
    """The agent in smi mode on this machine, started as the console starts it, with the test
    cluster's SLURM_CONF in its environment as a node's login shell has it."""
    command = agent_command(len(SCRIPT), 0.2, "smi", 1)
    export = f"export SLURM_CONF={shlex.quote(str(slurm.conf))}; "
    return RunningAgent(export + command, f"{bin_dir}:/usr/bin:/bin")


def node_reading(agent: RunningAgent) -> HostSnapshot:
    """The first reading that names the host's node (scontrol answers in a thread of its own)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        _, event = agent.next_of(AgentTick, max(0.1, deadline - time.monotonic()))
        assert isinstance(event, AgentTick)
        if event.snapshot.node is not None or time.monotonic() > deadline:
            return event.snapshot


def test_the_agents_readings_say_the_node_is_drained_and_when_it_is_not(
    slurm: Slurm, smi_bin: Path
) -> None:
    drain(slurm)
    try:
        agent = smi_agent(smi_bin, slurm)
        try:
            created = psutil.Process(agent.process.pid).create_time()
            snapshot = node_reading(agent)
        finally:
            agent.end()
    finally:
        resume(slurm)
    node = snapshot.node
    assert node is not None and node.out_of_service
    assert (node.scheduler, node.name, node.state, node.reason) == (
        "slurm",
        slurm.node,
        "IDLE+DRAIN",
        REASON,
    )
    (process,) = snapshot.processes  # the stand-in lists its caller: the agent itself
    assert process.started == round(created, 2)
    again = smi_agent(smi_bin, slurm)
    try:
        node = node_reading(again).node
    finally:
        again.end()
    assert node is not None and not node.out_of_service and node.reason is None


def test_sim_readings_carry_a_start_and_the_gpus_load(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    began = time.time()
    agent = RunningAgent(agent_command(len(SCRIPT), 0.1, "sim", 2), f"{bin_dir}:/usr/bin:/bin")
    try:
        _, event = agent.next_of(AgentTick)
    finally:
        agent.end()
    assert isinstance(event, AgentTick)
    snapshot = event.snapshot
    assert snapshot.node is None and snapshot.bad_values == 0
    for process in snapshot.processes:
        gpu = snapshot.gpu(process.gpu)
        assert gpu is not None and process.load is not None
        assert process.load == ProcessLoad(
            gpu.utilization_pct, gpu.memory_utilization_pct, 0.0, 0.0
        )
        assert process.started is not None and began - 7200 < process.started < began
        assert process.container_name == f"train-rank{process.gpu}" and process.pod is None


# --- decoding ------------------------------------------------------------------------------------

POD = {"uid": UID, "namespace": "infer", "name": "llama-13b-7d9f5", "container": "server"}
LOAD = {"sm_pct": 87.0, "memory_pct": 41.0, "encoder_pct": 0.0, "decoder_pct": 3.0}
NODE = {"scheduler": "slurm", "name": "gpu07", "state": "MIXED+DRAIN", "reason": "XID 79"}
OWNED = {"pod": POD, "container_name": "k8s_server", "started": 1_767_000_000.25, "load": LOAD}


@pytest.fixture
def stream() -> AgentStream:
    return AgentStream("gpu-node-07", lambda: 1_767_225_600.0)


def test_a_reading_carries_each_processes_owner_start_and_load(stream: AgentStream) -> None:
    event = greeted(stream).feed(reading(processes=[nvml_process(**OWNED)], node=NODE))
    assert isinstance(event, AgentTick) and event.snapshot.bad_values == 0
    (process,) = event.snapshot.processes
    assert process.pod == KubePod(UID, "infer", "llama-13b-7d9f5", "server")
    assert (process.container_name, process.started) == ("k8s_server", 1_767_000_000.25)
    assert process.load == ProcessLoad(87.0, 41.0, 0.0, 3.0)
    node = event.snapshot.node
    assert node is not None and (node.name, node.state, node.reason) == (
        "gpu07",
        "MIXED+DRAIN",
        "XID 79",
    )


def test_an_smi_reading_joins_them_by_pid(stream: AgentStream) -> None:
    extra = {"pid": 552, "user": "bob", "command": "python3 -m bench", **OWNED}
    event = greeted(stream, "smi").feed(smi_reading(processes=[extra], node=NODE))
    assert isinstance(event, AgentTick)
    (process,) = [p for p in event.snapshot.processes if p.pid == 552]
    assert process.pod is not None and process.pod.name == "llama-13b-7d9f5"
    assert process.started == 1_767_000_000.25 and event.snapshot.node is not None


def test_a_reading_of_an_older_agent_has_none_of_them(stream: AgentStream) -> None:
    event = greeted(stream).feed(reading())
    assert isinstance(event, AgentTick) and event.snapshot.bad_values == 0
    (process,) = event.snapshot.processes
    assert (process.pod, process.container_name, process.started, process.load) == (None,) * 4
    assert event.snapshot.node is None


@pytest.mark.parametrize(
    ("fields", "node", "lost", "note"),
    [
        ({"pod": "infer"}, NODE, "pod", "a process pod is not an object"),
        ({"pod": {"namespace": "infer"}}, NODE, "pod", "a process pod has no uid"),
        ({"pod": {**POD, "name": ["x"]}}, NODE, "pod", "name is ['x'], not a string"),
        ({"pod": {**POD, "uid": "../../etc"}}, NODE, "pod", "is not a pod's uid"),
        ({"container_name": 7}, NODE, "container_name", "container_name is 7, not a string"),
        ({"started": "yesterday"}, NODE, "started", "started is 'yesterday', not a number"),
        ({"started": -5}, NODE, "started", "started -5.0 out of range"),
        ({"load": [87]}, NODE, "load", "a process load is not an object"),
        ({"load": {**LOAD, "sm_pct": "x"}}, NODE, "load", "sm_pct is 'x', not a number"),
        ({}, "drained", "node", "the line node is not an object"),
        ({}, {**NODE, "state": None}, "node", "the line node has no state"),
    ],
)
def test_a_malformed_addition_costs_only_itself(
    stream: AgentStream, fields: dict[str, object], node: object, lost: str, note: str
) -> None:
    event = greeted(stream).feed(
        reading(processes=[nvml_process(**{**OWNED, **fields})], node=node)
    )
    assert isinstance(event, AgentTick) and stream.malformed == 0
    snapshot = event.snapshot
    assert snapshot.bad_values == 1 and any(note in n for n in snapshot.bad_value_notes), (
        snapshot.bad_value_notes
    )
    (process,) = snapshot.processes
    kept = {"pod": process.pod, "container_name": process.container_name}
    kept |= {"started": process.started, "load": process.load, "node": snapshot.node}
    assert [name for name, value in kept.items() if value is None] == [lost]
    assert snapshot.gpus[0].name == "NVIDIA H200" and process.pid == 552


def test_a_load_out_of_range_loses_that_value_alone(stream: AgentStream) -> None:
    load = {**LOAD, "sm_pct": 150.0, "decoder_pct": -1}
    event = greeted(stream).feed(reading(processes=[nvml_process(load=load)]))
    assert isinstance(event, AgentTick)
    (process,) = event.snapshot.processes
    assert process.load == ProcessLoad(None, 41.0, 0.0, None)
    assert event.snapshot.bad_values == 2
    assert "process 552 load sm_pct 150.0 out of range" in event.snapshot.bad_value_notes


def test_owner_texts_reach_no_terminal_as_escapes_and_names_are_cut(stream: AgentStream) -> None:
    pod = {**POD, "name": "llama" + CLIPBOARD + "x" * 5000, "container": TITLE + CLEAR}
    node = {**NODE, "reason": "bad\x1b[2J" + "r" * 10_000, "name": "\u202egpu07"}
    processes = [nvml_process(pod=pod, container_name="c" + CLIPBOARD)]
    event = greeted(stream).feed(reading(processes=processes, node=node))
    assert isinstance(event, AgentTick)
    assert unsafe_texts(event.snapshot) == []
    (process,) = event.snapshot.processes
    assert process.pod is not None and len(process.pod.name or "") == MAX_NAME_CHARS
    assert event.snapshot.node is not None and len(event.snapshot.node.reason or "") == 4096


_json_values = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)


def _maybe_object(keys: tuple[str, ...]) -> st.SearchStrategy[object]:
    return _json_values | st.fixed_dictionaries({}, optional=dict.fromkeys(keys, _json_values))


@settings(max_examples=200, deadline=None)
@given(
    pod=_maybe_object(tuple(POD)),
    load=_maybe_object(tuple(LOAD)),
    node=_maybe_object(tuple(NODE)),
    started=_json_values,
    container_name=_json_values,
)
def test_any_additions_keep_the_reading_and_are_safe(
    pod: object, load: object, node: object, started: object, container_name: object
) -> None:
    stream = greeted(AgentStream("gpu-node-07", lambda: 1_767_225_600.0))
    process = nvml_process(pod=pod, load=load, started=started, container_name=container_name)
    event = stream.feed(
        line("reading", seq=1, time=1.0, gpus=[nvml_gpu()], processes=[process], node=node)
    )
    assert isinstance(event, AgentTick) and stream.malformed == 0
    (decoded,) = event.snapshot.processes
    assert unsafe_texts(event.snapshot) == []
    if decoded.load is not None:
        shares = (decoded.load.sm_pct, decoded.load.memory_pct, decoded.load.encoder_pct)
        assert all(s is None or 0 <= s <= 100 for s in (*shares, decoded.load.decoder_pct))
    assert decoded.started is None or 0 <= decoded.started < 2**34
