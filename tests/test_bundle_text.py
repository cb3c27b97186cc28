"""The incident bundle's files are text a person reads with `cat`: whatever the host printed
(its kernel log's escapes, a hostile process's output in a check's evidence), no file holds a
raw control character other than the newlines and tabs of its own layout; the rest show as
visible stand-ins, so `cat verification.txt` neither retitles nor clears the terminal."""

from __future__ import annotations

import asyncio
import contextlib
import re
import tarfile
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuconsole.actions.bundle import make
from gpuconsole.actions.bundle.contents import BundleInputs
from gpuconsole.actions.bundle.gather import KERNEL_LOG_COMMAND
from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.session import HostShell
from gpuconsole.hosts.targets import Context, Target

RAW = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
"""What no file of a bundle may hold: control characters but newline and tab, and the
bidirectional overrides and line separators `gpuconsole.core.untrusted` makes visible."""
HOSTILE = (
    "NVRM: Xid (PCI:0000:28:00): 79\x1b]0;owned by the host\x07\x1b[2J\x1b[3J\x1b[H"
    "\rgpuconsole: all GPUs healthy\x9b31m\u202eevil\x00\x08\tcolumn\n"
)
"""A kernel-log line as a hostile host writes it: a new terminal title, a cleared screen and
scrollback, a carriage return over the line, a C1 CSI, a right-to-left override."""

Answer = Callable[[str], CommandOutput]


class HostileShell:
    """A host's shell whose every command prints what ``answer`` says."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    async def run(self, command: str, timeout: float) -> CommandOutput:
        return self.answer(command)

    async def stream(
        self, command: str, timeout: float, on_line: Callable[[str], None]
    ) -> CommandOutput:
        output = self.answer(command)
        for line in output.stdout.splitlines():
            on_line(line)
        return output


def use_shell(monkeypatch: pytest.MonkeyPatch, shell: HostileShell) -> None:
    @contextlib.asynccontextmanager
    async def open_shell(target: Target, action: str, settings: object) -> AsyncIterator[HostShell]:
        yield HostShell(target.name, action, shell)

    monkeypatch.setattr(make, "open_shell", open_shell)


def bundle_files(folder: Path, note: str = "a note") -> dict[str, str]:
    """Make a bundle of gpu-test into ``folder``, ``note`` among what it says is missing; its
    files by name."""
    inputs = BundleInputs("gpu-test", 1_767_226_500.0, "a test", notes=(note,))
    target = Target("gpu-test", None, Context("gpu-test", 8))
    result = asyncio.run(make.make_bundle(inputs, target, folder))
    with tarfile.open(result.path) as tar:
        return {
            member.name.split("/", 1)[1]: tar.extractfile(member).read().decode()  # type: ignore[union-attr]
            for member in tar.getmembers()
        }


def hostile_answer(text: str) -> Answer:
    """The kernel log and nvidia-smi print ``text`` and succeed; every other command prints it
    on both outputs and fails, so the checks show it as their evidence."""

    def answer(command: str) -> CommandOutput:
        if command == KERNEL_LOG_COMMAND or "nvidia-smi -q" in command:
            return CommandOutput(command, 0, text, "")
        return CommandOutput(command, 1, text, text)

    return answer


def test_a_hostile_kernel_log_and_evidence_show_visible_in_every_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_shell(monkeypatch, HostileShell(hostile_answer("# source: dmesg\n" + HOSTILE * 3)))
    files = bundle_files(tmp_path)
    assert {"verification.txt", "kernel-log.txt", "summary.md"} <= files.keys()
    for name, text in files.items():
        assert not RAW.search(text), (name, RAW.findall(text))
    # Made visible, not dropped: the admin sees what the host tried, on the lines it came in.
    assert (
        "79␛]0;owned by the host␇␛[2J␛[3J␛[H␍gpuconsole: all GPUs healthy\\x9b31m"
        in (files["verification.txt"])
    )
    log = files["kernel-log.txt"]
    assert log.count("\n") == 4 and log.count("\t") == 3
    assert log.splitlines()[1].startswith("NVRM: Xid (PCI:0000:28:00): 79␛]0;owned")


def test_what_was_not_collected_is_one_visible_line_each(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The notes say what the host said when a command failed; `gpuconsole bundle` prints
    each as a line of its own, and summary.md lists each as one item."""

    def answer(command: str) -> CommandOutput:
        if command == KERNEL_LOG_COMMAND:
            return CommandOutput(command, 77, "", HOSTILE * 2)
        if "nvidia-smi -q" in command:
            return CommandOutput(command, None, "", HOSTILE)  # timed out
        return CommandOutput(command, 0, "", "")

    use_shell(monkeypatch, HostileShell(answer))
    inputs = BundleInputs("gpu-test", 1_767_226_500.0, "a test")
    target = Target("gpu-test", None, Context("gpu-test", 8))
    result = asyncio.run(make.make_bundle(inputs, target, tmp_path))
    assert len(result.notes) == 2
    for note in result.notes:
        assert not RAW.search(note) and "\n" not in note and "\t" not in note, note
    assert result.notes[1].startswith("kernel log: not readable by this user (NVRM: Xid")
    assert "␛]0;owned by the host␇" in result.notes[1]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=st.text(max_size=200))
def test_any_text_from_outside_leaves_no_control_character_in_any_file(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Printed by the host, or brought by a recording (a note of what is missing), even a lone
    surrogate that JSON can carry."""
    use_shell(monkeypatch, HostileShell(hostile_answer(text)))
    with tempfile.TemporaryDirectory() as folder:
        files = bundle_files(Path(folder), note=text)
    for name, written in files.items():
        assert not RAW.search(written), (name, RAW.findall(written))
