"""The audit log: one JSON line per action the console ran, in the XDG state directory.

What was run on which host, by whom, is for the user alone: the log is 0600 in directories the
console creates 0700 (as the XDG base directory spec asks of the directories it creates). Its own
state directory and log are narrowed to those modes where an older version left them wider; a
log named by $GPUCONSOLE_AUDIT_LOG keeps the mode its owner gave it, and is created 0600.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from gpuconsole.core import paths
from gpuconsole.core.private_files import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    make_private_dirs,
    narrow,
)


def record(action: str, **details: Any) -> None:
    """Append one entry; the log is append-only so nothing earlier is ever rewritten."""
    path = paths.AUDIT_LOG.path()
    own = path == paths.AUDIT_LOG.default()
    make_private_dirs(path.parent)
    if own:
        narrow(path.parent, PRIVATE_DIR_MODE)
    entry = {"time": time.time(), "user": _user(), "action": action, **details}
    descriptor = os.open(
        path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE
    )
    with os.fdopen(descriptor, "a", encoding="utf-8") as log:
        if own:
            narrow(path, PRIVATE_FILE_MODE)
        log.write(json.dumps(entry, sort_keys=True) + "\n")


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
