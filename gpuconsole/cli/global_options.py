"""Which of `gpuconsole`'s global options each command reads, and the parse that holds them to it.

A global option is one given before the command: ``gpuconsole --refresh 5 record``. argparse
alone gets two things wrong with them. A command that has an option of the same name (record's
own ``--refresh``) writes that option's default over the value given before it; and a command
that reads no such option ignores it. So while parsing, every global option (at the top and in
each command) has no default, which tells what was given from what was not; a given one that the
command does not read is refused, and the defaults are filled in afterwards. Given both before
and after the command, the later one wins, as a repeated option does.

A command that reads an option may still not read it beside another: with --demo it watches the
simulated rack, not --hosts. Such a pair is refused too (`UNREAD_WITH`), so that no option given
is dropped in silence. --demo-hosts and --seed size the demo: given, they mean --demo. (What
depends on a value rather than on what was given, --hosts where only this machine is named, is
refused where the names are resolved: `gpuconsole.cli.commands.sources`.)

`USES` is written from what each command's ``run`` reads (in `gpuconsole.cli.commands` and the
modules it calls), `UNREAD_WITH` from what `gpuconsole.cli.commands.sources` reads; their tests
check them against the parser and against those reads.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from typing import NamedTuple

COMMAND_DEST = "_command_words"
"""Where the parse notes the command, as `USES` names it ("" for the console itself)."""

DEMO = frozenset({"demo", "demo_hosts", "seed"})
INVENTORY = frozenset({"hosts", "inventory"})
SOURCE = DEMO | INVENTORY | {"prometheus", "refresh"}
"""What `gpuconsole.cli.commands.sources.console_source` reads: the demo rack, a Prometheus server,
or this host and the inventory's hosts polled every --refresh seconds."""

USES: dict[str, frozenset[str]] = {
    "": SOURCE | {"theme", "alerts", "alertmanager", "record", "no_record"},
    "snapshot": DEMO | INVENTORY,
    "triage": frozenset(),
    "hosts check": INVENTORY,
    "verify": INVENTORY,
    "repair": INVENTORY,
    "drain": INVENTORY,
    "resume": INVENTORY,
    "launch": INVENTORY,
    "memory": INVENTORY,
    "bench history": frozenset(),
    "oom": DEMO | INVENTORY,
    "exporter": SOURCE | {"alerts", "alertmanager"},
    "rules export": frozenset({"alerts"}),
    "grafana export": frozenset(),
    "record": SOURCE | {"alerts", "alertmanager", "record"},
    "replay": frozenset({"theme", "alerts"}),
    "bundle": DEMO | INVENTORY | {"alerts", "record"},
}
"""Command -> the global options (by dest) it reads."""


DEMO_SIZE = frozenset({"demo_hosts", "seed"})
"""The demo rack's options besides --demo, which they imply."""


class Unread(NamedTuple):
    """Given ``given`` (an option's dest), a command does not read ``unread``, for ``why``."""

    given: str
    unread: frozenset[str]
    why: str
    commands: frozenset[str] | None = None
    """Where this holds; None: in every command that reads both."""


UNREAD_WITH: tuple[Unread, ...] = (
    Unread("demo", INVENTORY | {"prometheus"}, "the demo watches a simulated rack"),
    Unread("prometheus", INVENTORY, "the hosts are those Prometheus scrapes"),
    Unread("hosts", frozenset({"inventory"}), "--hosts stands for the whole inventory"),
    Unread("no_record", frozenset({"record"}), "it records nothing", frozenset({""})),
    Unread(
        "demo",
        frozenset({"record"}),
        "the demo's past is simulated afresh, not recorded",
        frozenset({"bundle"}),
    ),
    Unread("demo", frozenset({"here"}), "it reads a host of the demo rack", frozenset({"oom"})),
    Unread("host", frozenset({"here"}), "it reads that host", frozenset({"oom"})),
)
"""The pairs refused (`parse`): the second option is not read beside the first."""


def parse(parser: argparse.ArgumentParser, words: Sequence[str]) -> argparse.Namespace:
    """``words`` parsed by ``parser`` (which this changes: call it once per parser).

    Exits 2 with one line when a global option is given to a command that does not read it, or
    beside one that keeps the command from reading it.
    """
    flags = global_flags(parser)
    defaults = _suppress_defaults(parser, flags)
    args = parser.parse_args(words)
    command = getattr(args, COMMAND_DEST, "")
    if command:
        delattr(args, COMMAND_DEST)
    given = {dest for dest in flags if hasattr(args, dest)}
    for dest, flag in flags.items():
        if dest not in given:
            setattr(args, dest, defaults.get((command, dest), defaults[("", dest)]))
        elif dest not in USES[command]:
            parser.exit(2, f"{parser.prog}: {flag} does not apply to `{command}`\n")
    if given & DEMO_SIZE:
        args.demo = True
    problem = _unread_pair(leaf_commands(parser)[command], command, args, given, flags)
    if problem:
        parser.exit(2, f"{parser.prog}: {problem}\n")
    return args


def _unread_pair(
    sub: argparse.ArgumentParser,
    command: str,
    args: argparse.Namespace,
    given_globals: set[str],
    flags: dict[str, str],
) -> str | None:
    """The line that refuses an option ``command`` does not read beside another, if any."""
    own = {a.dest: a for a in sub._actions if a.option_strings and a.dest not in flags}

    def given(dest: str) -> bool:
        if dest in own:  # a command's own option: given where it is not its default
            return getattr(args, dest, own[dest].default) != own[dest].default
        return dest in given_globals or (dest == "demo" and bool(given_globals & DEMO_SIZE))

    def flag(dest: str) -> str:
        if dest in own:
            return own[dest].option_strings[-1]
        if dest == "demo" and "demo" not in given_globals:
            return flags[min(given_globals & DEMO_SIZE)]  # the option that meant --demo
        return flags[dest]

    for rule in UNREAD_WITH:
        if (rule.commands is None or command in rule.commands) and given(rule.given):
            for other in sorted(rule.unread):
                if given(other):
                    return f"{flag(other)} does not apply with {flag(rule.given)} ({rule.why})"
    return None


# argparse has no public way to list a parser's options or commands: `_actions` and
# `_SubParsersAction` are how its own help formatter finds them.


def global_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The top-level options that hold a value (not --help, --version): dest -> long flag."""
    return {
        action.dest: action.option_strings[-1]
        for action in parser._actions
        if action.option_strings and action.default is not argparse.SUPPRESS
    }


def _commands(
    parser: argparse.ArgumentParser, words: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the tree with its command words, the top one ("") first."""
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{words} {name}".strip())


def leaf_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands that run something (``rules export``, not ``rules``), and the console."""
    return {
        words: sub
        for words, sub in _commands(parser)
        if not words or not any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
    }


def _suppress_defaults(
    parser: argparse.ArgumentParser, flags: dict[str, str]
) -> dict[tuple[str, str], object]:
    """Take the defaults of the global options off every parser: (command, dest) -> default.

    Each command that runs notes its words in the namespace (`COMMAND_DEST`).
    """
    defaults: dict[tuple[str, str], object] = {}
    leaves = leaf_commands(parser)
    for words, sub in _commands(parser):
        for action in sub._actions:
            if action.dest in flags and action.option_strings:
                if action.default is not argparse.SUPPRESS:
                    defaults[(words, action.dest)] = action.default
                action.default = argparse.SUPPRESS
        if words in leaves and words:
            sub.set_defaults(**{COMMAND_DEST: words})
    return defaults
