"""A recording from a killed `gpuconsole record` (SIGKILL, no clean shutdown) still opens, with at
most about the last second lost, and the next recording carries on in the same file."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from gpuconsole.fleet.record.reader import Recording
from gpuconsole.fleet.record.schema import RecordingError

REFRESH_S = 0.2
# Commits come at most a second apart; a reading waits for the next commit at most that long,
# plus one polling round. The rest is slack for a loaded test machine.
MOST_LOST_S = 1.0 + REFRESH_S + 1.5


def start_recorder(path: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuconsole",
            "record",
            "--demo",
            "--record",
            str(path),
            "--refresh",
            str(REFRESH_S),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def readings_in(path: Path) -> int:
    """How many readings a reader sees now (0 while the file is not there yet)."""
    try:
        recording = Recording(path)
    except RecordingError:
        return 0
    try:
        if recording.start is None or recording.end is None:
            return 0
        return len(recording.snapshots(recording.hosts[0], recording.start, recording.end))
    finally:
        recording.close()


def test_a_killed_recorder_leaves_a_recording_that_opens(tmp_path: Path) -> None:
    path = tmp_path / "killed.sqlite"
    recorder = start_recorder(path)
    try:
        deadline = time.monotonic() + 120
        while readings_in(path) < 10:
            assert recorder.poll() is None, (
                recorder.stderr.read().decode() if recorder.stderr else ""
            )
            assert time.monotonic() < deadline, "the recorder wrote nothing in 120 s"
            time.sleep(0.2)
        time.sleep(1.5)  # mid-run: some readings are committed, others still queued
        killed_at = time.time()
        os.kill(recorder.pid, signal.SIGKILL)
        recorder.wait(timeout=30)
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
        if recorder.stderr is not None:
            recorder.stderr.close()
    assert recorder.returncode == -signal.SIGKILL
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    recording = Recording(path)
    try:
        assert len(recording.hosts) == 6
        assert recording.end is not None
        assert killed_at - recording.end <= MOST_LOST_S
        (session,) = recording.sessions
        assert session.ended is None  # no clean shutdown
        for host in recording.hosts:  # every reading that was committed decodes
            assert recording.snapshots(host, session.started, recording.end)
        open_then = recording.open_episodes(recording.end)
        assert any(e.code == "gpu-lost" for e in open_then)
        last = recording.end
    finally:
        recording.close()

    # The next recorder appends: a second session, and the killed one's episodes end where its
    # recording ended.
    again = start_recorder(path, "--duration", "2s")
    _, stderr = again.communicate(timeout=120)
    assert again.returncode == 0, stderr.decode()
    recording = Recording(path)
    try:
        _, second = recording.sessions
        assert second.started > last and second.ended is not None
        ended_first = [e for e in recording.episodes(None, last) if e.since <= last]
        assert ended_first and all(e.until is not None for e in ended_first)
    finally:
        recording.close()
