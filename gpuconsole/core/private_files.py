"""Files that say what hosts ran and who ran it are the user's alone: 0600 in folders made 0700.

The audit log, recordings and incident bundles are made this way (the XDG base directory spec asks
0700 of the folders an application creates). Folders that were there already keep the mode their
owner chose; `narrow` takes group and other bits away from the console's own where an older
version left them wider.
"""

from __future__ import annotations

import contextlib
import stat
from pathlib import Path

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def make_private_dirs(folder: Path) -> None:
    """``folder`` and its missing parents, each created 0700 (`Path.mkdir` would give the parents
    the umask's default, 0755)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for level in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile, by someone else: theirs
            level.mkdir(mode=PRIVATE_DIR_MODE)


def narrow(path: Path, mode: int) -> None:
    """Take away from ``path`` what ``mode`` does not allow."""
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode:
        path.chmod(current & mode)
