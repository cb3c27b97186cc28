"""Which file and line set a keyword that `ssh -G` reports, so a refusal can point at it.

`ssh -G` prints the values ssh would use, not where they came from. This module runs the same
command again with `-vvv` and replays ssh's own trace of reading its config: the files it read
("Reading configuration data F"), what each `Include` pulled in ("F line N: Including file X depth
D"), and which `Host` and `Match` lines applied ("F line N: Applying options for ...", "match
found"). Walking those files in that order, line by line, it keeps ssh's rule that the first value
obtained wins: the first line that sets the keyword while its block is active is the one ssh used.
The command line comes before every file (`-o`, `-l`, `-p`, and `user@` in the destination).

The walk mirrors readconf.c (OpenSSH 9.2 to 10.5):

- each file ssh reads at the top starts active; a `Host` or `Match` line switches the state for
  the lines after it, up to the next such line or the end of that file;
- an included file starts in the state of its `Include` line, its own `Host`/`Match` lines switch
  it until that file ends, and the including file then goes on in the state it had;
- an `Include` in an inactive block is read "parse only": none of its lines is active, not even
  after one of its `Match` lines that ssh logs as matched (readconf.c evaluates the condition but
  forces the block off);
- a keyword counts under each of its names (`PubkeyAcceptedKeyTypes` for
  `PubkeyAcceptedAlgorithms`, ...); `ProxyCommand` and `ProxyJump` share one value: whichever comes
  first wins, and the other is then set by no line;
- when ssh reads its config twice (`Match final`, `CanonicalizeHostname`), the second pass counts
  after the first, except for `HostName`, which ssh fixes before that pass.

ssh's trace and the files are untrusted. Every read is bounded; a file that is not a regular file
is not opened; a trace that does not fit the files line for line (a file changed since, a name ssh
cut at 200 bytes, a name with a newline, something printing lines of its own) means the answer
cannot be told, and the answer is None rather than a guess.
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import time
from collections import deque
from collections.abc import Iterator, Sequence

from gpuconsole.hosts.known_hosts import read_regular

MAX_LOG_BYTES = 1024 * 1024
"""ssh's stderr read at most: its trace of any sane config is a few KiB."""
MAX_FILE_BYTES = 1024 * 1024
MAX_FILES = 64
"""Files read at most (a file ssh reads twice counts twice)."""
NAME_CUT = 200
"""ssh prints a config file's name with "%.200s": a name this long may have been cut."""

_ALIASES: tuple[tuple[str, ...], ...] = (
    # readconf.c keywords[], 9.2 to 10.5: names with the same opcode, ssh_config(5)'s name first
    ("pubkeyauthentication", "dsaauthentication"),
    ("pubkeyacceptedalgorithms", "pubkeyacceptedkeytypes"),
    ("hostbasedacceptedalgorithms", "hostbasedkeytypes"),
    (
        "kbdinteractiveauthentication",
        "challengeresponseauthentication",
        "skeyauthentication",
        "tisauthentication",
    ),
    ("identityfile", "identityfile2"),
    ("tcpkeepalive", "keepalive"),
    ("pkcs11provider", "smartcarddevice"),
)
_SHARED = {"proxycommand": "proxyjump", "proxyjump": "proxycommand"}
"""Keywords that fill one value: the first of either wins (readconf.c parse_jump, oProxyCommand)."""

_FLAGS: dict[str, tuple[str, ...]] = {
    # the options besides -o that the console's `ssh -G` carries (ssh.c main()); each, as -o,
    # sets a value only where none is set yet
    "l": ("user",),
    "p": ("port",),
}
_FLAGS_WITH_VALUE = set("BDEFIJLOPQRSWbceilmopw")
"""ssh.c's getopt() string, 10.5 (`-P` takes a tag there; 9.2 ignores a bare `-P`)."""

_READ = "Reading configuration data "
_EVENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # the lines of ssh's trace the walk follows, by what readconf.c prints (after "debugN: ")
    ("read", re.compile(re.escape(_READ))),
    ("final", re.compile(r"re-parsing configuration$")),
    ("check", re.compile(r"checking match for ")),
    ("found", re.compile(r"match (not )?found$")),
    ("apply", re.compile(r".* line \d+: Applying options for ")),
    ("skip", re.compile(r".* line \d+: Skipping Host block because of negated match for ")),
    ("step", re.compile(r".* line \d+: (?:(?:not )?matched '|skipped exec )")),
    ("include", re.compile(r".* line \d+: Including file ")),
    ("nomatch", re.compile(r".* line \d+: include .* matched no files$")),
)
_DEBUG = re.compile(r"debug[123]: (.*)")
_INCLUDING = re.compile(r"Including file (.*) depth (\d+)( \(parse only\))?", re.DOTALL)
_DELIMITER = re.compile(r'[ \t\r\n"=]')
_WHITESPACE = " \t\r\n"
_VIS = re.compile(rb"\\(\\|[0-3][0-7][0-7])")


class _Unknown(Exception):
    """The trace and the files disagree, or a bound was reached: the answer cannot be told."""


def where_set(keyword: str, command: Sequence[str], *, timeout: float = 10.0) -> str | None:
    """Where the value ssh uses for `keyword` was set, for the host of `command`, as
    "FILE line N" (FILE as ssh prints it), or "the command line (-o)" for an `-o`, `-l`, `-p`
    option given on the command line; None when no line sets it (ssh's built-in default),
    or when it cannot be told (ssh fails, times out, prints something unexpected).

    `command` is an `ssh -G ...` argv as the caller ran it; it is run again with `-vvv` after
    argv[0] (so a `Match exec` command runs again), unless the command line itself sets the
    keyword: that is told from `command` alone. A `user@` in the destination is named the same
    way."""
    names = _names(keyword)
    argv = [str(arg) for arg in command]
    if not names or not argv:
        return None
    slot = names | {_SHARED[name] for name in names if name in _SHARED}
    given = _command_line(argv[1:], slot)
    if given is not None:
        where, name = given
        return where if name in names else None
    deadline = time.monotonic() + timeout
    log = _ssh_log([argv[0], "-vvv", *argv[1:]], deadline)
    if log is None:
        return None
    walk = _Walk(log, slot, deadline)
    try:
        walk.run()
    except _Unknown:
        return None
    if walk.found is None:
        return None
    where, name = walk.found
    return _printable(where) if name in names else None


def _names(keyword: str) -> set[str]:
    """Every name ssh reads `keyword` under, lowercased."""
    name = keyword.strip().lower()
    for group in _ALIASES:
        if name in group:
            return set(group)
    return {name} if name else set()


def _command_line(args: Sequence[str], slot: set[str]) -> tuple[str, str] | None:
    """What on the command line sets a keyword of `slot`: ("the command line (-o)", the keyword).

    ssh takes its options before it reads any file, so what they set wins over every file."""
    return next(
        (
            (f"the command line ({label})", keyword)
            for keyword, label in _settings(args)
            if keyword in slot
        ),
        None,
    )


def _settings(args: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(keyword, label) for each option that sets one, in ssh's order: each sets a value only
    where none is set yet, so the first one wins."""
    for flag, value in _options(args):
        if flag == "o":
            yield _keyword(value), "-o"
        elif flag == "@":
            yield from _destination(value)
        else:
            for keyword in _FLAGS.get(flag, ()):
                yield keyword, f"-{flag}"


def _options(args: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(flag, value) in the order ssh's getopt() takes them; ("@", destination) for the host.

    As ssh.c does: options stop at the first operand (the destination) and go on after it,
    unless `--` came first; after the destination's options comes the remote command."""
    index = 0
    destination = False
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            if not destination and index < len(args):
                yield "@", args[index]
            return
        if not arg.startswith("-") or arg == "-":
            if destination:
                return
            destination = True
            yield "@", arg
            continue
        for position in range(1, len(arg)):
            flag = arg[position]
            if flag not in _FLAGS_WITH_VALUE:
                yield flag, ""
                continue
            value = arg[position + 1 :]
            if not value and index < len(args):
                value = args[index]
                index += 1
            yield flag, value
            break


def _destination(destination: str) -> Iterator[tuple[str, str]]:
    """The User (and Port) that `user@host` or `ssh://user@host:port` sets, as ssh.c reads it."""
    if destination.startswith("ssh://"):
        authority = destination[len("ssh://") :].partition("/")[0]
        if "@" in authority:
            yield "user", "ssh://"
        if re.search(r":\d+$", authority.rpartition("@")[2]):
            yield "port", "ssh://"
    elif "@" in destination:
        yield "user", "user@host"


def _keyword(line: str) -> str:
    """The keyword of one config line, lowercased, split as ssh's strdelim() does ("" for none:
    a blank line or a comment)."""
    token, rest = _strdelim(line.partition("\0")[0])
    if token == "" and rest is not None:  # leading blanks
        token = _strdelim(rest)[0]
    if not token or token.startswith("#"):
        return ""
    return token.lower()


def _strdelim(text: str) -> tuple[str | None, str | None]:
    """misc.c strdelim(): the next token (spaces, one `=`, or "quotes" end it) and the rest."""
    found = _DELIMITER.search(text)
    if found is None:
        return text, None
    at = found.start()
    if text[at] == '"':
        text = text[:at] + text[at + 1 :]
        end = text.find('"', at)
        if end < 0:
            return None, None
        return text[:end], text[end + 1 :].lstrip(_WHITESPACE)
    rest = text[at + 1 :].lstrip(_WHITESPACE)
    if text[at] != "=" and rest.startswith("="):
        rest = rest[1:].lstrip(_WHITESPACE)
    return text[:at], rest


def _ssh_log(argv: list[str], deadline: float) -> list[tuple[str, str]] | None:
    """The lines of ssh's trace the walk follows, (kind, message) in order; None when ssh fails,
    runs past the deadline, or prints more than `MAX_LOG_BYTES`."""
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    except (OSError, ValueError):
        return None
    with process:
        assert process.stderr is not None
        stderr = _read_bounded(process.stderr.fileno(), deadline)
        if stderr is None:
            process.kill()
            return None
        try:
            code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            return None
    if code != 0:
        return None
    events = []
    for raw in stderr.split(b"\n"):
        line = _DEBUG.fullmatch(raw.removesuffix(b"\r").decode("utf-8", "surrogateescape"))
        if line is None or len(line[1]) > 4 * 1024:  # ssh cuts its lines at 1 KiB
            continue
        kind = next((kind for kind, pattern in _EVENTS if pattern.match(line[1])), None)
        if kind is not None:
            events.append((kind, line[1]))
    return events


def _read_bounded(fd: int, deadline: float) -> bytes | None:
    """All of a pipe up to its end, or None past the deadline or `MAX_LOG_BYTES`."""
    data = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return None
            chunk = os.read(fd, 64 * 1024)
            if not chunk:
                return bytes(data)
            data += chunk
            if len(data) > MAX_LOG_BYTES:
                return None


class _Walk:
    """ssh's reading of its config, replayed: the files in its order, each `Host`/`Match`/
    `Include` line checked against the trace line it must have printed, in turn."""

    def __init__(self, events: list[tuple[str, str]], slot: set[str], deadline: float) -> None:
        self.events = deque(events)
        self.slot = slot
        self.deadline = deadline
        self.files = 0
        self.final_pass = False
        self.found: tuple[str, str] | None = None
        """("FILE line N", the keyword it sets): the first active line for `slot`."""

    def run(self) -> None:
        """Every file ssh read at the top (the user's, the system's or `-F`'s), both passes."""
        while self.events:
            if self._take("final") is not None:
                self.final_pass = True
                continue
            read = self._take("read")
            if read is None:
                raise _Unknown  # a trace line no file line accounts for
            name = read[len(_READ) :]
            if len(_unvis(name)) >= NAME_CUT:
                raise _Unknown  # perhaps cut: not the name of the file ssh read
            self._file(name, name, active=True, never=False, depth=0)

    def _file(self, path: str, name: str, *, active: bool, never: bool, depth: int) -> None:
        """Walk one file: `path` as ssh printed it in full, `name` as in its "line N" messages.
        `never`: read "parse only", no block of it can be active."""
        for number, line in enumerate(self._lines(_unvis(path)), 1):
            if number % 4096 == 0 and time.monotonic() > self.deadline:
                raise _Unknown
            keyword = _keyword(line)
            if keyword in ("host", "match", "include"):
                at = f"{name} line {number}: "
                if keyword == "include":
                    self._include(at, active=active, never=never, depth=depth)
                else:
                    active = self._applies(keyword, at) and not never
            elif active and self.found is None and self._counts(keyword):
                self.found = (f"{path} line {number}", keyword)

    def _applies(self, keyword: str, at: str) -> bool:
        """Whether ssh applied the `Host` or `Match` line `at`, by what it printed for it."""
        if keyword == "host":
            applied = self._take("apply", at) is not None
            self._take("skip", at)  # "Skipping Host block because of negated match"
            return applied
        if self._take("check") is None:
            raise _Unknown
        while self._take("step", at) is not None:  # one line per criterion
            pass
        found = self._take("found")
        if found is None:
            raise _Unknown
        return found == "match found"

    def _include(self, at: str, *, active: bool, never: bool, depth: int) -> None:
        """The files one `Include` line pulled in, in ssh's order: each is walked from the state
        of the `Include` line, which the including file keeps afterwards."""
        while True:
            if self._take("nomatch", at) is not None:  # a pattern that matched no file
                continue
            message = self._take("include", at)
            if message is None:
                return
            including = _INCLUDING.fullmatch(message[len(at) :])
            if (
                including is None  # a name with a newline, or cut by ssh's 1 KiB lines
                or int(including[2]) != depth
                or bool(including[3]) == active  # "(parse only)" exactly where inactive
            ):
                raise _Unknown
            read = self._take("read")
            if read is None:
                raise _Unknown
            path, name = including[1], read[len(_READ) :]
            if name != path and not (len(_unvis(name)) == NAME_CUT and path.startswith(name)):
                raise _Unknown
            self._file(path, name, active=active, never=never or not active, depth=depth + 1)

    def _counts(self, keyword: str) -> bool:
        """Whether an active line of `keyword` sets the value asked about (ssh sets HostName
        before its second pass, so no HostName line of that pass counts)."""
        return keyword in self.slot and not (keyword == "hostname" and self.final_pass)

    def _take(self, kind: str, prefix: str = "") -> str | None:
        """The next trace line, if it is of this kind (and starts so); None leaves it there."""
        if self.events and self.events[0][0] == kind and self.events[0][1].startswith(prefix):
            return self.events.popleft()[1]
        return None

    def _lines(self, path: bytes) -> list[str]:
        """A config file's lines as ssh's getline() splits them, each cut at a NUL as C does."""
        self.files += 1
        if self.files > MAX_FILES or time.monotonic() > self.deadline:
            raise _Unknown
        data = _read_file(path)
        if data is None:
            raise _Unknown
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()  # the end of the last line, not a line
        return [line.partition(b"\0")[0].decode("utf-8", "replace") for line in lines]


def _read_file(path: bytes) -> bytes | None:
    """A regular file's bytes, or None: missing, too big, or a FIFO, device or directory."""
    try:
        data = read_regular(path, MAX_FILE_BYTES)
    except (OSError, ValueError):
        return None
    return data if len(data) <= MAX_FILE_BYTES else None


def _unvis(text: str) -> bytes:
    """A name as ssh printed it (vis(3) VIS_SAFE|VIS_OCTAL: `\\ooo` for a byte, `\\\\` for a
    backslash) back to the bytes of the name."""
    raw = text.encode("utf-8", "surrogateescape")
    return _VIS.sub(lambda m: b"\\" if m[1] == b"\\" else bytes([int(m[1], 8)]), raw)


def _printable(text: str) -> str:
    """One printable line: what ssh left raw (tab, CR, BEL, BS, odd bytes) becomes `?`."""
    return "".join(char if char.isprintable() else "?" for char in text)
