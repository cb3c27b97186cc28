"""XID errors read from the kernel log, where the driver writes every one of them.

The driver logs ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the
bus.``; this reads such lines as ``journalctl -k -o short-unix`` (epoch seconds first),
``dmesg --time-format iso`` (an ISO 8601 time first) and plain ``dmesg`` (``[  123.456]``, seconds
since boot) print them. NVML's XID events cover only the XIDs raised while a watcher listens; the
kernel log also holds those from before, since boot.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import datetime

from gpuconsole.core.model import XidEvent

PciAddress = tuple[int, int, int]
"""(domain, bus, device) of a PCI function, as numbers: spellings differ in case and width."""

_PCI = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})"
    r"(?:\.[0-7])?$"
)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)(?:,\s*(?P<message>.*?))?\s*$"
)
_EPOCH = re.compile(r"^\s*(?P<seconds>\d{9,}(?:\.\d+)?)\s")
_ISO = re.compile(r"^\s*(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s")
_SINCE_BOOT = re.compile(r"\[\s*(?P<seconds>\d+\.\d+)\]")

COMMAND_TIMEOUT_S = 5.0
# Tried in order until one runs: the journal keeps more than the kernel's ring buffer does.
_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("journalctl", "-k", "-o", "short-unix", "--no-pager", "-q", "-g", "Xid"),
    ("dmesg", "--time-format", "iso"),
    ("dmesg",),
)


def pci_address(bus_id: str) -> PciAddress | None:
    """``00000000:3B:00.0`` (NVML), ``0000:3b:00`` (kernel log) or ``3b:00`` -> (0, 0x3B, 0)."""
    match = _PCI.match(bus_id.strip())
    if not match:
        return None
    return (int(match["domain"] or "0", 16), int(match["bus"], 16), int(match["device"], 16))


def _line_time(line: str, boot_time: float | None) -> float | None:
    """When the line was logged, in epoch seconds; None when the line does not say."""
    if match := _EPOCH.match(line):
        return float(match["seconds"])
    if match := _ISO.match(line):
        try:
            return datetime.fromisoformat(match["iso"].replace(",", ".")).timestamp()
        except ValueError:
            return None
    if boot_time is not None and (match := _SINCE_BOOT.search(line)):
        return boot_time + float(match["seconds"])
    return None


def parse_xid_lines(
    text: str,
    bus_to_gpu: Mapping[str, int],
    boot_time: float | None = None,
    now: float | None = None,
) -> list[XidEvent]:
    """The XID events in kernel log text, oldest first; every other line is skipped.

    ``bus_to_gpu`` maps NVML bus ids (``00000000:3B:00.0``) to GPU indices; a line's PCI address
    is matched on domain, bus and device as numbers, so case and domain width do not matter. An
    address no GPU has gives ``gpu=None``. A ``[seconds since boot]`` stamp needs ``boot_time``;
    a line whose time cannot be told (also ``dmesg -T``'s) is stamped ``now`` (default: the time
    of the call), since `XidEvent.time` is always a number.
    """
    gpus = {address: index for bus, index in bus_to_gpu.items() if (address := pci_address(bus))}
    read_at = time.time() if now is None else now
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if not match:
            continue
        address = pci_address(match["pci"])
        stamp = _line_time(line, boot_time)
        events.append(
            XidEvent(
                xid=int(match["xid"]),
                gpu=gpus.get(address) if address else None,
                time=read_at if stamp is None else stamp,
                message=match["message"] or "",
            )
        )
    return events


def _run(command: Sequence[str]) -> str | None:
    """The command's output when it ran and exited 0 with nothing on stderr, else None.

    journalctl run by a user outside the ``adm``/``systemd-journal`` groups exits 0 but says on
    stderr that it could not open the journal: then ``dmesg`` may still work.
    """
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0 or result.stderr.strip():
        return None
    return result.stdout


def read_kernel_xids(bus_to_gpu: Mapping[str, int]) -> list[XidEvent]:
    """This boot's XID events from the journal, else from ``dmesg``; [] when neither can be read
    (no permission, no such tool). Never raises."""
    import psutil  # here: the NVML source is made at the console's start, this runs on a reading

    for command in _COMMANDS:
        output = _run(command)
        if output is not None:
            return parse_xid_lines(output, bus_to_gpu, boot_time=psutil.boot_time())
    return []
