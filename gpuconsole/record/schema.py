"""The recording file: one SQLite database in WAL mode, its tables, and opening it safely.

A file that is not a recording (or a recording of a newer format) is refused with one line that
names it, and is never written to: creating a recording never replaces an existing file.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import platformdirs

from gpuconsole.record import codec

FORMAT = "gpuconsole-recording"
VERSION = 1
RECORDING_ENV = "GPUCONSOLE_RECORDING"
BUSY_TIMEOUT_MS = 5000

_TABLES = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE hosts (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE readings (
    host INTEGER NOT NULL,
    t INTEGER NOT NULL,
    key INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (host, t)
) WITHOUT ROWID;
CREATE TABLE states (
    host INTEGER NOT NULL,
    t INTEGER NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    PRIMARY KEY (host, t)
) WITHOUT ROWID;
CREATE TABLE episodes (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    ident TEXT NOT NULL,
    host TEXT NOT NULL,
    gpu INTEGER,
    code TEXT NOT NULL,
    severity INTEGER NOT NULL,
    message TEXT NOT NULL,
    remediation TEXT NOT NULL,
    since REAL NOT NULL,
    until REAL,
    labels TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX episodes_since ON episodes (since);
CREATE INDEX episodes_onsets ON episodes (severity, since);
CREATE TABLE actions (
    id INTEGER PRIMARY KEY,
    t REAL NOT NULL,
    host TEXT,
    action TEXT,
    entry TEXT NOT NULL
);
CREATE INDEX actions_t ON actions (t);
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY,
    started REAL NOT NULL,
    last REAL,
    ended REAL,
    label TEXT NOT NULL DEFAULT '',
    pid INTEGER
);
"""


class RecordingError(Exception):
    """A recording cannot be opened or written; the message is one line naming the file."""


def default_recording_path() -> Path:
    """`$GPUCONSOLE_RECORDING`, else `<XDG data dir>/gpuconsole/recording.sqlite`."""
    override = os.environ.get(RECORDING_ENV)
    if override:
        return Path(override)
    return Path(platformdirs.user_data_dir("gpuconsole")) / "recording.sqlite"


def _connect(path: Path, *, read_only: bool = False) -> sqlite3.Connection:
    mode = "ro" if read_only else "rw"
    connection = sqlite3.connect(
        f"{path.resolve().as_uri()}?mode={mode}",
        uri=True,
        check_same_thread=False,
        isolation_level=None,
    )
    connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return connection


def _check(connection: sqlite3.Connection, path: Path) -> dict[str, str]:
    """The recording's meta table; RecordingError when the file is not a recording we read."""
    try:
        rows = connection.execute("SELECT key, value FROM meta").fetchall()
    except sqlite3.DatabaseError as error:
        raise RecordingError(f"{path}: not a gpuconsole recording ({error})") from None
    meta = dict(rows)
    if meta.get("format") != FORMAT:
        raise RecordingError(f"{path}: not a gpuconsole recording")
    version = int(meta.get("version", "0"))
    if version > VERSION:
        raise RecordingError(
            f"{path}: recording format {version} is newer than this gpuconsole reads ({VERSION})"
        )
    return meta


def open_for_reading(path: Path) -> tuple[sqlite3.Connection, dict[str, str]]:
    """A connection that only reads, and the meta table.

    It opens read-write where it may, so that SQLite can replay the write-ahead log a killed
    recorder left behind; where the file is not writable (a daemon's recording), read-only.
    """
    if not path.is_file():
        raise RecordingError(f"{path}: no such recording")
    try:
        writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
        connection = _connect(path, read_only=not writable)
    except sqlite3.Error as error:
        raise RecordingError(f"{path}: cannot open: {error}") from None
    try:
        meta = _check(connection, path)
    except RecordingError:
        connection.close()
        raise
    return connection, meta


def open_for_writing(path: Path) -> tuple[sqlite3.Connection, dict[str, str]]:
    """A connection to append to the recording at ``path`` (see `create`), and its meta."""
    try:
        connection = _connect(path)
    except sqlite3.Error as error:
        raise RecordingError(f"{path}: cannot write: {error}") from None
    try:
        meta = _check(connection, path)
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.Error as error:
        connection.close()
        raise RecordingError(f"{path}: cannot write: {error}") from None
    except RecordingError:
        connection.close()
        raise
    return connection, meta


def create(path: Path, label: str = "") -> bool:
    """Create an empty recording (and its folder) unless a file is there; True if it did.

    It never replaces a file, not even one that appears meanwhile.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _create(path, label)
    except FileExistsError:
        return False
    except sqlite3.Error as error:
        raise RecordingError(f"{path}: cannot create: {error}") from None
    except OSError as error:
        raise RecordingError(f"{path}: cannot create: {error.strerror or error}") from None
    return True


def _create(path: Path, label: str) -> None:
    """The tables and meta of a new recording at ``path``; FileExistsError if a file is there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
    meta: Mapping[str, str] = {
        "format": FORMAT,
        "version": str(VERSION),
        "label": label,
        "schema": json.dumps(codec.schema()),
    }
    try:
        connection = _connect(path)
        try:
            connection.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("BEGIN")
            for statement in _TABLES.split(";"):
                if statement.strip():
                    connection.execute(statement)
            connection.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta.items())
            connection.execute("COMMIT")
        finally:
            connection.close()
    except BaseException:
        path.unlink(missing_ok=True)  # ours, created above: no half-made recording stays
        raise
