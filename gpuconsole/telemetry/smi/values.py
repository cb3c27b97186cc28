"""The value helpers every nvidia-smi parser shares: what reads as missing, numbers, whole
numbers, flags, NVML codes, the clock-event reason bits, a process row, `SmiParseError`, and the
bounds on what a parser reads."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from gpuconsole.core.model import THROTTLE_REASON_BITS, GpuProcess

T = TypeVar("T")


class SmiParseError(ValueError):
    """nvidia-smi output that cannot be read; the message is one line that says what is wrong."""


# --- bounds --------------------------------------------------------------------------------------
# What the parsers read comes from watched hosts and from files attached to tickets: anyone's. A
# real `nvidia-smi -q -x` is 27 KB and ~560 elements per GPU (the H200's, driver 580, in
# tests/fixtures/nvidia-smi/), so ~220 KB and ~4,500 elements for 8 GPUs. Without bounds a
# crafted input costs ~60 MiB of memory per MiB parsed (a flat run of `<a/>` or `a : b` lines).

MAX_OUTPUT_SIZE = 8 << 20
"""The most output a parser takes: characters of text, bytes of a dump file (~38 times an 8-GPU
dump)."""
MAX_ENTRIES = 200_000
"""The most entries a parser builds: elements of XML, lines of ``-q`` text, CSV or ``topo -m``
rows (~44 times an 8-GPU dump)."""
MAX_DEPTH = 32
"""The deepest nesting a dump may have: nvidia-smi's is 6 levels, and its tree is walked
recursively."""


def check_size(text: str, what: str) -> None:
    """SmiParseError when ``text`` is larger than a parser takes."""
    if len(text) > MAX_OUTPUT_SIZE:
        raise SmiParseError(
            f"{what} is {size_text(len(text))}, more than the {size_text(MAX_OUTPUT_SIZE)} "
            "nvidia-smi output may be"
        )


def size_text(size: int) -> str:
    """A size for a message: "812 bytes", "8.0 MiB", "1.0 GiB"."""
    if size < 1 << 10:
        return f"{size} bytes"
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size / 1024:.1f} KiB"


# --- values --------------------------------------------------------------------------------------

# What nvidia-smi prints where it has no value (brackets stripped, case folded): the field is N/A,
# and no bad value. Anything else that does not read is N/A too, with a bad-value note.
_MISSING = frozenset(
    {
        "",
        "n/a",
        "not supported",
        "unknown error",
        "gpu is lost",
        "insufficient permissions",
        "not found",
        "not available",
        "not available in wddm driver model",
        # drivers 590 and later under Applications Clocks (and telegraf's v13 XML of earlier ones)
        "requested functionality has been deprecated",
    }
)
_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)\s*[A-Za-z%/()]*")
_FLAGS = {
    "enabled": True,
    "disabled": False,
    "yes": True,
    "no": False,
    "active": True,
    "not active": False,
}


def _folded(text: str) -> str:
    return text.strip().strip("[]").strip().casefold()


def _missing(text: str | None) -> bool:
    return text is None or _folded(text) in _MISSING


def _text(text: str | None) -> str | None:
    return None if text is None or _missing(text) else text.strip()


def _number(text: str | None) -> float | None:
    """``"700.00 W"``, ``"45 %"``, ``"16x"``, ``"-2 C"`` -> the number; "N/A" and kin -> None."""
    if text is None or _missing(text):
        return None
    match = _NUMBER.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text.strip()!r} is not a number")
    return float(match.group(1))


def _integer(text: str | None) -> int | None:
    value = _number(text)
    if value is None:
        return None
    if not value.is_integer():
        raise ValueError(f"{text!r} is not a whole number")
    return int(value)


def _flag(text: str | None) -> bool | None:
    if text is None or _missing(text):
        return None
    try:
        return _FLAGS[_folded(text)]
    except KeyError:
        raise ValueError(f"{text.strip()!r} is neither enabled nor disabled") from None


def _kebab(text: str | None) -> str | None:
    """NVML's recovery action as a code: "None" -> ``none``, "Drain P2P" -> ``drain-p2p``."""
    value = _text(text)
    return None if value is None else re.sub(r"[\s_]+", "-", value.casefold())


def _reason_mask(text: str | None) -> tuple[str, ...] | None:
    if text is None or _missing(text):
        return None
    try:
        mask = int(text.strip(), 0)
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a bit mask") from None
    return tuple(code for bit, code in THROTTLE_REASON_BITS.items() if mask & bit)


# --- processes, as the dumps and --query-compute-apps both list them -------------------------

_PROCESS_KINDS = {"C": "compute", "G": "graphics", "C+G": "compute+graphics"}


def _process_kind(text: str | None) -> str:
    """nvidia-smi's C / G / C+G as words; a process of no stated type is a compute one."""
    kind = _text(text)
    return "compute" if kind is None else _PROCESS_KINDS.get(kind, kind.casefold())


def _process(
    gpu: int,
    pid: str | None,
    kind: str | None,
    name: str | None,
    used: str | None,
    gi: str | None,
    notes: list[str],
) -> GpuProcess | None:
    """A process row; None, with a note, where its pid is not one (it cannot be told apart from
    another), and its memory or GPU instance N/A, with a note, where they are not numbers."""

    def read(text: str | None, parser: Callable[[str | None], T], where: str) -> T | None:
        try:
            return parser(text)
        except ValueError as error:
            notes.append(f"GPU {gpu} process {pid!r} {where}: {error}")
            return None

    try:
        number = _integer(pid)
    except ValueError:
        number = None
    if number is None:
        notes.append(f"GPU {gpu} process {pid!r}: no process id")
        return None
    return GpuProcess(
        pid=number,
        gpu=gpu,
        used_memory_mib=read(used, _number, "used memory"),
        command=_text(name),
        kind=_process_kind(kind),
        mig_instance=read(gi, _integer, "GPU instance ID"),
    )
