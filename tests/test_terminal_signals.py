"""The console leaves the terminal as it found it: on SIGTERM and SIGHUP as on `q`, and it does not
start where there is no terminal to draw on (output to a file, input from /dev/null, TERM=dumb).

Every run is a real `python -m gpuconsole --demo`, in a pseudo-terminal where it has one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_runner import GPUCONSOLE, gpuconsole

from gpuconsole.ui.terminal import PLAIN_OUTPUT_ENV

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = [*GPUCONSOLE, "--demo"]
XDG_DIRS = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")
PROMPT_S = 15.0
"""Time enough to import gpuconsole and refuse; far less than the console runs when it starts."""
MOUSE = (b"1000", b"1003", b"1015", b"1006")
"""The mouse reporting modes Textual turns on (and off, at its normal exit)."""
_PRIVATE_MODE = re.compile(rb"\x1b\[\?([0-9;]+)([hl])")


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "TERM": "xterm-256color",
        "COLORTERM": "truecolor",
        "LANG": "C.UTF-8",
        **{name: str(tmp_path / name.lower()) for name in XDG_DIRS},
        **extra,
    }
    env.pop("NO_COLOR", None)
    if PLAIN_OUTPUT_ENV not in extra:
        env.pop(PLAIN_OUTPUT_ENV, None)
    return env


def _controlling_terminal() -> None:
    """In the child, in its new session: the pseudo-terminal becomes its controlling terminal,
    as a login's is, so that the kernel sends it SIGHUP when the terminal goes away."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Pty:
    """A child in a pseudo-terminal of 80x24: what it wrote, and the terminal's settings."""

    def __init__(self, argv: list[str], env: dict[str, str], controlling: bool = True) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.settings = termios.tcgetattr(slave)
        self.child = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
            start_new_session=True, preexec_fn=_controlling_terminal if controlling else None,
        )  # fmt: skip
        os.close(slave)
        self.output = bytearray()

    def read(self, done: Callable[[bytes], bool], timeout: float) -> bool:
        """Read until ``done(output)``, the end of the output, or ``timeout``; whether done."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(bytes(self.output)):
                return True
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready:
                if self.child.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            self.output += chunk
            if b"\x1b[?2026$p" in chunk:  # a terminal that has synchronized output
                os.write(self.master, b"\x1b[?2026;2$y")
        return done(bytes(self.output))

    def finish(self, timeout: float) -> int | None:
        """Read to the end; the exit status, or None when it is still running after
        ``timeout``."""
        self.read(lambda _: False, timeout)
        try:
            return self.child.wait(max(0.1, timeout / 10))
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        if self.child.poll() is None:
            os.killpg(self.child.pid, signal.SIGKILL)
        self.child.wait(10)
        os.close(self.master)


@pytest.fixture
def in_pty() -> Iterator[Callable[..., Pty]]:
    started: list[Pty] = []

    def start(argv: list[str], env: dict[str, str], controlling: bool = True) -> Pty:
        started.append(Pty(argv, env, controlling))
        return started[-1]

    yield start
    for each in started:
        each.close()


def shown(output: bytes) -> bool:
    """The fleet has been drawn: the demo rack's hosts are on the screen."""
    return b"\x1b[?1049h" in output and b"h100-01" in output and b"l40s-01" in output


def restored_modes(output: bytes) -> set[bytes]:
    """The private modes ``output`` leaves set or reset, as ``1049l``, ``25h``... (not 2026,
    synchronized output, which each frame turns on and off)."""
    last: dict[bytes, bytes] = {}
    for match in _PRIVATE_MODE.finditer(output):
        for mode in match.group(1).split(b";"):
            last[mode] = match.group(2)
    return {mode + letter for mode, letter in last.items() if mode != b"2026"}


def recording_begun(path: Path, timeout: float = 60) -> bool:
    """Whether the console's recording holds its session within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and session_ends(path):
            return True
        time.sleep(0.2)
    return False


def session_ends(path: Path) -> list[float | None]:
    """When each session of the recording ended: None for one a killed console left open."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        try:
            return [ended for (ended,) in db.execute("SELECT ended FROM sessions")]
        except sqlite3.OperationalError:  # not made yet
            return []


def assert_refused(output: str, code: int | None) -> None:
    assert code is not None, "still running: it should have refused at once"
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "Traceback" not in output
    line = lines[0]
    assert line.startswith("gpuconsole: ")
    for pointer in ("snapshot", "record", "--json"):
        assert pointer in line, line


# --- no terminal: one line, no escape, a prompt exit ---------------------------------------------


def test_output_to_a_file_and_no_input_refuses_in_one_line(tmp_path: Path) -> None:
    """The issue's case: `gpuconsole > out.txt < /dev/null` wrote xterm sequences into the file
    and never exited."""
    out = tmp_path / "out.txt"
    with out.open("wb") as stdout:
        child = subprocess.Popen(
            CONSOLE, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
            env=environment(tmp_path), cwd=ROOT,
        )  # fmt: skip
        try:
            _, err = child.communicate(timeout=PROMPT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            err = b""
    assert_refused(err.decode(), child.returncode)
    assert "not a terminal" in err.decode()
    assert b"\x1b" not in out.read_bytes()
    assert b"\x1b" not in err


def test_replay_without_a_terminal_refuses_and_points_to_its_list(tmp_path: Path) -> None:
    """`gpuconsole replay FILE > out.txt < /dev/null` wrote xterm sequences and never exited."""
    recording = tmp_path / "r.sqlite"
    env = environment(tmp_path)
    record = ("record", "--demo", "--duration", "2s", "--record", str(recording))
    done = gpuconsole(*record, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    try:
        done = gpuconsole("replay", str(recording), env=env, timeout=PROMPT_S)
    except subprocess.TimeoutExpired:
        pytest.fail("replay without a terminal ran on instead of refusing")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "not a terminal" in lines[0] and "--list" in lines[0]
    assert "\x1b" not in done.stdout + done.stderr


@pytest.mark.parametrize("without", ["input", "output", "error"])
def test_a_terminal_on_one_side_only_refuses_in_one_line(
    tmp_path: Path, in_pty: Callable[..., Pty], without: str
) -> None:
    """`… | gpuconsole`, `gpuconsole > out.txt` and `gpuconsole 2> log` typed at a terminal:
    the rest is a terminal, which is not enough (no keys to read, output meant for a file, or
    the screen, which Textual draws on standard error, going into the log)."""
    out = tmp_path / "out.txt"
    redirect = {"input": "< /dev/null", "output": f"> {out}", "error": f"2> {out}"}[without]
    argv = ["sh", "-c", f'exec "$@" {redirect}', "sh", *CONSOLE]
    console = in_pty(argv, environment(tmp_path))
    code = console.finish(PROMPT_S)
    written = bytes(console.output) + (out.read_bytes() if out.exists() else b"")
    assert_refused(written.decode(), code)
    assert f"standard {without} is not a terminal" in written.decode()
    assert b"\x1b" not in written


def test_term_dumb_refuses_in_one_line_and_the_subcommands_run(
    tmp_path: Path, in_pty: Callable[..., Pty]
) -> None:
    """A terminal that takes no escape sequences (TERM=dumb: Emacs' shell, some CI logs): the
    console wrote xterm sequences to it anyway. What the refusal points to works there."""
    console = in_pty(CONSOLE, environment(tmp_path, TERM="dumb"))
    code = console.finish(PROMPT_S)
    assert_refused(console.output.decode(), code)
    assert "TERM=dumb" in console.output.decode()
    assert b"\x1b" not in console.output
    snapshot = in_pty(
        [*GPUCONSOLE, "snapshot", "--demo", "--json"],
        environment(tmp_path, TERM="dumb"),
    )
    assert snapshot.finish(60) in (0, 1, 2), bytes(snapshot.output)
    assert snapshot.output.startswith(b"{")


# --- SIGTERM and SIGHUP: the terminal as `q` leaves it -------------------------------------------


@pytest.fixture(scope="module")
def quit_modes(tmp_path_factory: pytest.TempPathFactory) -> set[bytes]:
    """What the console turns off when it quits the normal way (`q`)."""
    tmp_path = tmp_path_factory.mktemp("quit")
    console = Pty(CONSOLE, environment(tmp_path))
    try:
        assert console.read(shown, 60), bytes(console.output[-2000:])
        os.write(console.master, b"q")
        assert console.finish(30) == 0
        modes = restored_modes(bytes(console.output))
        assert termios.tcgetattr(console.master) == console.settings
    finally:
        console.close()
    assert {b"1049l", b"25h"} <= modes
    assert {mode + b"l" for mode in MOUSE} <= modes
    return modes


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_stop_signal_leaves_the_terminal_as_quitting_does(
    tmp_path: Path, in_pty: Callable[..., Pty], quit_modes: set[bytes], number: signal.Signals
) -> None:
    """The issue's case: after SIGTERM the console exited in the alternate screen, the mouse
    still reporting, the cursor hidden and the terminal raw, its recording left open. Now a
    stop signal quits as `q` does, and the exit status says which signal."""
    recording = tmp_path / "rec.sqlite"
    console = in_pty([*CONSOLE, "--record", str(recording)], environment(tmp_path))
    assert console.read(shown, 60), bytes(console.output[-2000:])
    assert recording_begun(recording)
    drawn = len(console.output)
    console.child.send_signal(number)
    code = console.finish(30)
    after = bytes(console.output[drawn:])
    assert quit_modes <= restored_modes(bytes(console.output)), after[-400:]
    assert after.rfind(b"\x1b[?1049l") > after.rfind(b"\x1b[?1049h")
    assert termios.tcgetattr(console.master) == console.settings
    assert None not in session_ends(recording)
    assert code == 128 + number


HUNG_EXIT = (
    "from gpuconsole.ui.app import GpuConsoleApp\n"
    "from gpuconsole.cli.main import main\n"
    "GpuConsoleApp.exit = lambda *_, **__: None  # a way out that never comes\n"
    "raise SystemExit(main(['--demo']))\n"
)
"""The console, with an app whose exit hangs (a worker that never ends, a dead terminal)."""


@pytest.mark.parametrize("again", [False, True], ids=["grace", "second-signal"])
def test_a_way_out_that_hangs_still_restores_the_terminal(
    tmp_path: Path, in_pty: Callable[..., Pty], quit_modes: set[bytes], again: bool
) -> None:
    """Where the app does not exit, the driver restores the terminal itself and ends the
    process: `STOP_GRACE_S` after the signal, or at once at a second one (`kill` again, as one
    does when the first seems slow)."""
    from gpuconsole.ui.terminal.driver import STOP_GRACE_S

    console = in_pty([sys.executable, "-c", HUNG_EXIT], environment(tmp_path))
    assert console.read(shown, 60), bytes(console.output[-2000:])
    console.child.send_signal(signal.SIGTERM)
    started = time.monotonic()
    if again:
        time.sleep(0.5)
        console.child.send_signal(signal.SIGTERM)
    code = console.finish(STOP_GRACE_S + 20)
    took = time.monotonic() - started
    assert quit_modes <= restored_modes(bytes(console.output))
    assert termios.tcgetattr(console.master) == console.settings
    assert code == 128 + signal.SIGTERM
    if again:
        assert took < STOP_GRACE_S - 1
    else:
        assert STOP_GRACE_S - 1 < took < STOP_GRACE_S + 10


def test_a_stop_signal_while_the_rack_is_primed_restores_the_terminal_at_once(
    tmp_path: Path, in_pty: Callable[..., Pty], quit_modes: set[bytes]
) -> None:
    """SIGTERM in the first seconds, while 256 simulated hosts are still being primed in a
    thread: the terminal is restored within seconds all the same. (The process ends when that
    thread is done, as it does after `q`.)"""
    console = in_pty([*CONSOLE, "--demo-hosts", "256"], environment(tmp_path))
    assert console.read(lambda out: b"\x1b[?1049h" in out and b"host" in out, 60)
    drawn = len(console.output)
    console.child.send_signal(signal.SIGTERM)
    restored = console.read(lambda out: quit_modes <= restored_modes(out[drawn:]), 10)
    assert restored, bytes(console.output[drawn:])[-400:]
    assert termios.tcgetattr(console.master) == console.settings
    assert console.finish(60) == 128 + signal.SIGTERM


@pytest.mark.parametrize(
    "controlling", [True, False], ids=["hang-up signal", "not its controlling terminal"]
)
def test_a_hang_up_with_the_terminal_gone_exits_and_closes_the_recording(
    tmp_path: Path, in_pty: Callable[..., Pty], controlling: bool
) -> None:
    """The SSH session dropped: the terminal is gone and the kernel sends SIGHUP. SIGHUP killed
    the console outright, its recording's session left open; now it closes the recording and
    exits, though nothing is left to restore or write to. A terminal that was not the console's
    controlling terminal sends no SIGHUP: its failed writes and ended input are taken as one
    (the console used to wait on its writer for good, the recording held)."""
    recording = tmp_path / "rec.sqlite"
    console = in_pty(
        [*CONSOLE, "--record", str(recording)], environment(tmp_path), controlling=controlling
    )
    assert console.read(shown, 60), bytes(console.output[-2000:])
    assert recording_begun(recording)
    os.close(console.master)
    console.master = os.open(os.devnull, os.O_RDONLY)  # for close()
    try:
        code = console.child.wait(20)
    except subprocess.TimeoutExpired:
        code = None
    assert code is not None, "still running 20 s after its terminal went away"
    assert None not in session_ends(recording)
    assert code == 128 + signal.SIGHUP
