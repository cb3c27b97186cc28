"""Writing the bundle's tar.gz: all of it or nothing, and never over an existing file.

The archive is written to a temporary file beside the target and linked into place, which fails
when the target exists (also when it appeared meanwhile): nothing the user had is replaced.

A bundle tells about hosts, their users and their processes: it is private. The archive is made
0600 (as `tempfile.mkstemp` makes its file), its members say 0600 (what `tar` gives them when it
unpacks them), and the folders created for it are 0700.

Every file is text a person reads with `cat`, and much of it comes from the host (its kernel log,
nvidia-smi's output, a check's evidence): each holds no control character but the newlines and
tabs that lay it out. The others are written as visible stand-ins (`printable`), so an escape
sequence in the host's kernel log neither retitles nor clears the terminal that shows the file.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from gpuconsole.core import paths
from gpuconsole.core.private_files import PRIVATE_FILE_MODE, make_private_dirs
from gpuconsole.core.untrusted import UNSAFE, stand_in

_RAW = re.compile(rf"(?![\t\n]){UNSAFE.pattern}")
"""What a file may not hold as it is: what text from outside may not (`UNSAFE`), but the
newlines and tabs that lay a text file out."""


class BundleError(Exception):
    """The bundle cannot be written; the message is one line that names the file."""


def bundle_path(output: Path | None, name: str) -> Path:
    """Where to write: ``output`` itself when it names a ``.tar.gz`` (or ``.tgz``) file, which
    must not exist; else ``name`` in the folder ``output`` (default: the bundle folder), with a
    number added when that name is taken."""
    if output is not None and output.name.endswith((".tar.gz", ".tgz")):
        if output.exists():
            raise BundleError(f"{output}: exists; a bundle never replaces a file")
        return output
    folder = output or paths.BUNDLES.path()
    candidate = folder / f"{name}.tar.gz"
    number = 2
    while candidate.exists():
        candidate = folder / f"{name}-{number}.tar.gz"
        number += 1
    return candidate


def printable(text: str) -> str:
    """``text`` as a file of the bundle holds it: its newlines and tabs as they are, every other
    control character a visible stand-in (``\\x1b`` as ``␛``, a carriage return as ``␍``)."""
    return _RAW.sub(stand_in, text)


def write_archive(path: Path, root: str, files: Mapping[str, str], mtime: float) -> None:
    """A tar.gz at ``path`` holding ``root/NAME`` for every file, in order, each `printable`
    (a lone surrogate, which JSON can carry, written as ``\\ud800``)."""
    try:
        make_private_dirs(path.parent)
        handle, temporary = tempfile.mkstemp(prefix=".bundle-", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise BundleError(f"{path}: cannot write: {error.strerror or error}") from None
    try:
        with os.fdopen(handle, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name, text in files.items():
                data = printable(text).encode("utf-8", "backslashreplace")
                member = tarfile.TarInfo(f"{root}/{name}")
                member.size = len(data)
                member.mtime = int(mtime)
                member.mode = PRIVATE_FILE_MODE
                tar.addfile(member, io.BytesIO(data))
        os.link(temporary, path)
    except FileExistsError:
        raise BundleError(f"{path}: exists; a bundle never replaces a file") from None
    except OSError as error:
        raise BundleError(f"{path}: cannot write: {error.strerror or error}") from None
    finally:
        os.unlink(temporary)
