"""A path the user may not use is one line naming it, never a traceback, and a recording that
cannot be read is said to be one (not "not a gpuconsole recording"); an inventory larger than one
`hosts check` connects to is refused in one line before any connection.

The tests run as root here, whom file modes do not stop: the command then runs as root without
the two capabilities that let it pass them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, dropped from
its bounding set before it starts), as an ordinary user would. Run as an ordinary user, the modes
stop it by themselves.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import gpuconsole

from gpuconsole.cli.main import main
from gpuconsole.hosts.check import MAX_CHECKED_HOSTS

PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


def as_a_user() -> None:
    """In the child before exec: root gives up passing file modes; anyone else has nothing to
    give up."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def as_user(*args: str) -> subprocess.CompletedProcess[str]:
    """`gpuconsole ARGS` run by a user whom file modes stop (`as_a_user`)."""
    return gpuconsole(*args, timeout=180, preexec_fn=as_a_user)


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("recording") / "rec.sqlite"
    done = gpuconsole("record", "--demo", "--duration", "1s", "--record", str(path))
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture
def stopped(tmp_path: Path) -> None:
    """Skips where file modes do not stop the command (a root that keeps its capabilities)."""
    probe = tmp_path / "probe"
    probe.write_text("")
    probe.chmod(0o000)
    tried = subprocess.run(
        [sys.executable, "-c", f"open({str(probe)!r})"],
        preexec_fn=as_a_user,
        capture_output=True,
        check=False,
    )
    if tried.returncode == 0:
        pytest.skip("file modes do not stop this user")


@pytest.fixture
def locked(tmp_path: Path, recording: Path, stopped: None) -> Iterator[Path]:
    """A folder the command cannot enter, holding a recording."""
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "rec.sqlite").write_bytes(recording.read_bytes())
    folder.chmod(0o000)
    yield folder
    folder.chmod(0o700)


def test_replay_in_a_folder_that_cannot_be_entered(locked: Path) -> None:
    path = locked / "rec.sqlite"
    done = as_user("replay", str(path), "--list")
    assert done.returncode == 3
    assert one_line(done.stderr) == f"gpuconsole: {path}: cannot read: Permission denied"


def test_bundle_record_in_a_folder_that_cannot_be_entered(locked: Path) -> None:
    path = locked / "rec.sqlite"
    done = as_user("bundle", "h100-01", "--record", str(path))
    assert done.returncode == 3
    assert one_line(done.stderr) == f"gpuconsole: {path}: cannot read: Permission denied"


def test_bundle_output_in_a_folder_that_cannot_be_entered(locked: Path) -> None:
    path = locked / "out.tar.gz"
    done = as_user("bundle", "--demo", "h100-01", "-o", str(path))
    assert done.returncode == 3
    assert one_line(done.stderr) == f"gpuconsole: {path}: Permission denied"


def test_bundle_output_folder_that_cannot_be_entered(locked: Path) -> None:
    done = as_user("bundle", "--demo", "h100-01", "-o", str(locked))
    assert done.returncode == 3
    line = one_line(done.stderr)
    assert line.startswith(f"gpuconsole: {locked}/gpuconsole-bundle-h100-01-"), line
    assert line.endswith(".tar.gz: Permission denied"), line


@pytest.mark.parametrize("command", [("replay", "{path}", "--list"), ("bundle", "h100-01")])
def test_a_recording_that_cannot_be_read_is_said_to_be_one(
    command: tuple[str, ...], tmp_path: Path, recording: Path, stopped: None
) -> None:
    """Not "not a gpuconsole recording (file is not a database)": it may well be one."""
    path = tmp_path / "unreadable.sqlite"
    path.write_bytes(recording.read_bytes())
    path.chmod(0o000)
    words = [word.format(path=path) for word in command]
    if command[0] == "bundle":
        words += ["--record", str(path)]
    done = as_user(*words)
    assert done.returncode == 3
    assert one_line(done.stderr) == f"gpuconsole: {path}: cannot read: Permission denied"


# --- hosts check on an inventory of 200,000 hosts -------------------------------------------------


def test_hosts_check_refuses_200000_hosts_in_one_line(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.toml"
    with inventory.open("w") as file:
        file.write("[defaults]\nport = 1\nconnect_timeout = 2\n")
        for i in range(200_000):
            file.write(f'[hosts.gpu{i:06d}]\naddress = "127.0.0.1"\n')
    done = gpuconsole("hosts", "check", "--inventory", str(inventory), timeout=180)
    assert done.returncode == 2
    assert done.stdout == ""
    assert one_line(done.stderr) == (
        f"gpuconsole: hosts check: {inventory} holds 200,000 hosts, more than the 1,024 one check "
        "connects to; check a rack at a time (--hosts NAMES, or an inventory of that rack), or "
        "watch a fleet this size through Prometheus (gpuconsole --prometheus URL)"
    )


def test_one_host_over_the_bound_is_refused_before_any_connection(
    capsys: pytest.CaptureFixture[str],
) -> None:
    names = ",".join(f"gpu{i:04d}" for i in range(MAX_CHECKED_HOSTS + 1))
    assert main(["hosts", "check", "--hosts", names]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_line(captured.err).startswith(
        f"gpuconsole: hosts check: --hosts holds {MAX_CHECKED_HOSTS + 1:,} hosts, more than"
    )
