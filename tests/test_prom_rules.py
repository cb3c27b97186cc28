"""`gpuconsole rules export`: correct PromQL, checked and unit-tested with the real promtool."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from promserver import promtool, promtool_available

from gpuconsole.core.model import GpuState, HostSnapshot
from gpuconsole.fleet.alerts.config import merge_rules
from gpuconsole.fleet.alerts.defaults import BUILT_IN_RULES, DEFAULT_RULES
from gpuconsole.fleet.alerts.expr import READINGS
from gpuconsole.fleet.alerts.rules import rule_from_dict
from gpuconsole.prom.rules_export import go_template, requirement, rule_expr, rules_yaml
from gpuconsole.telemetry import dcgm

CLASSIC = dcgm.Dialect.of("classic", "Hostname")
"""dcgm-exporter before 4.8.3, and the console's exporter: classic names, ``Hostname``."""
CURRENT = dcgm.Dialect.of("4.9")
BOTH = dcgm.Dialect.of("both")
DIALECTS = {dcgm.CLASSIC: CLASSIC, dcgm.CURRENT: CURRENT}
POWER_NEEDS = (
    "needs DCGM_FI_DEV_ENFORCED_POWER_LIMIT or DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS, "
    "which dcgm-exporter does not collect by default: add it to its collector file "
    "(--collectors, default-counters.csv)"
)

needs_promtool = pytest.mark.skipif(not promtool_available(), reason="promtool is not installed")

GUIDE_RULE = """\
groups:
  - name: guide
    rules:
      - alert: HighGPUUsage
        expr: avg(rate(DCGM_FI_DEV_GPU_UTIL[1m])) by (Hostname) > 95
        for: 5m
        labels:
          severity: warning
"""
"""The guide's §4.2 rule, on dcgm-exporter's metric: rate() of a gauge."""


HOST_LABEL = {dcgm.CLASSIC: "Hostname", dcgm.CURRENT: "hostname"}


def gpu(
    metric: str, host: str, index: int, values: str, generation: str = dcgm.CLASSIC
) -> dict[str, str]:
    """An input series of one GPU: ``metric`` is the classic name and ``values`` promtool's
    notation in the classic unit; written as dcgm-exporter of ``generation`` writes it (its
    name, its unit, its host label)."""
    name = metric
    if generation == dcgm.CURRENT and metric in dcgm.BY_NAME:
        spelled = dcgm.BY_NAME[metric]
        name, unit = spelled.current_name, spelled.unit
        values = " ".join(_in_unit(token, unit) for token in values.split())
    labels = (
        f'{HOST_LABEL[generation]}="{host}",gpu="{index}",UUID="GPU-{host}-{index}",'
        'modelName="NVIDIA H100"'
    )
    return {"series": f"{name}{{{labels}}}", "values": values}


def _in_unit(token: str, unit: dcgm.Unit) -> str:
    """A promtool value token (``80``, ``96x8``, ``_``) in ``unit`` instead of the classic one."""
    value, _, times = token.partition("x")
    if value == "_":
        return token
    converted = repr(float(value) * unit.divide / unit.multiply)
    return f"{converted}x{times}" if times else converted


def expected(host: str, index: int, generation: str = dcgm.CLASSIC, **extra: str) -> dict[str, str]:
    return {
        HOST_LABEL[generation]: host,
        "gpu": str(index),
        "UUID": f"GPU-{host}-{index}",
        "modelName": "NVIDIA H100",
        **extra,
    }


def run_tests(tmp_path: Path, rules_text: str, tests: list[dict]) -> subprocess.CompletedProcess:
    (tmp_path / "rules.yml").write_text(rules_text)
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "tests.yml").write_text(json.dumps(spec, indent=2, ensure_ascii=False))
    return promtool("test", "rules", str(tmp_path / "tests.yml"))


def test_promql_of_the_default_rules() -> None:
    exprs = {rule.name: rule_expr(rule, CLASSIC) for rule in BUILT_IN_RULES}
    assert exprs["gpu-utilization-high"] == "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) > 95"
    assert exprs["gpu-temperature-high"] == "DCGM_FI_DEV_GPU_TEMP >= 85"
    assert "rate(" not in "".join(exprs.values())
    assert exprs["gpu-xid"] == 'gpuconsole_findings{code=~"xid|gpu-lost"} > 0'
    host_label = {
        rule.name: rule_expr(rule, dcgm.Dialect.of("classic", "hostname"))
        for rule in BUILT_IN_RULES
    }
    assert host_label["gpu-utilization-high"].startswith("avg by (hostname) (")


def test_promql_of_dcgm_exporter_4_9_and_of_both() -> None:
    """4.9's names in base units, converted back; `or` of both names for both generations; a
    field outside the default collector file under either spelling, whatever the generation."""
    current = {rule.name: rule_expr(rule, CURRENT) for rule in BUILT_IN_RULES}
    assert current["gpu-utilization-high"] == (
        "avg by (hostname) ((DCGM_FI_DEV_GPU_UTIL_RATIO * 100)) > 95"
    )
    assert current["gpu-temperature-high"] == "DCGM_FI_DEV_GPU_TEMP_CELSIUS >= 85"
    assert "(DCGM_FI_DEV_FB_USED_BYTES / 1048576)" in current["gpu-memory-high"]
    assert current["gpu-power-at-limit"] == (
        "DCGM_FI_DEV_BOARD_POWER_WATTS >= ((DCGM_FI_DEV_ENFORCED_POWER_LIMIT or "
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS) * 0.98)"
    )
    classic_names = {m.name for m in dcgm.BY_FIELD.values() if m.default and m.current}
    for expr in current.values():
        assert not set(re.findall(r"DCGM_FI_[A-Z0-9_]+", expr)) & classic_names, expr
    both = {rule.name: rule_expr(rule, BOTH) for rule in BUILT_IN_RULES}
    assert both["gpu-temperature-high"] == (
        "(DCGM_FI_DEV_GPU_TEMP or DCGM_FI_DEV_GPU_TEMP_CELSIUS) >= 85"
    )
    assert both["gpu-utilization-high"].startswith("avg by (Hostname, hostname) (")


def test_rules_outside_the_default_collectors_say_so() -> None:
    needs = {rule.name: requirement(rule) for rule in BUILT_IN_RULES}
    assert needs["gpu-power-at-limit"] == POWER_NEEDS
    assert {name for name, need in needs.items() if need} == {"gpu-power-at-limit"}
    text = rules_yaml(BUILT_IN_RULES)
    assert f'      # "gpu-power-at-limit" {POWER_NEEDS}\n      - alert: "GpuPowerAtLimit"' in text
    assert text.count("not collect by default") == 1


def test_messages_become_prometheus_templates() -> None:
    assert go_template("{host} GPU {gpu} at {value:.0f} °C", CLASSIC) == (
        '{{ $labels.Hostname }} GPU {{ $labels.gpu }} at {{ printf "%.0f" $value }} °C'
    )
    assert go_template("{host}: {value}", CURRENT) == "{{ $labels.hostname }}: {{ $value }}"
    assert go_template("{host}", BOTH) == "{{ or $labels.Hostname $labels.hostname }}"
    assert go_template("{host}: {detail}", CLASSIC) == (
        "{{ $labels.Hostname }}: {{ $labels.code }}"
        "{{ if $labels.gpu }} on GPU {{ $labels.gpu }}{{ end }}"
    )


@needs_promtool
def test_promtool_check_rules_on_the_export(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(rules_yaml(BUILT_IN_RULES))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(BUILT_IN_RULES)} rules found" in result.stdout


@needs_promtool
def test_promtool_check_rules_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(rules_yaml(BUILT_IN_RULES).replace(" >= 85", " >>= 85"))
    assert promtool("check", "rules", str(path)).returncode != 0


@needs_promtool
@pytest.mark.parametrize("generation", dcgm.GENERATIONS)
def test_alert_unit_tests_pending_firing_resolved(tmp_path: Path, generation: str) -> None:
    """Input series in, alerts out, at each minute: `for:` and thresholds as the console has;
    the series written in each generation's names, units and host label, the rules exported for
    it (the console's exporter writing ``hostname`` for 4.9: ``--host-label hostname``)."""
    host_label = HOST_LABEL[generation]
    tests = [
        {
            "interval": "1m",
            "input_series": [
                # Hot from minute 1 to 3, cool again at 4: pending at 1, firing at 2 and 3.
                gpu("DCGM_FI_DEV_GPU_TEMP", "n1", 0, "80 86 90 88 70", generation),
                gpu("DCGM_FI_DEV_GPU_TEMP", "n1", 1, "60 60 60 60 60", generation),
                # 85 counts (>= 85): pending at 0, firing at 1; 84 resolves it at 2.
                gpu("DCGM_FI_DEV_GPU_TEMP", "n2", 0, "85 85 84 84 84", generation),
                # A host at 96 % and 100 % averages 98 for 5 minutes; another averages 90.
                gpu("DCGM_FI_DEV_GPU_UTIL", "n1", 0, "96x8", generation),
                gpu("DCGM_FI_DEV_GPU_UTIL", "n1", 1, "100x8", generation),
                gpu("DCGM_FI_DEV_GPU_UTIL", "n2", 0, "100x8", generation),
                gpu("DCGM_FI_DEV_GPU_UTIL", "n2", 1, "80x8", generation),
                # 70 of 80 GiB used: 87.5 % for the memory rule.
                gpu("DCGM_FI_DEV_FB_USED", "n1", 0, "71680x8", generation),
                gpu("DCGM_FI_DEV_FB_FREE", "n1", 0, "10240x8", generation),
                gpu("DCGM_FI_DEV_FB_USED", "n1", 1, "1024x8", generation),
                gpu("DCGM_FI_DEV_FB_FREE", "n1", 1, "80896x8", generation),
                # At the cap (>= 98 % of 700 W) on GPU 0 only.
                gpu("DCGM_FI_DEV_POWER_USAGE", "n1", 0, "690x8", generation),
                gpu("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "n1", 0, "700x8", generation),
                gpu("DCGM_FI_DEV_POWER_USAGE", "n1", 1, "500x8", generation),
                gpu("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "n1", 1, "700x8", generation),
                {
                    "series": f'gpuconsole_findings{{{host_label}="n1",gpu="3",code="xid",'
                    'severity="critical"}',
                    "values": "_ 1 1",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "0m", "alertname": "GpuTemperatureHigh", "exp_alerts": []},
                {
                    "eval_time": "1m",
                    "alertname": "GpuTemperatureHigh",
                    "exp_alerts": [
                        {
                            "exp_labels": expected(
                                "n2", 0, generation, severity="warning", rule="gpu-temperature-high"
                            ),
                            "exp_annotations": {"summary": "n2 GPU 0 at 85 °C (alert at 85 °C)"},
                        }
                    ],
                },
                {
                    "eval_time": "2m",
                    "alertname": "GpuTemperatureHigh",
                    "exp_alerts": [
                        {
                            "exp_labels": expected(
                                "n1", 0, generation, severity="warning", rule="gpu-temperature-high"
                            ),
                            "exp_annotations": {"summary": "n1 GPU 0 at 90 °C (alert at 85 °C)"},
                        }
                    ],
                },
                {"eval_time": "4m", "alertname": "GpuTemperatureHigh", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "GpuUtilizationHigh", "exp_alerts": []},
                {
                    "eval_time": "5m",
                    "alertname": "GpuUtilizationHigh",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                host_label: "n1",
                                "severity": "warning",
                                "rule": "gpu-utilization-high",
                            },
                            "exp_annotations": {
                                "summary": "n1: its GPUs average 98 % busy, no headroom left"
                            },
                        }
                    ],
                },
                {
                    "eval_time": "5m",
                    "alertname": "GpuMemoryHigh",
                    "exp_alerts": [
                        {
                            "exp_labels": expected(
                                "n1", 0, generation, severity="warning", rule="gpu-memory-high"
                            ),
                            "exp_annotations": {
                                "summary": "n1 GPU 0: 88 % of memory used, past the 20 % reserve"
                            },
                        }
                    ],
                },
                {
                    "eval_time": "5m",
                    "alertname": "GpuPowerAtLimit",
                    "exp_alerts": [
                        {
                            "exp_labels": expected(
                                "n1", 0, generation, severity="info", rule="gpu-power-at-limit"
                            ),
                            "exp_annotations": {
                                "summary": "n1 GPU 0 drawing 690 W, at its power limit"
                            },
                        }
                    ],
                },
                {
                    "eval_time": "1m",
                    "alertname": "GpuXid",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                host_label: "n1",
                                "gpu": "3",
                                "code": "xid",
                                "severity": "critical",
                                "rule": "gpu-xid",
                            },
                            "exp_annotations": {"summary": "n1: xid on GPU 3"},
                        }
                    ],
                },
            ],
        }
    ]
    result = run_tests(tmp_path, rules_yaml(BUILT_IN_RULES, DIALECTS[generation]), tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_alert_unit_tests_can_fail(tmp_path: Path) -> None:
    """The same harness reports a wrong expectation: an alert one minute too early."""
    tests = [
        {
            "interval": "1m",
            "input_series": [gpu("DCGM_FI_DEV_GPU_TEMP", "n1", 0, "80 86 90 88 70")],
            "alert_rule_test": [
                {
                    "eval_time": "1m",
                    "alertname": "GpuTemperatureHigh",
                    "exp_alerts": [
                        {
                            "exp_labels": expected(
                                "n1", 0, severity="warning", rule="gpu-temperature-high"
                            )
                        }
                    ],
                }
            ],
        }
    ]
    result = run_tests(tmp_path, rules_yaml(BUILT_IN_RULES, CLASSIC), tests)
    assert result.returncode != 0
    assert "GpuTemperatureHigh" in result.stdout + result.stderr


@needs_promtool
def test_the_guides_rule_never_fires_on_a_pinned_gpu(tmp_path: Path) -> None:
    """rate() of a gauge pinned at 100 % is 0: the guide's rule stays silent; ours fires."""
    (tmp_path / "guide.yml").write_text(GUIDE_RULE)
    (tmp_path / "ours.yml").write_text(rules_yaml(BUILT_IN_RULES, CLASSIC))
    series = [gpu("DCGM_FI_DEV_GPU_UTIL", "n1", i, "100x10") for i in range(2)]
    spec = {
        "rule_files": ["guide.yml", "ours.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": "HighGPUUsage", "exp_alerts": []},
                    {
                        "eval_time": "9m",
                        "alertname": "GpuUtilizationHigh",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "Hostname": "n1",
                                    "severity": "warning",
                                    "rule": "gpu-utilization-high",
                                },
                                "exp_annotations": {
                                    "summary": "n1: its GPUs average 100 % busy, no headroom left"
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(json.dumps(spec))
    result = promtool("test", "rules", str(tmp_path / "tests.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_user_rules_export_and_pass_promtool(tmp_path: Path) -> None:
    rules = merge_rules(
        {
            "rule": [
                {
                    "name": "gpu-hot-and-idle",
                    "expr": "temperature_c > 70 and utilization_pct < 5 or xid == 79",
                    "for": "1h30m",
                    "severity": "critical",
                    "message": "{host} GPU {gpu}: {value:.1f}",
                    "labels": {"team": "ml-infra"},
                },
                {"name": "link", "findings": ["pcie-degraded"], "severity": "info"},
            ]
        },
        "test",
    )
    path = tmp_path / "rules.yml"
    path.write_text(rules_yaml(rules, dcgm.Dialect.of("classic", "hostname")))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    text = path.read_text()
    assert '"team": "ml-infra"' not in text  # labels are YAML keys, values quoted
    assert 'team: "ml-infra"' in text
    assert 'for: "1h30m"' in text


def test_cli_rules_export_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "gpu.rules.yml"
    result = gpuconsole("rules", "export", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == rules_yaml(DEFAULT_RULES, CURRENT)  # dcgm-exporter 4.9 by default
    alerts = tmp_path / "alerts.toml"
    alerts.write_text('enable = ["gpu-utilization-high"]\n')
    stdout = gpuconsole("rules", "export", "--alerts", str(alerts), "--host-label", "hostname")
    assert stdout.returncode == 0, stdout.stderr
    assert "avg by (hostname)" in stdout.stdout
    for generation, dialect in (("classic", dcgm.Dialect.of("classic")), ("both", BOTH)):
        chosen = gpuconsole("rules", "export", "--dcgm-exporter", generation)
        assert chosen.returncode == 0, chosen.stderr
        assert chosen.stdout == rules_yaml(DEFAULT_RULES, dialect)
    classic = gpuconsole(
        "rules", "export", "--dcgm-exporter", "classic", "--host-label", "Hostname"
    )
    assert classic.stdout == rules_yaml(DEFAULT_RULES, CLASSIC)
    wrong = gpuconsole("rules", "export", "--dcgm-exporter", "4.8")
    assert wrong.returncode == 2 and "invalid choice: '4.8'" in wrong.stderr


def test_cli_rules_export_bad_rule_is_one_line(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.toml"
    alerts.write_text('[[rule]]\nname = "gpu-hot"\nexpr = "temp > 85"\nseverity = "info"\n')
    result = gpuconsole("rules", "export", "--alerts", str(alerts))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"gpuconsole: {alerts}: rule 'gpu-hot': expr: unknown reading")
    assert len(result.stderr.strip().splitlines()) == 1


@needs_promtool
def test_rules_for_both_generations_alert_on_a_mixed_fleet(tmp_path: Path) -> None:
    """``--dcgm-exporter both``: a host behind classic dcgm-exporter (``Hostname``) and one behind
    4.9 (``hostname``, base units) alert alike; a GPU reporting under both names alerts once."""
    series = [
        gpu("DCGM_FI_DEV_GPU_TEMP", "old", 0, "90x8"),
        gpu("DCGM_FI_DEV_GPU_TEMP", "new", 0, "90x8", dcgm.CURRENT),
        gpu("DCGM_FI_DEV_GPU_TEMP", "new", 1, "60x8", dcgm.CURRENT),
        gpu("DCGM_FI_DEV_FB_USED", "old", 0, "71680x8"),
        gpu("DCGM_FI_DEV_FB_FREE", "old", 0, "10240x8"),
        gpu("DCGM_FI_DEV_FB_USED", "new", 0, "71680x8", dcgm.CURRENT),
        gpu("DCGM_FI_DEV_FB_FREE", "new", 0, "10240x8", dcgm.CURRENT),
    ]
    both = dcgm.Dialect.of("both")

    def alert(host: str, generation: str, rule: str, summary: str) -> dict:
        return {
            "exp_labels": expected(host, 0, generation, severity="warning", rule=rule),
            "exp_annotations": {"summary": summary},
        }

    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {
                    "eval_time": "6m",
                    "alertname": "GpuTemperatureHigh",
                    "exp_alerts": [
                        alert(h, g, "gpu-temperature-high", f"{h} GPU 0 at 90 °C (alert at 85 °C)")
                        for h, g in (("old", dcgm.CLASSIC), ("new", dcgm.CURRENT))
                    ],
                },
                {
                    "eval_time": "6m",
                    "alertname": "GpuMemoryHigh",
                    "exp_alerts": [
                        alert(
                            h,
                            g,
                            "gpu-memory-high",
                            f"{h} GPU 0: 88 % of memory used, past the 20 % reserve",
                        )
                        for h, g in (("old", dcgm.CLASSIC), ("new", dcgm.CURRENT))
                    ],
                },
            ],
        }
    ]
    result = run_tests(tmp_path, rules_yaml(BUILT_IN_RULES, both), tests)
    assert result.returncode == 0, result.stdout + result.stderr


# --- property: the exported rule holds exactly where the console's rule holds ------------------

_PROPERTY_RULES = tuple(
    rule_from_dict({"severity": "warning", **table, "message": "{host} GPU {gpu}"}, "test")
    for table in (
        *(
            {"name": r.name, "expr": r.condition.text, "for": r.for_text}
            for r in BUILT_IN_RULES
            if r.condition is not None and r.scope == "gpu"
        ),
        {"name": "hot-idle", "expr": "temperature_c > 70 and utilization_pct < 5", "for": "1m"},
        {"name": "slow-or-full", "expr": "sm_clock_mhz < 1000 or memory_used_mib > 70000"},
        {"name": "free-low", "expr": "memory_free_mib * 10 < memory_total_mib"},
    )
)
"""The built-in GPU conditions and a few of a user's. Host-scoped rules are left out: PromQL's
`avg` sums in another order than the console's mean, so a mean that lands exactly on a threshold
may differ in its last bit."""

_GPU_VALUES = st.fixed_dictionaries(
    {
        "temperature_c": st.integers(20, 100),
        "utilization_pct": st.integers(0, 100),
        "memory_used_mib": st.integers(0, 81920),
        "memory_free_mib": st.integers(0, 81920),
        "power_w": st.floats(50, 800, allow_nan=False).map(lambda w: round(w, 2)),
        "power_limit_w": st.sampled_from([300.0, 400.0, 700.0]),
        "sm_clock_mhz": st.integers(200, 1980),
    }
)
_SERIES = {
    "temperature_c": "DCGM_FI_DEV_GPU_TEMP",
    "utilization_pct": "DCGM_FI_DEV_GPU_UTIL",
    "memory_used_mib": "DCGM_FI_DEV_FB_USED",
    "memory_free_mib": "DCGM_FI_DEV_FB_FREE",
    "power_w": "DCGM_FI_DEV_POWER_USAGE",
    "power_limit_w": "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "sm_clock_mhz": "DCGM_FI_DEV_SM_CLOCK",
}


def _as_read(values: dict[str, float], generation: str) -> GpuState:
    """The GPU as the console reads it from ``generation``'s series: each value through the unit
    conversion of its metric, as the Prometheus source does it (and the PromQL)."""
    read = {}
    for field, value in values.items():
        metric = dcgm.BY_NAME[_SERIES[field]]
        unit = metric.unit if generation == dcgm.CURRENT else dcgm.SAME
        read[field] = unit.convert(value * unit.divide / unit.multiply)
    free = read.pop("memory_free_mib")
    return GpuState(index=0, memory_total_mib=read["memory_used_mib"] + free, **read)


@needs_promtool
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fleet=st.lists(
        st.tuples(st.sampled_from(dcgm.GENERATIONS), _GPU_VALUES), min_size=1, max_size=24
    ),
    dialect=st.sampled_from(["classic", "4.9", "both"]),
)
def test_exported_conditions_hold_where_the_consoles_do(
    tmp_path_factory: pytest.TempPathFactory, fleet: list, dialect: str
) -> None:
    """For any readings of any GPUs, written in their generation's names and units, the exported
    rules fire for exactly the GPUs where the console's conditions hold (rules exported for both
    generations see every GPU; for one generation, only that generation's GPUs)."""
    chosen = dcgm.Dialect.of(dialect)
    series, wanted = [], {rule.alert_name: [] for rule in _PROPERTY_RULES}
    for number, (generation, values) in enumerate(fleet):
        host = f"n{number}"
        for field, value in values.items():
            series.append(gpu(_SERIES[field], host, 0, f"{value!r}x12", generation))
        if generation not in chosen.generations:
            continue
        state = _as_read(values, generation)
        snapshot = HostSnapshot(host=host, time=0.0, gpus=(state,))
        readings = {name: reading.read(state, snapshot) for name, reading in READINGS.items()}
        for rule in _PROPERTY_RULES:
            assert rule.condition is not None
            holds = rule.condition.test(readings.get)
            if holds is None:
                continue
            annotations = {"summary": f"{host} GPU 0"}
            labels = expected(host, 0, generation, rule=rule.name)
            if rule.severity is not None:
                labels["severity"] = rule.severity.label
            wanted[rule.alert_name].append({"exp_labels": labels, "exp_annotations": annotations})
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": name, "exp_alerts": alerts}
                for name, alerts in wanted.items()
            ],
        }
    ]
    result = run_tests(tmp_path_factory.mktemp("rules"), rules_yaml(_PROPERTY_RULES, chosen), tests)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
