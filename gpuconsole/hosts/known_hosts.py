"""Reading OpenSSH known_hosts files as the OpenSSH client (9.x) decides which lines apply.

The console decides host keys itself before asyncssh connects, and it must decide exactly as
`ssh` would from the same files (`hostfile.c`, `match.c`; sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT"):

- a line is ``[@cert-authority|@revoked] HOSTNAMES KEYTYPE BASE64 [COMMENT]``, fields split by
  spaces or tabs; blank lines and ``#`` lines (after leading spaces or tabs) are comments; a line
  ends at a newline or at a NUL byte, as a C string does;
- HOSTNAMES is a comma-separated list of patterns (``*``, ``?``, ``!`` negation, ASCII case
  folded) or one hashed name ``|1|SALT|HMAC``; a line applies when a pattern matches and no
  negated one does; ``[host]:port`` is matched literally, as any other text;
- a line ssh could not read (an unknown marker, a malformed hashed name, a key it cannot parse)
  is passed over: it never refuses the whole file. We do the same and keep why in `skipped`.

Matching is done on the line's bytes, as C does: a ``?`` matches one byte, not one character, and
bytes that are not UTF-8 simply never match a name. Only the key part is decoded (as UTF-8, bad
bytes replaced), so no byte in a file can raise.

The files are untrusted input (a global file written by anyone with root on this machine, a
user's file possibly edited by scripts): each is read only if it is a regular file, only up to
`MAX_KNOWN_HOSTS_BYTES`, and its lines only up to `MAX_LINE_CHARS`; the glob matcher is linear
in the pattern and name (no backtracking blow-up on ``*a*a*a*…``).
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from gpuconsole.core.private_files import PRIVATE_FILE_MODE, make_private_dirs

MAX_KNOWN_HOSTS_BYTES = 16 * 1024 * 1024
"""Of a bigger file only the first 16 MiB are read (the file is untrusted: it may be huge, or grow
while read); a line cut there is dropped and the cut noted in `HostKeys.skipped`."""
MAX_LINE_CHARS = 64 * 1024
"""A longer line (counted in bytes, before decoding) is skipped as a bad line. OpenSSH has no
limit; a real key line is under 1,000 bytes (an RSA 16384-bit key is about 2,800)."""
UNREADABLE = "cannot be read"
"""How a reason in `HostKeys.skipped` says a whole file could not be read (ssh reads it as
missing; the console says so, as the key then looks unknown)."""
MAX_SKIPPED = 20
"""Reasons kept in `HostKeys.skipped`: enough to diagnose, bounded however bad the file is."""

CA_MARKER = "@cert-authority"
REVOKED_MARKER = "@revoked"
_MARKERS = {CA_MARKER.encode(): CA_MARKER, REVOKED_MARKER.encode(): REVOKED_MARKER}
_MAX_MARKER_BYTES = 31
"""OpenSSH copies a marker into a 32-byte buffer: a longer one is an error."""
_MAX_SUBPATTERN_BYTES = 1022
"""OpenSSH's pattern buffer is 1024 bytes: a longer pattern ends the list with "no match"."""

HASH_MAGIC = "|1|"
_HASH_SALT_BYTES = 20
"""HMAC-SHA1's key and digest size: OpenSSH accepts only a salt of exactly this length."""
_MAX_HASH_SALT_CHARS = 1024

_RSA_ALGORITHMS = frozenset({b"ssh-rsa", b"rsa-sha2-256", b"rsa-sha2-512"})
"""One RSA key, three signature algorithm names: OpenSSH reads all three as the type of an RSA
key line, and they are one key type when deciding whether a host's key changed."""
_FIELD_SPACE = b" \t"
_BLANK = re.compile(rb"[ \t]")
_BASE64_SPACE = re.compile(rb"[\r\v\f]")
"""Whitespace inside a base64 field, skipped by OpenSSH's decoder (a CRLF file's trailing \\r)."""
_UNSAFE_NAME = re.compile(r"[\x00-\x20\x7f]")
_PATTERN_CHARS = re.compile(r"[,*?]")
_PATTERN_STARTS = ("!", "|", "#", "@")


@dataclass(frozen=True, slots=True)
class KnownKey:
    """One line of a known_hosts file that applies to the host looked up."""

    path: Path
    line: int
    """1-based, as OpenSSH numbers lines."""
    marker: str | None
    """None, "@cert-authority" or "@revoked"."""
    key: asyncssh.SSHKey

    @property
    def place(self) -> str:
        """How a reason names the line: OpenSSH prints "FILE:LINE"."""
        return f"{self.path}:{self.line}"


@dataclass(frozen=True, slots=True)
class HostKeys:
    """Every line of the files that applies to one name, by marker, in file order."""

    name: str
    """The name looked up, e.g. "gpu07" or "[127.0.0.1]:2222"."""
    keys: tuple[KnownKey, ...]
    """Plain lines (no marker)."""
    authorities: tuple[KnownKey, ...]
    """@cert-authority lines: CA keys trusted to sign this host's certificates."""
    revoked: tuple[KnownKey, ...]
    """@revoked lines: keys never accepted, as host key or as CA."""
    skipped: tuple[str, ...]
    """"FILE:LINE: why" (or "FILE: why") for what could not be read. OpenSSH passes over these
    silently; we keep the reason for diagnostics, at most `MAX_SKIPPED` of them."""

    def trusted(self) -> tuple[KnownKey, ...]:
        """Plain lines whose key is not also @revoked: a revoked key is never trusted, even if a
        plain line lists it too (OpenSSH checks revocation after finding a match)."""
        return tuple(known for known in self.keys if self.revoked_entry(known.key) is None)

    def trusts(self, key: asyncssh.SSHKey) -> bool:
        """Whether a trusted plain line lists ``key``."""
        return any(_same_key(known.key, key) for known in self.trusted())

    def revoked_entry(self, key: asyncssh.SSHKey) -> KnownKey | None:
        """The first @revoked line listing `key`, to name in the refusal; None if none does."""
        return next((known for known in self.revoked if _same_key(known.key, key)), None)

    def same_type(self, key: asyncssh.SSHKey) -> tuple[KnownKey, ...]:
        """Trusted lines whose key is of the same type as `key` (the RSA signature algorithms
        count as one type): those that make a different `key` a "changed" host key."""
        kind = _key_type(key)
        return tuple(known for known in self.trusted() if _key_type(known.key) == kind)


def lookup_name(host: str, port: int, alias: str | None) -> str:
    """The name OpenSSH looks up in known_hosts for a connection.

    `HostKeyAlias` if set, with no port added, else the host, as "[host]:port" when the port is
    not 22 (`put_host_port`; port 0 also means the default). ssh lowercases both (ASCII only)
    before it looks anything up (`ssh.c`, `ssh_login`); `ssh -G` already prints the alias
    lowercased, so lowercasing it again here changes nothing for settings taken from there.
    """
    if alias:
        return _ascii_lower(alias)
    name = _ascii_lower(host)
    if port in (0, 22):
        return name
    return f"[{name}]:{port}"


def host_keys(files: Sequence[Path], name: str) -> HostKeys:
    """Read each file and keep the lines that apply to `name`, as ssh's `load_hostkeys` does.

    A missing file is no lines, as for OpenSSH; an unreadable or non-regular one is no lines
    too, with the reason in `skipped`. `name` is matched as given: plain patterns fold ASCII case
    on both sides, a hashed name is the HMAC of `name`'s exact bytes (ssh hashes the lowercased
    name; pass `lookup_name`'s result).
    """
    found: dict[str | None, list[KnownKey]] = {None: [], CA_MARKER: [], REVOKED_MARKER: []}
    skipped: list[str] = []
    wanted = name.encode("utf-8", "surrogateescape")
    for path in files:
        for item in _file_entries(Path(path), wanted):
            if isinstance(item, KnownKey):
                found[item.marker].append(item)
            elif len(skipped) < MAX_SKIPPED:
                skipped.append(item)
    return HostKeys(
        name=name,
        keys=tuple(found[None]),
        authorities=tuple(found[CA_MARKER]),
        revoked=tuple(found[REVOKED_MARKER]),
        skipped=tuple(skipped),
    )


def known_hosts_line(name: str, key: asyncssh.SSHKey, *, hashed: bool) -> str:
    """The line OpenSSH appends for a newly accepted key: "NAME KEYTYPE BASE64\\n".

    With `hashed` (HashKnownHosts yes) NAME is ``|1|base64(salt)|base64(HMAC-SHA1(salt, name))``
    with a new random 20-byte salt, so the file does not tell which hosts the user visits.
    A name that would corrupt the file or, written in clear, read back as a pattern (whitespace,
    a control character, ``,``, ``*``, ``?``, or a leading ``!``, ``|``, ``#``, ``@``) is a
    ValueError (ssh, too, will not record a host name with wildcards or brackets in it).
    """
    _check_name(name, hashed=hashed)
    if hashed:
        salt = secrets.token_bytes(_HASH_SALT_BYTES)
        field = _hashed_name(name.encode("utf-8"), salt).decode("ascii")
    else:
        field = name
    blob = base64.b64encode(key.public_data).decode("ascii")
    return f"{field} {key.algorithm.decode('ascii')} {blob}\n"


def append_known_host(path: Path, line: str) -> None:
    """Append `line` to the user's known_hosts as ssh does, without ever losing what is there.

    The parent folder is created (0700) and the file (0600) if missing; the file is opened for
    appending only, never truncated; if it does not end with a newline one is added first, so the
    new line is not glued to a last line an editor left unterminated. A path that is not a
    regular file (a FIFO, a device, a folder) is refused with OSError rather than written to.
    """
    body = line if line.endswith("\n") else line + "\n"
    if "\n" in body[:-1] or "\r" in body:
        raise ValueError("a known_hosts line must be one line")
    path = Path(path)
    make_private_dirs(path.parent)
    fd = _open_for_append(path)
    try:
        size = os.fstat(fd).st_size
        data = body.encode("utf-8")
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        _write_all(fd, data)
    finally:
        os.close(fd)


# Reading files


def _file_entries(path: Path, wanted: bytes) -> Iterator[KnownKey | str]:
    """The lines of one file that apply to `wanted`, and reasons for what could not be read."""
    try:
        data, note = _read_bounded(path)
    except FileNotFoundError:
        return
    except OSError as error:
        if error.errno == errno.ENOTDIR:
            return  # a missing folder on the way: a missing file, as for fopen
        yield f"{path}: {UNREADABLE}: {error.strerror or error}"
        return
    for number, raw in enumerate(data.split(b"\n"), start=1):
        entry = _line_entry(path, number, raw, wanted)
        if entry is not None:
            yield entry
    if note:
        yield f"{path}: {note}"


def read_regular(path: str | bytes | os.PathLike[str], limit: int) -> bytes:
    """Up to ``limit`` + 1 bytes of a regular file (more than ``limit`` tells the caller it is
    too big); OSError for anything else. Only a regular file is read: a FIFO would block forever
    and /dev/zero never end. The check is on the opened descriptor, so a path swapped between a
    check and the open cannot fool it; O_NONBLOCK keeps the open itself from hanging on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_file_kind(mode)})")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1024 * 1024))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_bounded(path: Path) -> tuple[bytes, str | None]:
    """The file's complete lines (no final newline), at most `MAX_KNOWN_HOSTS_BYTES` of them,
    and a note if it was cut (`read_regular`)."""
    data = read_regular(path, MAX_KNOWN_HOSTS_BYTES)
    note = None
    if len(data) > MAX_KNOWN_HOSTS_BYTES:
        data = data[:MAX_KNOWN_HOSTS_BYTES]
        data = data[: data.rfind(b"\n") + 1]  # a line cut in two is no line
        note = f"larger than {MAX_KNOWN_HOSTS_BYTES} bytes: only the first lines were read"
    if data.endswith(b"\n"):
        data = data[:-1]
    return data, note


def _file_kind(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a folder",
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((kind for test, kind in kinds.items() if test(mode)), "not a file")


# One line


class _BadLine(ValueError):
    """A line OpenSSH would pass over as invalid; the message says why."""


def _line_entry(path: Path, number: int, raw: bytes, wanted: bytes) -> KnownKey | str | None:
    """The line's key if it applies to `wanted`, a "FILE:LINE: why" if it cannot be read, None
    for a comment or a line for other hosts."""
    try:
        return _read_line(path, number, raw, wanted)
    except _BadLine as bad:
        return f"{path}:{number}: {bad}"


def _read_line(path: Path, number: int, raw: bytes, wanted: bytes) -> KnownKey | None:
    line = raw.split(b"\0", 1)[0].lstrip(_FIELD_SPACE)
    if not line or line.startswith(b"#"):
        return None
    if len(raw) > MAX_LINE_CHARS:
        raise _BadLine(f"line longer than {MAX_LINE_CHARS} bytes")
    marker, line = _split_marker(line)
    hosts, rest = _split_field(line)
    if not _hosts_match(hosts, wanted):
        return None
    return KnownKey(path=path, line=number, marker=marker, key=_read_key(rest))


def _split_field(text: bytes) -> tuple[bytes, bytes]:
    """The first space- or tab-separated field, and what follows it without leading blanks."""
    blank = _BLANK.search(text)
    end = blank.start() if blank else len(text)
    return text[:end], text[end:].lstrip(_FIELD_SPACE)


def _split_marker(line: bytes) -> tuple[str | None, bytes]:
    """The line's marker (None if it has none) and the rest of the line.

    As OpenSSH: a marker ends at the line's first space (or, with no space, its first tab); only
    the two known markers, and only one of them, are accepted."""
    marker: str | None = None
    while line.startswith(b"@"):
        if marker is not None:
            raise _BadLine("more than one marker")
        end = line.find(b" ")
        if end < 0:
            end = line.find(b"\t")
        if end < 0:
            raise _BadLine("a marker and nothing after it")
        word = line[:end]
        if len(word) > _MAX_MARKER_BYTES or word not in _MARKERS:
            raise _BadLine(f"unknown marker {_shown(word)}")
        marker = _MARKERS[word]
        line = line[end:].lstrip(_FIELD_SPACE)
    return marker, line


def _read_key(rest: bytes) -> asyncssh.SSHKey:
    """The key of "KEYTYPE BASE64 [COMMENT]", checked as OpenSSH's `sshkey_read` checks it: the
    type word known and followed by a blob, the blob strict base64 of a key of that type."""
    if not rest or rest.startswith(b"#"):
        raise _BadLine("no key after the host names")
    word, after = _split_field(rest)
    blob, _comment = _split_field(after)
    if not blob:
        raise _BadLine("no key after the key type")
    blob = _BASE64_SPACE.sub(b"", blob)
    try:
        data = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if not data or base64.b64encode(data) != blob:
        raise _BadLine("the key is not valid base64")
    kind = b"ssh-rsa" if word in _RSA_ALGORITHMS else word
    text = kind.decode("utf-8", "replace") + " " + blob.decode("ascii")
    try:
        key = asyncssh.import_public_key(text)
    except Exception as error:  # untrusted bytes: whatever the parser says, the line is bad
        raise _BadLine(f"unreadable {_shown(word)} key: {error}") from None
    if not isinstance(key, asyncssh.SSHKey):
        raise _BadLine(f"unreadable {_shown(word)} key")
    return key


def _shown(word: bytes) -> str:
    """A word from the file, quoted for a reason: decoded, cut, control characters escaped."""
    text = word[:40].decode("utf-8", "replace")
    return ascii(text) if not text.isprintable() else f'"{text}"'


# Host names


def _hosts_match(hosts: bytes, wanted: bytes) -> bool:
    """Whether the HOSTNAMES field applies to `wanted` (`match_maybe_hashed`)."""
    if hosts.startswith(b"|"):
        matched = _hash_matches(hosts, wanted)
        if matched is None:
            raise _BadLine(f"malformed hashed host name {_shown(hosts)}")
        return matched
    return _pattern_list_match(wanted.lower(), hosts.lower()) == 1


def _pattern_list_match(name: bytes, patterns: bytes) -> int:
    """1 if a pattern matches and no negated one does, -1 if a negated one matches, else 0
    (`match_pattern_list`): a negated match ends the list at once, a too-long pattern too."""
    if not patterns:
        return 0
    subpatterns = patterns.split(b",")
    if patterns.endswith(b","):
        subpatterns.pop()  # OpenSSH sees no empty pattern after a final comma
    positive = 0
    for pattern in subpatterns:
        negated = pattern.startswith(b"!")
        if negated:
            pattern = pattern[1:]
        if len(pattern) > _MAX_SUBPATTERN_BYTES:
            return 0
        if _glob_match(name, pattern):
            if negated:
                return -1
            positive = 1
    return positive


def _glob_match(name: bytes, pattern: bytes) -> bool:
    """Whether `pattern` (``*`` any bytes, ``?`` one byte, anything else itself) matches all of
    `name`, in time linear in their lengths: after a ``*`` only the latest one is retried."""
    star, resume = -1, 0
    n = p = 0
    while n < len(name):
        if p < len(pattern) and pattern[p] == ord("*"):
            star, resume = p, n
            p += 1
        elif p < len(pattern) and pattern[p] in (ord("?"), name[n]):
            n += 1
            p += 1
        elif star >= 0:
            resume += 1
            n, p = resume, star + 1
        else:
            return False
    return all(byte == ord("*") for byte in pattern[p:])


def _hash_matches(field: bytes, wanted: bytes) -> bool | None:
    """Whether a hashed field ``|1|SALT|HMAC`` is `wanted`'s; None if it is malformed (OpenSSH
    then passes over the line). As OpenSSH, the field must be exactly what hashing `wanted` with
    its salt writes: anything after the HMAC (another name) means no match."""
    if not field.startswith(HASH_MAGIC.encode()):
        return None
    salt_text, bar, _ = field[len(HASH_MAGIC) :].partition(b"|")
    if not bar or not 0 < len(salt_text) <= _MAX_HASH_SALT_CHARS:
        return None
    try:
        salt = base64.b64decode(salt_text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(salt) != _HASH_SALT_BYTES:
        return None
    return hmac.compare_digest(_hashed_name(wanted, salt), field)


def _hashed_name(name: bytes, salt: bytes) -> bytes:
    digest = hmac.new(salt, name, hashlib.sha1).digest()
    return b"|1|" + base64.b64encode(salt) + b"|" + base64.b64encode(digest)


def _ascii_lower(text: str) -> str:
    """Lowercase A-Z only, as C's tolower: "İ" or "K" (Kelvin) stay as they are."""
    return text.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _check_name(name: str, *, hashed: bool) -> None:
    if not name or _UNSAFE_NAME.search(name):
        raise ValueError(f"not a name to record in known_hosts: {name!r}")
    if not hashed and (_PATTERN_CHARS.search(name) or name.startswith(_PATTERN_STARTS)):
        raise ValueError(f"a name that would read back as a pattern: {name!r}")


# Keys


def _same_key(a: asyncssh.SSHKey, b: asyncssh.SSHKey) -> bool:
    """The same public key (the blob names the key's type, so equal blobs are equal keys)."""
    return a.public_data == b.public_data


def _key_type(key: asyncssh.SSHKey) -> bytes:
    return b"ssh-rsa" if key.algorithm in _RSA_ALGORITHMS else key.algorithm


# Appending


def _open_for_append(path: Path) -> int:
    """A descriptor appending to `path`: a new file made 0600, an existing one as it is. Never
    truncates; refuses what is not a regular file (O_NONBLOCK: a FIFO must not hang the open)."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK  # read: its last byte
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        fd = os.open(path, flags)
    else:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"not a regular file ({_file_kind(mode)})", str(path))
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
