"""The recording subcommands of `gpuconsole`: ``record`` (headless, for a bastion daemon) and
``replay`` (the console on a recording, or its timeline as text), and the console's own
``--record FILE`` / ``--no-record``.

`gpuconsole.cli` registers them and runs them; bad input is one line and an exit code here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpuconsole import paths
from gpuconsole.record.retention import Retention, Tier, parse_duration
from gpuconsole.record.schema import RecordingError

if TYPE_CHECKING:
    from gpuconsole.record.episodes import Episode
    from gpuconsole.record.reader import Damage, Recording
    from gpuconsole.record.recorder import Recorder
    from gpuconsole.telemetry import Source

EXIT_BAD_INPUT = 2
EXIT_UNREADABLE = 3
LIST_WINDOW_S = 600.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
MAX_DAMAGE_LISTED = 50
MAX_LIST_CHECKED_ROWS = 200_000
"""`--list` without `--at` inflates every reading to check it up to this many (a few seconds)."""

AddOptions = Callable[[argparse.ArgumentParser], None]


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_console_options(parser: argparse.ArgumentParser) -> None:
    """``--record FILE`` and ``--no-record`` for the console itself."""
    parser.add_argument(
        "--record",
        type=Path,
        metavar="FILE",
        help="record readings, findings, alerts and actions into FILE (default: "
        "recording.sqlite in the XDG data dir; the demo records only when given a FILE)",
    )
    parser.add_argument(
        "--no-record", action="store_true", help="do not record (replay needs a recording)"
    )


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    source_options: tuple[AddOptions, ...],
) -> None:
    """Register ``record`` and ``replay``; ``source_options`` add the options choosing what to
    watch."""
    record = commands.add_parser(
        "record",
        help="record the fleet without the UI (for a daemon on a bastion host); Ctrl+C or "
        "SIGTERM stops",
    )
    record.add_argument(
        "--record",
        type=Path,
        metavar="FILE",
        help="the recording (default: $GPUCONSOLE_RECORDING, else recording.sqlite in the XDG "
        "data dir); an existing one is appended to",
    )
    record.add_argument(
        "--refresh", type=_duration, default=1.0, metavar="SECONDS", help="seconds between readings"
    )
    record.add_argument(
        "--retain",
        type=_duration,
        default=Retention().keep_s,
        metavar="DURATION",
        help="delete what is older (default: 7d)",
    )
    record.add_argument(
        "--full-resolution",
        type=_duration,
        default=Retention().tiers[0].age_s,
        metavar="DURATION",
        help="keep every reading this long, then one per 10 s, after 48 h one per minute "
        "(default: 6h)",
    )
    record.add_argument(
        "--duration", type=_duration, metavar="DURATION", help="stop after this long"
    )
    for add in source_options:
        add(record)
    replay = commands.add_parser(
        "replay",
        help="open the console on a recording, with a time cursor (or --list its timeline)",
    )
    replay.add_argument("file", type=Path, metavar="FILE", help="a recording")
    replay.add_argument(
        "--at",
        metavar="TIME",
        help="start there: 03:12 (the last 03:12 in the recording), 2026-01-01 03:12:05 or an "
        "ISO 8601 time; UTC unless it says otherwise (default: the recording's end)",
    )
    replay.add_argument("--host", metavar="NAME", help="open this host's screen")
    replay.add_argument(
        "--list",
        action="store_true",
        help="print the findings and alerts instead (around --at, for --host), then exit",
    )
    replay.add_argument("--json", action="store_true", help="with --list: print JSON")


def retention_of(args: argparse.Namespace) -> Retention:
    full = args.full_resolution
    coarse = max(48 * 3600.0, 2 * full)
    try:
        return Retention(args.retain, (Tier(full, 10.0), Tier(coarse, 60.0)))
    except ValueError as error:
        raise RecordingError(f"--retain/--full-resolution: {error}") from None


def console_recorder(args: argparse.Namespace, label: str) -> Recorder | None:
    """The console's recorder: --record FILE, else the default file (not for the demo)."""
    from gpuconsole.record.recorder import Recorder

    if args.no_record or (args.demo and args.record is None):
        return None
    path = args.record or paths.RECORDING.path()
    try:
        return Recorder(path, label=label)
    except RecordingError as error:
        if args.record is not None:
            raise
        print(f"gpuconsole: not recording: {error}", file=sys.stderr)
        return None


def run_record(
    args: argparse.Namespace,
    source_of: Callable[[], tuple[Source, str]],
    rules_of: Callable[[], Sequence[Any]],
) -> int:
    """Record until stopped (Ctrl+C, SIGTERM, --duration).

    A signal stops it within a second, from the moment the handlers are in (before the source
    and the file are opened): the round in progress is dropped, what was taken is written, the
    session ends, and a line says what the file holds.
    """
    path = args.record or paths.RECORDING.path()
    try:
        retention = retention_of(args)
    except RecordingError as error:
        return _fail(str(error), EXIT_BAD_INPUT)
    with _SignalStop() as stop:
        return _record(args, path, retention, stop, source_of, rules_of)


class _SignalStop:
    """An event that SIGTERM and SIGINT set while installed (``with``); ``by`` names the first."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.by: str | None = None
        self._before: dict[int, Any] = {}

    def _caught(self, number: int, _frame: FrameType | None) -> None:
        self.by = self.by or signal.Signals(number).name
        self.event.set()

    def __enter__(self) -> _SignalStop:
        self._before = {number: signal.signal(number, self._caught) for number in STOP_SIGNALS}
        return self

    def __exit__(self, *_: object) -> None:
        for number, handler in self._before.items():
            signal.signal(number, handler)


def _record(
    args: argparse.Namespace,
    path: Path,
    retention: Retention,
    stop: _SignalStop,
    source_of: Callable[[], tuple[Source, str]],
    rules_of: Callable[[], Sequence[Any]],
) -> int:
    from gpuconsole.record.daemon import record_fleet
    from gpuconsole.record.recorder import Recorder
    from gpuconsole.record.when import stamp

    rules = rules_of()
    source, label = source_of()
    try:
        try:
            recorder = Recorder(path, label=label, retention=retention)
        except RecordingError as error:
            return _fail(str(error), EXIT_UNREADABLE)
        hosts = len(source.hosts)
        print(
            f"gpuconsole: recording {hosts} host{'s' if hosts != 1 else ''} ({label}) into "
            f"{path} every {args.refresh:g} s (Ctrl+C stops)",
            file=sys.stderr,
            flush=True,
        )
        try:
            problem = record_fleet(
                source,
                recorder,
                rules,
                interval=args.refresh,
                stop=stop.event,
                duration=args.duration,
            )
        finally:
            recorder.close()
        if problem is not None:
            return _fail(problem, EXIT_UNREADABLE)
        if stop.by is not None:
            until = recorder.recorded_until
            held = "no readings yet" if until is None else f"readings until {stamp(until)}"
            print(
                f"gpuconsole: stopped by {stop.by}: {path} holds {held}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    return 0


def run_replay(args: argparse.Namespace, theme: str, rules_of: Callable[[], Sequence[Any]]) -> int:
    """The console on the recording, or (--list) its timeline as text or JSON."""
    from gpuconsole.record.reader import Recording
    from gpuconsole.record.when import parse_moment

    try:
        recording = Recording(args.file, skip_damaged=True)
    except RecordingError as error:
        return _fail(str(error), EXIT_UNREADABLE)
    try:
        if recording.start is None or recording.end is None:
            return _fail(f"{args.file}: the recording holds no readings yet", EXIT_UNREADABLE)
        if args.host is not None and args.host not in recording.hosts:
            known = ", ".join(recording.hosts[:8]) + (" …" if len(recording.hosts) > 8 else "")
            return _fail(
                f"{args.file}: no host {args.host!r} in this recording (hosts: {known})",
                EXIT_BAD_INPUT,
            )
        at = None
        if args.at is not None:
            try:
                at = parse_moment(args.at, recording.start, recording.end)
            except ValueError as error:
                return _fail(f"--at {error}", EXIT_BAD_INPUT)
        if args.list:
            try:
                return _list(recording, at, args.host, args.json)
            except BrokenPipeError:  # `… --list | head`: the reader has seen enough
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
        from gpuconsole.replay_app import ReplayApp

        ReplayApp(recording, at=at, host=args.host, theme=theme, alert_rules=rules_of()).run()
        return 0
    except RecordingError as error:
        return _fail(str(error), EXIT_UNREADABLE)
    finally:
        recording.close()


def _list(recording: Recording, at: float | None, host: str | None, as_json: bool) -> int:
    """The episodes (around ``at`` when given), oldest first; INFO ones only in JSON.

    The listed stretch is checked for damage first: the damaged parts are listed too, and the
    exit code says that the list is not all the recording held. The readings' contents are
    checked around ``at``, or everywhere in a recording of at most `MAX_LIST_CHECKED_ROWS`
    readings (a line says when they were not).
    """
    from gpuconsole.record.when import stamp

    start = None if at is None else at - LIST_WINDOW_S
    end = None if at is None else at + LIST_WINDOW_S
    rows = recording.count_readings(start, end)
    contents = at is not None or rows <= MAX_LIST_CHECKED_ROWS
    damage = recording.check(start, end, contents=contents)
    episodes = recording.episodes(start, end, host)
    if as_json:
        print(
            json.dumps(
                {
                    "file": str(recording.path),
                    "start": recording.start,
                    "end": recording.end,
                    "hosts": list(recording.hosts),
                    "at": at,
                    "episodes": [e.as_dict() for e in episodes],
                    "damage": [_damage_dict(d) for d in damage],
                    "contents_checked": contents,
                },
                indent=2,
            )
        )
        return _damaged(recording, damage)
    assert recording.start is not None and recording.end is not None
    print(
        f"{recording.path}: {len(recording.hosts)} hosts, {stamp(recording.start)} to "
        f"{stamp(recording.end)}"
    )
    if at is not None:
        print(f"around {stamp(at)} (±{LIST_WINDOW_S / 60:.0f} min){f', {host}' if host else ''}:")
    shown = [e for e in episodes if e.severity > 0]
    for episode in shown:
        print(_episode_line(episode, at))
    if not shown:
        print("no warning or critical finding or alert")
    for part in damage[:MAX_DAMAGE_LISTED]:
        print(f"! damaged: {part.line()}")
    if len(damage) > MAX_DAMAGE_LISTED or recording.damage.more:
        print("! damaged: and more")
    if not contents:
        print(
            f"! not checked: the contents of {rows} readings (--at checks the "
            f"{2 * LIST_WINDOW_S / 60:.0f} minutes around a time)"
        )
    return _damaged(recording, damage)


def _damaged(recording: Recording, damage: Sequence[Damage]) -> int:
    """The exit code of a list: EXIT_UNREADABLE (and a line saying so) when damage was found."""
    if not damage:
        return 0
    count = f"{len(damage)} damaged part{'s' if len(damage) != 1 else ''}"
    return _fail(f"{recording.path}: {count}, listed with the rest", EXIT_UNREADABLE)


def _damage_dict(damage: Damage) -> dict[str, Any]:
    return {
        "table": damage.table,
        "host": damage.host,
        "start": damage.start,
        "end": damage.end,
        "rows": damage.rows,
        "what": damage.what,
    }


def _episode_line(episode: Episode, at: float | None) -> str:
    from gpuconsole.record.when import clock

    until = "open" if episode.until is None else clock(episode.until)
    marker = "*" if at is not None and episode.open_at(at) else " "
    where = episode.host if episode.gpu is None else f"{episode.host} GPU {episode.gpu}"
    kind = "alert " if episode.kind == "alert" else ""
    line = (
        f"{marker} {clock(episode.since)}–{until:<8} {episode.severity.name:<8} {where:<18} "
        f"{kind}{episode.code}: {episode.message}"
    )
    if episode.remediation:
        line += f"\n    next: {episode.remediation}"
    return line


def _fail(message: str, code: int) -> int:
    print(f"gpuconsole: {message}", file=sys.stderr)
    return code
