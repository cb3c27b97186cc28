"""Alert rules: the condition language, rule checks, the built-in rules and the alerts file."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import gpuconsole

from gpuconsole.core import paths
from gpuconsole.core.model import GpuState, HostSnapshot, Severity, XidEvent
from gpuconsole.fleet.alerts.config import load_rules
from gpuconsole.fleet.alerts.defaults import BUILT_IN_RULES, CAPACITY_RULES, DEFAULT_RULES
from gpuconsole.fleet.alerts.expr import READINGS, ExprError, parse
from gpuconsole.fleet.alerts.rules import RuleError, parse_duration, rule_from_dict


def gpu(index: int = 0, **fields: object) -> GpuState:
    return GpuState(index=index, name="NVIDIA H100 80GB HBM3", **fields)  # type: ignore[arg-type]


def lookup(state: GpuState, snapshot: HostSnapshot | None = None):
    snapshot = snapshot or HostSnapshot("n1", 0.0, (state,))
    return lambda name: READINGS[name].read(state, snapshot)


# --- the condition language ---------------------------------------------------------------------


def test_condition_holds_with_the_left_operand_as_value() -> None:
    condition = parse("temperature_c >= 85")
    assert condition.test(lookup(gpu(temperature_c=86.0))) == 86.0
    assert condition.test(lookup(gpu(temperature_c=85.0))) == 85.0
    assert condition.test(lookup(gpu(temperature_c=84.0))) is None


def test_missing_reading_never_counts_as_zero() -> None:
    assert parse("temperature_c < 50").test(lookup(gpu())) is None
    assert parse("utilization_pct == 0").test(lookup(gpu())) is None


def test_arithmetic_between_readings() -> None:
    condition = parse("power_w >= power_limit_w * 0.98")
    assert condition.test(lookup(gpu(power_w=690.0, power_limit_w=700.0))) == 690.0
    assert condition.test(lookup(gpu(power_w=600.0, power_limit_w=700.0))) is None
    assert condition.test(lookup(gpu(power_w=690.0))) is None  # no limit: unknown, not 0


def test_and_or_and_chained_comparisons() -> None:
    busy_hot = parse("utilization_pct > 90 and temperature_c > 80")
    assert busy_hot.test(lookup(gpu(utilization_pct=95.0, temperature_c=81.0))) == 95.0
    assert busy_hot.test(lookup(gpu(utilization_pct=95.0, temperature_c=70.0))) is None
    either = parse("temperature_c > 90 or utilization_pct > 90")
    assert either.test(lookup(gpu(utilization_pct=95.0, temperature_c=70.0))) == 95.0
    band = parse("80 < temperature_c < 90")
    # The reading's value, not 80: PromQL's `80 < x` keeps the vector's sample.
    assert band.test(lookup(gpu(temperature_c=85.0))) == 85.0
    assert band.test(lookup(gpu(temperature_c=95.0))) is None


def test_derived_readings_memory_percent_and_xid() -> None:
    state = gpu(memory_used_mib=900.0, memory_total_mib=1000.0)
    assert parse("memory_used_pct > 80").test(lookup(state)) == pytest.approx(90.0)
    assert parse("memory_free_mib < 200").test(lookup(state)) == 100.0
    snapshot = HostSnapshot("n1", 5.0, (state,), xid_events=(XidEvent(79, 0, 4.0),))
    assert parse("xid == 79").test(lookup(state, snapshot)) == 79.0
    assert parse("xid > 0").test(lookup(state)) is None  # no XID reported: 0


def test_division_by_zero_is_infinite_as_in_promql() -> None:
    # PromQL divides in float64: 1 / 0 is +Inf, which is > 0.5 (tests/test_hostile_alerts.py
    # checks this against promtool).
    condition = parse("power_w / power_limit_w > 0.5")
    assert condition.test(lookup(gpu(power_w=1.0, power_limit_w=0.0))) == float("inf")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("temp >= 85", "unknown reading 'temp'"),
        ("temperature_c", "is not a condition"),
        ("temperature_c >= ", "not a valid condition"),
        ("85 > 80", "compare a reading"),
        ("temperature_c >= 85 and 1", "is not a condition"),
        ("not temperature_c > 85", "is not a condition"),
        ("abs(temperature_c) > 85", "is not allowed"),
        ("temperature_c ** 2 > 85", "is not allowed"),
        ("temperature_c in (85, 86)", "comparisons are not supported"),
        ("__import__('os') > 1", "is not allowed"),
    ],
)
def test_bad_conditions_say_why(text: str, complaint: str) -> None:
    with pytest.raises(ExprError, match=complaint.replace("(", r"\(").replace("*", r"\*")):
        parse(text)


def test_promql_of_conditions() -> None:
    assert parse("temperature_c >= 85").promql() == "DCGM_FI_DEV_GPU_TEMP >= 85"
    assert (
        parse("power_w >= power_limit_w * 0.98").promql()
        == "DCGM_FI_DEV_POWER_USAGE >= (DCGM_FI_DEV_ENFORCED_POWER_LIMIT * 0.98)"
    )
    assert (
        parse("utilization_pct > 95").promql("hostname", host_scope=True)
        == "avg by (hostname) (DCGM_FI_DEV_GPU_UTIL) > 95"
    )
    assert parse("80 < temperature_c < 90 or xid > 0").promql() == (
        "((80 < DCGM_FI_DEV_GPU_TEMP) and (DCGM_FI_DEV_GPU_TEMP < 90))"
        " or (DCGM_FI_DEV_XID_ERRORS > 0)"
    )


# --- rules ----------------------------------------------------------------------------------------


def test_durations() -> None:
    assert parse_duration("0s") == 0
    assert parse_duration("90s") == 90
    assert parse_duration("5m") == 300
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d") == 172800
    assert parse_duration("1w") == 604800
    assert parse_duration("1y") == 31536000
    assert parse_duration("1s500ms") == 1.5
    assert parse_duration("0") == 0
    for bad in ("", "5", "5 minutes", "1m1h", "-5m", "1.5m", "00", "5M", "\u0665m"):
        with pytest.raises(ValueError, match="is not a duration"):
            parse_duration(bad)


def test_rule_renders_its_message() -> None:
    rule = rule_from_dict(
        {
            "name": "gpu-hot",
            "expr": "temperature_c >= 80",
            "for": "2m",
            "severity": "critical",
            "message": "{host} GPU {gpu} at {value:.1f} °C",
            "labels": {"team": "infra"},
        },
        "test",
    )
    assert rule.for_seconds == 120
    assert rule.severity is Severity.CRITICAL
    assert rule.labels == (("team", "infra"),)
    assert rule.alert_name == "GpuHot"
    assert rule.render("n1", 3, 81.25) == "n1 GPU 3 at 81.2 °C"
    assert rule.render("n1", None, None) == "n1 GPU  at N/A °C"


def test_finding_rule_defaults() -> None:
    rule = rule_from_dict({"name": "xids", "findings": "xid"}, "test")
    assert rule.findings == ("xid",)
    assert rule.severity is None  # taken from the finding
    assert rule.for_seconds == 0
    assert rule.render("n1", 3, None, "XID 79 on GPU 3") == "n1: XID 79 on GPU 3"


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        ({"expr": "temperature_c > 1", "severity": "info", "message": "m"}, "a missing name"),
        ({"name": "Hot GPU", "expr": "x"}, "name 'Hot GPU'"),
        ({"name": "r"}, "give either expr"),
        ({"name": "r", "expr": "temperature_c > 1", "findings": ["xid"]}, "give either expr"),
        ({"name": "r", "expr": "temp > 1", "severity": "info", "message": "m"}, "unknown reading"),
        ({"name": "r", "findings": ["xidd"]}, "unknown finding code 'xidd'"),
        ({"name": "r", "findings": []}, "findings must be a list"),
        ({"name": "r", "expr": "temperature_c > 1", "message": "m"}, "severity is missing"),
        (
            {"name": "r", "expr": "temperature_c > 1", "severity": "fatal", "message": "m"},
            "severity 'fatal'",
        ),
        ({"name": "r", "findings": ["xid"], "for": "5 minutes"}, "for: '5 minutes'"),
        ({"name": "r", "expr": "temperature_c > 1", "severity": "info"}, "needs a message"),
        ({"name": "r", "findings": ["xid"], "message": "{hostname}"}, "unknown placeholder"),
        ({"name": "r", "findings": ["xid"], "message": "{value:>5}"}, "only {value:.Nf}"),
        (
            {"name": "r", "expr": "temperature_c > 1", "severity": "info", "message": "{detail}"},
            "findings rules only",
        ),
        ({"name": "r", "findings": ["xid"], "labels": {"severity": "x"}}, "label 'severity'"),
        ({"name": "r", "findings": ["xid"], "labels": {"team": 3}}, "must be a string"),
        ({"name": "r", "findings": ["xid"], "scope": "rack"}, "scope 'rack'"),
        ({"name": "r", "findings": ["xid"], "scope": "host"}, "drop scope"),
        ({"name": "r", "findings": ["xid"], "fro": "5m"}, "unknown key 'fro'"),
    ],
)
def test_bad_rules_name_the_rule_and_the_problem(table: dict, complaint: str) -> None:
    with pytest.raises(RuleError) as caught:
        rule_from_dict(table, "alerts.toml")
    message = str(caught.value)
    assert message.startswith("alerts.toml: ")
    assert complaint in message
    if "name" in table and isinstance(table["name"], str) and table["name"] == "r":
        assert "rule 'r'" in message
    assert "\n" not in message


def test_default_rules_follow_the_guide() -> None:
    rules = {rule.name: rule for rule in BUILT_IN_RULES}
    utilization = rules["gpu-utilization-high"]
    assert utilization.condition is not None
    assert utilization.condition.text == "utilization_pct > 95"
    assert utilization.for_seconds == 300
    assert utilization.scope == "host"
    assert rules["gpu-memory-high"].condition.text == "memory_used_pct > 80"  # type: ignore[union-attr]
    assert rules["gpu-temperature-high"].condition.text == "temperature_c >= 85"  # type: ignore[union-attr]
    assert "power_limit_w" in rules["gpu-power-at-limit"].condition.readings  # type: ignore[union-attr]
    assert "xid" in rules["gpu-xid"].findings
    assert "ecc-uncorrectable" in rules["gpu-ecc"].findings
    assert "thermal-throttle" in rules["gpu-throttling"].findings
    assert rules["gpu-link-degraded"].findings == ("pcie-degraded",)


def test_the_default_rules_page_for_faults_and_leave_capacity_to_the_findings() -> None:
    """A busy GPU, its memory in use, its power at the limit: what training does, a finding
    (mem-pressure, power-cap) and no page; the capacity rules are built in, but off."""
    on = {rule.name for rule in DEFAULT_RULES}
    capacity = {rule.name for rule in CAPACITY_RULES}
    assert capacity == {"gpu-utilization-high", "gpu-memory-high", "gpu-power-at-limit"}
    assert not on & capacity
    assert {"gpu-xid", "gpu-ecc", "gpu-throttling", "gpu-temperature-high"} <= on
    watched = {code for rule in DEFAULT_RULES for code in rule.findings}
    assert not watched & {"mem-pressure", "power-cap", "idle-memory-held"}


# --- the alerts file ------------------------------------------------------------------------------


def test_no_file_means_the_built_in_rules() -> None:
    assert load_rules() == DEFAULT_RULES


def test_file_adds_replaces_and_disables(tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(
        """
disable = ["gpu-ecc"]
enable = ["gpu-power-at-limit", "gpu-memory-high"]

[[rule]]
name = "gpu-temperature-high"
expr = "temperature_c >= 80"
for = "30s"
severity = "critical"
message = "{host} GPU {gpu}: {value:.0f} °C"

[[rule]]
name = "gpu-idle-but-full"
expr = "utilization_pct < 5 and memory_used_pct > 50"
for = "10m"
severity = "info"
message = "{host} GPU {gpu} idle with memory held"
labels = { team = "ml-infra" }
"""
    )
    rules = {rule.name: rule for rule in load_rules(path)}
    assert "gpu-ecc" not in rules
    assert "gpu-utilization-high" not in rules
    assert rules["gpu-power-at-limit"] in CAPACITY_RULES
    assert rules["gpu-memory-high"].severity is Severity.WARNING
    assert rules["gpu-temperature-high"].severity is Severity.CRITICAL
    assert rules["gpu-temperature-high"].for_seconds == 30
    assert rules["gpu-idle-but-full"].labels == (("team", "ml-infra"),)
    assert "gpu-xid" in rules


def test_file_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('disable = ["gpu-xid"]\n')
    monkeypatch.setenv(paths.ALERTS.variable, str(path))
    assert "gpu-xid" not in {rule.name for rule in load_rules()}


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (
            '[[rule]]\nname = "hot"\nexpr = "temp > 85"\n',
            "rule 'hot': expr: unknown reading 'temp'",
        ),
        ('[[rule]]\nexpr = "temperature_c > 85"\n', "rule #1: a missing name"),
        ('disable = ["gpu-nope"]\n', "no built-in rule 'gpu-nope'"),
        ('disable = ["gpu-memory-high"]\n', "'gpu-memory-high' is on (it is off unless enabled)"),
        ('enable = ["gpu-xid"]\n', "enable: 'gpu-xid' is not a capacity rule"),
        ('enable = "gpu-memory-high"\n', "enable must be a list of rule names"),
        ("rules = []\n", "unknown key 'rules'"),
        ("[[rule]\n", "line 1"),
        (
            '[[rule]]\nname = "a"\nfindings = ["xid"]\n[[rule]]\nname = "a"\nfindings = ["xid"]\n',
            "rule 'a' is defined twice",
        ),
    ],
)
def test_bad_file_is_one_line_naming_file_and_rule(
    tmp_path: Path, text: str, complaint: str
) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(text)
    with pytest.raises(RuleError) as caught:
        load_rules(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert complaint in message
    assert "\n" not in message


def test_missing_named_file(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="No such file"):
        load_rules(tmp_path / "absent.toml")


def test_console_refuses_a_bad_alerts_file_in_one_line(tmp_path: Path) -> None:

    path = tmp_path / "alerts.toml"
    path.write_text(
        '[[rule]]\nname = "gpu-hot"\nexpr = "temperature_c >= 85"\n'
        'severity = "hot"\nmessage = "m"\n'
    )
    result = gpuconsole("--demo", "--alerts", str(path))
    assert result.returncode == 2
    assert result.stderr == (
        f"gpuconsole: {path}: rule 'gpu-hot': severity 'hot' is not info, warning or critical\n"
    )
