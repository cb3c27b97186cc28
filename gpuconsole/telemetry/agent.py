"""The gpuconsole agent: streams one host's GPU readings as JSON lines (docs/agent-protocol.md).

The console sends this file as text over an SSH channel's stdin and runs it with the host's own
``python3`` (see ``gpuconsole.telemetry.wire.agent_command``), so it imports nothing but the
standard library, nothing from gpuconsole, and keeps to Python 3.8.

One thread paces the ticks and is the only writer of stdout. A reader thread turns stdin's lines
into events on the same queue, and in ``smi`` mode a worker thread runs nvidia-smi, so a call
stuck in the driver holds up that worker, never the ticks. Readings come from NVML through
ctypes (no pynvml on the host), from nvidia-smi's CSV, or from a cheap simulation. The console
reads its own host with the same NVML reader (`Nvml`), in its own process.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import functools
import json
import math
import os
import pwd
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor

PROTOCOL_VERSION = 2
MARKER = "gpuconsole-agent"
MODES = ("auto", "nvml", "smi", "sim")
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 3600.0
MAX_TEXT = 4096
"""Longest command line or message sent, in characters."""
MAX_CGROUP_TEXT = 65536
MAX_ENVIRON = 256 * 1024
"""Most of /proc/PID/environ read when looking for SLURM_JOB_ID."""
MAX_COMMAND_LINE = 65536
"""Longest stdin line read; a longer one is skipped as malformed."""
_EXIT_WAIT_S = 0.5
"""How long leaving waits for a killed nvidia-smi to go."""


# --- output ----------------------------------------------------------------------------------


class LineWriter:
    """Writes the protocol's lines to a file descriptor, each whole (no partial writes)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def send(self, kind: str, **fields: object) -> None:
        """Write one line; `OSError` (a broken pipe) when the console is gone."""
        line = {"v": PROTOCOL_VERSION, "type": kind}
        line.update(fields)
        data = memoryview((json.dumps(line, separators=(",", ":")) + "\n").encode())
        while data:
            data = data[os.write(self._fd, data) :]


def clipped(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- what /proc says about a process ---------------------------------------------------------

_user_names: dict[int, str] = {}


def _user_name(uid: int) -> str:
    """The account name of ``uid`` (its number as text when it has none), looked up once."""
    if uid not in _user_names:
        try:
            _user_names[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _user_names[uid] = str(uid)
    return _user_names[uid]


def _read_proc(pid: int, name: str, limit: int = MAX_CGROUP_TEXT) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as file:
            return file.read(limit)
    except OSError:
        return None


def cgroup_text(pid: int) -> str | None:
    """/proc/PID/cgroup (bounded), or None when the process is gone."""
    raw = _read_proc(pid, "cgroup")
    return None if raw is None else raw.decode("utf-8", "replace")


def command_line(pid: int) -> str | None:
    """The process's arguments joined by spaces; None when it is gone or has none (a zombie)."""
    raw = _read_proc(pid, "cmdline")
    if not raw:
        return None
    words = raw.rstrip(b"\0").split(b"\0")
    return clipped(" ".join(word.decode("utf-8", "replace") for word in words))


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (the state) on: the name before it may hold spaces."""
    raw = _read_proc(pid, "stat")
    if raw is None or b")" not in raw:
        return None
    return raw[raw.rindex(b")") + 1 :].decode("ascii", "replace").split()


_JOB_ID = "([1-9][0-9]{0,9})"  # ASCII digits (\\d takes any script's), no leading zero
_SLURM_CGROUP = re.compile(
    # v1: /slurm/uid_N/job_N/... (/slurm_<node>/... where one host runs several slurmd);
    # v2: /system.slice/slurmstepd.scope/job_N/... (<node>_slurmstepd.scope likewise)
    r"(?:^|/)(?:slurm(?:_[^/]+)?/uid_[0-9]+|(?:[^/]+_)?slurmstepd\.scope)/job_"
    + _JOB_ID
    + "(?:/|$)"
)
_ENV_JOB_ID = re.compile(_JOB_ID)


def _job_id(digits: str) -> int | None:
    value = int(digits)
    return value if 0 < value < 2**32 else None


def slurm_job_id(pid: int, cgroup_text: str | None) -> int | None:
    """The Slurm job ``pid`` runs in: from its cgroup path where slurmstepd put it in one, else
    from ``SLURM_JOB_ID`` in its environment (which /proc shows only for one's own processes,
    or to root); None when neither says."""
    for line in (cgroup_text or "").splitlines():
        path = line.split(":", 2)[-1]
        match = _SLURM_CGROUP.search(path)
        if match is not None:
            return _job_id(match.group(1))
    environ = _read_proc(pid, "environ", MAX_ENVIRON)
    if not environ:
        return None
    variables = environ.split(b"\0")
    if len(environ) == MAX_ENVIRON:
        variables.pop()  # cut short by the bound: the last one may be only part of itself
    for variable in variables:
        if variable.startswith(b"SLURM_JOB_ID="):
            match = _ENV_JOB_ID.fullmatch(variable[13:].decode("ascii", "replace"))
            return None if match is None else _job_id(match.group(1))
    return None


_boot: list[float | None] = []


def boot_time() -> float | None:
    """When the kernel booted, seconds since the epoch (``btime`` of /proc/stat), read once:
    the kernel works it out afresh on each read from the clock and the uptime, so it can move
    by a second as the clock is adjusted, and a process's start must not move with it."""
    if not _boot:
        words: list[bytes] = []
        try:
            with open("/proc/stat", "rb") as file:  # line by line: "intr" can run to 100s of KiB
                words = next((line.split() for line in file if line.startswith(b"btime ")), [])
        except OSError:
            pass
        _boot.append(float(words[1]) if len(words) == 2 and words[1].isdigit() else None)
    return _boot[0]


def started_at(ticks: int | None) -> float | None:
    """A process's start in seconds since the epoch, from its start in clock ticks after boot
    (field 22 of /proc/PID/stat), as ``ps -o lstart`` and psutil's ``create_time`` work it out."""
    boot = boot_time()
    if ticks is None or boot is None:
        return None
    return round(boot + ticks / os.sysconf("SC_CLK_TCK"), 2)


def _start_ticks(stat: list[str] | None) -> int | None:
    """A process's start in clock ticks after boot: field 22 of its /proc/PID/stat."""
    start = stat[19] if stat is not None and len(stat) > 19 else None
    return int(start) if start is not None and start.isdigit() else None


def reused_pid(pid: int, started: float | None) -> str | None:
    """Why ``pid`` cannot be taken for the process that was read as starting at ``started``
    (None when it can): a pid is reused, by any command line, and only the start tells a new
    process from the one that was read. The start is read again as `process_details` read it,
    so the same process gives the same number."""
    ticks = _start_ticks(_stat_fields(pid))
    if ticks is None:
        return f"pid {pid} has already exited"
    now = started_at(ticks)
    if started is None or now is None:
        return (
            f"pid {pid}: its start was not read, so a process that took its pid could not be "
            "told from it; nothing sent"
        )
    if now != started:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
        return f"pid {pid} is now another process (started at {stamp}), nothing sent"
    return None


def process_details(pid: int) -> dict[str, object]:
    """What /proc adds to a GPU process: owner, command line, cgroup text, start (in clock
    ticks since boot and in seconds since the epoch), and the Slurm job it runs in."""
    try:
        user: str | None = _user_name(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        user = None
    cgroup = cgroup_text(pid)
    ticks = _start_ticks(_stat_fields(pid))
    return {
        "user": user,
        "command": command_line(pid),
        "cgroup": cgroup,
        "start_time": ticks,
        "started": started_at(ticks),
        "slurm_job": slurm_job_id(pid, cgroup),
    }


# --- child processes, each with a timeout -----------------------------------------------------


def spawn(argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """``argv`` started with no stdin and its output piped; OSError when it cannot be."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=None if env is None else dict(env),
        close_fds=True,
    )


def reap(child: subprocess.Popen, timeout: float) -> tuple[bytes, bytes] | None:
    """The child's stdout and stderr once it exits; None when it ran past ``timeout`` and was
    killed. The kill is waited for as long as the kernel holds the child (a driver call): the
    calling thread waits, never the ticks."""
    try:
        return child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return None


# --- asked in the background: a tick takes what is known and never waits for the asking -------

ASK_AGAIN_S = 30.0
"""How long an answer about an owner (a job, a pod, a container, this host's node) is believed
before it is asked again."""
FIRST_WAIT_S = 0.5
"""How long a tick waits for an answer about something never seen before (a healthy slurmctld
or Docker answers in milliseconds): so that a one-shot snapshot has it, while a slow source
costs a tick at most this, once per new thing."""


class Asker:
    """Answers about keys (jobs, containers, this host's node) from a source that a busy or hung
    daemon can hold for seconds, asked in a thread of its own: a tick takes what is known.

    One ask at a time, about every key not known or known for more than ``stale_after`` (at most
    ``batch`` of them); an ask that fails keeps what was known, to be tried again once that is
    stale. Only an ask about a key never seen before is waited for, and for ``first_wait`` at
    most. At most ``limit`` keys are remembered; the longest unasked are forgotten first.
    """

    def __init__(
        self, name: str, stale_after: float, first_wait: float, limit: int, batch: int
    ) -> None:
        self._name = name
        self._stale_after = stale_after
        self._first_wait = first_wait
        self._limit = limit
        self._batch = batch
        self._lock = threading.Lock()
        # key -> (when it was last asked about, the answer or None where there was none), in
        # the order they were asked: the first is the one to forget
        self._known: dict = {}
        self._asking = False

    def lookup(self, keys: set) -> dict:
        """What is known of ``keys`` (an answer older than ``stale_after`` too, until a newer
        one comes); asks about the rest in the background."""
        now = time.monotonic()
        with self._lock:
            known = {key: self._known[key] for key in keys if key in self._known}
            wanted = sorted(
                key for key in keys if key not in known or now - known[key][0] > self._stale_after
            )[: self._batch]
            ask = bool(wanted) and self._can_ask() and not self._asking
            self._asking = self._asking or ask
        if ask:
            answered = threading.Event()
            threading.Thread(
                target=self._ask, args=(wanted, answered), name=self._name, daemon=True
            ).start()
            if len(known) < len(keys) and answered.wait(self._first_wait):
                with self._lock:
                    known = {key: self._known[key] for key in keys if key in self._known}
        return {key: answer for key, (_, answer) in known.items() if answer is not None}

    def _ask(self, keys: list, answered: threading.Event) -> None:
        answers = None
        try:
            answers = self._answers(keys)
        finally:
            now = time.monotonic()
            with self._lock:
                for key in keys:
                    previous = self._known.pop(key, (now, None))[1]
                    # Failed (None): keep what was known, ask again once it is stale.
                    self._known[key] = (now, previous if answers is None else answers.get(key))
                while len(self._known) > self._limit:
                    del self._known[next(iter(self._known))]
                self._asking = False
            answered.set()

    def _can_ask(self) -> bool:
        return True

    def _answers(self, keys: list) -> dict | None:
        """The source's answer about each of ``keys`` (a key left out has none); None where the
        source could not be asked."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop what is being asked, where that can be stopped."""


class ToolAsker(Asker):
    """An `Asker` whose source is a command on PATH (squeue, scontrol), each call killed past
    ``timeout``; where the command is not on PATH nothing is asked."""

    def __init__(
        self,
        tool: str,
        env: Mapping[str, str] | None,
        timeout: float,
        stale_after: float,
        first_wait: float,
        limit: int,
        batch: int,
    ) -> None:
        """``env``: the environment the command runs in (``SLURM_CONF`` points Slurm's at a
        cluster)."""
        super().__init__(tool, stale_after, first_wait, limit, batch)
        self._env = dict(os.environ if env is None else env)
        self._tool = shutil.which(tool, path=self._env.get("PATH", os.defpath))
        self._timeout = timeout
        self._child: subprocess.Popen | None = None

    def _can_ask(self) -> bool:
        return self._tool is not None

    def _run(self, *args: str) -> tuple[int, str, str] | None:
        """The command's exit status, stdout and stderr; None where it could not be started or
        was killed past its timeout."""
        try:
            child = spawn([str(self._tool), *args], self._env)
        except OSError:
            return None
        self._child = child
        try:
            output = reap(child, self._timeout)
        finally:
            self._child = None
        if output is None:
            return None
        stdout, stderr = (data.decode("utf-8", "replace") for data in output)
        return child.returncode, stdout, stderr

    def close(self) -> None:
        """Kill the call in flight, if any."""
        child = self._child
        if child is not None:
            with contextlib.suppress(OSError):
                child.kill()


# --- Slurm: what squeue says about the jobs the GPU processes run in ----------------------------

SLURM_FIELDS = ("job_id", "user", "partition", "start", "time_limit", "state", "name")
SQUEUE_FORMAT = "%A\x1f%u\x1f%P\x1f%S\x1f%l\x1f%T\x1f%j"
"""squeue's fields in SLURM_FIELDS' order, split by US: the job name, free text that may hold
anything, comes last so that no character of it can shift the others. ``%A`` is the job's own
id (an array task's too, where ``%i`` prints ``base_index``), the number its cgroup carries."""
SLURM_TIMEOUT_S = 5.0
MAX_SLURM_JOBS = 1024
"""Jobs remembered; the longest unasked are forgotten first."""


def parse_squeue(output: str, asked: set[int]) -> dict[int, dict[str, object]]:
    """The rows of ``squeue -o SQUEUE_FORMAT`` for the jobs ``asked`` about, by job id.

    A job name may hold a newline and so forge what looks like another job's row: a job id
    that comes twice is left out rather than believed either time."""
    rows: dict[int, dict[str, object]] = {}
    repeated: set[int] = set()
    for line in output.split("\n"):
        values = line.split("\x1f", len(SLURM_FIELDS) - 1)
        match = _ENV_JOB_ID.fullmatch(values[0].strip())
        if len(values) != len(SLURM_FIELDS) or match is None:
            continue
        job = _job_id(match.group(1))
        if job is None or job not in asked:
            continue
        if job in rows:
            repeated.add(job)
        row: dict[str, object] = {"job_id": job}
        for position, name in enumerate(SLURM_FIELDS[1:], 1):  # no zip(strict=) in 3.8
            value = values[position] if name == "name" else values[position].strip()
            row[name] = clipped(value) if value else None
        rows[job] = row
    for job in repeated:
        del rows[job]
    return rows


class SlurmJobs(ToolAsker):
    """What squeue says about jobs (`ToolAsker`): one call for every job not known or known for
    more than ASK_AGAIN_S."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout: float = SLURM_TIMEOUT_S,
        stale_after: float = ASK_AGAIN_S,
        first_wait: float = FIRST_WAIT_S,
    ) -> None:
        super().__init__(
            "squeue", env, timeout, stale_after, first_wait, MAX_SLURM_JOBS, MAX_SLURM_JOBS
        )

    def _answers(self, keys: list) -> dict | None:
        """squeue's rows for the jobs ``keys``.

        squeue exits 1 ("Invalid job id specified") when none of the jobs is still known to
        slurmctld: an answer too, that all have ended."""
        ran = self._run("-h", "-j", ",".join(map(str, keys)), "-o", SQUEUE_FORMAT)
        if ran is None:
            return None
        code, stdout, stderr = ran
        if code != 0 and "Invalid job id" not in stderr:
            return None
        return parse_squeue(stdout, set(keys))


def jobs_of(processes: list[dict], slurm: SlurmJobs) -> list[dict[str, object]]:
    """The reading's ``jobs``: what is known of the jobs its processes run in."""
    ids = {p["slurm_job"] for p in processes if isinstance(p.get("slurm_job"), int)}
    known = slurm.lookup(ids)
    return [known[job] for job in sorted(known)]


# --- Slurm: this host's node as scontrol says it ---------------------------------------------

_NODE_FIELD = re.compile(r"(?:^| )(NodeName|NodeHostName|NodeAddr|State)=(\S+)")
_REASON_STAMP = re.compile(r" \[[^\[\]@ ]+@[^\[\]]+\]")
"""What scontrol puts after a reason's first line: `` [who@when]`` (``when`` as
SLURM_TIME_FORMAT has it, ISO 8601 by default)."""
_AFTER_REASON = re.compile(r" (?:Comment|Extra|InstanceId|InstanceType|ReservationName)=")
"""The fields scontrol may print after the reason (src/api/node_info.c)."""


def slurm_node(output: str, short: str) -> dict[str, object] | None:
    """The node among ``scontrol -o show node``'s lines (one per node) whose NodeName,
    NodeHostName or NodeAddr is ``short`` (the host's short name, as slurmd names itself):
    ``{scheduler, name, state, reason}``; None where none is.

    The reason is free text and comes after every other field the match needs: a line is read
    up to its first `` Reason=`` only, so that no reason can forge a name or a state. The
    reason ends at its `` [who@when]`` stamp, or at a field scontrol prints after it."""
    for line in output.split("\n"):
        fields, _, reason = line.partition(" Reason=")
        found: dict[str, str] = {}
        for key, value in _NODE_FIELD.findall(fields):
            found.setdefault(key, value)
        names = (found.get("NodeName"), found.get("NodeHostName"), found.get("NodeAddr"))
        if short not in names or "NodeName" not in found or "State" not in found:
            continue
        stamp = _REASON_STAMP.search(reason) or _AFTER_REASON.search(reason)
        reason = (reason[: stamp.start()] if stamp else reason).strip()
        return {
            "scheduler": "slurm",
            "name": clipped(found["NodeName"]),
            "state": clipped(found["State"]),
            "reason": clipped(reason) if reason else None,
        }
    return None


class SlurmNode(ToolAsker):
    """This host's Slurm node as ``scontrol -o show node`` says it (`ToolAsker`), asked every
    ASK_AGAIN_S: first by name (the NodeName found before, else the host's short name), and
    only where Slurm knows no node by that name, every node, to find the one whose NodeHostName
    or NodeAddr is the short name. A host that is no Slurm node has none."""

    _KEY = "node"

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        host: str | None = None,
        timeout: float = SLURM_TIMEOUT_S,
        stale_after: float = ASK_AGAIN_S,
        first_wait: float = FIRST_WAIT_S,
    ) -> None:
        """``host``: this host's name (``socket.gethostname()``)."""
        super().__init__("scontrol", env, timeout, stale_after, first_wait, 1, 1)
        self._short = (host or socket.gethostname()).split(".")[0]
        self._name: str | None = None

    def state(self) -> dict[str, object] | None:
        """``{scheduler, name, state, reason}`` as scontrol last said it; None where the host
        is no Slurm node, or scontrol has not answered yet."""
        return self.lookup({self._KEY}).get(self._KEY)

    def _answers(self, keys: list) -> dict | None:
        ran = self._run("-o", "show", "node", self._name or self._short)
        if ran is not None and ran[0] != 0 and " not found" in ran[1] + ran[2]:
            ran = self._run("-o", "show", "node")  # known by its NodeHostName or NodeAddr only
        if ran is None or ran[0] != 0:
            return None
        node = slurm_node(ran[1], self._short)
        self._name = None if node is None else str(node["name"])
        return {self._KEY: node}


# --- containers and pods: what a process's cgroup path says ----------------------------------

_CONTAINER_ID = "([0-9a-f]{64})"
CONTAINER_RUNTIMES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"(?:^|/)docker-" + _CONTAINER_ID + r"\.scope(?:/|$)"), "docker"),
    (re.compile(r"/docker/" + _CONTAINER_ID + "(?:/|$)"), "docker"),
    (re.compile(r"(?:^|/)cri-containerd-" + _CONTAINER_ID + r"(?:\.scope)?(?:/|$)"), "containerd"),
    (re.compile(r"(?:^|/)crio-" + _CONTAINER_ID + r"(?:\.scope)?(?:/|$)"), "cri-o"),
    (re.compile(r"(?:^|/)libpod-" + _CONTAINER_ID + r"(?:\.scope)?(?:/|$)"), "podman"),
)
"""(pattern, runtime) in the order they are tried on a cgroup path. Runtimes name the cgroup of
a container's processes after its id, under the systemd cgroup driver (``docker-<id>.scope``)
and the cgroupfs one (``/docker/<id>``) alike."""
_POD = re.compile(
    # A pod's uid: a UUID (dashes under cgroupfs, underscores in systemd slice names) or, for a
    # static pod, the 32-hex hash of its manifest.
    r"kubepods\b.*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?(?:/|$)"
)
_POD_CONTAINER = re.compile(r"(?:[a-z]+(?:-[a-z]+)*-)?" + _CONTAINER_ID + r"(?:\.scope)?(?:/|$)")
"""A container's cgroup right below its pod's: ``cri-containerd-<id>.scope``, ``crio-<id>.scope``
and ``docker-<id>.scope`` under the systemd driver, a bare ``<id>`` under cgroupfs."""


def cgroup_paths(cgroup_text: str) -> list[str]:
    """The path of each ``hierarchy-id:controllers:path`` line of /proc/PID/cgroup."""
    return [line.split(":", 2)[2] for line in cgroup_text.splitlines() if line.count(":") >= 2]


def runtime_container(path: str) -> tuple[str, str] | None:
    """(runtime, 64-hex container id) of the container a cgroup path names; None for none."""
    for pattern, runtime in CONTAINER_RUNTIMES:
        match = pattern.search(path)
        if match:
            return runtime, match.group(1)
    return None


def pod_of(path: str) -> tuple[str, str | None] | None:
    """(uid, the id of its container where the path goes on to name one) of the Kubernetes pod a
    cgroup path is in, the uid as the API server writes it; None for none."""
    match = _POD.search(path)
    if match is None:
        return None
    container = _POD_CONTAINER.match(path, match.end())
    return match.group(1).replace("_", "-"), container and container.group(1)


def containers_in(cgroup_text: str | None) -> tuple[tuple[str, str | None] | None, str | None]:
    """What a process's cgroup text names: its pod (uid, container id) and its Docker
    container's id, each where it names one."""
    pod = docker = None
    for path in cgroup_paths(cgroup_text or ""):
        pod = pod or pod_of(path)
        found = runtime_container(path)
        if docker is None and found is not None and found[0] == "docker":
            docker = found[1]
    return pod, docker


# --- Kubernetes pods: their names from the kubelet's log directories ---------------------------

KUBELET_LOG_ROOT = "/var/log"
"""Where the kubelet keeps containers' logs, in a layout that names each pod and its containers
(kubernetes/kubernetes, pkg/kubelet/kuberuntime/helpers.go: ``BuildPodLogsDirectory``,
``BuildContainerLogsDirectory``, ``buildContainerLogsPath``; legacy.go: ``logSymlink``):
``pods/<namespace>_<pod>_<uid>/<container>/<restarts>.log``, and for each running container a
link ``containers/<pod>_<namespace>_<container>-<container id>.log`` to its log, the link's name
cut to 255 bytes (ext4's longest) before ``.log``."""
_LINK_NAME_MAX = 255 - len(".log")
MAX_LOG_ENTRIES = 4096
"""Most entries read of one log directory (a node runs at most 110 pods by default)."""
LOG_SCAN_S = 0.1
"""Longest one lookup reads the log directories; what it has not reached by then stays
unknown until the pod is looked up again."""
MAX_PODS = 1024
"""(pod, container) pairs remembered; the longest unasked are forgotten first."""


def _entries(directory: str, deadline: float, directories_only: bool = False) -> Iterator[str]:
    """The names in ``directory``: at most MAX_LOG_ENTRIES of them, until ``deadline``; none
    where it cannot be read."""
    try:
        with os.scandir(directory) as entries:
            for count, entry in enumerate(entries):
                if count == MAX_LOG_ENTRIES or time.monotonic() > deadline:
                    return
                if not directories_only or entry.is_dir(follow_symlinks=False):
                    yield entry.name
    except OSError:
        return


def _shown(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (which the file system allows) replaced."""
    return clipped(os.fsencode(name).decode("utf-8", "replace"))


class KubePods:
    """Each pod's namespace and name, and the name of a process's container in it, read from the
    kubelet's log directories on the node (`KUBELET_LOG_ROOT`): no API server, no kubectl.

    The kubelet's pod-resources socket would say the same but speaks gRPC, which the standard
    library does not. A pod and container is looked up once per ASK_AGAIN_S; each lookup reads
    the directories for LOG_SCAN_S at most."""

    def __init__(self, log_root: str = KUBELET_LOG_ROOT, stale_after: float = ASK_AGAIN_S) -> None:
        """``log_root``: where the ``pods`` and ``containers`` directories are."""
        self._pods_dir = os.path.join(log_root, "pods")
        self._links_dir = os.fsencode(os.path.join(log_root, "containers"))
        self._stale_after = stale_after
        self._known: dict[tuple[str, str | None], tuple[float, dict[str, object]]] = {}

    def lookup(
        self, pods: set[tuple[str, str | None]]
    ) -> dict[tuple[str, str | None], dict[str, object]]:
        """``{uid, namespace, name, container}`` of each (pod uid, container id); what the logs
        do not say is None."""
        now = time.monotonic()
        stale = {
            p for p in pods if p not in self._known or now - self._known[p][0] > self._stale_after
        }
        if stale:
            deadline = now + LOG_SCAN_S
            directories = self._directories({uid for uid, _ in stale}, deadline)
            for uid, container_id in stale:
                pod = self._pod(uid, container_id, directories.get(uid), deadline)
                self._known.pop((uid, container_id), None)
                self._known[uid, container_id] = (now, pod)
        found = {p: self._known[p][1] for p in pods}
        while len(self._known) > MAX_PODS:
            del self._known[next(iter(self._known))]
        return found

    def _directories(self, uids: set[str], deadline: float) -> dict[str, str]:
        """The log directory of each pod of ``uids`` that has one, by uid."""
        found: dict[str, str] = {}
        for name in _entries(self._pods_dir, deadline):
            uid = name.rpartition("_")[2]
            if uid in uids:
                found[uid] = name
                if len(found) == len(uids):
                    break
        return found

    def _pod(
        self, uid: str, container_id: str | None, directory: str | None, deadline: float
    ) -> dict[str, object]:
        pod: dict[str, object] = {"uid": uid, "namespace": None, "name": None, "container": None}
        namespace, _, name = (directory or "")[: -len(uid) - 1].partition("_")
        if not namespace or not name or "_" in name:  # not <namespace>_<pod>_<uid>
            return pod
        containers = list(_entries(os.path.join(self._pods_dir, directory), deadline, True))
        container = self._container(namespace, name, containers, container_id)
        pod.update(
            namespace=_shown(namespace),
            name=_shown(name),
            container=None if container is None else _shown(container),
        )
        return pod

    def _container(
        self, namespace: str, name: str, containers: list[str], container_id: str | None
    ) -> str | None:
        """The container whose log link names ``container_id``; else the pod's only one."""
        for container in containers if container_id is not None else ():
            link = os.fsencode(f"{name}_{namespace}_{container}-{container_id}")
            if os.path.lexists(os.path.join(self._links_dir, link[:_LINK_NAME_MAX] + b".log")):
                return container
        return containers[0] if len(containers) == 1 else None


# --- Docker: a container's name from the Engine API on its socket ----------------------------

DOCKER_SOCKET = "/var/run/docker.sock"
DOCKER_TIMEOUT_S = 1.0
"""Longest one question to Docker takes, connecting and reading the whole answer included."""
MAX_DOCKER_ANSWER = 1 << 20
"""Longest answer read; a longer one gives no name (an inspect is a few KiB)."""
DOCKER_BATCH = 16
"""Containers asked about in one turn, each at most DOCKER_TIMEOUT_S."""
MAX_CONTAINERS = 1024
"""Containers remembered; the longest unasked are forgotten first."""


class _DeadlineSocket(socket.socket):
    """A socket whose every read waits only for what is left until ``deadline``, so that an
    answer dribbled out a byte at a time still ends in time."""

    deadline = 0.0

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no whole answer in time")
        self.settimeout(left)
        return super().recv_into(buffer, nbytes, flags)


@functools.lru_cache(maxsize=None)  # noqa: UP033 (the agent keeps to Python 3.8)
def _docker_connection() -> type:
    """HTTP over a unix socket, the whole exchange within ``timeout``. Built on first use:
    http.client (and ssl with it) is the agent's largest import, and only Docker's socket needs
    it."""
    import http.client

    class DockerConnection(http.client.HTTPConnection):
        def __init__(self, path: str, timeout: float) -> None:
            super().__init__("localhost", timeout=timeout)
            self._path = path

        def connect(self) -> None:
            sock = _DeadlineSocket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.deadline = time.monotonic() + float(self.timeout)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self._path)
            except OSError:
                sock.close()
                raise
            self.sock = sock

    return DockerConnection


def docker_name(path: str, container_id: str, timeout: float = DOCKER_TIMEOUT_S) -> str | None:
    """The container's name as Docker's Engine API gives it (``Name`` of ``GET
    /containers/<id>/json``, without its leading ``/``) on the socket at ``path``; None where
    Docker knows no such container or answers without a usable name. OSError or HTTPException
    where Docker cannot be asked.

    The path has no API version: Docker then answers in its own (a pinned one is refused by
    engines older or, since Docker 29, much newer than it), and every version has ``Name``."""
    connection = _docker_connection()(path, timeout)
    try:
        connection.request("GET", f"/containers/{container_id}/json")
        response = connection.getresponse()
        body = response.read(MAX_DOCKER_ANSWER + 1)
    finally:
        connection.close()
    if response.status != 200 or len(body) > MAX_DOCKER_ANSWER:
        return None
    try:
        answer = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    name = answer.get("Name") if isinstance(answer, dict) else None
    if not isinstance(name, str):
        return None
    return clipped(name[1:] if name.startswith("/") else name) or None


class DockerNames(Asker):
    """Containers' names from Docker (`docker_name`), asked in a thread of its own (`Asker`);
    where the socket is absent nothing is asked, and where Docker refuses or cannot answer a
    container has no name."""

    def __init__(
        self,
        path: str = DOCKER_SOCKET,
        timeout: float = DOCKER_TIMEOUT_S,
        stale_after: float = ASK_AGAIN_S,
        first_wait: float = FIRST_WAIT_S,
    ) -> None:
        """``path``: Docker's socket."""
        super().__init__("docker", stale_after, first_wait, MAX_CONTAINERS, DOCKER_BATCH)
        self._path = path
        self._timeout = timeout

    def _can_ask(self) -> bool:
        return os.path.exists(self._path)

    def _answers(self, keys: list) -> dict | None:
        import http.client

        try:
            return {key: docker_name(self._path, key, self._timeout) for key in keys}
        except (OSError, http.client.HTTPException):
            return None


# --- owners: who each GPU process works for, and the host's node -----------------------------


class Owners:
    """Who each GPU process works for as the host itself says it, with nothing installed on it:
    its Slurm job (`SlurmJobs`), its Kubernetes pod (`KubePods`) and its Docker container's name
    (`DockerNames`); and the host's own Slurm node (`SlurmNode`)."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        slurm: SlurmJobs | None = None,
        pods: KubePods | None = None,
        docker: DockerNames | None = None,
        node: SlurmNode | None = None,
    ) -> None:
        """``env``: the environment Slurm's commands run in; a part given is used as it is."""
        self.slurm = slurm or SlurmJobs(env)
        self.pods = pods or KubePods()
        self.docker = docker or DockerNames()
        self.node = node or SlurmNode(env)

    def annotate(self, processes: list[dict]) -> None:
        """Add each process's ``pod`` and ``container_name`` (from its ``cgroup`` text)."""
        found = [containers_in(p.get("cgroup")) for p in processes]
        pods = self.pods.lookup({pod for pod, _ in found if pod is not None})
        names = self.docker.lookup({docker for _, docker in found if docker is not None})
        for index, process in enumerate(processes):  # no zip(strict=) in 3.8
            pod, docker = found[index]
            process["pod"] = None if pod is None else pods[pod]
            process["container_name"] = None if docker is None else names.get(docker)

    def reading(self, processes: list[dict]) -> dict[str, object]:
        """A reading's owner fields: each process's pod and container name added, and the
        reading's ``jobs`` and ``node``."""
        self.annotate(processes)
        return {"jobs": jobs_of(processes, self.slurm), "node": self.node.state()}

    def close(self) -> None:
        """Kill the Slurm calls in flight."""
        self.slurm.close()
        self.node.close()


# --- commands --------------------------------------------------------------------------------

_SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}


def send_signal(
    pid: int, name: str, expected_command: str, expected_start: float | None
) -> tuple[bool, str]:
    """Signal ``pid`` only if it is still the process that was read: the same start (a reused
    pid is left alone, see `reused_pid`) and the same command line."""
    stat = _stat_fields(pid)
    if stat is None or stat[0] == "Z":
        return False, f"pid {pid} has already exited"
    reused = reused_pid(pid, expected_start)
    if reused is not None:
        return False, reused
    actual = command_line(pid) or ""
    if actual != expected_command:
        return False, f"pid {pid} is now {actual[:200]!r}, not the GPU process: nothing sent"
    try:
        os.kill(pid, _SIGNALS[name])
    except ProcessLookupError:
        return False, f"pid {pid} has already exited"
    except PermissionError:
        return False, f"not permitted to signal pid {pid}"
    return True, f"sent {name} to pid {pid}"


class BadCommand(ValueError):
    """A console command the agent cannot act on; the message says why."""


def _whole_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(command: dict, name: str, check, meaning: str) -> object:
    value = command.get(name)
    if not check(value):
        raise BadCommand(f"{command.get('cmd')!r} needs {name} {meaning}")
    return value


def checked_interval(seconds: float) -> float:
    """``seconds`` between ticks if the agent takes it (`MIN_INTERVAL_S` ... `MAX_INTERVAL_S`),
    else ValueError; the console asks the same before it starts an agent."""
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
        raise ValueError(
            f"interval {seconds:g} s is outside {MIN_INTERVAL_S:g} ... {MAX_INTERVAL_S:g} s"
        )
    return seconds


def interval_of(command: dict) -> float:
    seconds = _field(
        command,
        "seconds",
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        "(a number)",
    )
    try:
        return checked_interval(float(seconds))
    except ValueError as error:
        raise BadCommand(str(error)) from None


def signal_of(command: dict) -> tuple[int, str, str, float | None]:
    pid = _field(command, "pid", lambda v: _whole_number(v) and v > 0, "(a process id)")
    name = _field(command, "signal", lambda v: v in _SIGNALS, "(TERM or KILL)")
    expected = _field(command, "command", lambda v: isinstance(v, str), "(its command line)")
    start = _field(
        command,
        "started",
        lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
        "(its start as read, or null)",
    )
    return pid, name, expected, start


# --- sim: cheap, plausible, slowly varying GPUs ----------------------------------------------


class SimGpus:
    """``count`` H100-80GB-like GPUs; two of every three run a load that swells and ebbs. Each
    entry has every key an nvml-mode one has (`GPU_KEYS`), with an H100's values.

    A tick is a few sines per GPU: 128 agents fit on two cores.
    """

    NAME = "NVIDIA H100 80GB HBM3"
    MEMORY_MIB = 81559.0
    POWER_LIMIT_W = 700.0
    SM_MAX_MHZ = 1980.0
    MEMORY_CLOCK_MHZ = 2619.0

    STARTED_AGO_S = 5400.0
    """How long before the agent began its first process started; each next one 10 min later."""

    def __init__(self, count: int, host: str) -> None:
        self.count = count
        tag = sum(host.encode()) & 0xFFFF
        began = time.time()
        self._static = [self._card(index, tag) for index in range(count)]
        self._processes = [
            {
                "pid": 900001 + gpu,
                "gpu": gpu,
                "user": "sim",
                "command": f"python train.py --rank {gpu}",
                "cgroup": f"0::/system.slice/docker-{tag + gpu:064x}.scope\n",
                "start_time": 1000 + gpu,
                "started": round(began - self.STARTED_AGO_S + 600.0 * gpu, 2),
                "kind": "compute",
                "slurm_job": None,
                "pod": None,
                "container_name": f"train-rank{gpu}",
            }
            for gpu in range(min(2, count))
        ]

    def _card(self, index: int, tag: int) -> dict[str, object]:
        bus = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)[index % 8] + index // 8
        return {
            "index": index,
            "name": self.NAME,
            "uuid": f"GPU-{tag:08x}-{index:04x}-4000-8000-{index * 7919:012x}",
            "pci_bus_id": "00000000:%02X:00.0" % (bus % 256),
            "serial": str(1651624100000 + tag * 64 + index),
            "vbios_version": "96.00.99.00.0D",
            "memory_total_mib": self.MEMORY_MIB,
            "slowdown_temperature_c": 87.0,
            "shutdown_temperature_c": 95.0,
            "power_limit_w": self.POWER_LIMIT_W,
            "power_limit_min_w": 200.0,
            "power_limit_max_w": self.POWER_LIMIT_W,
            "power_limit_default_w": self.POWER_LIMIT_W,
            "sm_clock_max_mhz": self.SM_MAX_MHZ,
            "sm_clock_application_mhz": self.SM_MAX_MHZ,
            "memory_clock_mhz": self.MEMORY_CLOCK_MHZ,
            "memory_clock_max_mhz": self.MEMORY_CLOCK_MHZ,
            "memory_clock_application_mhz": self.MEMORY_CLOCK_MHZ,
            "pstate": 0,
            "fan_pct": None,
            "ecc": {
                "volatile_corrected": 0,
                "volatile_uncorrected": 0,
                "aggregate_corrected": 0,
                "aggregate_uncorrected": 0,
            },
            "remap": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
            "retired_pages_pending": None,
            "recovery_action": 0,
            "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16},
            "persistence_mode": True,
            "compute_mode": 0,
            "mig_mode": False,
            "mig_instances": [],
            "lost": False,
        }

    def read(self, now: float) -> tuple[list[dict], list[dict]]:
        gpus = []
        for index, static in enumerate(self._static):
            load = 0.0 if index % 3 == 2 else 0.55 + 0.45 * math.sin(now / 90.0 + index)
            gpu = dict(static)
            gpu["utilization_pct"] = round(100.0 * load)
            gpu["memory_utilization_pct"] = round(60.0 * load)
            gpu["memory_used_mib"] = round(self.MEMORY_MIB * 0.8 * load)
            gpu["temperature_c"] = round(31.0 + 45.0 * load)
            gpu["power_w"] = round(70.0 + 610.0 * load, 2)
            gpu["sm_clock_mhz"] = 1980.0 if load > 0.05 else 345.0
            gpu["throttle_mask"] = 0x1 if load <= 0.05 else (0x4 if load > 0.95 else 0)
            gpu["pcie_tx_kib_s"] = round(2048.0 + 4.0e6 * load)
            gpu["pcie_rx_kib_s"] = round(1024.0 + 1.0e6 * load)
            gpus.append(gpu)
        processes = []
        for process in self._processes:
            gpu = gpus[process["gpu"]]
            entry = dict(process)
            entry["used_memory_mib"] = gpu["memory_used_mib"]
            entry["load"] = self._load(gpu)
            processes.append(entry)
        return gpus, processes

    @staticmethod
    def _load(gpu: dict[str, object]) -> dict[str, object]:
        """A process's load: all of its GPU's, the only process on it; no video."""
        return {
            **IDLE_LOAD,
            "sm_pct": float(gpu["utilization_pct"]),
            "memory_pct": float(gpu["memory_utilization_pct"]),
        }


# --- nvml: libnvidia-ml.so.1 through ctypes --------------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_FEATURE_ENABLED = 1  # also NVML_DEVICE_MIG_ENABLE
NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_CORRECTED = 0
NVML_MEMORY_ERROR_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_MEMORY_V2 = 40 | 2 << 24  # nvmlMemory_v2: the struct's size, version 2
NVML_TEMPERATURE_V1 = 12 | 1 << 24  # nvmlTemperature_v1: the struct's size, version 1
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
MIB = 1024 * 1024
MODE_REFRESH_S = 10.0
"""How long a GPU's ECC, MIG, compute and persistence modes and application clocks are kept
before they are read again: settings an admin may change while the driver runs, that cost
0.17 ms (the ECC and MIG modes) and 1.3 ms (the clocks) a read on an H200, and 0.2 ms of CPU
(the compute and persistence modes) on an H100."""
PCIE_SAMPLE_S = 5.0
"""How often a GPU's PCIe throughput is sampled; readings in between carry the latest sample.
NVML samples each direction for 20 ms and spends about 0.95 ms of CPU on it (one H100, driver
580, 2026-12-07): the two directions were half the CPU of a whole reading, for figures that only
the GPU screen shows, and that are a 20 ms glimpse of the second however often they are taken."""


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _MemoryV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _TemperatureV1(ctypes.Structure):
    """nvmlTemperature_v1_t, which nvmlDeviceGetTemperatureV fills."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("sensorType", ctypes.c_int),
        ("temperature", ctypes.c_int),
    ]


class _PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class _Value(ctypes.Union):
    """nvmlValue_t: a field value's number, in the member its ``valueType`` names."""

    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


VALUE_MEMBERS = tuple(name for name, _ in _Value._fields_)
"""nvmlValueType_t (NVML_VALUE_TYPE_DOUBLE = 0, _UNSIGNED_INT = 1 ...) -> the member of the
value union that holds the number: the union lists them in that order."""


class _FieldValue(ctypes.Structure):
    """nvmlFieldValue_t: one field asked for with nvmlDeviceGetFieldValues, and its answer."""

    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", _Value),
    ]


class _ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t as the _v2 and _v3 process calls fill it."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessUtilization(ctypes.Structure):
    """nvmlProcessUtilizationSample_t: one process's share of the GPU over one sampling period."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


def field_number(value: _FieldValue) -> float | None:
    """The number in an nvmlFieldValue_t, or None where NVML could not read that field."""
    if value.nvmlReturn != NVML_SUCCESS or not 0 <= value.valueType < len(VALUE_MEMBERS):
        return None
    return getattr(value.value, VALUE_MEMBERS[value.valueType])


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version number as nvidia-smi prints it: 12080 -> "12.8"."""
    return f"{version // 1000}.{version % 1000 // 10}"


PROCESS_LOAD_WINDOW_S = 1.0
"""A process's load is its newest NVML utilization sample of this last stretch of time, as
``nvidia-smi pmon`` shows the newest; a process with no sample in it used none of the GPU."""
LOAD_SAMPLE_FIELDS = (
    ("sm_pct", "smUtil"),
    ("memory_pct", "memUtil"),
    ("encoder_pct", "encUtil"),
    ("decoder_pct", "decUtil"),
)
"""A ``load`` entry's fields, and the sample fields they come from."""
IDLE_LOAD = {name: 0.0 for name, _ in LOAD_SAMPLE_FIELDS}


def load_window_start(now: float) -> int:
    """``lastSeenTimeStamp`` for a reading at ``now``: NVML's samples carry CPU time in
    microseconds, and it returns only those newer than this."""
    return int((now - PROCESS_LOAD_WINDOW_S) * 1_000_000)


def newest_loads(samples: Iterable) -> dict[int, dict[str, float]]:
    """Each pid's newest sample as a ``load`` entry."""
    newest: dict[int, object] = {}
    for sample in samples:
        known = newest.get(sample.pid)
        if known is None or sample.timeStamp > known.timeStamp:
            newest[sample.pid] = sample
    return {
        pid: {name: float(getattr(sample, field)) for name, field in LOAD_SAMPLE_FIELDS}
        for pid, sample in newest.items()
    }


def load_of(pid: int, loads: dict[int, dict[str, float]] | None) -> dict[str, float] | None:
    """A process's ``load``: its sample, idle where the GPU samples but has none of it, None
    where the GPU gives no samples (MIG mode, vGPU, older GPUs)."""
    if loads is None:
        return None
    return loads.get(pid, IDLE_LOAD)


def merge_running(compute: Iterable, graphics: Iterable) -> list[tuple[int, int | None, str]]:
    """NVML's compute and graphics process lists as (pid, used bytes, kind), one per process.

    A process in both lists is "compute+graphics" (nvidia-smi's C+G) with the larger of its
    two memory figures; a figure NVML cannot give (NVML_VALUE_NOT_AVAILABLE) is None.
    """
    found: dict[int, tuple[int | None, list[str]]] = {}
    for kind, listing in (("compute", compute), ("graphics", graphics)):
        for process in listing:
            used, kinds = found.get(process.pid, (None, []))
            figures = [
                figure
                for figure in (used, process.usedGpuMemory)
                if figure is not None and figure != NVML_VALUE_NOT_AVAILABLE
            ]
            kinds = kinds if kind in kinds else [*kinds, kind]
            found[process.pid] = (max(figures) if figures else None, kinds)
    return [(pid, used, "+".join(kinds)) for pid, (used, kinds) in found.items()]


IDENTITY = ("name", "uuid", "pci_bus_id", "serial", "vbios_version")
"""What names a GPU: read once, and kept in the entries of a GPU that is lost."""
GPU_KEYS = (
    "index",
    "lost",
    *IDENTITY,
    "utilization_pct",
    "memory_utilization_pct",
    "memory_used_mib",
    "memory_total_mib",
    "temperature_c",
    "slowdown_temperature_c",
    "shutdown_temperature_c",
    "power_w",
    "power_limit_w",
    "power_limit_min_w",
    "power_limit_max_w",
    "power_limit_default_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "sm_clock_application_mhz",
    "memory_clock_mhz",
    "memory_clock_max_mhz",
    "memory_clock_application_mhz",
    "fan_pct",
    "pcie_tx_kib_s",
    "pcie_rx_kib_s",
    "pstate",
    "throttle_mask",
    "compute_mode",
    "recovery_action",
    "ecc",
    "remap",
    "retired_pages_pending",
    "pcie",
    "persistence_mode",
    "mig_mode",
    "mig_instances",
)
"""The keys of an nvml-mode GPU entry (docs/agent-protocol.md), every one in every entry."""


class Unavailable(RuntimeError):
    """The host cannot be read the way asked (no NVML, no field list); the message says why."""


class _GpuLost(Exception):
    """The GPU under a reading answered GPU_IS_LOST."""


class Nvml:
    """The NVML library, called by name (a function this library lacks answers
    FUNCTION_NOT_FOUND), and this host's GPUs read through it.

    The object keeps each GPU's `NvmlDevice` from one reading to the next, so it is made once
    and read again and again: by the agent's tick thread, and in the console's own process by
    `gpuconsole.telemetry.nvml.NvmlSource`, under its lock. One reader at a time.
    """

    def __init__(self, library: object | None = None) -> None:
        """Load and initialise NVML; ``library`` is a loaded libnvidia-ml (or a stand-in for
        it in tests), None to load ``libnvidia-ml.so.1``."""
        try:
            self._lib = ctypes.CDLL("libnvidia-ml.so.1") if library is None else library
        except OSError as error:
            raise Unavailable(f"libnvidia-ml.so.1 cannot be loaded ({error})") from None
        self._functions: dict[str, Callable[..., int] | None] = {}
        self._devices: dict[int, NvmlDevice] = {}
        self._pool: ThreadPoolExecutor | None = None
        code = self.call("nvmlInit_v2")
        if code == NVML_ERROR_FUNCTION_NOT_FOUND:
            code = self.call("nvmlInit")
        if code != NVML_SUCCESS:
            raise Unavailable(f"nvmlInit failed with NVML error {code}")

    def call(self, name: str, *args: object) -> int:
        """NVML's answer to ``name(*args)``; each function is looked up once."""
        if name not in self._functions:
            self._functions[name] = getattr(self._lib, name, None)
        function = self._functions[name]
        return NVML_ERROR_FUNCTION_NOT_FOUND if function is None else function(*args)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self.call("nvmlShutdown")

    def text(self, name: str, *args: object) -> str | None:
        buffer = ctypes.create_string_buffer(96)
        if self.call(name, *args, buffer, ctypes.c_uint(len(buffer))) != NVML_SUCCESS:
            return None
        return buffer.value.decode("utf-8", "replace")

    def driver_version(self) -> str | None:
        return self.text("nvmlSystemGetDriverVersion")

    def cuda_version(self) -> str | None:
        version = ctypes.c_int()
        for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
            if self.call(name, ctypes.byref(version)) == NVML_SUCCESS:
                return cuda_version_text(version.value)
        return None

    def gpu_count(self) -> int | None:
        count = ctypes.c_uint()
        if self.call("nvmlDeviceGetCount_v2", ctypes.byref(count)) != NVML_SUCCESS:
            return None
        return count.value

    def read(self) -> tuple[list[dict], list[dict]]:
        """Every GPU and the processes on them; `Unavailable` when not even the count reads.

        Every GPU's PCIe throughput, where its sample is `PCIE_SAMPLE_S` old, is asked for
        first, on a pool of two threads per GPU (`NvmlDevice.ask_traffic` says why), and the GPUs
        are read while NVML samples it.
        """
        count = self.gpu_count()
        if count is None:
            raise Unavailable("nvmlDeviceGetCount failed")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max(1, 2 * count), thread_name_prefix="nvml-pcie")
        devices = []
        for index in range(count):
            if index not in self._devices:
                self._devices[index] = NvmlDevice(self, index)
            devices.append(self._devices[index])
        traffic = [device.ask_traffic(self._pool) for device in devices]
        gpus, processes = [], []
        for position, device in enumerate(devices):  # no zip(strict=) in 3.8
            gpu, found = device.read(traffic[position])
            gpus.append(gpu)
            processes.extend(found)
        return gpus, processes


class NvmlDevice:
    """One GPU's NVML calls, and what its readings carry from one to the next.

    Every field has its own call: a call NVML refuses gives None for its field alone.
    GPU_IS_LOST, from any call, makes the GPU's entry a lost one, and so does UNKNOWN_ERROR
    from every call of a reading; a lost GPU keeps the identity read before. What cannot change
    while the driver runs (identity, maximum clocks, temperature thresholds, power limit range
    and default, the most the PCIe link can do: the maximum clocks alone cost 1.8 ms each on an
    H200) is read once. A call on the GPU's handle answered NOT_SUPPORTED is remembered and not
    made again (fan speed costs 0.2 ms to refuse on an H200), until the GPU's MIG mode changes:
    utilization, for one, is not supported in MIG mode only.
    """

    def __init__(self, nvml: Nvml, index: int) -> None:
        self._nvml = nvml
        self.index = index
        self._handle: ctypes.c_void_p | None = None
        self._static: dict[str, object] | None = None
        self._modes: dict[str, object] | None = None
        self._modes_read_at = 0.0
        self._refused: set[tuple] = set()
        """The calls answered NOT_SUPPORTED: name and whole-number arguments."""
        self._made = 0
        self._unknown = 0
        """This reading's calls, and those of them answered UNKNOWN_ERROR."""
        self._traffic: tuple[int | None, int | None] = (None, None)
        self._traffic_at: float | None = None
        """When the carried PCIe sample was asked for (`time.monotonic`); None: never, or the
        GPU was lost since."""

    def handle(self) -> tuple[ctypes.c_void_p | None, bool]:
        """The GPU's handle, asked for until NVML gives it, then kept; with None, whether
        the GPU is lost."""
        if self._handle is None:
            handle = ctypes.c_void_p()
            code = self._nvml.call(
                "nvmlDeviceGetHandleByIndex_v2", self.index, ctypes.byref(handle)
            )
            if code != NVML_SUCCESS:
                return None, code in (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN)
            self._handle = handle
        return self._handle, False

    def ask_traffic(self, pool: Executor) -> list[Future]:
        """The GPU's PCIe throughput, TX then RX in KiB/s, asked for on ``pool``'s threads;
        nothing for a GPU without a handle (yet), nor within `PCIE_SAMPLE_S` of the sample the
        GPU carries (`traffic`).

        NVML samples each direction for 20 ms and returns only then: 21 ms a call on an H200,
        42 ms a GPU read in turn. Calls on separate threads overlap (8 at once took 23 ms
        there), so every GPU's two are asked for before the GPUs are read, and a reading takes
        about 21 ms longer whatever the number of GPUs. NVML's byte counters
        (``NVML_FI_DEV_PCIE_COUNT_TX_BYTES`` and ``_RX_BYTES``) cost no wait, but on the H200
        they went backwards between two reads 1 s apart while the GPU copied 55 GB/s: they wrap
        too often to give a rate between readings.
        """
        handle, _ = self.handle()
        if handle is None:
            return []
        now = time.monotonic()
        if self._traffic_at is not None and now - self._traffic_at < PCIE_SAMPLE_S:
            return []
        self._traffic_at = now
        return [
            pool.submit(self._throughput, direction)
            for direction in (NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES)
        ]

    def traffic(self, asked: list[Future]) -> tuple[int | None, int | None]:
        """(TX, RX) KiB/s: the sample `ask_traffic` asked for, else the one carried (None, None
        before the first); `_GpuLost` where the GPU answered so."""
        if asked:
            tx, rx = asked
            self._traffic = (tx.result(), rx.result())
        return self._traffic

    def _throughput(self, direction: int) -> int | None:
        """One direction's throughput, on a pool thread: not counted with the reading's calls
        (which one thread counts); `_GpuLost` reaches the reading through the future."""
        value = ctypes.c_uint()
        code = self._ask(
            self._handle, "nvmlDeviceGetPcieThroughput", direction, ctypes.byref(value)
        )
        if code == NVML_ERROR_GPU_IS_LOST:
            raise _GpuLost
        return value.value if code == NVML_SUCCESS else None

    def read(self, traffic: list[Future]) -> tuple[dict[str, object], list[dict[str, object]]]:
        """The GPU's entry and the processes on it; ``traffic`` is its throughput as
        `ask_traffic` asked for it."""
        handle, lost = self.handle()
        if handle is None:
            return self._unreadable(lost), []
        self._made = self._unknown = 0
        try:
            static = self._static or self._read_static()
            if not self._unknown:
                self._static = static
            modes = self._read_modes()
            migs = self._mig_devices() if modes["mig_mode"] else []
            gpu = self._state(static, modes, migs, traffic)
            if migs:
                processes = [p for gi, _, mig in migs for p in self._processes(mig, gi)]
            else:
                processes = self._processes(handle, None)
        except _GpuLost:
            return self._unreadable(True), []
        if self._made and self._unknown == self._made:
            return self._unreadable(True), []
        return gpu, processes

    def _unreadable(self, lost: bool) -> dict[str, object]:
        """The entry of a GPU that gives no reading: its identity, where it was read before.
        Its PCIe sample is forgotten: a GPU back from lost is sampled anew."""
        self._traffic, self._traffic_at = (None, None), None
        entry: dict[str, object] = dict.fromkeys(GPU_KEYS)
        entry.update(index=self.index, lost=lost, mig_instances=[])
        if self._static is not None:
            entry.update((key, self._static[key]) for key in IDENTITY)
        return entry

    # --- calls ---------------------------------------------------------------------------

    def _ask(self, on: ctypes.c_void_p | None, name: str, *args: object) -> int | None:
        """NVML's answer to ``name(on, *args)``, or None for a call on the GPU's handle that
        NVML refused before (not made again). A call is known by its name and its
        whole-number arguments (its out-parameters left out); a MIG device's are not kept."""
        key = None
        if on is self._handle:
            key = (name, *(arg for arg in args if isinstance(arg, int)))
            if key in self._refused:
                return None
        code = self._nvml.call(name, on, *args)
        if code == NVML_ERROR_NOT_SUPPORTED and key is not None:
            self._refused.add(key)
        return code

    def _call(self, name: str, *args: object, on: ctypes.c_void_p | None = None) -> int:
        """One call of this reading, on the GPU or on ``on`` (one of its MIG devices)."""
        code = self._ask(self._handle if on is None else on, name, *args)
        if code is None:
            return NVML_ERROR_NOT_SUPPORTED
        if code == NVML_ERROR_GPU_IS_LOST:
            raise _GpuLost
        if code != NVML_ERROR_FUNCTION_NOT_FOUND:  # no call was made
            self._made += 1
            if code == NVML_ERROR_UNKNOWN:
                self._unknown += 1
        return code

    def _ok(self, name: str, *args: object, on: ctypes.c_void_p | None = None) -> bool:
        return self._call(name, *args, on=on) == NVML_SUCCESS

    def _value(
        self, ctype: type, name: str, *args: object, on: ctypes.c_void_p | None = None
    ) -> int | None:
        """A call that answers one number of C type ``ctype``."""
        value = ctype()
        return value.value if self._ok(name, *args, ctypes.byref(value), on=on) else None

    def _uint(self, name: str, *args: object, on: ctypes.c_void_p | None = None) -> int | None:
        return self._value(ctypes.c_uint, name, *args, on=on)

    def _uints(self, name: str, count: int) -> list[int] | None:
        """A call that answers ``count`` unsigned numbers."""
        values = [ctypes.c_uint() for _ in range(count)]
        if not self._ok(name, *[ctypes.byref(value) for value in values]):
            return None
        return [value.value for value in values]

    def _watts(self, name: str) -> float | None:
        milliwatts = self._uint(name)
        return None if milliwatts is None else milliwatts / 1000.0

    def _text(self, name: str, on: ctypes.c_void_p | None = None) -> str | None:
        buffer = ctypes.create_string_buffer(96)
        if not self._ok(name, buffer, ctypes.c_uint(len(buffer)), on=on):
            return None
        return buffer.value.decode("utf-8", "replace")

    def _filled(
        self,
        struct: type,
        name: str,
        arguments: Callable[[object, object], tuple],
        on: ctypes.c_void_p,
    ) -> tuple[int, list]:
        """A call that fills an array, its arguments ``arguments(count, array)``, asked again
        while the list outgrows the array: (NVML's last answer, the entries filled)."""
        count = ctypes.c_uint(0)
        array = None
        for _ in range(4):
            code = self._call(name, *arguments(ctypes.byref(count), array), on=on)
            if code != NVML_ERROR_INSUFFICIENT_SIZE:
                break
            size = count.value + 8
            array = (struct * size)()
            count = ctypes.c_uint(size)
        filled = list(array)[: count.value] if code == NVML_SUCCESS and array is not None else []
        return code, filled

    # --- what is read once, and every MODE_REFRESH_S ---------------------------------------

    def _read_static(self) -> dict[str, object]:
        limits = self._uints("nvmlDeviceGetPowerManagementLimitConstraints", 2) or [None, None]
        low, high = (None if limit is None else limit / 1000.0 for limit in limits)
        return {
            "name": self._text("nvmlDeviceGetName"),
            "uuid": self._text("nvmlDeviceGetUUID"),
            "pci_bus_id": self._pci_bus_id(),
            "serial": self._text("nvmlDeviceGetSerial"),
            "vbios_version": self._text("nvmlDeviceGetVbiosVersion"),
            "sm_clock_max_mhz": self._uint("nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM),
            "memory_clock_max_mhz": self._uint("nvmlDeviceGetMaxClockInfo", NVML_CLOCK_MEM),
            "slowdown_temperature_c": self._uint(
                "nvmlDeviceGetTemperatureThreshold", NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            "shutdown_temperature_c": self._uint(
                "nvmlDeviceGetTemperatureThreshold", NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
            ),
            "power_limit_min_w": low,
            "power_limit_max_w": high,
            "power_limit_default_w": self._watts("nvmlDeviceGetPowerManagementDefaultLimit"),
            "max_gen": self._uint("nvmlDeviceGetMaxPcieLinkGeneration"),
            "max_width": self._uint("nvmlDeviceGetMaxPcieLinkWidth"),
        }

    def _pci_bus_id(self) -> str | None:
        info = _PciInfo()
        if not self._ok("nvmlDeviceGetPciInfo_v3", ctypes.byref(info)):
            return None
        return info.busId.decode("ascii", "replace")

    def _read_modes(self) -> dict[str, object]:
        """The ECC and MIG modes and the application clocks, read again once `MODE_REFRESH_S`
        old; a change of MIG mode forgets the calls refused."""
        now = time.monotonic()
        if self._modes is not None and now - self._modes_read_at < MODE_REFRESH_S:
            return self._modes
        ecc = self._uints("nvmlDeviceGetEccMode", 2)  # current, pending
        mig = self._uints("nvmlDeviceGetMigMode", 2)
        modes = {
            "ecc": None if ecc is None else ecc[0] == NVML_FEATURE_ENABLED,
            "mig_mode": None if mig is None else mig[0] == NVML_FEATURE_ENABLED,
            "sm_clock_application_mhz": self._uint("nvmlDeviceGetApplicationsClock", NVML_CLOCK_SM),
            "memory_clock_application_mhz": self._uint(
                "nvmlDeviceGetApplicationsClock", NVML_CLOCK_MEM
            ),
            "compute_mode": self._uint("nvmlDeviceGetComputeMode"),
            "persistence": self._uint("nvmlDeviceGetPersistenceMode"),
        }
        if self._modes is not None and self._modes["mig_mode"] != modes["mig_mode"]:
            self._refused.clear()
        self._modes, self._modes_read_at = modes, now
        return modes

    # --- every reading ---------------------------------------------------------------------

    def _state(
        self,
        static: dict[str, object],
        modes: dict[str, object],
        migs: list[tuple[int, int | None, ctypes.c_void_p]],
        traffic: list[Future],
    ) -> dict[str, object]:
        utilization = _Utilization()
        utilized = self._ok("nvmlDeviceGetUtilizationRates", ctypes.byref(utilization))
        used, total = self._memory()
        remap = self._uints("nvmlDeviceGetRemappedRows", 4)
        pending = self._uint("nvmlDeviceGetRetiredPagesPendingStatus")
        persistence = modes["persistence"]
        gpu = {
            "index": self.index,
            "lost": False,
            **{key: static[key] for key in IDENTITY},
            "utilization_pct": utilization.gpu if utilized else None,
            "memory_utilization_pct": utilization.memory if utilized else None,
            "memory_used_mib": used,
            "memory_total_mib": total,
            "temperature_c": self._temperature(),
            "slowdown_temperature_c": static["slowdown_temperature_c"],
            "shutdown_temperature_c": static["shutdown_temperature_c"],
            "power_w": self._watts("nvmlDeviceGetPowerUsage"),
            "power_limit_w": self._watts("nvmlDeviceGetEnforcedPowerLimit"),
            "power_limit_min_w": static["power_limit_min_w"],
            "power_limit_max_w": static["power_limit_max_w"],
            "power_limit_default_w": static["power_limit_default_w"],
            "sm_clock_mhz": self._uint("nvmlDeviceGetClockInfo", NVML_CLOCK_SM),
            "sm_clock_max_mhz": static["sm_clock_max_mhz"],
            "sm_clock_application_mhz": modes["sm_clock_application_mhz"],
            "memory_clock_mhz": self._uint("nvmlDeviceGetClockInfo", NVML_CLOCK_MEM),
            "memory_clock_max_mhz": static["memory_clock_max_mhz"],
            "memory_clock_application_mhz": modes["memory_clock_application_mhz"],
            "fan_pct": self._uint("nvmlDeviceGetFanSpeed"),
            "pstate": self._uint("nvmlDeviceGetPerformanceState"),
            "throttle_mask": self._throttle_mask(),
            "compute_mode": modes["compute_mode"],
            "recovery_action": self._recovery_action(),
            "ecc": self._ecc() if modes["ecc"] else None,
            "remap": {
                "correctable": None if remap is None else remap[0],
                "uncorrectable": None if remap is None else remap[1],
                "pending": None if remap is None else bool(remap[2]),
                "failure": None if remap is None else bool(remap[3]),
            },
            "retired_pages_pending": None if pending is None else pending == NVML_FEATURE_ENABLED,
            "pcie": {
                "gen": self._uint("nvmlDeviceGetCurrPcieLinkGeneration"),
                "width": self._uint("nvmlDeviceGetCurrPcieLinkWidth"),
                "max_gen": static["max_gen"],
                "max_width": static["max_width"],
            },
            "persistence_mode": (
                None if persistence is None else persistence == NVML_FEATURE_ENABLED
            ),
            "mig_mode": modes["mig_mode"],
            "mig_instances": [self._mig_instance(*mig) for mig in migs],
        }
        # Last: NVML sampled it while the rest was read.
        gpu["pcie_tx_kib_s"], gpu["pcie_rx_kib_s"] = self.traffic(traffic)
        return gpu

    def _memory(self, on: ctypes.c_void_p | None = None) -> tuple[float | None, float | None]:
        """(used, total) in MiB; v2 first, whose 'used' leaves out the driver's reservation as
        nvidia-smi does."""
        memory = _MemoryV2(version=NVML_MEMORY_V2)
        if not self._ok("nvmlDeviceGetMemoryInfo_v2", ctypes.byref(memory), on=on):
            memory = _Memory()
            if not self._ok("nvmlDeviceGetMemoryInfo", ctypes.byref(memory), on=on):
                return None, None
        return memory.used / MIB, memory.total / MIB

    def _temperature(self) -> int | None:
        """The newer call first (the older is deprecated), the older where a driver lacks or
        refuses it."""
        reading = _TemperatureV1(version=NVML_TEMPERATURE_V1, sensorType=NVML_TEMPERATURE_GPU)
        if self._ok("nvmlDeviceGetTemperatureV", ctypes.byref(reading)):
            return reading.temperature
        return self._uint("nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)

    def _throttle_mask(self) -> int | None:
        mask = self._value(ctypes.c_ulonglong, "nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None:
            mask = self._value(ctypes.c_ulonglong, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return mask

    def _recovery_action(self) -> int | None:
        """NVML_GPU_RECOVERY_ACTION_*, which only a field value gives."""
        values = (_FieldValue * 1)()
        values[0].fieldId = NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        if not self._ok("nvmlDeviceGetFieldValues", 1, values):
            return None
        number = field_number(values[0])
        return None if number is None else int(number)

    def _ecc(self) -> dict[str, int | None]:
        def total(error: int, counter: int) -> int | None:
            return self._value(ctypes.c_ulonglong, "nvmlDeviceGetTotalEccErrors", error, counter)

        corrected, uncorrected = NVML_MEMORY_ERROR_CORRECTED, NVML_MEMORY_ERROR_UNCORRECTED
        return {
            "volatile_corrected": total(corrected, NVML_VOLATILE_ECC),
            "volatile_uncorrected": total(uncorrected, NVML_VOLATILE_ECC),
            "aggregate_corrected": total(corrected, NVML_AGGREGATE_ECC),
            "aggregate_uncorrected": total(uncorrected, NVML_AGGREGATE_ECC),
        }

    def _mig_devices(self) -> list[tuple[int, int | None, ctypes.c_void_p]]:
        """The GPU's MIG devices as (GPU instance id, compute instance id, handle): one per
        compute instance."""
        devices = []
        for slot in range(self._uint("nvmlDeviceGetMaxMigDeviceCount") or 0):
            mig = ctypes.c_void_p()
            if not self._ok("nvmlDeviceGetMigDeviceHandleByIndex", slot, ctypes.byref(mig)):
                continue
            gpu_instance = self._uint("nvmlDeviceGetGpuInstanceId", on=mig)
            if gpu_instance is not None:
                compute_instance = self._uint("nvmlDeviceGetComputeInstanceId", on=mig)
                devices.append((gpu_instance, compute_instance, mig))
        return devices

    def _mig_instance(
        self, gpu_instance: int, compute_instance: int | None, mig: ctypes.c_void_p
    ) -> dict[str, object]:
        used, total = self._memory(on=mig)
        return {
            "gpu_instance_id": gpu_instance,
            "compute_instance_id": compute_instance,
            "name": self._text("nvmlDeviceGetName", on=mig),
            "memory_total_mib": total,
            "memory_used_mib": used,
            "uuid": self._text("nvmlDeviceGetUUID", on=mig),
        }

    def _running(self, kind: str, on: ctypes.c_void_p) -> list[_ProcessInfo]:
        """The _v3 call (or _v2, same struct)."""
        for version in ("_v3", "_v2"):
            code, infos = self._filled(
                _ProcessInfo,
                f"nvmlDeviceGet{kind}RunningProcesses{version}",
                lambda count, array: (count, array),
                on,
            )
            if code != NVML_ERROR_FUNCTION_NOT_FOUND:
                return infos
        return []

    def _loads(self, on: ctypes.c_void_p) -> dict[int, dict[str, float]] | None:
        """Each process's newest utilization sample (`PROCESS_LOAD_WINDOW_S`); None where the
        GPU gives none."""
        since = ctypes.c_ulonglong(load_window_start(time.time()))
        code, samples = self._filled(
            _ProcessUtilization,
            "nvmlDeviceGetProcessUtilization",
            lambda count, array: (array, count, since),
            on,
        )
        if code == NVML_ERROR_NOT_FOUND:  # no process used the GPU in the window
            return {}
        return newest_loads(samples) if code == NVML_SUCCESS else None

    def _processes(self, on: ctypes.c_void_p, mig_instance: int | None) -> list[dict[str, object]]:
        """The compute and graphics processes of the GPU, or of one of its MIG devices (then
        ``mig_instance`` is its GPU instance id), with what /proc says of each."""
        running = merge_running(self._running("Compute", on), self._running("Graphics", on))
        loads = self._loads(on) if running else None
        processes = []
        for pid, used, kind in running:
            process: dict[str, object] = {
                "pid": pid,
                "gpu": self.index,
                "used_memory_mib": None if used is None else used / MIB,
                "kind": kind,
                "mig_instance": mig_instance,
            }
            process.update(process_details(pid), load=load_of(pid, loads))
            processes.append(process)
        return processes


# --- smi: nvidia-smi in a worker thread, each call with a timeout ----------------------------


class SmiFailure(RuntimeError):
    """An nvidia-smi call that gave no output to use; the message is one line."""


class SmiRunner:
    """Runs nvidia-smi jobs one at a time in a worker thread.

    A job is a list of (label, argv), run in order until one fails; its outcome arrives on the
    event queue as ``("smi", tag, {label: stdout}, error or None)``. Each call is killed past its
    timeout; a child stuck in the driver (a GPU off the bus) does not die even then, and the
    worker waits for it as long as it takes, while the tick loop goes on and starts no other
    call.
    """

    def __init__(self, timeout: float, events: queue.Queue) -> None:
        self._timeout = timeout
        self._events = events
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._closing = False
        self._child: subprocess.Popen | None = None
        self._label: str | None = None
        self._since = 0.0
        self._busy = False
        self._idle = threading.Event()
        self._idle.set()
        threading.Thread(target=self._work, name="nvidia-smi", daemon=True).start()

    @property
    def busy(self) -> bool:
        return self._busy

    def submit(self, tag: object, commands: list[tuple[str, list[str]]]) -> None:
        self._busy = True
        self._idle.clear()
        self._jobs.put((tag, commands))

    def waiting_message(self) -> str:
        """Why this tick has no reading: which call holds the worker, and for how long."""
        with self._lock:
            label, since = self._label or "nvidia-smi", self._since
        waited = time.monotonic() - since
        if waited <= self._timeout:
            return f"{label} has not answered for {waited:.1f} s: no reading this tick"
        return (
            f"{label} is stuck: killed after {self._timeout:g} s, still not gone after "
            f"{waited:.1f} s (a GPU that fell off the bus hangs it in the driver): "
            "no other call until it ends"
        )

    def close(self) -> None:
        """Start no more calls; kill the one running and give it a moment to go."""
        with self._lock:
            self._closing = True
            child = self._child
        if child is not None:
            with contextlib.suppress(OSError):
                child.kill()
        self._idle.wait(_EXIT_WAIT_S)

    def _work(self) -> None:
        while True:
            tag, commands = self._jobs.get()
            outputs, error = {}, None
            try:
                for label, argv in commands:
                    outputs[label] = self._run(label, argv)
            except SmiFailure as failure:
                error = str(failure)
            self._busy = False
            self._idle.set()
            self._events.put(("smi", tag, outputs, error))

    def _run(self, label: str, argv: list[str]) -> str:
        with self._lock:
            if self._closing:
                raise SmiFailure("the agent is leaving")
            self._label, self._since = label, time.monotonic()
            try:
                child = spawn(argv)
            except OSError as error:
                raise SmiFailure(f"cannot run {label} ({error.strerror})") from None
            self._child = child
        try:
            output = reap(child, self._timeout)
        finally:
            with self._lock:
                self._child = None
        if output is None:
            raise SmiFailure(f"{label} gave no answer within {self._timeout:g} s and was killed")
        stdout, stderr = output
        if child.returncode != 0:
            detail = _first_line(stderr) or _first_line(stdout)
            raise SmiFailure(
                f"{label} exited with {child.returncode}" + (f": {detail}" if detail else "")
            )
        return stdout.decode("utf-8", "replace")


def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return clipped(line.strip(), 200)
    return ""


_SUMMARY = ("nvidia-smi", ["nvidia-smi"])
_TOPOLOGY = ("nvidia-smi topo -m", ["nvidia-smi", "topo", "-m"])
_GPU_QUERY = "nvidia-smi --query-gpu"
_APPS_QUERY = "nvidia-smi --query-compute-apps"
_CSV_FORMAT = "--format=csv,noheader,nounits"
_DRIVER = re.compile(r"Driver Version:\s*([0-9][\w.-]*)")
_CUDA = re.compile(r"CUDA Version:\s*([0-9][\w.-]*)")


def _search(pattern: re.Pattern, text: str) -> str | None:
    match = pattern.search(text)
    return match.group(1) if match else None


def pids_in(apps_csv: str, fields: list[str]) -> list[int]:
    """The pids of ``--query-compute-apps`` rows, in order, each once."""
    if "pid" not in fields:
        return []
    column = fields.index("pid")
    pids: list[int] = []
    for row in csv.reader(apps_csv.splitlines(), skipinitialspace=True):
        if len(row) == len(fields) and row[column].strip().isdigit():
            pid = int(row[column])
            if pid not in pids:
                pids.append(pid)
    return pids


# --- the agent -------------------------------------------------------------------------------


class Agent:
    """The tick loop: one reading (or one error) per tick, paced on the monotonic clock."""

    def __init__(
        self, options: argparse.Namespace, events: queue.Queue, output: LineWriter
    ) -> None:
        self._options = options
        self._events = events
        self._out = output
        self._interval = options.interval
        self._seq = 0
        self._last_tick = time.monotonic()
        self._next_tick = self._last_tick
        self._greeting_until: float | None = None
        self._hello: dict[str, object] = {}
        self._sim: SimGpus | None = None
        self._nvml: Nvml | None = None
        self._runner: SmiRunner | None = None
        self._owners: Owners | None = None
        self.mode = self._choose_mode(options)

    def _choose_mode(self, options: argparse.Namespace) -> str:
        if options.mode == "sim":
            self._sim = SimGpus(options.gpus, socket.gethostname())
            return "sim"
        self._owners = Owners()
        self._runner = SmiRunner(options.timeout, self._events)
        if options.mode in ("auto", "nvml"):
            try:
                self._nvml = Nvml()
                return "nvml"
            except Unavailable:
                if options.mode == "nvml":
                    raise
        if not options.gpu_fields or not options.apps_fields:
            raise Unavailable("smi mode needs --gpu-fields and --apps-fields")
        return "smi"

    # --- greeting --------------------------------------------------------------------------

    def greet(self) -> None:
        """Send the hello now (sim), or once nvidia-smi has told the driver and topology."""
        self._hello = {
            "agent_pid": os.getpid(),
            "hostname": socket.gethostname(),
            "mode": self.mode,
            "python": sys.version.split()[0],
            "driver": None,
            "cuda": None,
            "topology": None,
        }
        if self._runner is None:
            self._send_hello()
            return
        commands = [_TOPOLOGY]
        if self._nvml is not None:
            self._hello["driver"] = self._nvml.driver_version()
            self._hello["cuda"] = self._nvml.cuda_version()
        else:
            commands.insert(0, _SUMMARY)  # its header names the driver and CUDA versions
        self._runner.submit("hello", commands)
        self._greeting_until = time.monotonic() + self._options.timeout + 0.25

    def _hello_answered(self, outputs: dict[str, str]) -> None:
        summary = outputs.get(_SUMMARY[0])
        if summary is not None:
            self._hello["driver"] = _search(_DRIVER, summary)
            self._hello["cuda"] = _search(_CUDA, summary)
        self._hello["topology"] = outputs.get(_TOPOLOGY[0])
        self._send_hello()

    def _send_hello(self) -> None:
        self._greeting_until = None
        self._out.send("hello", **self._hello)
        self._last_tick = self._next_tick = time.monotonic()

    # --- the loop --------------------------------------------------------------------------

    def run(self) -> None:
        """Until stdin ends or a ``stop`` comes."""
        self.greet()
        while True:
            wake = self._next_tick if self._greeting_until is None else self._greeting_until
            try:
                event = self._events.get(timeout=max(0.0, wake - time.monotonic()))
            except queue.Empty:
                if self._greeting_until is not None:
                    self._send_hello()  # without what nvidia-smi did not say in time
                else:
                    self._tick()
                continue
            if event[0] == "eof":
                return
            if event[0] == "line" and self._command(event[1]) == "stop":
                return
            if event[0] == "smi":
                self._smi_done(*event[1:])

    def close(self) -> None:
        if self._owners is not None:
            self._owners.close()
        if self._runner is not None:
            self._runner.close()
        if self._nvml is not None:
            self._nvml.shutdown()

    def _tick(self) -> None:
        now = time.monotonic()
        self._last_tick = self._next_tick
        self._next_tick += self._interval
        if self._next_tick <= now:  # fell behind (a stopped process): skip, do not burst
            self._next_tick = now + self._interval
        self._seq += 1
        if self._sim is not None:
            now = time.time()
            gpus, processes = self._sim.read(now)
            self._send_reading(now, gpus=gpus, processes=processes)
        elif self._nvml is not None:
            self._nvml_tick()
        else:
            self._smi_tick()

    def _send_reading(self, stamp: float, gpus: list[dict], processes: list[dict]) -> None:
        self._out.send(
            "reading",
            seq=self._seq,
            time=stamp,
            gpus=gpus,
            processes=processes,
            **self._owned(processes),
        )

    def _owned(self, processes: list[dict]) -> dict[str, object]:
        """The reading's ``jobs`` and ``node``, each process's pod and container name added; in
        sim mode its processes say it all, and the host is no simulated rack's node."""
        if self._owners is None:
            return {"jobs": [], "node": None}
        return self._owners.reading(processes)

    def _error(self, message: str) -> None:
        self._out.send("error", time=time.time(), message=clipped(" ".join(message.split())))

    def _nvml_tick(self) -> None:
        try:
            gpus, processes = self._nvml.read()
        except Unavailable as error:
            self._error(f"NVML: {error}")
            return
        self._send_reading(time.time(), gpus=gpus, processes=processes)

    def _smi_tick(self) -> None:
        if self._runner.busy:
            self._error(self._runner.waiting_message())
            return
        gpu_fields, apps_fields = self._options.gpu_fields, self._options.apps_fields
        gpu_query = ["nvidia-smi", "--query-gpu=" + ",".join(gpu_fields), _CSV_FORMAT]
        apps_query = ["nvidia-smi", "--query-compute-apps=" + ",".join(apps_fields), _CSV_FORMAT]
        self._runner.submit(
            ("reading", self._seq, time.time()),
            [(_GPU_QUERY, gpu_query), (_APPS_QUERY, apps_query)],
        )

    def _smi_done(self, tag: object, outputs: dict[str, str], error: str | None) -> None:
        if tag == "hello":
            if self._greeting_until is not None:
                self._hello_answered(outputs)
            return
        if error is not None:
            self._error(error)
            return
        _, seq, stamp = tag
        apps_fields = self._options.apps_fields
        processes = []
        for pid in pids_in(outputs[_APPS_QUERY], apps_fields):
            details = process_details(pid)
            details["pid"] = pid
            processes.append(details)
        self._out.send(
            "reading",
            seq=seq,
            time=stamp,
            gpu_csv=outputs[_GPU_QUERY],
            gpu_fields=self._options.gpu_fields,
            apps_csv=outputs[_APPS_QUERY],
            apps_fields=apps_fields,
            processes=processes,
            **self._owned(processes),
        )

    # --- commands --------------------------------------------------------------------------

    def _command(self, line: bytes) -> str | None:
        """Act on one stdin line; "stop" when the agent should leave."""
        try:
            command = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None
        if not isinstance(command, dict):
            return None
        request = command.get("id")
        if not _whole_number(request):
            request = None
        try:
            if command.get("v", PROTOCOL_VERSION) != PROTOCOL_VERSION:
                raise BadCommand(f"protocol version {command['v']!r}, not {PROTOCOL_VERSION}")
            name = command.get("cmd")
            if name == "signal" and request is None:
                return None  # a signal is always answered: without an id it is malformed
            if name == "stop":
                return "stop"
            if name == "interval":
                self._set_interval(interval_of(command))
                ok, message = True, f"interval set to {self._interval:g} s"
            elif name == "signal":
                ok, message = send_signal(*signal_of(command))
            else:
                raise BadCommand(f"unknown command {name!r}")
        except BadCommand as error:
            ok, message = False, str(error)
        if request is not None:
            self._out.send("reply", id=request, ok=ok, message=clipped(message))
        return None

    def _set_interval(self, seconds: float) -> None:
        self._interval = seconds
        if self._greeting_until is None:
            self._next_tick = max(self._last_tick + seconds, time.monotonic())


def read_commands(stdin, events: queue.Queue) -> None:
    """Put each stdin line on the queue, then ``("eof",)``; an overlong line is skipped."""
    try:
        while True:
            line = stdin.readline(MAX_COMMAND_LINE)
            if not line:
                break
            if not line.endswith(b"\n") and len(line) == MAX_COMMAND_LINE:
                while line and not line.endswith(b"\n"):
                    line = stdin.readline(MAX_COMMAND_LINE)
                continue
            events.put(("line", line))
    except (OSError, ValueError):
        pass
    events.put(("eof",))


def _interval(text: str) -> float:
    value = float(text)
    if not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(
            f"{text} is outside {MIN_INTERVAL_S:g} ... {MAX_INTERVAL_S:g} s"
        )
    return value


def _field_list(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def parse_options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=MARKER, description="gpuconsole's telemetry agent")
    parser.add_argument("--interval", type=_interval, default=1.0, help="seconds per tick")
    parser.add_argument("--mode", choices=MODES, default="auto")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (sim mode)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per nvidia-smi call")
    parser.add_argument("--gpu-fields", type=_field_list, default=[], help="--query-gpu fields")
    parser.add_argument("--apps-fields", type=_field_list, default=[])
    options = parser.parse_args(argv)
    if not 1 <= options.gpus <= 1024:
        parser.error("--gpus must be between 1 and 1024")
    if not 0 < options.timeout <= 600:
        parser.error("--timeout must be between 0 and 600 s")
    return options


def main(argv: list[str]) -> int:
    if argv and argv[0] == MARKER:
        argv = argv[1:]
    options = parse_options(argv)
    events: queue.Queue = queue.Queue()
    try:
        agent = Agent(options, events, LineWriter(sys.stdout.fileno()))
    except Unavailable as error:
        sys.stderr.write(f"{MARKER}: {error}\n")
        return 1
    reader = threading.Thread(
        target=read_commands, args=(sys.stdin.buffer, events), name="stdin", daemon=True
    )
    reader.start()
    try:
        agent.run()
    except OSError:  # stdout is gone: the console left
        pass
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Not sys.exit: the stdin thread may be blocked in a read that finalization would wait for.
    sys.stderr.flush()
    os._exit(code)
