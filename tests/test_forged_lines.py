"""A file's name is whatever its sender chose: `triage` prints it as part of its own lines, never
as lines of its choosing (a newline), a control sequence, or a raw byte that is not UTF-8."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from gpuconsole.cli.commands import exits
from gpuconsole.cli.main import main
from gpuconsole.core.untrusted import UNSAFE

DUMP = Path(__file__).parent / "fixtures" / "nvidia-smi" / "h200-q-loaded.xml"
PROPERTY = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
NAMES = st.binary(min_size=1, max_size=120).filter(
    lambda name: b"\0" not in name and b"/" not in name and name not in (b".", b"..")
)
"""Any file name Linux allows: bytes but NUL and '/'."""


def clean(text: str) -> None:
    """Text a terminal shows as it is: no control or bidirectional character but the newlines
    that end the console's own lines, and nothing that is not UTF-8."""
    text.encode("utf-8")  # a lone surrogate (a byte that was not UTF-8) raises
    assert not UNSAFE.search(text.replace("\n", "")), ascii(text)  # C0, C1, bidi, U+2028/9


def triage(path: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["triage", "--from", path])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return os.fsencode(tmp_path_factory.mktemp("names"))


@PROPERTY
@given(name=NAMES)
@example(name=b"x\nFAKE LINE")
@example(name=b"\x1b]0;pwned\x07\xc2\x9b\xe2\x80\xa8\x9b.xml")
def test_a_missing_dump_is_one_line_whatever_its_name(
    name: bytes, folder: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.fsdecode(os.path.join(folder, b"missing", name))  # as Python gives it from argv
    code, out, err = triage(path, capsys)
    assert (code, out) == (3, "")
    lines = err.splitlines()
    assert len(lines) == 1, ascii(err)
    assert lines[0].startswith("gpuconsole: ") and lines[0].endswith(
        ": No such file or directory"
    ), ascii(err)
    clean(err)


@pytest.fixture(scope="module")
def plain(folder: bytes) -> list[str]:
    """What triage prints of the dump under a plain name, line by line."""
    path = os.fsdecode(os.path.join(folder, b"plain.xml"))
    shutil.copyfile(DUMP, path)
    done = gpuconsole("triage", "--from", path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{path}: 1 GPUs, driver 580.159.04"
    return lines


@PROPERTY
@given(name=NAMES)
@example(name=b"gpu01\ninfo  GPU 0  all clear.xml")
@example(name=b"\x1b]0;pwned\x07\xc2\x9b\xe2\x80\xa8\x9b.xml")
def test_a_dump_prints_the_same_lines_whatever_its_name(
    name: bytes, folder: bytes, plain: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assume(name != b"plain.xml")
    raw = os.path.join(folder, name)
    shutil.copyfile(DUMP, raw)
    try:
        code, out, err = triage(os.fsdecode(raw), capsys)
    finally:
        os.unlink(raw)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == len(plain), ascii(out)
    assert lines[0].endswith(": 1 GPUs, driver 580.159.04"), ascii(lines[0])
    assert lines[1:] == plain[1:]
    clean(out)


def test_the_issues_name_forges_no_line() -> None:
    """`gpuconsole triage --from "$(printf 'x\\nFAKE LINE')"`, as the red team ran it."""
    done = gpuconsole("triage", "--from", "x\nFAKE LINE")
    assert done.returncode == 3
    assert done.stderr == "gpuconsole: x␊FAKE LINE: No such file or directory\n"


@given(st.text(max_size=200))
def test_a_refusal_is_one_printable_line_whatever_it_quotes(text: str) -> None:
    """`fail` is where every refusal is printed: whatever it quotes, it prints one line."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        assert exits.fail(f"cannot read {text}", 3) == 3
    printed = stderr.getvalue()
    assert printed.endswith("\n") and printed.count("\n") == 1
    assert not UNSAFE.search(printed[:-1])
