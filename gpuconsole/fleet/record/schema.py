"""The recording file: one SQLite database in WAL mode, its tables, and opening it safely.

A file that is not a recording (or a recording of a newer format) is refused with one line that
names it, and is never written to: creating a recording never replaces an existing file. A
recording a ticket brings may have been written by anyone: before anything reads it, the file must
be an SQLite database whose tables are tables (not views that compute something) and whose meta
table says, in values of bounded length, that it is a recording this code reads.

Recordings are private: the file is made 0600 and the folders created for it 0700 (SQLite gives
its write-ahead log the database's mode).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from gpuconsole.core.private_files import PRIVATE_FILE_MODE, make_private_dirs
from gpuconsole.core.untrusted import shown
from gpuconsole.fleet.record import codec

FORMAT = "gpuconsole-recording"
VERSION = 1
BUSY_TIMEOUT_MS = 5000
MAX_META_CHARS = 1 << 16
"""The longest meta value read (the schema is about 2 KB); a longer one is refused unread."""
_SQLITE_MAGIC = b"SQLite format 3\x00"
_VERSION_TEXT = re.compile(r"[0-9]{1,9}")
_READ_META = ("format", "version", "label", "schema")

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
_TABLE_NAMES = tuple(re.findall(r"CREATE TABLE (\w+)", _TABLES))


class RecordingError(Exception):
    """A recording cannot be opened or written; the message is one line naming the file."""


def _text(raw: bytes) -> str:
    """Text as SQLite holds it; bytes that are not UTF-8 show as U+FFFD, not as an error that
    would lose the whole query."""
    return raw.decode("utf-8", "replace")


def _connect(path: Path, *, read_only: bool = False) -> sqlite3.Connection:
    mode = "ro" if read_only else "rw"
    connection = sqlite3.connect(
        f"{path.resolve().as_uri()}?mode={mode}",
        uri=True,
        check_same_thread=False,
        isolation_level=None,
    )
    connection.text_factory = _text
    connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    connection.execute("PRAGMA trusted_schema = OFF")  # no SQL functions run from the file
    return connection


def _is_sqlite(path: Path) -> bool:
    """Whether the file starts as an SQLite database does (SQLite takes an empty file for an
    empty database, and would write one into it)."""
    try:
        with path.open("rb") as file:
            return file.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def _check(connection: sqlite3.Connection, path: Path) -> dict[str, str]:
    """The recording's meta table; RecordingError when the file is not a recording we read."""
    try:
        kinds = dict(
            connection.execute(
                "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')"
            ).fetchall()
        )
        if kinds.get("meta") != "table":
            raise RecordingError(f"{path}: not a gpuconsole recording (it has no meta table)")
        rows = connection.execute(
            "SELECT key, typeof(value), CASE WHEN length(value) <= ? THEN value END FROM meta "
            f"WHERE key IN ({', '.join('?' * len(_READ_META))})",
            (MAX_META_CHARS, *_READ_META),
        ).fetchall()
    except sqlite3.DatabaseError as error:
        raise RecordingError(f"{path}: not a gpuconsole recording ({error})") from None
    meta = _meta_values(rows, path)
    if meta.get("format") != FORMAT:
        raise RecordingError(f"{path}: not a gpuconsole recording")
    version = _version(meta.get("version", "0"), path)
    if version > VERSION:
        raise RecordingError(
            f"{path}: recording format {version} is newer than this gpuconsole reads ({VERSION})"
        )
    for table in _TABLE_NAMES:
        if kinds.get(table) != "table":
            what = "no table" if table not in kinds else f"a {kinds[table]}, not a table:"
            raise RecordingError(f"{path}: damaged recording ({what} {table})")
    recorded_schema(meta, path)
    return meta


def _meta_values(rows: list[tuple[str, str, object]], path: Path) -> dict[str, str]:
    meta = {}
    for key, kind, value in rows:
        if kind != "text":
            raise RecordingError(f"{path}: damaged recording (meta {key} is {kind}, not text)")
        if value is None:
            raise RecordingError(
                f"{path}: damaged recording (meta {key} is longer than {MAX_META_CHARS} chars)"
            )
        assert isinstance(value, str)
        meta[key] = value
    return meta


def _version(text: str, path: Path) -> int:
    if not _VERSION_TEXT.fullmatch(text):
        raise RecordingError(
            f"{path}: damaged recording (format version {shown(text)} is not a version number)"
        )
    return int(text)


def recorded_schema(meta: Mapping[str, str], path: Path) -> dict[str, list[str]]:
    """The field names the recording's rows were written with (see `codec.schema`)."""
    try:
        fields = json.loads(meta.get("schema", ""))
    except (ValueError, RecursionError):
        fields = None
    if not (
        isinstance(fields, dict)
        and all(
            isinstance(names, list) and all(isinstance(n, str) for n in names)
            for names in fields.values()
        )
    ):
        raise RecordingError(f"{path}: damaged recording (its schema is not lists of field names)")
    return fields


def open_for_reading(path: Path) -> tuple[sqlite3.Connection, dict[str, str]]:
    """A connection that only reads, and the meta table.

    It opens read-write where it may, so that SQLite can replay the write-ahead log a killed
    recorder left behind; where the file is not writable (a daemon's recording), read-only.
    """
    if not path.is_file():
        raise RecordingError(f"{path}: no such recording")
    if not _is_sqlite(path):
        raise RecordingError(f"{path}: not a gpuconsole recording (file is not a database)")
    try:
        writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
        connection = _connect(path, read_only=not writable)
    except sqlite3.Error as error:
        raise RecordingError(f"{path}: cannot open: {error}") from None
    try:
        meta = _check(connection, path)
        connection.execute("PRAGMA query_only = ON")
    except sqlite3.Error as error:
        connection.close()
        raise RecordingError(f"{path}: cannot open: {error}") from None
    except RecordingError:
        connection.close()
        raise
    return connection, meta


def open_for_writing(path: Path) -> tuple[sqlite3.Connection, dict[str, str]]:
    """A connection to append to the recording at ``path`` (see `create`), and its meta."""
    if not _is_sqlite(path):
        raise RecordingError(f"{path}: not a gpuconsole recording (file is not a database)")
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
        make_private_dirs(path.parent)
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
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
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
