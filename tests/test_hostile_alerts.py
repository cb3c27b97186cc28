"""Hostile alert rules: an alerts file a ticket brings is anyone's, and promtool is the judge.

Every refusal is one line naming the file, the rule and the value, never a traceback; what the
console accepts, promtool accepts once exported, and Prometheus evaluates it as the console does.
The judge runs for real: ``promtool check rules`` on what is exported and on the raw texts the
console refuses, ``promtool test rules`` for how PromQL evaluates a condition on given readings.
The properties (hypothesis) feed the parser and the loader arbitrary text, bytes and TOML values.
"""

from __future__ import annotations

import ast
import decimal
import json
import math
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from hypothesis import given, settings
from hypothesis import strategies as st
from promserver import promtool, promtool_available

from gpuconsole.fleet.alerts.config import MAX_FILE_BYTES, load_rules, merge_rules
from gpuconsole.fleet.alerts.defaults import DEFAULT_RULES
from gpuconsole.fleet.alerts.expr import MAX_CONDITION_CHARS, MAX_DEPTH, READINGS, ExprError, parse
from gpuconsole.fleet.alerts.rules import (
    MAX_DURATION_MS,
    AlertRule,
    RuleError,
    parse_duration,
    rule_from_dict,
)
from gpuconsole.prom.rules_export import rules_yaml
from gpuconsole.telemetry.dcgm import Dialect

needs_promtool = pytest.mark.skipif(not promtool_available(), reason="promtool is not installed")
fuzz = settings(max_examples=200, deadline=None, database=None)

JUDGED = ("temperature_c", "power_w", "power_limit_w")
"""The readings the promtool comparisons feed: plain dcgm-exporter gauges."""


def refusal(path: Path) -> str:
    """The one-line RuleError that loading ``path`` gives; it names the file first."""
    with pytest.raises(RuleError) as caught:
        load_rules(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    assert message.isprintable()
    return message


def alerts_file(tmp_path: Path, text: str | bytes, name: str = "alerts.toml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def promtool_verdicts(tmp_path: Path, rule_files: Mapping[str, str]) -> dict[str, str | None]:
    """``promtool check rules`` on each named rules file: None where it passes, else its reason.

    One promtool run for all: it prints each failure on stderr as ``FILE: reason``."""
    directory = tmp_path / "verdicts"
    directory.mkdir()
    paths = {name: directory / f"{name}.yml" for name in rule_files}
    for name, text in rule_files.items():
        paths[name].write_text(text, encoding="utf-8")
    result = promtool("check", "rules", *map(str, paths.values()))
    verdicts: dict[str, str | None] = dict.fromkeys(rule_files)
    for line in result.stderr.splitlines():
        for name, path in paths.items():
            if line.startswith(f"{path}: "):
                verdicts[name] = line.removeprefix(f"{path}: ")
    assert (result.returncode == 0) == all(v is None for v in verdicts.values()), result.stderr
    return verdicts


def raw_rule(expr: str = "up > 0", duration: str = "0s", label: str = "x") -> str:
    """A Prometheus rules file written by hand, for the judge's verdict on raw texts."""
    return (
        "groups:\n  - name: g\n    rules:\n      - alert: A\n"
        f"        expr: {json.dumps(expr)}\n        for: {json.dumps(duration)}\n"
        f"        labels:\n          team: {json.dumps(label)}\n"
    )


# --- the file itself ----------------------------------------------------------------------------


def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = alerts_file(tmp_path, b'\xff\xfe[[rule]]\nname = "x"\n')
    assert refusal(path) == f"{path}: not UTF-8 text, as TOML must be (byte 0xff at offset 0)"
    data = 'disable = ["gpu-xid"]\n# caf\xe9\n'.encode("latin-1")
    later = alerts_file(tmp_path, data, "latin-1.toml")
    offset = data.index(0xE9)
    assert refusal(later).endswith(f"(byte 0xe9 at offset {offset})")


def test_cli_rules_export_of_a_non_utf8_file_is_one_line(tmp_path: Path) -> None:
    path = alerts_file(tmp_path, b"\x80\x81\x82")
    for argv in (
        ("--alerts", str(path), "rules", "export"),
        ("rules", "export", "--alerts", str(path)),
    ):
        result = gpuconsole(*argv)
        assert result.returncode == 2
        assert result.stdout == ""
        assert result.stderr == (
            f"gpuconsole: {path}: not UTF-8 text, as TOML must be (byte 0x80 at offset 0)\n"
        )


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("a = " + "[" * 5000 + "]" * 5000, "not valid TOML: arrays or tables nested too deeply"),
        ("a = " + "{b = " * 3000 + "1" + "}" * 3000, "nested too deeply"),
        ("a = " + "9" * 5000, "not valid TOML: Exceeds the limit (4300 digits)"),
        ("#" * (MAX_FILE_BYTES + 1), f"larger than {MAX_FILE_BYTES} bytes"),
    ],
    ids=["nested-arrays", "nested-tables", "5000-digit-integer", "too-big"],
)
def test_hostile_toml_is_one_line(tmp_path: Path, text: str, complaint: str) -> None:
    assert complaint in refusal(alerts_file(tmp_path, text))


def test_a_file_name_a_terminal_would_obey_is_quoted(tmp_path: Path) -> None:
    path = alerts_file(tmp_path, b"\xff", "evil\n\x1b[2J.toml")
    with pytest.raises(RuleError) as caught:
        load_rules(path)
    message = str(caught.value)
    assert message.startswith(repr(str(path)) + ": not UTF-8 text")
    assert message.isprintable()


# --- numbers and durations beyond float64 and int64 ---------------------------------------------

BIG = "9" * 400


@pytest.mark.parametrize(
    ("expr", "number"),
    [
        (f"temperature_c > {BIG}", BIG),
        (f"power_w > power_limit_w * 1{'0' * 399}", "1" + "0" * 399),
        ("temperature_c < 1e400", "1e400"),
    ],
    ids=["threshold", "factor", "exponent"],
)
def test_a_number_past_float64_is_refused_in_one_line(
    tmp_path: Path, expr: str, number: str
) -> None:
    path = alerts_file(
        tmp_path, f'[[rule]]\nname = "big"\nexpr = "{expr}"\nseverity = "info"\nmessage = "m"\n'
    )
    message = refusal(path)
    quoted = repr(number) if len(number) <= 60 else f"{number[:60]!r}… ({len(number)} characters)"
    assert message == (
        f"{path}: rule 'big': expr: number {quoted} is out of range for a float64 "
        "(PromQL: value out of range)"
    )


@needs_promtool
def test_promtool_refuses_the_same_numbers(tmp_path: Path) -> None:
    verdicts = promtool_verdicts(
        tmp_path,
        {
            "digits": raw_rule(f"up > {BIG}"),
            "exponent": raw_rule("up > 1e400"),
            "underflow": raw_rule("up > 1e-400"),
        },
    )
    assert "value out of range" in (verdicts["digits"] or "")
    assert "value out of range" in (verdicts["exponent"] or "")
    assert verdicts["underflow"] is None
    assert parse("temperature_c > 1e-400").promql() == "DCGM_FI_DEV_GPU_TEMP > 0"


DURATIONS = [
    "0",
    "0s",
    "0ms",
    "1ms",
    "01m",
    "90s",
    "1h30m",
    "1w",
    "1y2w3d4h5m6s7ms",
    "292y",
    "293y",
    f"{MAX_DURATION_MS}ms",
    f"{MAX_DURATION_MS + 1}ms",
    "292y24w3d23h47m16s854ms",
    "292y24w3d23h47m16s855ms",
    "2562047h",
    "2562048h",
    "99999999999999999y",
    BIG + "s",
    "0" * 30 + "5m",
    "",
    "5",
    "00",
    "1m1h",
    "1.5m",
    "5M",
    "-5m",
    "\u0665m",
]


@needs_promtool
def test_for_durations_agree_with_promtool(tmp_path: Path) -> None:
    """Each ``for`` is accepted by the console exactly when promtool accepts it, refused with
    promtool's own reason where it is out of range."""
    verdicts = promtool_verdicts(
        tmp_path, {f"d{i}": raw_rule(duration=text) for i, text in enumerate(DURATIONS)}
    )
    assert MAX_DURATION_MS == 9_223_372_036_854  # int64 nanoseconds, in milliseconds
    for i, text in enumerate(DURATIONS):
        judged = verdicts[f"d{i}"]
        try:
            parse_duration(text)
        except ValueError as error:
            assert judged is not None, f"{text!r}: promtool accepts it, the console refuses"
            if judged == "duration out of range":
                assert "duration out of range" in str(error), text
            continue
        assert judged is None, f"{text!r}: the console accepts it, promtool says {judged}"


def test_a_huge_for_is_one_line_naming_file_rule_and_value(tmp_path: Path) -> None:
    path = alerts_file(
        tmp_path, '[[rule]]\nname = "slow"\nfindings = ["xid"]\nfor = "99999999999999999y"\n'
    )
    assert refusal(path) == (
        f"{path}: rule 'slow': for: '99999999999999999y': duration out of range (Prometheus's "
        "longest is 9223372036854ms, about 292 years)"
    )
    path.write_text(f'[[rule]]\nname = "slower"\nfindings = ["xid"]\nfor = "{BIG}s"\n')
    assert refusal(path).startswith(f"{path}: rule 'slower': for: '{'9' * 60}'… (401 characters)")


def test_the_longest_for_is_kept_exactly() -> None:
    assert parse_duration("292y24w3d23h47m16s854ms") == MAX_DURATION_MS / 1000
    assert parse_duration("1s500ms") == 1.5


# --- expressions too long or too deep -------------------------------------------------------------

CHAINS = {
    "and": " and ".join(["temperature_c > 1"] * 100_000),
    "plus": "1 + " * 100_000 + "temperature_c > 1",
    "compare": "temperature_c" + " > 1" * 100_000,
}


@pytest.mark.parametrize("name", CHAINS)
def test_100000_chained_operators_are_refused_at_once(name: str) -> None:
    text = CHAINS[name]
    began = time.perf_counter()
    with pytest.raises(ExprError) as caught:
        parse(text)
    assert time.perf_counter() - began < 2.0  # a length check: microseconds, not a parse
    message = str(caught.value)
    assert message.startswith(f"longer than {MAX_CONDITION_CHARS} characters ({len(text)}): ")
    assert "\n" not in message
    assert len(message) < 200


def test_chained_operators_in_a_file_are_one_line(tmp_path: Path) -> None:
    chain = " and ".join(["temperature_c > 1"] * 30_000)  # 630 kB: under the file's cap
    path = alerts_file(
        tmp_path,
        f'[[rule]]\nname = "long"\nexpr = "{chain}"\nseverity = "info"\nmessage = "m"\n',
    )
    assert refusal(path).startswith(
        f"{path}: rule 'long': expr: longer than {MAX_CONDITION_CHARS} characters ({len(chain)}): "
    )
    result = gpuconsole("--alerts", str(path), "rules", "export")
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "text",
    [
        "-" * 500 + "temperature_c > 1",
        "(" * 100 + "temperature_c" + ")" * 100 + " > 1",
        "temperature_c" + " + 1" * 100 + " > 1",
        "not " * 100 + "temperature_c > 1",
    ],
    ids=["minus", "parentheses", "sum", "not"],
)
def test_deep_nesting_within_the_length_is_refused(text: str) -> None:
    assert len(text) <= MAX_CONDITION_CHARS
    with pytest.raises(ExprError, match=f"^nested more than {MAX_DEPTH} deep: "):
        parse(text)


@needs_promtool
def test_a_condition_at_the_depth_cap_works_and_exports(tmp_path: Path) -> None:
    deepest = "temperature_c" + " + 1" * (MAX_DEPTH - 2) + " > 1"
    rule = rule_from_dict(
        {"name": "deep", "expr": deepest, "severity": "info", "message": "m"}, "test"
    )
    assert rule.condition is not None
    assert rule.condition.test(lambda name: 10.0) == 10.0 + MAX_DEPTH - 2
    with pytest.raises(ExprError, match="nested more than"):
        parse(deepest.replace(" > 1", " + 1 > 1"))
    assert promtool_verdicts(tmp_path, {"deep": rules_yaml([rule])}) == {"deep": None}


# --- templates and control characters in labels and messages --------------------------------------

TEMPLATE_LABELS = {
    "open": "{{",
    "template": "{{ $labels.Hostname }}",
    "query": '{{ query "up" }}',
    "close": "a }} b {",
    "brace": "{",
}


@needs_promtool
def test_promtool_refuses_or_runs_templates_in_raw_labels(tmp_path: Path) -> None:
    """Why the export escapes: written raw, promtool refuses ``{{`` and passes a query."""
    verdicts = promtool_verdicts(
        tmp_path, {name: raw_rule(label=text) for name, text in TEMPLATE_LABELS.items()}
    )
    assert verdicts["open"] == (
        'group "g", rule 1, "A": label "team": template: __alert_A:1: unclosed action'
    )
    assert verdicts["template"] is None  # would expand to the host's name
    assert verdicts["query"] is None  # would run PromQL at every evaluation
    assert verdicts["close"] is None


@needs_promtool
def test_braces_in_labels_and_messages_stay_text_in_prometheus(tmp_path: Path) -> None:
    """Exported, every label and message keeps its braces as text: promtool passes the file and
    its alert carries exactly the labels and the message the console's alert does."""
    rule = rule_from_dict(
        {
            "name": "braces",
            "expr": "temperature_c > 80",
            "severity": "warning",
            # "{{" is the console's own escape for "{": the literal text is "{0} {{ query ...".
            "message": '{{{gpu}}} {{{{ query "up" }}}} {host}{{',
            "labels": TEMPLATE_LABELS,
        },
        "test",
    )
    assert rule.render("n1", 0, 85.0) == '{0} {{ query "up" }} n1{'
    assert promtool_verdicts(tmp_path, {"braces": rules_yaml([rule])}) == {"braces": None}
    labels = {"Hostname": "n1", "gpu": "0", "UUID": "GPU-n1", "modelName": "H200"}
    result = unit_test(
        tmp_path,
        [rule],
        [
            {
                "interval": "1m",
                "input_series": [series("n1", "temperature_c", 85.0)],
                "alert_rule_test": [
                    {
                        "eval_time": "0m",
                        "alertname": "Braces",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    **labels,
                                    **dict(rule.labels),
                                    "rule": "braces",
                                    "severity": "warning",
                                },
                                "exp_annotations": {"summary": rule.render("n1", 0, 85.0)},
                            }
                        ],
                    }
                ],
            }
        ],
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("where", "text", "shown"),
    [
        ("label", "\x1b]52;c;cm0gLXJmIH4=\x07", "'\\x1b'"),
        ("label", "ops\x85", "'\\x85'"),
        ("label", "team\x7f", "'\\x7f'"),
        ("message", "{host}\x1b[2J hot", "'\\x1b'"),
        ("message", "{host}\nforged line", "'\\n'"),
        ("message", "GPU \u202ecod", "'\\u202e'"),
    ],
)
def test_control_characters_in_alert_texts_are_refused(
    tmp_path: Path, where: str, text: str, shown: str
) -> None:
    # JSON's string escapes (\u001b) are TOML's.
    line = (
        f"labels = {{ team = {json.dumps(text)} }}"
        if where == "label"
        else (f"message = {json.dumps(text)}")
    )
    path = alerts_file(tmp_path, f'[[rule]]\nname = "r"\nfindings = ["xid"]\n{line}\n')
    what = "label 'team'" if where == "label" else "message"
    assert (
        refusal(path) == f"{path}: rule 'r': {what}: {text!r} holds the control character {shown}"
    )


@needs_promtool
def test_unprintable_characters_are_escaped_for_yaml(tmp_path: Path) -> None:
    """An `AlertRule` built in code skips the loader's checks; its export still passes."""
    rule = AlertRule(
        name="odd",
        for_text="0s",
        for_seconds=0.0,
        severity=None,
        message="{host}\x7f\x9b\u2028\ufeff",
        labels=(("team", "a\x85\x7f\U000e0001b"),),
        findings=("xid",),
    )
    text = rules_yaml([rule])
    assert all(line.isprintable() for line in text.splitlines())
    assert "\\u007f" in text and "\\u2028" in text and "\\U000e0001" in text
    assert promtool_verdicts(tmp_path, {"odd": text}) == {"odd": None}


# --- PromQL's arithmetic, judged by promtool test rules -------------------------------------------


def series(host: str, reading: str, value: float) -> dict[str, str]:
    labels = f'Hostname="{host}",gpu="0",UUID="GPU-{host}",modelName="H200"'
    return {"series": f"{READINGS[reading].promql}{{{labels}}}", "values": repr(value)}


def unit_test(
    tmp_path: Path, rules: list[AlertRule], tests: list[dict]
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yml").write_text(rules_yaml(rules), encoding="utf-8")
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "tests.yml").write_text(json.dumps(spec), encoding="utf-8")
    return promtool("test", "rules", str(tmp_path / "tests.yml"))


def judged_by_promtool(
    tmp_path: Path, cases: list[tuple[str, dict[str, float | None]]]
) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on the console's: each case a condition and one GPU's readings (None:
    no series), in a test group of its own; the alert expected is the console's, with its value
    in the summary (``%.3f``, which Python and Go print alike, Inf and NaN as Go does)."""
    rules = [
        rule_from_dict(
            {"name": f"case-{k}", "expr": expr, "severity": "info", "message": "{value:.3f}"},
            "cases",
        )
        for k, (expr, _) in enumerate(cases)
    ]
    tests = []
    for k, (rule, (_, readings)) in enumerate(zip(rules, cases, strict=True)):
        host = f"h{k}"
        assert rule.condition is not None
        value = rule.condition.test(readings.get)
        alerts = [
            {
                "exp_labels": {
                    "Hostname": host,
                    "gpu": "0",
                    "UUID": f"GPU-{host}",
                    "modelName": "H200",
                    "rule": rule.name,
                    "severity": "info",
                },
                "exp_annotations": {"summary": rule.render(host, 0, value)},
            }
        ]
        tests.append(
            {
                "interval": "1m",
                "input_series": [
                    series(host, name, v) for name, v in readings.items() if v is not None
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "0m",
                        "alertname": rule.alert_name,
                        "exp_alerts": [] if value is None else alerts,
                    }
                ],
            }
        )
    return unit_test(tmp_path, rules, tests)


T5 = {"temperature_c": 5.0}
T0 = {"temperature_c": 0.0}
PROMQL_CASES: list[tuple[str, dict[str, float | None], float | None]] = [
    # (condition, readings, the console's value: None where it does not hold)
    ("-temperature_c / 0 < 1", T5, -math.inf),  # (-x) / 0: -Inf, which is < 1
    ("temperature_c / 0 > 1", T5, math.inf),
    ("temperature_c / -0 < 1", T5, -math.inf),  # -0 is a signed zero
    ("-temperature_c / 0 > 1", T0, None),  # -0 / 0 is NaN: no comparison holds...
    ("temperature_c / 0 != 1", T0, math.nan),  # ... but !=, which holds, keeping NaN
    ("temperature_c / 0 == temperature_c / 0", T0, None),
    ("temperature_c / 0 < 1 or temperature_c / 0 >= 1", T0, None),
    ("80 < temperature_c", {"temperature_c": 85.0}, 85.0),  # the vector's value, not 80
    ("80 < temperature_c < 90", {"temperature_c": 85.0}, 85.0),
    ("-temperature_c * 2 + 3 < 0", T5, -7.0),
    ("2 - -temperature_c > 6", T5, 7.0),
    ("temperature_c - 2 - 1 == 2", T5, 2.0),  # left-associative: (5 - 2) - 1
    ("temperature_c / 10 / 2 == 0.25", T5, 0.25),  # (5 / 10) / 2, not 5 / (10 / 2)
    ("temperature_c - 1 * 2 == 3", T5, 3.0),  # * before -
    ("power_w > 1", T5, None),  # no series: no alert, never a zero
    ("power_w >= power_limit_w * 0.98", {"power_w": 690.0, "power_limit_w": 0.0}, 690.0),
    ("power_w / power_limit_w > 0.5", {"power_w": 1.0, "power_limit_w": 0.0}, math.inf),
    ("temperature_c < 1e300", T5, 5.0),
    ("1e-400 < temperature_c", T5, 5.0),  # 1e-400 is 0 in float64, for both
    ("temperature_c > 1 and power_w > 1 or temperature_c < 10", T5, 5.0),
]


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_the_console_evaluates_as_promql() -> None:
    for expr, readings, expected in PROMQL_CASES:
        assert same(parse(expr).test(readings.get), expected), expr


@needs_promtool
def test_promtool_evaluates_the_same(tmp_path: Path) -> None:
    result = judged_by_promtool(tmp_path, [(expr, readings) for expr, readings, _ in PROMQL_CASES])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_the_promtool_comparison_can_fail(tmp_path: Path) -> None:
    """The old evaluation (a division by zero never holds) is what promtool contradicts."""
    rule = rule_from_dict(
        {"name": "case-0", "expr": "-temperature_c / 0 < 1", "severity": "info", "message": "m"},
        "cases",
    )
    result = unit_test(
        tmp_path,
        [rule],
        [
            {
                "interval": "1m",
                "input_series": [series("h0", "temperature_c", 5.0)],
                "alert_rule_test": [{"eval_time": "0m", "alertname": "Case0", "exp_alerts": []}],
            }
        ],
    )
    assert result.returncode != 0
    assert "Case0" in result.stdout + result.stderr


# --- rules export exports the file the console would load -----------------------------------------

MINE = '[[rule]]\nname = "mine"\nfindings = ["xid"]\n'


@pytest.mark.parametrize("where", ["global", "subcommand"])
def test_rules_export_exports_the_alerts_option(tmp_path: Path, where: str) -> None:
    path = alerts_file(tmp_path, MINE)
    argv = (
        ("--alerts", str(path), "rules", "export")
        if where == "global"
        else ("rules", "export", "--alerts", str(path))
    )
    result = gpuconsole(*argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout == rules_yaml(load_rules(path), Dialect.of("4.9"))  # the CLI's default
    assert '- alert: "Mine"' in result.stdout


def test_rules_export_exports_the_environment_and_the_default_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUCONSOLE_ALERTS", raising=False)
    default = tmp_path / "xdg_config_home" / "gpuconsole" / "alerts.toml"  # conftest's XDG dir
    default.parent.mkdir(parents=True)
    default.write_text('disable = ["gpu-xid"]\n')
    result = gpuconsole("rules", "export")
    assert result.returncode == 0, result.stderr
    assert '"GpuXid"' not in result.stdout
    monkeypatch.setenv("GPUCONSOLE_ALERTS", str(alerts_file(tmp_path, MINE)))
    result = gpuconsole("rules", "export")
    assert '"Mine"' in result.stdout and '"GpuXid"' in result.stdout


# --- properties -----------------------------------------------------------------------------------


def one_line(error: Exception) -> None:
    message = str(error)
    assert message and "\n" not in message and message.isprintable()


GRAMMAR_TOKENS = st.sampled_from(
    [*READINGS, "and", "or", "not", "in", "(", ")", "-", "+", "*", "/", "**", "^", "%", ">",
     ">=", "<", "<=", "==", "!=", "=", "0", "1e400", "9" * 40, "0.5", ".", "e", "1e", "'x'",
     "abs(", "\x1b", "\n", " "]
)  # fmt: skip
CONDITION_TEXTS = st.one_of(
    st.text(max_size=200),
    st.lists(GRAMMAR_TOKENS, max_size=40).map(" ".join),
    st.lists(GRAMMAR_TOKENS, max_size=40).map("".join),
)


@fuzz
@given(CONDITION_TEXTS)
def test_the_parser_accepts_or_says_why_in_one_line(text: str) -> None:
    try:
        condition = parse(text)
    except ExprError as error:
        one_line(error)
        return
    assert condition.readings <= set(READINGS)
    condition.promql()
    condition.test(lambda name: 1.0)


def numbers() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["0", "1", "2", "0.5", "80", "1e300", "1e308", "1e-400"]),
        st.integers(0, 1000).map(str),
        st.floats(0, 1e6, allow_nan=False).map(repr),
    )


def values() -> st.SearchStrategy[str]:
    """Value expressions both Python's parser and the console's take, over the judged readings."""
    leaves = st.one_of(st.sampled_from(JUDGED), numbers())
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from("+-*/"), inner).map(" ".join),
            st.tuples(inner, st.sampled_from(["0", "-0", "(power_w - power_w)"])).map(" / ".join),
            inner.map(lambda v: f"-{v}"),
            inner.map(lambda v: f"({v})"),
        ),
        max_leaves=6,
    )


def reads(text: str) -> bool:
    return any(name in text for name in JUDGED)


def comparisons() -> st.SearchStrategy[str]:
    ops = st.sampled_from([">", ">=", "<", "<=", "==", "!="])
    pair = st.tuples(values(), ops, values()).filter(lambda t: reads(t[0]) or reads(t[2]))
    return st.one_of(
        pair.map(" ".join),
        st.tuples(pair, ops, values())
        .filter(lambda t: reads(t[0][2]) or reads(t[2]))
        .map(lambda t: f"{' '.join(t[0])} {t[1]} {t[2]}"),
    )


CONDITIONS = st.recursive(
    comparisons(),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["and", "or"]), inner).map(" ".join),
        inner.map(lambda c: f"({c})"),
    ),
    max_leaves=3,
)
READING_VALUES = st.one_of(
    st.none(),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 80.0, math.nan]),
    st.floats(allow_infinity=False, width=64),
)


def reference(text: str, readings: Mapping[str, float | None]) -> float | None:
    """The condition evaluated by an independent route: Python's own parser (whose precedence
    and associativity for these operators are PromQL's), float64 arithmetic, a division by zero
    from `decimal`'s IEEE 754 special values, and the value PromQL's comparison keeps."""

    def value(node: ast.expr) -> float | None:
        if isinstance(node, ast.Constant):
            return float(node.value)
        if isinstance(node, ast.Name):
            return readings.get(node.id)
        if isinstance(node, ast.UnaryOp):
            inner = value(node.operand)
            return None if inner is None else -inner
        assert isinstance(node, ast.BinOp)
        left, right = value(node.left), value(node.right)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Div):
            if right != 0:
                return left / right
            quotient = decimal.Context(traps=[]).divide(
                decimal.Decimal(left), decimal.Decimal(right)
            )
            return float(quotient)
        operation = {ast.Add: float.__add__, ast.Sub: float.__sub__, ast.Mult: float.__mul__}
        return operation[type(node.op)](left, right)

    def condition(node: ast.expr) -> float | None:
        if isinstance(node, ast.BoolOp):
            results = [condition(part) for part in node.values]
            if isinstance(node.op, ast.And):
                return results[0] if all(r is not None for r in results) else None
            return next((r for r in results if r is not None), None)
        assert isinstance(node, ast.Compare)
        operands = [node.left, *node.comparators]
        results = [value(operand) for operand in operands]
        for op, left, right in zip(node.ops, results, results[1:], strict=False):
            if left is None or right is None:
                return None
            holds = {
                ast.Gt: left > right,
                ast.GtE: left >= right,
                ast.Lt: left < right,
                ast.LtE: left <= right,
                ast.Eq: left == right,
                ast.NotEq: left != right,
            }[type(op)]
            if not holds:
                return None
        vector = any(isinstance(n, ast.Name) for n in ast.walk(operands[0]))
        return results[0] if vector else results[1]

    return condition(ast.parse(text, mode="eval").body)


def within_caps(text: str) -> bool:
    """Whether the console takes a generated condition: every one is in its language, and only
    the stated caps may refuse one."""
    try:
        parse(text)
    except ExprError as error:
        assert str(error).startswith(("nested more than", "longer than")), error
        return False
    return True


@fuzz
@given(CONDITIONS, st.fixed_dictionaries({name: READING_VALUES for name in JUDGED}))
def test_the_console_evaluates_as_the_reference(
    text: str, readings: dict[str, float | None]
) -> None:
    if within_caps(text):
        assert same(parse(text).test(readings.get), reference(text, readings)), text


@needs_promtool
def test_promtool_evaluates_fuzzed_conditions_as_the_console(tmp_path: Path) -> None:
    """A hundred generated conditions and readings, judged by promtool in one run."""
    cases: list[tuple[str, dict[str, float | None]]] = []
    finite = st.one_of(
        st.none(), st.sampled_from([0.0, -0.0, 1.0, 80.0]), st.floats(-1e6, 1e6, width=64)
    )

    @settings(max_examples=100, deadline=None, database=None)
    @given(CONDITIONS, st.fixed_dictionaries({name: finite for name in JUDGED}))
    def collect(text: str, readings: dict[str, float | None]) -> None:
        if within_caps(text):
            cases.append((text, readings))

    collect()
    result = judged_by_promtool(tmp_path, cases)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


TOML_TEXTS = st.lists(
    st.sampled_from(
        ["[[rule]]", "[rule]", "\n", 'name = "r"', 'findings = ["xid"]', 'expr = "', '"', "=",
         "disable = [", "]", "{", "}", "[", ",", "1e400", "9" * 30, "'", '"""', "\\u0000",
         "\\x1b", "#", "\r\n", "\x00", "\ufeff"]
    ),
    max_size=30,
).map("".join)  # fmt: skip


def test_the_loader_on_any_bytes(tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"

    @fuzz
    @given(st.one_of(st.binary(max_size=400), st.text(max_size=200).map(str.encode),
                     TOML_TEXTS.map(str.encode)))  # fmt: skip
    def load(data: bytes) -> None:
        path.write_bytes(data)
        try:
            load_rules(path)
        except RuleError as error:
            one_line(error)
            assert str(error).startswith(f"{path}: ")

    load()


TOML_SCALARS = st.one_of(
    st.text(max_size=30),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.datetimes(),
    st.dates(),
)
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
KEBAB = st.from_regex(r"\A[a-z][a-z0-9]{0,6}(-[a-z0-9]{1,4}){0,2}\Z")
SAFE_TEXT = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="{}"),
    min_size=1,
    max_size=8,
)
"""Text the loader takes in a message or a label: no control character, no brace."""
PLACEHOLDERS = st.sampled_from(["{host}", "{gpu}", "{value}", "{value:.1f}", "{{", "}}"])
GOOD_MESSAGES = st.lists(st.one_of(PLACEHOLDERS, SAFE_TEXT), min_size=1, max_size=5).map("".join)
BAD_MESSAGES = st.lists(
    st.one_of(
        PLACEHOLDERS,
        st.sampled_from(["{", "}", "{{ $labels.x }}", "{{{{", "{nope}", "{value!r}", "{detail}"]),
        st.text(max_size=8),
    ),
    max_size=5,
).map("".join)
GOOD_LABELS = st.dictionaries(
    st.from_regex(r"\A[a-zA-Z_][a-zA-Z0-9_]{0,6}\Z"),
    st.one_of(SAFE_TEXT, st.sampled_from(list(TEMPLATE_LABELS.values())), st.just("")),
    max_size=3,
)
BAD_LABELS = st.dictionaries(st.text(max_size=6), st.text(max_size=20), min_size=1, max_size=3)
WELL_FORMED = st.fixed_dictionaries(
    {
        "name": KEBAB,
        "expr": CONDITIONS,
        "severity": st.sampled_from(["info", "warning", "critical", "WARNING"]),
        "message": GOOD_MESSAGES,
    },
    optional={
        "for": st.from_regex(r"\A([0-9]{1,3}(y|w|d|h|m|s|ms)){1,3}\Z"),
        "labels": GOOD_LABELS,
        "scope": st.sampled_from(["gpu", "host"]),
    },
)
FINDING_TABLES = st.fixed_dictionaries(
    {"name": KEBAB, "findings": st.lists(st.sampled_from(["xid", "gpu-lost"]), min_size=1)},
    optional={"message": GOOD_MESSAGES, "labels": GOOD_LABELS},
)
KEYS = ["name", "expr", "findings", "for", "severity", "scope", "message", "labels"]
HOSTILE_TABLES = st.one_of(
    st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), TOML_VALUES, max_size=8),
    st.tuples(WELL_FORMED, st.sampled_from(KEYS), TOML_VALUES).map(lambda t: {**t[0], t[1]: t[2]}),
    st.tuples(WELL_FORMED, BAD_MESSAGES).map(lambda t: {**t[0], "message": t[1]}),
    st.tuples(FINDING_TABLES, BAD_LABELS).map(lambda t: {**t[0], "labels": t[1]}),
    st.tuples(WELL_FORMED, st.sampled_from(DURATIONS)).map(lambda t: {**t[0], "for": t[1]}),
)
TABLES = st.one_of(WELL_FORMED, WELL_FORMED, FINDING_TABLES, HOSTILE_TABLES)
RULE_LISTS = st.fixed_dictionaries(
    {"rule": st.lists(TABLES, min_size=1, max_size=3, unique_by=lambda t: repr(t.get("name")))},
    optional={
        "disable": st.lists(st.sampled_from([r.name for r in DEFAULT_RULES]), unique=True),
    },
)
FILES = st.one_of(
    RULE_LISTS,
    RULE_LISTS,
    RULE_LISTS,
    st.dictionaries(st.sampled_from(["rule", "disable", "rules"]), TOML_VALUES, max_size=3),
)


def loaded(data: dict[str, object]) -> list[AlertRule]:
    """The file's own rules, or [] where it is refused, in one line naming it; every message
    renders, whatever the value."""
    try:
        rules = merge_rules(data, "fuzz.toml")
    except RuleError as error:
        one_line(error)
        assert str(error).startswith("fuzz.toml: ")
        return []
    for rule in rules:
        for value in (None, 0.5, -0.0, -math.inf, math.nan):
            rule.render("h", 0, value, "detail")
    return [rule for rule in rules if rule not in DEFAULT_RULES]


@fuzz
@given(FILES)
def test_the_loader_on_any_toml_values(data: dict[str, object]) -> None:
    loaded(data)


def name_of(table: dict[str, object]) -> object:
    return table["name"]


@needs_promtool
def test_promtool_passes_every_rule_the_loader_takes(tmp_path: Path) -> None:
    """Generated rules with hostile texts in their labels and messages, exported together and
    judged in one promtool run."""
    taken: list[AlertRule] = []

    @fuzz
    @given(st.lists(WELL_FORMED | FINDING_TABLES, min_size=1, max_size=3, unique_by=name_of))
    def load(tables: list[dict[str, object]]) -> None:
        taken.extend(loaded({"rule": tables}))

    load()
    assert len(taken) > 100  # most of these tables load: the judge sees many rules
    assert promtool_verdicts(tmp_path, {"taken": rules_yaml(taken)}) == {"taken": None}
