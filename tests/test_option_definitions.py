"""Each option is defined once, with its bounds, and parses alike in every command that takes it.

--refresh was parsed three ways (`record --refresh 5s` worked, `exporter --refresh 5s` was
refused, `exporter --refresh -1` passed), and the agent's interval bound was met only inside a
host's watch task, where the agent refused the interval and the host showed as down. Now one
parser (`options.refresh_seconds`) takes plain seconds and durations everywhere and holds them to
the agent's own constants at parse time; and every option that several commands share has one
definition (`options.add_*`), which `divergences` checks over the whole parser.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
from collections.abc import Callable, Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hostile_cli import REQUIRED  # what each command needs besides its options

from gpuconsole.cli import global_options
from gpuconsole.cli.commands import options
from gpuconsole.cli.commands.exits import EXIT_BAD_INPUT
from gpuconsole.cli.main import build_parser, main
from gpuconsole.telemetry import agent, wire

LOW, HIGH = agent.MIN_INTERVAL_S, agent.MAX_INTERVAL_S


def _commands_with(flag: str) -> list[str]:
    """The commands (by their words; "" is the console) whose parser has ``flag``."""
    return sorted(
        words
        for words, parser in global_options.leaf_commands(build_parser()).items()
        if any(flag in action.option_strings for action in parser._actions)
    )


REFRESH_COMMANDS = _commands_with("--refresh")


def _placements(command: str, value: str) -> list[list[str]]:
    """``--refresh=VALUE`` given to ``command``: after it, and before it (a global option).

    The ``=`` form hands argparse any text as the value (``-1e3`` would read as an option)."""
    option = f"--refresh={value}"
    after = [*command.split(), option, *REQUIRED.get(command, ())]
    if not command:
        return [after]
    return [after, [option, *command.split(), *REQUIRED.get(command, ())]]


class Parsed:
    """What one parse of ``words`` gave: the namespace, or the exit code and the last line said."""

    def __init__(self, words: Sequence[str]) -> None:
        err = io.StringIO()
        self.args: argparse.Namespace | None = None
        self.code: object = None
        with contextlib.redirect_stderr(err):
            try:
                self.args = global_options.parse(build_parser(), list(words))
            except SystemExit as exited:
                self.code = exited.code
        said = err.getvalue().strip().splitlines()
        self.line = said[-1] if said else ""

    @property
    def value(self) -> float | None:
        """--refresh's value."""
        return None if self.args is None else self.args.refresh

    @property
    def error(self) -> str:
        """The line without the program's name (`gpuconsole record: `), which names the
        command."""
        return self.line.partition(": error: ")[2]


def _parsed_everywhere(value: str) -> list[tuple[list[str], Parsed]]:
    return [
        (words, Parsed(words))
        for command in REFRESH_COMMANDS
        for words in _placements(command, value)
    ]


def _agent_takes(text: str) -> float | None:
    """The agent's own --interval parse of ``text`` (the judge): its value, or None."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return float(agent.parse_options(["--interval", text]).interval)
        except SystemExit:
            return None


# --- --refresh ----------------------------------------------------------------------------------


def test_the_refresh_commands_are_the_console_record_and_the_exporter() -> None:
    assert REFRESH_COMMANDS == ["", "exporter", "record"]


def test_the_bounds_are_the_agents_own_constants() -> None:
    """Imported, not copied: a literal 0.1 in the CLI would be another float object."""
    low, high = options.REFRESH_BOUNDS_S
    assert low is agent.MIN_INTERVAL_S
    assert high is agent.MAX_INTERVAL_S


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5", 5.0),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("0.5", 0.5),
        (".5", 0.5),
        ("1e1", 10.0),
        (f"{LOW!r}", LOW),
        (f"{HIGH!r}", HIGH),
    ],
)
def test_every_command_takes_the_same_spellings(text: str, seconds: float) -> None:
    for words, parsed in _parsed_everywhere(text):
        assert parsed.code is None, (words, parsed.line)
        assert parsed.value == seconds, words


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0.01", f"is not between {LOW:g} and {HIGH:g} seconds"),
        ("99999", f"is not between {LOW:g} and {HIGH:g} seconds"),
        ("2h", f"is not between {LOW:g} and {HIGH:g} seconds"),
        ("0", f"is not between {LOW:g} and {HIGH:g} seconds"),
        ("-1", f"is not between {LOW:g} and {HIGH:g} seconds"),
        ("nan", f"is not between {LOW:g} and {HIGH:g} seconds"),
        ("inf", f"is not between {LOW:g} and {HIGH:g} seconds"),
        ("1e300", f"is not between {LOW:g} and {HIGH:g} seconds"),
        (repr(math.nextafter(LOW, 0)), f"is not between {LOW:g} and {HIGH:g} seconds"),
        (repr(math.nextafter(HIGH, math.inf)), f"is not between {LOW:g} and {HIGH:g} seconds"),
        ("abc", "is not a number of seconds or a duration (like 5s, 2m)"),
        ("5 minutes", "is not a number of seconds or a duration (like 5s, 2m)"),
    ],
)
def test_every_command_refuses_the_same_values_with_the_same_line(text: str, why: str) -> None:
    for words, parsed in _parsed_everywhere(text):
        assert parsed.code == EXIT_BAD_INPUT == 2, words
        prog = " ".join(["gpuconsole", *words[: words.index(f"--refresh={text}")]])
        assert parsed.line == f"{prog}: error: argument --refresh: {text!r} {why}", words


def test_the_refusal_is_one_line_and_exit_2_from_main(capsys: pytest.CaptureFixture[str]) -> None:
    """As the CLI's other usage errors: argparse's usage, then the one line naming the option
    and the bound; nothing starts (no source, no host's watch task)."""
    for argv in (
        ["exporter", "--demo", "--refresh", "0.01"],
        ["record", "--hosts", "gpu01", "--refresh", "99999"],
        ["--refresh", "0.01", "record"],
        ["--hosts", "gpu01", "--refresh", "0.01"],
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2, argv
        out, err = capsys.readouterr()
        assert out == ""
        errors = [line for line in err.splitlines() if ": error: " in line]
        assert len(errors) == 1, err
        assert errors[0] == err.strip().splitlines()[-1]
        assert "argument --refresh: " in errors[0]
        assert f"between {LOW:g} and {HIGH:g} seconds" in errors[0]
        assert "Traceback" not in err


def test_the_help_names_the_bounds_in_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    shown = set()
    for command in REFRESH_COMMANDS:
        with pytest.raises(SystemExit):
            build_parser().parse_args([*command.split(), "--help"])
        text = " ".join(capsys.readouterr().out.split())
        line = text[text.index("--refresh SECONDS ") :].split("--", 2)[1]
        assert f"{LOW:g} to {HIGH:g}" in line, command
        shown.add(line)
    assert len(shown) == 1, shown  # one help, word for word


_UNITS = st.sampled_from(["", "s", "m", "h", "d", "w", " s", "ms", "x"])
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(min_value=0, max_value=5000).map(lambda x: f"{x:g}"),
    st.floats(min_value=0, max_value=5000).map(lambda x: f"{x:.3f}"),
    st.integers(min_value=-10, max_value=10**6).map(str),
)
_SPELLINGS = st.one_of(
    st.tuples(_NUMBERS, _UNITS).map("".join),
    st.text(alphabet="0123456789.eE+-_ smhdwinfa", max_size=8),
)


@settings(max_examples=150, deadline=None)
@given(_SPELLINGS)
def test_every_command_parses_any_spelling_alike(text: str) -> None:
    """Same value everywhere, or the same refusal (but for the program's name) and code."""
    outcomes = {(p.value, p.code, p.error) for _, p in _parsed_everywhere(text)}
    assert len(outcomes) == 1, (text, outcomes)
    ((value, code, error),) = outcomes
    if code is None:
        assert value is not None and LOW <= value <= HIGH
        assert error == ""
    else:
        assert code == 2 and value is None
        assert error.startswith("argument --refresh: "), error


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0.0, 4000.0)))
def test_a_plain_number_is_taken_where_the_agent_takes_it(seconds: float) -> None:
    """The judge is the agent's own --interval parse, and what the console then sends it."""
    text = repr(seconds)
    try:
        value: float | None = options.refresh_seconds(text)
    except argparse.ArgumentTypeError:
        value = None
    assert value == _agent_takes(text)
    if value is not None:  # the command line the supervisor starts the agent with
        assert _agent_takes(f"{value:g}") is not None
        wire.agent_command(100, value)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.001, 100.0), st.sampled_from([("s", 1), ("m", 60), ("h", 3600)]))
def test_a_duration_is_its_seconds(number: float, unit: tuple[str, int]) -> None:
    suffix, scale = unit
    text = f"{number:.3f}{suffix}"
    seconds = float(f"{number:.3f}") * scale
    try:
        value: float | None = options.refresh_seconds(text)
    except argparse.ArgumentTypeError:
        value = None
    assert value == (seconds if LOW <= seconds <= HIGH else None)


def test_the_supervisor_refuses_an_interval_the_agent_would_refuse() -> None:
    """Not in a host's watch task, where the host would show as down: at construction."""
    from gpuconsole.hosts.supervisor import Supervisor

    for seconds in (math.nextafter(LOW, 0), math.nextafter(HIGH, math.inf), math.nan):
        with pytest.raises(ValueError, match="is outside"):
            Supervisor([], interval=seconds, script=b"#")
    Supervisor([], interval=LOW, script=b"#")
    Supervisor([], interval=HIGH, script=b"#")


# --- every shared option, one definition -----------------------------------------------------

HELP_PER_COMMAND = frozenset(
    {"--record", "--host", "--json", "--yes", "-o", "--output", "--at", "--preset", "--steps"}
    | {"--host-label", "--dcgm-exporter"}
)
"""Options whose help says what the command does with them (it differs by command); their
type, choices and bounds do not."""
DEFAULT_PER_COMMAND = frozenset({"--steps"})
"""`launch --steps`: the recipe's; `memory --steps`: 20 per trial."""
METAVAR_PER_COMMAND = frozenset({"-o", "--output"})
"""-o FILE (an export) or -o PATH (a bundle: a file or a folder)."""

_SAME = ("type", "choices", "nargs", "const", "required", "dest")


def divergences(parsers: Iterable[tuple[str, argparse.ArgumentParser]]) -> list[str]:
    """Each option that two commands define differently: another parse (``type`` is the
    parsing function itself, so a copy with the same bounds counts), other choices, another
    action, or (outside the lists above) another default, metavar or help. Positionals are each
    command's own words (repair's optional HOST, drain's required one)."""
    seen: dict[str, tuple[str, argparse.Action]] = {}
    found: list[str] = []
    for words, parser in parsers:
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            for name in action.option_strings:
                if name not in seen:
                    seen[name] = (words, action)
                    continue
                where, first = seen[name]
                fields: list[str] = [f for f in _SAME if getattr(first, f) != getattr(action, f)]
                if type(first) is not type(action):
                    fields.append("action")
                if name not in DEFAULT_PER_COMMAND and first.default != action.default:
                    fields.append("default")
                if name not in METAVAR_PER_COMMAND and first.metavar != action.metavar:
                    fields.append("metavar")
                if name not in HELP_PER_COMMAND and first.help != action.help:
                    fields.append("help")
                if fields:
                    found.append(f"{name}: `{where}` and `{words}` differ in {', '.join(fields)}")
    return found


def _leaves() -> list[tuple[str, argparse.ArgumentParser]]:
    return list(global_options.leaf_commands(build_parser()).items())


def test_every_shared_option_has_one_definition() -> None:
    assert divergences(_leaves()) == []


def _with_probe(change: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    extra = argparse.ArgumentParser(prog="gpuconsole probe")
    change(extra)
    return divergences([*_leaves(), ("probe", extra)])


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        # the bug this file is about: a --refresh of a command's own, parsed as a float
        (
            lambda p: p.add_argument("--refresh", type=float, default=1.0, metavar="SECONDS"),
            "type",
        ),
        (lambda p: p.add_argument("--preset", choices=("tuned", "baseline")), "choices"),
        (lambda p: p.add_argument("--json", action="store_const", const=1), "action"),
        (lambda p: p.add_argument("--alerts", metavar="FILE"), "type"),
        (lambda p: p.add_argument("--demo-hosts", type=options.positive_int), "type"),
    ],
)
def test_a_divergent_definition_is_found(
    change: Callable[[argparse.ArgumentParser], None], differs: str
) -> None:
    """The check can fail: a command that defines a shared option its own way is named."""
    found = _with_probe(change)
    named = [line.partition(" differ in ")[2].split(", ") for line in found]
    assert any(differs in fields for fields in named), found
    assert all("`probe`" in line for line in found), found


def test_a_shared_definition_is_not_found() -> None:
    def shared(parser: argparse.ArgumentParser) -> None:
        options.add_refresh_option(parser)
        options.add_json_option(parser, "with --probe: print JSON")
        options.add_demo_options(parser)
        parser.add_argument("--probe-only", type=int)

    assert _with_probe(shared) == []


def test_a_shared_option_is_defined_by_one_function() -> None:
    """Every pair's type is the same function: `options`' own, not a copy."""
    types = {
        name: {
            action.type
            for _, p in _leaves()
            for action in p._actions
            if name in action.option_strings
        }
        for name in ("--refresh", "--demo-hosts", "--alertmanager", "--port", "--retain")
    }
    assert types["--refresh"] == {options.refresh_seconds}
    assert types["--port"] == {options.port}
    assert types["--retain"] == {options.duration}
    assert len(types["--demo-hosts"]) == 1
    assert len(types["--alertmanager"]) == 1


# --- the other bounds, at parse time ---------------------------------------------------------


@pytest.mark.parametrize("text", ["-1", "65536", "http", "1e3"])
def test_the_exporter_refuses_a_port_when_it_parses(text: str) -> None:
    parsed = Parsed(["exporter", f"--port={text}"])
    assert parsed.code == 2
    assert parsed.line.startswith(f"gpuconsole exporter: error: argument --port: {text!r} is not")


@pytest.mark.parametrize(("text", "number"), [("0", 0), ("9400", 9400), ("65535", 65535)])
def test_the_exporter_takes_every_port(text: str, number: int) -> None:
    assert global_options.parse(build_parser(), ["exporter", "--port", text]).port == number


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("1.5", 1.5), ("2m", 120.0), ("7d", 604800.0)]
)
@pytest.mark.parametrize("option", ["--retain", "--full-resolution", "--duration"])
def test_a_duration_option_takes_seconds_and_durations(
    option: str, text: str, seconds: float
) -> None:
    args = global_options.parse(build_parser(), ["record", option, text])
    assert getattr(args, option.lstrip("-").replace("-", "_")) == seconds


@pytest.mark.parametrize("text", ["0", "-5", "nan", "abc"])
def test_a_duration_option_refuses_what_is_no_duration(text: str) -> None:
    parsed = Parsed(["record", f"--retain={text}"])
    assert parsed.code == 2
    assert parsed.line == (
        f"gpuconsole record: error: argument --retain: {text!r} is not a "
        + ("number of seconds or a duration" if text == "abc" else "duration")
        + " (like 90s, 15m, 6h, 7d)"
    )
