"""`gpuconsole ARGS` as a user runs it: the console's command line in a subprocess of this
Python (``python -m gpuconsole``), from the repository's root, with no terminal.

The one home of what the test files each had a copy of: `gpuconsole` runs a command to its end,
`start_gpuconsole` starts one the test talks to and ends, and `GPUCONSOLE` is the command line
for a runner of its own (a pseudo-terminal, a line for a README)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root, where the commands run unless a test says otherwise."""

GPUCONSOLE: tuple[str, ...] = (sys.executable, "-m", "gpuconsole")
"""The console's command line, as this test run's Python runs it."""

File = int | IO[Any] | None
"""What `subprocess` takes for a standard stream: PIPE, DEVNULL, a descriptor, a file or None
(the test's own)."""


def gpuconsole(
    *args: str,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    stdin: File = subprocess.DEVNULL,
    stdout: File = subprocess.PIPE,
    stderr: File = subprocess.PIPE,
    timeout: float = 120,
    cwd: Path | str = ROOT,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``gpuconsole ARGS`` to its end; what it wrote (text) and its exit status, which is
    returned whatever it is, never raised.

    ``env`` is its whole environment (by default this process's, with the XDG folders
    tests/conftest.py points at the test's temporary folder). Its standard input is ``input``
    when given, else ``stdin``: /dev/null, so that no full-screen UI opens and nothing waits on a
    terminal. Standard output and error are captured unless ``stdout``/``stderr`` name another
    place. ``preexec_fn`` runs in the child before the console starts (to drop a capability,
    close a stream)."""
    return subprocess.run(
        [*GPUCONSOLE, *args],
        cwd=cwd,
        env=env,
        input=input,
        stdin=None if input is not None else stdin,
        stdout=stdout,
        stderr=stderr,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=preexec_fn,
    )


def start_gpuconsole(
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: File = subprocess.DEVNULL,
    stdout: File = subprocess.PIPE,
    stderr: File = subprocess.PIPE,
    cwd: Path | str = ROOT,
) -> subprocess.Popen[str]:
    """Start ``gpuconsole ARGS`` and return it running, its pipes text. Python's output is
    unbuffered (``PYTHONUNBUFFERED=1`` over ``env``, by default this process's environment), so
    that each line it says arrives when said. The caller waits for it or ends it."""
    return subprocess.Popen(
        [*GPUCONSOLE, *args],
        cwd=cwd,
        env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=True,
    )
