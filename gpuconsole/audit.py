"""The audit log: one JSON line per action the console ran, in the XDG state directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import platformdirs

AUDIT_ENV = "GPUCONSOLE_AUDIT_LOG"


def audit_path() -> Path:
    """`$GPUCONSOLE_AUDIT_LOG`, else `<XDG state dir>/gpuconsole/audit.jsonl`."""
    override = os.environ.get(AUDIT_ENV)
    if override:
        return Path(override)
    return Path(platformdirs.user_state_dir("gpuconsole")) / "audit.jsonl"


def record(action: str, **details: Any) -> None:
    """Append one entry; the log is append-only so nothing earlier is ever rewritten."""
    path = audit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"time": time.time(), "user": _user(), "action": action, **details}
    with path.open("a", encoding="utf-8") as log:
        log.write(json.dumps(entry, sort_keys=True) + "\n")


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
