"""XID errors read from kernel log text.

The lines follow the driver's documented form (``NVRM: Xid (PCI:0000:3b:00): 79, pid=...,
GPU has fallen off the bus.``, see shared/reference/gpu-facts.md) under the time prefixes of
``journalctl -o short-unix``, ``dmesg --time-format iso`` and plain ``dmesg``; they are written
from those formats, not captured.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import psutil
import pytest

from gpuconsole.core.model import XidEvent
from gpuconsole.telemetry import kernel_log
from gpuconsole.telemetry.kernel_log import parse_xid_lines, pci_address, read_kernel_xids

EPOCH = 1_767_225_600.0  # 2026-01-01 00:00 UTC
BUS = {"00000000:3B:00.0": 0, "00000000:86:00.0": 1}


def test_journalctl_short_unix() -> None:
    text = (
        "1767225600.123456 gpu01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, "
        "name=python, GPU has fallen off the bus.\n"
    )
    assert parse_xid_lines(text, BUS) == [
        XidEvent(
            xid=79,
            gpu=0,
            time=1767225600.123456,
            message="pid=1234, name=python, GPU has fallen off the bus.",
        )
    ]


@pytest.mark.parametrize(
    ("stamp", "time"),
    [
        ("2026-01-01T00:00:05,250000+00:00", EPOCH + 5.25),
        ("2026-01-01T01:00:05,250000+01:00", EPOCH + 5.25),
        ("2026-01-01T00:00:05+00:00", EPOCH + 5.0),
    ],
)
def test_dmesg_iso(stamp: str, time: float) -> None:
    text = f"{stamp} NVRM: Xid (PCI:0000:86:00): 48, pid=77, name=train, DBE (double bit error)\n"
    (event,) = parse_xid_lines(text, BUS)
    assert (event.xid, event.gpu, event.message) == (
        48,
        1,
        "pid=77, name=train, DBE (double bit error)",
    )
    assert event.time == pytest.approx(time)


def test_plain_dmesg_counts_from_boot_time() -> None:
    text = "[  123.456789] NVRM: Xid (PCI:0000:3b:00): 13, pid=9, name=a.out, Graphics Exception\n"
    (event,) = parse_xid_lines(text, BUS, boot_time=EPOCH)
    assert event.time == pytest.approx(EPOCH + 123.456789)
    assert (event.xid, event.gpu) == (13, 0)


def test_a_line_of_unknown_time_is_stamped_with_the_read_time() -> None:
    text = "[  123.456789] NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception\n"
    assert parse_xid_lines(text, BUS, now=42.0)[0].time == 42.0
    human = "[Thu Jan  1 00:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 31, MMU Fault\n"
    assert parse_xid_lines(human, BUS, now=42.0)[0].time == 42.0


@pytest.mark.parametrize(
    "pci",
    ["PCI:0000:3b:00", "PCI:0000:3B:00", "PCI:00000000:3b:00", "PCI:0000:3b:00.0", "0000:3b:00"],
)
def test_bus_ids_match_whatever_their_case_and_domain_width(pci: str) -> None:
    text = f"1767225600.0 h kernel: NVRM: Xid ({pci}): 79, GPU has fallen off the bus.\n"
    assert [event.gpu for event in parse_xid_lines(text, BUS)] == [0]


def test_bus_keys_match_in_any_spelling() -> None:
    text = "1767225600.0 h kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    assert parse_xid_lines(text, {"0000:3b:00.0": 5})[0].gpu == 5


@pytest.mark.parametrize("pci", ["PCI:0000:af:00", "PCI:0001:3b:00"])
def test_an_unknown_bus_gives_no_gpu(pci: str) -> None:
    text = f"1767225600.0 h kernel: NVRM: Xid ({pci}): 94, Contained: SM (0x1).\n"
    (event,) = parse_xid_lines(text, BUS)
    assert (event.xid, event.gpu) == (94, None)


def test_other_lines_are_skipped() -> None:
    text = "\n".join(
        [
            "[    4.100000] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04",
            "[    5.000000] NVRM: GPU at PCI:0000:3b:00: GPU-5c9f3e1a-0000-0000-0000-000000000000",
            "[    6.000000] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x23:0x65:1426)",
            "[    7.000000] nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver",
            "[    8.000000] a user program printed Xid (PCI:0000:3b:00): 79 on the console",
            "[    9.000000] NVRM: Xid (PCI:zz:zz): 79, not an address",
            "[   10.000000] NVRM: Xid (PCI:0000:3b:00): seventy-nine",
            "\x00\x01\x02 binary garbage \xff",
            "",
            "[   11.000000] NVRM: Xid (PCI:0000:3b:00): 31, pid=5, name=x, MMU Fault",
        ]
    )
    events = parse_xid_lines(text, BUS, boot_time=EPOCH)
    assert [(e.xid, e.gpu, e.time) for e in events] == [(31, 0, EPOCH + 11.0)]


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("00000000:3B:00.0", (0, 0x3B, 0)),
        ("0000:3b:00", (0, 0x3B, 0)),
        ("3b:00", (0, 0x3B, 0)),
        ("10000:01:00.0", (0x10000, 1, 0)),
        ("zz", None),
        ("", None),
    ],
)
def test_pci_address(text: str, address: tuple[int, int, int] | None) -> None:
    assert pci_address(text) == address


class FakeRun:
    """Stands in for subprocess.run: answers per program, records what was asked."""

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers
        self.asked: list[Sequence[str]] = []

    def __call__(self, command: Sequence[str], **_: object) -> subprocess.CompletedProcess[str]:
        self.asked.append(command)
        answer = self.answers.get(command[0] if command[0] != "dmesg" else " ".join(command))
        if isinstance(answer, BaseException):
            raise answer
        if answer is None:
            raise FileNotFoundError(command[0])
        code, stdout, stderr = answer  # type: ignore[misc]
        return subprocess.CompletedProcess(command, code, stdout, stderr)


LINE = "1767225600.5 h kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
ISO_LINE = "2026-01-01T00:00:00,500000+00:00 NVRM: Xid (PCI:0000:86:00): 48, DBE\n"


def test_read_kernel_xids_prefers_the_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRun({"journalctl": (0, LINE, "")})
    monkeypatch.setattr(kernel_log.subprocess, "run", run)
    assert [(e.xid, e.gpu) for e in read_kernel_xids(BUS)] == [(79, 0)]
    assert run.asked[0][:4] == ("journalctl", "-k", "-o", "short-unix")


@pytest.mark.parametrize(
    "journal",
    [
        None,  # not installed
        (1, "", "Failed to compile pattern: compiled without pattern matching support"),
        (0, "", "No journal files were opened due to insufficient permissions."),
        subprocess.TimeoutExpired("journalctl", 5),
    ],
)
def test_read_kernel_xids_falls_back_to_dmesg(
    monkeypatch: pytest.MonkeyPatch, journal: object
) -> None:
    run = FakeRun({"journalctl": journal, "dmesg --time-format iso": (0, ISO_LINE, "")})
    monkeypatch.setattr(kernel_log.subprocess, "run", run)
    assert [(e.xid, e.gpu, e.time) for e in read_kernel_xids(BUS)] == [(48, 1, EPOCH + 0.5)]


def test_read_kernel_xids_falls_back_to_plain_dmesg(monkeypatch: pytest.MonkeyPatch) -> None:
    busybox = (1, "", "dmesg: unrecognized option '--time-format'")
    plain = (0, "[   10.000000] NVRM: Xid (PCI:0000:3b:00): 63, Row Remapper\n", "")
    run = FakeRun({"dmesg --time-format iso": busybox, "dmesg": plain})
    monkeypatch.setattr(kernel_log.subprocess, "run", run)
    monkeypatch.setattr(psutil, "boot_time", lambda: EPOCH)
    assert [(e.xid, e.time) for e in read_kernel_xids(BUS)] == [(63, EPOCH + 10.0)]


def test_read_kernel_xids_gives_nothing_when_nothing_can_be_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    denied = (1, "", "dmesg: read kernel buffer failed: Operation not permitted")
    run = FakeRun(
        {
            "journalctl": PermissionError("journalctl"),
            "dmesg --time-format iso": denied,
            "dmesg": denied,
        }
    )
    monkeypatch.setattr(kernel_log.subprocess, "run", run)
    assert read_kernel_xids(BUS) == []
    assert len(run.asked) == 3


def test_read_kernel_xids_without_any_tool(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert read_kernel_xids(BUS) == []
