"""`gpuconsole replay FILE`: the console on a recording, with a time cursor, or (--list) what
began and ended in it, as text or JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuconsole.cli.commands import Subcommands
from gpuconsole.cli.commands.console import refuse_without_terminal
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT, EXIT_UNREADABLE, fail
from gpuconsole.cli.commands.options import (
    add_at_option,
    add_host_option,
    add_json_option,
    theme_of,
)
from gpuconsole.cli.commands.sources import alert_rules

if TYPE_CHECKING:
    from gpuconsole.fleet.record.episodes import Episode
    from gpuconsole.fleet.record.reader import Damage, Recording

LIST_WINDOW_S = 600.0
MAX_DAMAGE_LISTED = 50
MAX_LIST_CHECKED_ROWS = 200_000
"""`--list` without `--at` inflates every reading to check it up to this many (a few seconds)."""


def add(commands: Subcommands) -> None:
    replay = commands.add_parser(
        "replay",
        help="open the console on a recording, with a time cursor (or --list its timeline)",
    )
    replay.add_argument("file", type=Path, metavar="FILE", help="a recording")
    add_at_option(replay, "start there")
    add_host_option(replay, "open this host's screen")
    replay.add_argument(
        "--list",
        action="store_true",
        help="print the findings and alerts instead (around --at, for --host), then exit",
    )
    add_json_option(replay, "with --list: print JSON")
    replay.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The console on the recording, or (--list) its timeline as text or JSON."""
    from gpuconsole.cli.output import shown_path
    from gpuconsole.core.untrusted import visible
    from gpuconsole.fleet.record.reader import Recording
    from gpuconsole.fleet.record.schema import RecordingError
    from gpuconsole.fleet.record.when import resolve_moment

    theme = theme_of(args)
    try:
        recording = Recording(args.file, skip_damaged=True)
    except RecordingError as error:
        return fail(visible(str(error)), EXIT_UNREADABLE)
    shown = shown_path(args.file)
    try:
        if recording.start is None or recording.end is None:
            return fail(f"{shown}: the recording holds no readings yet", EXIT_UNREADABLE)
        if args.host is not None and args.host not in recording.hosts:
            known = ", ".join(recording.hosts[:8]) + (" …" if len(recording.hosts) > 8 else "")
            return fail(
                f"{shown}: no host {args.host!r} in this recording (hosts: {known})",
                EXIT_BAD_INPUT,
            )
        at = None
        if args.at is not None:
            try:
                at = resolve_moment(args.at, recording.start, recording.end, str(args.file))
            except ValueError as error:
                return fail(f"--at {error}", EXIT_BAD_INPUT)
        if args.list:
            return _list(recording, at, args.host, args.json)
        from gpuconsole.ui.replay_app import ReplayApp

        refuse_without_terminal(f"`gpuconsole replay {shown} --list [--json]` prints its timeline")
        rules = alert_rules(args)
        ReplayApp(recording, at=at, host=args.host, theme=theme, alert_rules=rules).run()
        return 0
    except RecordingError as error:
        return fail(visible(str(error)), EXIT_UNREADABLE)
    finally:
        recording.close()


def _list(recording: Recording, at: float | None, host: str | None, as_json: bool) -> int:
    """The episodes (around ``at`` when given), oldest first; INFO ones only in JSON.

    The listed stretch is checked for damage first: the damaged parts are listed too, and the
    exit code says that the list is not all the recording held. The readings' contents are
    checked around ``at``, or everywhere in a recording of at most `MAX_LIST_CHECKED_ROWS`
    readings (a line says when they were not).
    """
    from gpuconsole.cli.output import shown_path
    from gpuconsole.fleet.record.when import stamp

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
        f"{shown_path(recording.path)}: {len(recording.hosts)} hosts, {stamp(recording.start)} to "
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
    from gpuconsole.cli.output import shown_path

    count = f"{len(damage)} damaged part{'s' if len(damage) != 1 else ''}"
    return fail(f"{shown_path(recording.path)}: {count}, listed with the rest", EXIT_UNREADABLE)


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
    from gpuconsole.fleet.record.when import clock

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
