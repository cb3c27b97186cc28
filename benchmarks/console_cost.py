"""What a terminal monitor costs the admin who runs it: CPU, bytes written to the terminal, RSS.

    python benchmarks/console_cost.py [--seconds 30] [--warmup 5] [--cases NAME,...]

Each case runs its command in a pseudo-terminal of a fixed size (TERM=xterm-256color, truecolor),
sends its keys once the warm-up starts, and after the warm-up measures for ``--seconds``:

- CPU: user + system time of the process and its children, as % of one core;
- bytes/s: everything the program wrote to the terminal (the pty's master side, drained
  continuously, as an SSH session would carry it);
- RSS: the largest resident set seen (sampled every 0.5 s), MiB;
- first frame: seconds from start until the screen shows the case's ``ready`` text;
- loaded: seconds from start until the screen shows its ``loaded`` text (the console paints
  before it has read the hosts' recent past; nvitop paints with its readings).

The screen is what pyte, a terminal emulator, makes of the output: a console that writes only
the cells that change never writes a whole word it already showed. Without pyte the raw output
is searched instead, and "loaded" can come late or never.

Cases (all run at the same time, each in its own pty, unless --serial):

- ``demo-host-160x48``, ``demo-host-80x24``: ``gpuconsole --demo``, Enter on its first host
  (8 GPUs);
- ``demo-fleet-160x48``: ``gpuconsole --demo --demo-hosts 64``, the fleet screen;
- ``local-host-160x48``, ``local-host-80x24``: ``gpuconsole`` on this host's GPUs (NVML), Enter
  on it (skipped without NVML);
- ``nvitop-160x48``, ``nvitop-80x24``: ``python -m nvitop --interval 1`` (skipped without
  nvitop or NVML), the reference;
- ``textual-floor-160x48``: a bare Textual app of a Static and a DataTable with the fleet's
  headings (`FLOOR_APP`), the first frame Textual itself allows on this machine.

It prints one line per case and then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from process_tree import tree_cpu_seconds, tree_rss_mib

REPO = Path(__file__).resolve().parent.parent
CONSOLE = [sys.executable, "-m", "gpuconsole"]
FLOOR_APP = """
from textual.app import App
from textual.widgets import DataTable, Static


class Floor(App):
    def compose(self):
        yield Static("gpuconsole")
        table = DataTable()
        table.add_columns("Host", "State", "GPUs", "Worst problem")
        yield table


Floor().run()
"""
"""The least a Textual app paints: what the console's first frame cannot be quicker than."""


@dataclass(frozen=True)
class Case:
    name: str
    command: list[str]
    size: tuple[int, int]  # columns, rows
    ready: str
    """Text of the first painted frame."""
    loaded: str
    """Text shown once the readings are in."""
    keys: tuple[bytes, ...] = ()
    """Sent once the readings are in (Enter opens a host)."""
    needs: tuple[str, ...] = ()
    """Modules that must import for the case to run."""


def cases() -> list[Case]:
    host_keys = (b"\r",)
    local = [*CONSOLE, "--refresh", "1"]
    nvitop = [sys.executable, "-m", "nvitop", "--interval", "1"]
    # The fleet table's last heading, shown at every width (the title is shortened at 80
    # columns); a host's state once it has been read.
    ours = ("Worst problem", " live ")
    return [
        Case("demo-host-160x48", [*CONSOLE, "--demo"], (160, 48), *ours, host_keys),
        Case("demo-host-80x24", [*CONSOLE, "--demo"], (80, 24), *ours, host_keys),
        Case("demo-fleet-160x48", [*CONSOLE, "--demo", "--demo-hosts", "64"], (160, 48), *ours),
        Case("local-host-160x48", local, (160, 48), *ours, host_keys, ("pynvml",)),
        Case("local-host-80x24", local, (80, 24), *ours, host_keys, ("pynvml",)),
        Case("nvitop-160x48", nvitop, (160, 48), "NVITOP", "NVITOP", (), ("nvitop",)),
        Case("nvitop-80x24", nvitop, (80, 24), "NVITOP", "NVITOP", (), ("nvitop",)),
        Case(
            "textual-floor-160x48",
            [sys.executable, "-c", FLOOR_APP],
            (160, 48),
            "Worst problem",
            "Worst problem",
        ),
    ]


def nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:  # no library, no driver, no GPU: the local cases cannot run
        return False


@dataclass
class Measurement:
    case: Case
    started: float = 0.0
    first_frame_s: float | None = None
    loaded_s: float | None = None
    bytes_total: int = 0
    bytes_measured: int = 0
    measuring: bool = False
    rss_max_mib: float = 0.0
    cpu_percent: float | None = None
    exit_code: int | None = None
    tail: bytes = field(default=b"", repr=False)
    screen: str = ""
    """What the terminal showed at the end of the measurement."""


class _Shown:
    """The terminal's text: pyte's screen when pyte is there, else the latest raw output."""

    def __init__(self, columns: int, rows: int) -> None:
        try:
            import pyte
        except ImportError:
            self._screen = None
            self._raw = ""
            return
        self._screen = pyte.Screen(columns, rows)
        self._stream = pyte.ByteStream(self._screen)

    def feed(self, chunk: bytes) -> str:
        if self._screen is None:
            self._raw = (self._raw + chunk.decode("utf-8", "replace"))[-65536:]
            return self._raw
        self._stream.feed(chunk)
        return "\n".join(self._screen.display)


def run_case(
    case: Case, warmup: float, seconds: float, load_wait: float = 30.0, keep_screen: bool = False
) -> Measurement:
    """Run one case to the end of its measurement and stop it; its keys are sent once its
    readings are shown, or after ``load_wait`` seconds. The terminal's text is followed until
    then, and to the end only with ``keep_screen`` (emulating it costs this process CPU)."""
    master, slave = pty.openpty()
    columns, rows = case.size
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor", "LANG": "C.UTF-8"}
    env.pop("NO_COLOR", None)
    measurement = Measurement(case, started=time.perf_counter())
    child = subprocess.Popen(
        case.command,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    os.close(slave)
    process = psutil.Process(child.pid)
    stop = threading.Event()

    shown = _Shown(*case.size)

    def drain() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            measurement.bytes_total += len(chunk)
            if measurement.measuring:
                measurement.bytes_measured += len(chunk)
            if measurement.loaded_s is None or keep_screen:
                measurement.screen = shown.feed(chunk)
            if measurement.loaded_s is None:
                text = measurement.screen
                now = time.perf_counter() - measurement.started
                if measurement.first_frame_s is None and case.ready in text:
                    measurement.first_frame_s = now
                if measurement.first_frame_s is not None and case.loaded in text:
                    measurement.loaded_s = now
            measurement.tail = (measurement.tail + chunk)[-4096:]

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        give_up = time.perf_counter() + 30.0
        deadline = time.perf_counter() + load_wait
        while child.poll() is None and time.perf_counter() < give_up:
            if measurement.first_frame_s is not None and (
                measurement.loaded_s is not None or time.perf_counter() >= deadline
            ):
                break
            time.sleep(0.05)
        for key in case.keys:
            time.sleep(0.5)
            os.write(master, key)
        time.sleep(warmup)
        if child.poll() is None:
            cpu_before = tree_cpu_seconds(process)
            measurement.measuring = True
            began = time.perf_counter()
            while time.perf_counter() - began < seconds and child.poll() is None:
                measurement.rss_max_mib = max(measurement.rss_max_mib, tree_rss_mib(process))
                time.sleep(0.5)
            measurement.measuring = False
            elapsed = time.perf_counter() - began
            if child.poll() is None:
                cpu = tree_cpu_seconds(process) - cpu_before
                measurement.cpu_percent = 100.0 * cpu / elapsed
                measurement.bytes_measured = int(measurement.bytes_measured / elapsed)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        measurement.exit_code = child.returncode
        stop.set()
        reader.join(2)
        os.close(master)
    return measurement


def result_dict(m: Measurement, show_screen: bool = False) -> dict[str, Any]:
    ok = m.cpu_percent is not None
    screen = {"screen": [line.rstrip() for line in m.screen.splitlines()]} if show_screen else {}
    return screen | {
        "case": m.case.name,
        "size": f"{m.case.size[0]}x{m.case.size[1]}",
        "cpu_percent": round(m.cpu_percent, 2) if ok else None,
        "bytes_per_s": m.bytes_measured if ok else None,
        "rss_max_mib": round(m.rss_max_mib, 1),
        "first_frame_s": _rounded(m.first_frame_s),
        "loaded_s": _rounded(m.loaded_s),
        "error": None
        if ok
        else f"exited {m.exit_code}: {m.tail[-300:].decode('utf-8', 'replace')!r}",
    }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--cases", help="comma-separated case names (default: all that can run)")
    parser.add_argument("--serial", action="store_true", help="one case at a time")
    parser.add_argument(
        "--load-wait",
        type=float,
        default=30.0,
        help="seconds to wait for the readings after the first frame before the keys are sent",
    )
    parser.add_argument(
        "--show-screen", action="store_true", help="each case's last screen in the JSON line"
    )
    args = parser.parse_args()
    chosen = cases()
    if args.cases:
        names = set(args.cases.split(","))
        chosen = [c for c in chosen if c.name in names]
    nvml = nvml_works()
    runnable = []
    for case in chosen:
        missing = [m for m in case.needs if importlib.util.find_spec(m) is None]
        if missing or (case.needs and not nvml):
            why = f"no {', '.join(missing)}" if missing else "NVML does not answer here"
            print(f"{case.name:<20} skipped: {why}", flush=True)
            continue
        runnable.append(case)
    results: list[Measurement] = []
    if args.serial:
        results = [
            run_case(c, args.warmup, args.seconds, args.load_wait, args.show_screen)
            for c in runnable
        ]
    else:
        threads = []
        slots: list[Measurement | None] = [None] * len(runnable)

        def one(index: int, case: Case) -> None:
            slots[index] = run_case(
                case, args.warmup, args.seconds, args.load_wait, args.show_screen
            )

        for index, case in enumerate(runnable):
            thread = threading.Thread(target=one, args=(index, case))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        results = [m for m in slots if m is not None]
    rows = [result_dict(m, args.show_screen) for m in results]
    for row in rows:
        if row["error"]:
            print(f"{row['case']:<20} failed: {row['error']}", flush=True)
            continue
        print(
            f"{row['case']:<20} CPU {row['cpu_percent']:6.2f} %  {row['bytes_per_s']:8,} B/s  "
            f"RSS {row['rss_max_mib']:6.1f} MiB  first frame {row['first_frame_s']} s  "
            f"loaded {row['loaded_s']} s",
            flush=True,
        )
    print(json.dumps({"seconds": args.seconds, "warmup": args.warmup, "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
