"""No process outlives the test session that started it: the helpers that end a test's
processes, and the session-wide check (a pytest plugin; tests/conftest.py loads it).

A process is the tests' when, started after the session began, it

- descends from the pytest process;
- carries this session's mark, ``GPUCONSOLE_TEST_RUN``, in its environment (set in
  ``os.environ`` at the start, so every child inherits it; a nested pytest run adds its own mark
  after its parent's, so the parent's check still knows the grandchildren); or
- refers to a directory of this session (the base temporary directory, and each directory
  handed to `watch`, such as a test Slurm cluster's) in its command line, working directory or
  environment. ``slurmstepd`` needs this: slurmd starts it with an empty environment, as a
  child of a daemon that has left the pytest process's tree, in slurmd's working directory.

At the session's end, what is still running after a few seconds is listed (pid, command line,
the test after which it was first seen), ended, and counted as an error: the run exits 1. A
run that failed or was interrupted keeps its own exit status, and the check never makes it 5.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

MARKER = "GPUCONSOLE_TEST_RUN"
"""The environment variable that marks every process a test session starts."""

GRACE_S = 5.0
"""How long the session check lets processes finish exiting before it counts them."""

_WATCHED: set[str] = set()


def watch(directory: Path | str) -> None:
    """Count every process that refers to ``directory`` (in its command line, working directory
    or environment) as the tests', whoever started it: for daemons' children that neither carry
    the mark nor descend from pytest."""
    _WATCHED.add(str(directory))


def _pattern(directories: Iterable[str]) -> re.Pattern[str] | None:
    paths = sorted({d.rstrip("/") for d in directories if d and d != "/"})
    if not paths:
        return None
    # the path itself or below it: not /tmp/x-abc when the path is /tmp/x-ab
    return re.compile("(?:" + "|".join(map(re.escape, paths)) + r")(?![^/:\s])")


def _refers_to(process: psutil.Process, pattern: re.Pattern[str]) -> bool:
    texts: list[str] = []
    for read in (process.cmdline, process.cwd):
        try:
            value = read()
        except psutil.Error:
            continue
        texts.extend(value if isinstance(value, list) else [value])
    with contextlib.suppress(psutil.Error):
        texts.extend(process.environ().values())
    return any(pattern.search(text) for text in texts)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _spared() -> set[int]:
    """This process and its ancestors, which a clean-up never signals."""
    spared, process = {os.getpid()}, psutil.Process()
    try:
        for parent in process.parents():
            spared.add(parent.pid)
    except psutil.Error:
        pass
    return spared


def processes_of(directories: Iterable[Path | str]) -> list[psutil.Process]:
    """Running processes that refer to any of ``directories``, this one and its ancestors apart."""
    pattern = _pattern(str(d) for d in directories)
    if pattern is None:
        return []
    spared = _spared()
    found = []
    for process in psutil.process_iter():
        if process.pid in spared or not _alive(process):
            continue
        if _refers_to(process, pattern):
            found.append(process)
    return found


def with_children(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """``processes`` and every process descending from them, each once."""
    spared = _spared()
    found: dict[int, psutil.Process] = {}
    for process in processes:
        try:
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            family = [process]
        for member in family:
            if member.pid not in spared:
                found.setdefault(member.pid, member)
    return list(found.values())


def end(processes: Iterable[psutil.Process], timeout: float = 5.0) -> list[psutil.Process]:
    """TERM ``processes``, KILL what is left after ``timeout`` and wait for it; the processes
    still running after that (none, unless they are not ours to signal)."""
    targets = [p for p in processes if p.pid not in _spared()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in targets:
            with contextlib.suppress(psutil.Error):
                process.send_signal(sig)
        _, targets = psutil.wait_procs(targets, timeout=timeout)
        targets = [p for p in targets if _alive(p)]
        if not targets:
            break
    return targets


def end_processes_of(*directories: Path | str, timeout: float = 5.0) -> list[psutil.Process]:
    """End every process that refers to ``directories``, with its children; what survives."""
    return end(with_children(processes_of(directories)), timeout)


# --- the session check ----------------------------------------------------------------------------


@dataclass
class _Session:
    run: str
    pid: int
    before: set[tuple[int, float]]
    seen: set[int]
    origin: dict[tuple[int, float], str] = field(default_factory=dict)


_KEY = pytest.StashKey[_Session]()


def _key(process: psutil.Process) -> tuple[int, float] | None:
    try:
        return process.pid, process.create_time()
    except psutil.Error:
        return None


def _pids() -> set[int]:
    return {int(name) for name in os.listdir("/proc") if name.isdigit()}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if _KEY in config.stash:
        return
    run = uuid.uuid4().hex
    parent = os.environ.get(MARKER)
    os.environ[MARKER] = f"{parent} {run}" if parent else run
    before = {key for key in map(_key, psutil.process_iter()) if key is not None}
    config.stash[_KEY] = _Session(run, os.getpid(), before, _pids())


def _directories(config: pytest.Config) -> list[str]:
    directories = set(_WATCHED)
    factory = getattr(config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)  # only once a test has used tmp_path
    if basetemp is not None:
        directories.add(str(basetemp))
    return sorted(directories)


def _ours(process: psutil.Process, session: _Session, pattern: re.Pattern[str] | None) -> bool:
    if process.pid == session.pid or _key(process) in session.before or not _alive(process):
        return False
    try:
        if any(parent.pid == session.pid for parent in process.parents()):
            return True
    except psutil.Error:
        pass
    try:
        if session.run in process.environ().get(MARKER, "").split():
            return True
    except psutil.Error:
        pass
    return pattern is not None and _refers_to(process, pattern)


def _new_processes(pids: Iterable[int]) -> Iterator[psutil.Process]:
    for pid in pids:
        try:
            yield psutil.Process(pid)
        except psutil.Error:
            continue


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After each test (its teardown included), note which test each new process of ours
    outlived first: the failure names it."""
    try:
        return (yield)
    finally:
        session = item.config.stash.get(_KEY, None)
        if session is not None:
            try:
                now = _pids()
                fresh, session.seen = now - session.seen, now
                pattern = _pattern(_directories(item.config))
                for process in _new_processes(fresh):
                    key = _key(process)
                    if key is not None and _ours(process, session, pattern):
                        session.origin.setdefault(key, item.nodeid)
            except (OSError, psutil.Error):
                pass  # attribution only: the check at the end does not depend on it


def left_running(config: pytest.Config, grace: float = GRACE_S) -> list[psutil.Process]:
    """This session's processes still running after ``grace`` seconds."""
    session = config.stash[_KEY]
    pattern = _pattern(_directories(config))
    deadline = time.monotonic() + grace
    while True:
        left = [p for p in psutil.process_iter() if _ours(p, session, pattern)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def _describe(process: psutil.Process, session: _Session) -> str:
    try:
        with process.oneshot():
            command = " ".join(process.cmdline()) or f"[{process.name()}]"
            parent = process.ppid()
    except psutil.Error:
        command, parent = "(exited while being listed)", 0
    try:
        cwd = process.cwd()
    except psutil.Error:
        cwd = "?"
    key = _key(process)
    test = session.origin.get(key) if key else None
    when = f"first seen running after {test}" if test else "first seen at the session's end"
    command = command.encode("unicode_escape", "backslashreplace").decode("ascii")
    return f"  pid {process.pid} (parent {parent}, cwd {cwd}): {command}\n    {when}"


def report(descriptions: list[str], survivors: list[int]) -> str:
    lines = [
        f"{len(descriptions)} process(es) that the tests started were still running at the end "
        f"of the session, {GRACE_S:g} s after the last test:",
        *descriptions,
        "",
        "Each is a leak: the test (or fixture) named above started it, directly or through a "
        "daemon, and did not end it. End every process a test starts, with all its children, "
        "before the test returns: in a fixture's teardown or a `finally` (tests/leftovers.py: "
        "`end_processes_of(directory)`, `end(with_children([process]))`); for Slurm, "
        "tests/slurm.py's `Slurm.stop` cancels the jobs and waits for them before it stops the "
        "daemons. What one run leaves behind, the next run on this machine inherits.",
    ]
    if survivors:
        pids = ", ".join(map(str, survivors))
        lines.append(f"The check could not end pid {pids}: end it by hand.")
    else:
        lines.append("The check has ended them now (TERM, then KILL).")
    return "\n".join(lines)


def _fail(session: pytest.Session, message: str) -> None:
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    entry = pytest.TestReport(
        nodeid="processes left running",
        location=("tests/leftovers.py", None, "the session's end: processes left running"),
        keywords={},
        outcome="failed",
        longrepr=message,
        when="teardown",
    )
    if reporter is not None:
        reporter.stats.setdefault("error", []).append(entry)
    else:
        print(message, file=sys.stderr)


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(_KEY, None)
    if state is None or os.getpid() != state.pid:
        return
    try:
        left = left_running(session.config)
        if not left:
            return
        descriptions = [_describe(p, state) for p in left]
        survivors = end(with_children(left))
        message = report(descriptions, [p.pid for p in survivors])
    except Exception as error:  # the check's own fault is reported, never raised
        message = f"the check for processes left running could not run: {error!r}"
    _fail(session, message)
