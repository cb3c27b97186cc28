"""A hostile host for tests: what a user with a shell on a GPU node (or a broken driver) can make
the console read, and the scans that prove none of it reached a terminal as anything but text.

Every escape class a terminal acts on is here: an OSC 52 that would write the admin's clipboard,
a window title, a screen clear, an OSC that never ends, a DCS (sixel) string, an 8-bit CSI, a
bidirectional override, and a newline that would forge an output line.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyte

CLIPBOARD = "\x1b]52;c;SE9TVElMRQ==\x1b\\"
TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J\x1b[H"
UNENDING = "\x1b]0;never ends"
SIXEL = "\x1bPq#0;2;0;0;0#0~~\x1b\\"
CSI_8BIT = "\x9b2J"
BIDI = "\u202egnp.exe"
PAYLOAD = "SE9TVElMRQ"
"""The clipboard payload: behind an OSC 52 in raw output only if one from content got through."""

HOSTILE_SMI_FIELDS: dict[str, dict[str, str]] = {
    "name": {
        "0": "NVIDIA H200" + TITLE + CLEAR,
        "1": "NVIDIA H200" + CLIPBOARD,
        "2": "NVIDIA H200" + UNENDING,
        "6": "NVIDIA H200" + SIXEL + CSI_8BIT + BIDI,
    },
    "temperature.gpu": {"3": "100000"},
    "memory.used": {"4": "-5"},
    "ecc.errors.uncorrected.volatile.total": {"5": "-5"},
    "index": {"7": "1000000000000000000"},
}
"""What the hostile stand-in nvidia-smi says instead of the usual, GPU by GPU."""

HOSTILE_ARGV = ["hostile-job", CLIPBOARD, "ok\nCRIT GPU 0 forged line", TITLE + CLEAR]
"""The command line of the hostile process a node's user starts on GPU 0."""

UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""What no text of the model may hold once it is past the boundary."""


def start_hostile_process(pid_file: Path) -> subprocess.Popen[bytes]:
    """A process whose argv is `HOSTILE_ARGV`; its pid goes to ``pid_file`` for the stand-in."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", *HOSTILE_ARGV],
        start_new_session=True,
    )
    pid_file.write_text(str(child.pid))
    return child


def unsafe_texts(value: object, path: str = "") -> list[str]:
    """Every string inside ``value`` (a model object, a dict from JSON...) that holds a control
    or bidirectional character, as ``path: text``."""
    found: list[str] = []
    if isinstance(value, str):
        if UNSAFE.search(value):
            found.append(f"{path}: {value!r}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            found += unsafe_texts(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found += unsafe_texts(item, f"{path}[{index}]")
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:  # type: ignore[attr-defined]
            found += unsafe_texts(getattr(value, name), f"{path}.{name}")
    return found


OWN_OSC = (b"8", b"22")
"""The OSCs the console writes itself (hyperlinks, the pointer's shape); it never copies."""
_OSC = re.compile(rb"\x1b\]([^;\x07\x1b]*)")


def foreign_sequences(output: bytes) -> list[str]:
    """The escape sequences in a terminal's output that are not the console's own: any OSC but
    its own, any DCS/APC/PM/SOS string, any 8-bit control, and the clipboard payload."""
    found = [f"OSC {m.group(1)!r}" for m in _OSC.finditer(output) if m.group(1) not in OWN_OSC]
    found += [f"string {m.group()!r}" for m in re.finditer(rb"\x1b[P_^X]", output)]
    text = output.decode("utf-8", "replace")
    found += [f"8-bit control {c!r}" for c in set(re.findall("[\x80-\x9f]", text))]
    if f"\x1b]52;c;{PAYLOAD}".encode() in output:  # as visible text (␛]52;…) it is harmless
        found.append("the clipboard payload")
    return found


def plain_output_faults(output: str) -> list[str]:
    """What a subcommand's printed text must not hold: any ESC or 8-bit control, any control
    character but newline and tab, and a forged line (one that starts with the forged text)."""
    faults = [f"control {c!r}" for c in set(re.findall("[\x00-\x08\x0b-\x1f\x7f-\x9f]", output))]
    faults += [f"forged line {line!r}" for line in output.splitlines() if line.startswith("CRIT")]
    return faults


def run_in_pty(
    argv: Sequence[str],
    env: Mapping[str, str],
    keys: Sequence[tuple[float, bytes]],
    size: tuple[int, int] = (120, 40),
    cwd: Path | None = None,
) -> tuple[bytes, pyte.Screen]:
    """Run ``argv`` in a pseudo-terminal of ``size`` (columns, rows), typing each key once its
    time (seconds from the start) has come, then wait for the program to exit (it must: the last
    key should quit it). Returns every byte it wrote and the screen they leave."""
    columns, rows = size
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    child = subprocess.Popen(
        list(argv), stdin=slave, stdout=slave, stderr=slave, env=dict(env), cwd=cwd,
        start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    output = bytearray()
    start = time.monotonic()
    pending = list(keys)
    deadline = start + (keys[-1][0] if keys else 0) + 30
    try:
        while time.monotonic() < deadline:
            if pending and time.monotonic() - start >= pending[0][0]:
                os.write(master, pending.pop(0)[1])
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                output += chunk
                if b"\x1b[?2026$p" in chunk:  # say the terminal has synchronized output
                    os.write(master, b"\x1b[?2026;2$y")
            elif not pending and child.poll() is not None:
                break
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(10)
        os.close(master)
    screen = pyte.Screen(columns, rows)
    pyte.ByteStream(screen).feed(bytes(output))
    return bytes(output), screen
