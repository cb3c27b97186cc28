"""The session-wide check for processes the tests leave running (tests/leftovers.py), run for
real: a pytest of its own on a tiny test file, with the check loaded as the suite loads it."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
from leftovers import MARKER, end, processes_of, with_children
from slurm import running, slurm_available
from sshd import Sshd, sshd_available, wait_for

TESTS = Path(__file__).resolve().parent


def run_pytest(directory: Path, source: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``pytest -p leftovers`` on ``source`` (a test file) in ``directory``; its result and the
    token that every process its tests start names on its command line."""
    token = f"leak-{uuid.uuid4().hex}"
    directory.mkdir(exist_ok=True)
    (directory / "pytest.ini").write_text("[pytest]\n")
    (directory / "test_tiny.py").write_text(textwrap.dedent(source).replace("TOKEN", token))
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    command = [sys.executable, "-m", "pytest", "-p", "leftovers", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(
            [*command, "-q", f"--basetemp={directory / 'base'}", "test_tiny.py"],
            cwd=directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        left = end(with_children(tokened(token)))  # had the check failed to end them
    assert not left
    return done, token


def tokened(token: str) -> list[psutil.Process]:
    """Processes whose command line or working directory names ``token``."""
    found = []
    for process in psutil.process_iter():
        try:
            if token in " ".join(process.cmdline()) or token in process.cwd():
                found.append(process)
        except psutil.Error:
            continue
    return found


def listed_pids(output: str) -> set[int]:
    return {int(pid) for pid in re.findall(r"^  pid (\d+) ", output, re.MULTILINE)}


def test_the_suite_loads_the_check(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.has_plugin("leftovers")
    assert os.environ[MARKER]


LEAKS = """
    import subprocess
    import tempfile
    import time

    import psutil
    from leftovers import watch

    WATCHED = "@WATCHED@"


    def test_leaves_a_shell_and_its_sleep():
        shell = subprocess.Popen(["sh", "-c", "sleep 300; : TOKEN"])
        while not psutil.Process(shell.pid).children():  # its sleep has started
            time.sleep(0.01)


    def test_leaves_a_daemon():
        # the shell exits at once: its sleep is left to init, and carries the run's mark
        subprocess.run(["sh", "-c", "sleep 301 & : TOKEN"], check=True)


    def test_leaves_a_process_that_has_neither_the_mark_nor_pytest_as_ancestor():
        # as slurmd starts slurmstepd: an empty environment, in the cluster's directory (one
        # outside the run's temporary directories)
        directory = tempfile.mkdtemp(prefix="gpuconsole-leftovers-TOKEN-", dir=WATCHED)
        watch(directory)
        script = f"cd {directory} && exec sleep 302"
        subprocess.run(["env", "-i", "/bin/sh", "-c", f"/bin/sh -c '{script}' &"], check=True)
"""


def test_processes_left_running_fail_the_run_and_are_named_with_their_test(
    tmp_path: Path,
) -> None:
    watched = tmp_path / "watched"
    watched.mkdir()
    done, token = run_pytest(tmp_path / "run", LEAKS.replace("@WATCHED@", str(watched)))
    output = done.stdout
    assert done.returncode == 1, output + done.stderr
    assert "3 passed, 1 error" in output
    assert "ERROR processes left running" in output
    assert "were still running at the end of the session" in output
    for test, command in [
        ("test_leaves_a_shell_and_its_sleep", f"sh -c sleep 300; : {token}"),
        ("test_leaves_a_shell_and_its_sleep", "sleep 300"),
        ("test_leaves_a_daemon", "sleep 301"),
        ("test_leaves_a_process_that_has_neither_the_mark_nor_pytest_as_ancestor", "sleep 302"),
    ]:
        entry = re.search(
            rf"^  pid \d+ \(parent \d+, cwd [^)]*\): {re.escape(command)}\n"
            rf"    first seen running after test_tiny\.py::{test}$",
            output,
            re.MULTILINE,
        )
        assert entry, (command, output)
    assert "End every process a test starts, with all its children" in output
    assert "The check has ended them now" in output
    assert not any(psutil.pid_exists(pid) and _alive(pid) for pid in listed_pids(output))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_failing_test_stays_failed_and_its_leak_is_said_too(tmp_path: Path) -> None:
    done, token = run_pytest(
        tmp_path,
        """
        import subprocess


        def test_fails_and_leaks():
            subprocess.Popen(["sh", "-c", "sleep 300; : TOKEN"])
            assert 1 == 2
        """,
    )
    output = done.stdout
    assert done.returncode == 1, output + done.stderr
    assert "1 failed, 1 error" in output
    assert "FAILED test_tiny.py::test_fails_and_leaks - assert 1 == 2" in output
    assert f"sh -c sleep 300; : {token}\n    first seen running after test_tiny.py::" in output


def test_an_interrupted_run_keeps_its_exit_status(tmp_path: Path) -> None:
    done, _ = run_pytest(
        tmp_path,
        """
        import subprocess

        import pytest


        def test_leaks_then_stops_the_run():
            subprocess.Popen(["sh", "-c", "sleep 300; : TOKEN"])
            pytest.exit("stopped", returncode=2)
        """,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "were still running at the end of the session" in done.stdout


def test_a_clean_run_passes_and_an_empty_one_is_still_5(tmp_path: Path) -> None:
    clean, _ = run_pytest(
        tmp_path,
        """
        import subprocess


        def test_waits_for_what_it_starts():
            subprocess.run(["sh", "-c", "sleep 0.1; : TOKEN"], check=True)
        """,
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "1 passed" in clean.stdout and "left running" not in clean.stdout
    empty, _ = run_pytest(tmp_path, "")
    assert empty.returncode == 5, empty.stdout + empty.stderr
    assert "left running" not in empty.stdout


def test_a_process_of_another_run_is_never_counted(tmp_path: Path) -> None:
    """A process started after the session began but not by it (another pytest on the machine,
    say): neither a descendant, nor marked, nor in a directory of the run."""
    outsider_dir = tempfile.mkdtemp(prefix="gpuconsole-outsider-")
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    outsider = subprocess.Popen(
        ["sh", "-c", f"cd {outsider_dir} && sleep 1 && sleep 30"],
        env=env,
        start_new_session=True,
    )
    try:
        done, _ = run_pytest(
            tmp_path,
            """
            import time


            def test_starts_nothing():
                time.sleep(2.0)  # the outsider's sleep 30 starts meanwhile
            """,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert outsider.poll() is None  # and the check left it alone
        assert [p.cmdline() for p in psutil.Process(outsider.pid).children()] == [["sleep", "30"]]
    finally:
        end(with_children([psutil.Process(outsider.pid)]))
        outsider.wait()
        os.rmdir(outsider_dir)


# --- the helpers that start daemons end all they started ---------------------------------------


def test_a_stopped_slurm_cluster_leaves_no_step_daemon_and_no_job() -> None:
    """Before, `stop` sent scancel and stopped the daemons at once: the job's slurmstepd, left
    to init, ran on for ever with the job (`slurmstepd: [1.batch]`, `sleep 120`)."""
    if not slurm_available():
        if os.environ.get("CI"):
            pytest.fail("Slurm (slurmctld, slurmd, slurm-client, munge) is not installed")
        pytest.skip("needs Slurm and munge, run as root")
    cluster = running()
    slurm = next(cluster)
    try:
        slurm.submit("left-behind", "sleep 120")
        steps = [p for p in processes_of([slurm.directory]) if p.name() == "slurmstepd"]
        assert steps
        daemons = [
            int((slurm.directory / f"{name}.pid").read_text()) for name in ("slurmd", "slurmctld")
        ]
    finally:
        cluster.close()
    assert processes_of([slurm.directory]) == []
    assert not any(_alive(pid) for pid in [*daemons, *(p.pid for p in steps)])


@pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")
def test_a_killed_sshd_leaves_no_session_command_running(
    sshd: Sshd, standin: tuple[Path, Path]
) -> None:
    """Before, `kill` ended the sshd processes only: a stand-in nvidia-smi hanging in a session
    whose client had gone ran on, for as long as its hang flag was there."""
    directory, hang = standin
    hang.touch()
    sshd.ssh_config(["gpu-test"])
    smi = str(directory / "nvidia-smi")
    client = subprocess.Popen(
        ["ssh", "-F", str(sshd.home / ".ssh" / "config"), "gpu-test", f"{smi} -q & {smi} -q"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def standins() -> list[psutil.Process]:
        found = []
        for process in processes_of([directory]):
            with contextlib.suppress(psutil.Error):
                if process.cmdline()[-2:-1] == [smi]:
                    found.append(process)
        return found

    try:
        # the login shell's start-up files may take a while
        wait_for(lambda: len(standins()) == 2, timeout=60, what="the two hung nvidia-smi")
    finally:
        client.kill()  # as the console gives up on a command
        client.wait()
    time.sleep(1)
    hung = standins()
    assert len(hung) == 2  # still hanging, their client gone
    sshd.kill()
    assert not any(_alive(p.pid) for p in hung)
    assert processes_of([directory]) == []
