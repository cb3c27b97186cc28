"""The command line, run as a user runs it: version, help, and one-line errors for bad values."""

from __future__ import annotations

import subprocess

import pytest
from cli_runner import gpuconsole, start_gpuconsole

from gpuconsole import __version__


def test_version() -> None:
    result = gpuconsole("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"gpuconsole {__version__}"
    assert __version__.count(".") >= 1


def test_help_mentions_the_main_options() -> None:
    result = gpuconsole("--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: gpuconsole")
    assert "--demo" in result.stdout
    assert "--refresh" in result.stdout
    assert "--theme" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "bad", "option"),
    [
        (("--refresh", "0"), "'0'", "--refresh"),
        (("--refresh", "abc"), "'abc'", "--refresh"),
        (("--refresh", "-1"), "'-1'", "--refresh"),
        (("--refresh", "inf"), "'inf'", "--refresh"),
        (("--demo-hosts", "0"), "'0'", "--demo-hosts"),
        (("--demo-hosts", "two"), "'two'", "--demo-hosts"),
        (("--theme", "nope"), "'nope'", "theme"),
        (("--demo", "--theme", "nope"), "'nope'", "theme"),
    ],
)
def test_bad_value_exits_2_with_one_line_error(
    args: tuple[str, ...], bad: str, option: str
) -> None:
    result = gpuconsole(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("gpuconsole:")]
    assert len(errors) == 1, result.stderr
    (error,) = errors
    assert bad in error
    assert option in error
    assert result.stderr.rstrip("\n").endswith(error)  # the error is the last thing said


def test_ctrl_c_is_one_line_not_a_traceback() -> None:
    import signal
    import time

    # waits on a stdin that stays open
    child = start_gpuconsole("oom", "-", stdin=subprocess.PIPE, stdout=None)
    try:
        time.sleep(2)  # past the start, into the read
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 130
    assert err.strip() == "gpuconsole: interrupted"
