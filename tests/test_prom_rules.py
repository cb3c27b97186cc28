"""`gpuconsole rules export`: correct PromQL, checked and unit-tested with the real promtool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from promserver import promtool, promtool_available

from gpuconsole.alerts.config import merge_rules
from gpuconsole.alerts.defaults import DEFAULT_RULES
from gpuconsole.prom.rules_export import go_template, rule_expr, rules_yaml

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


def gpu(metric: str, host: str, index: int, values: str) -> dict[str, str]:
    labels = f'Hostname="{host}",gpu="{index}",UUID="GPU-{host}-{index}",modelName="NVIDIA H100"'
    return {"series": f"{metric}{{{labels}}}", "values": values}


def expected(host: str, index: int, **extra: str) -> dict[str, str]:
    return {
        "Hostname": host,
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
    exprs = {rule.name: rule_expr(rule) for rule in DEFAULT_RULES}
    assert exprs["gpu-utilization-high"] == "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) > 95"
    assert exprs["gpu-temperature-high"] == "DCGM_FI_DEV_GPU_TEMP >= 85"
    assert "rate(" not in "".join(exprs.values())
    assert exprs["gpu-xid"] == 'gpuconsole_findings{code=~"xid|gpu-lost"} > 0'
    host_label = {rule.name: rule_expr(rule, "hostname") for rule in DEFAULT_RULES}
    assert host_label["gpu-utilization-high"].startswith("avg by (hostname) (")


def test_messages_become_prometheus_templates() -> None:
    assert go_template("{host} GPU {gpu} at {value:.0f} °C") == (
        '{{ $labels.Hostname }} GPU {{ $labels.gpu }} at {{ printf "%.0f" $value }} °C'
    )
    assert go_template("{host}: {value}", "hostname") == "{{ $labels.hostname }}: {{ $value }}"
    assert go_template("{host}: {detail}") == (
        "{{ $labels.Hostname }}: {{ $labels.code }}"
        "{{ if $labels.gpu }} on GPU {{ $labels.gpu }}{{ end }}"
    )


@needs_promtool
def test_promtool_check_rules_on_the_export(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(rules_yaml(DEFAULT_RULES))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(DEFAULT_RULES)} rules found" in result.stdout


@needs_promtool
def test_promtool_check_rules_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(rules_yaml(DEFAULT_RULES).replace(" >= 85", " >>= 85"))
    assert promtool("check", "rules", str(path)).returncode != 0


@needs_promtool
def test_alert_unit_tests_pending_firing_resolved(tmp_path: Path) -> None:
    """Input series in, alerts out, at each minute: `for:` and thresholds as the console has."""
    tests = [
        {
            "interval": "1m",
            "input_series": [
                # Hot from minute 1 to 3, cool again at 4: pending at 1, firing at 2 and 3.
                gpu("DCGM_FI_DEV_GPU_TEMP", "n1", 0, "80 86 90 88 70"),
                gpu("DCGM_FI_DEV_GPU_TEMP", "n1", 1, "60 60 60 60 60"),
                # 85 counts (>= 85): pending at 0, firing at 1; 84 resolves it at 2.
                gpu("DCGM_FI_DEV_GPU_TEMP", "n2", 0, "85 85 84 84 84"),
                # A host at 96 % and 100 % averages 98 for 5 minutes; another averages 90.
                gpu("DCGM_FI_DEV_GPU_UTIL", "n1", 0, "96x8"),
                gpu("DCGM_FI_DEV_GPU_UTIL", "n1", 1, "100x8"),
                gpu("DCGM_FI_DEV_GPU_UTIL", "n2", 0, "100x8"),
                gpu("DCGM_FI_DEV_GPU_UTIL", "n2", 1, "80x8"),
                # 70 of 80 GiB used: 87.5 % for the memory rule.
                gpu("DCGM_FI_DEV_FB_USED", "n1", 0, "71680x8"),
                gpu("DCGM_FI_DEV_FB_FREE", "n1", 0, "10240x8"),
                gpu("DCGM_FI_DEV_FB_USED", "n1", 1, "1024x8"),
                gpu("DCGM_FI_DEV_FB_FREE", "n1", 1, "80896x8"),
                # At the cap (>= 98 % of 700 W) on GPU 0 only.
                gpu("DCGM_FI_DEV_POWER_USAGE", "n1", 0, "690x8"),
                gpu("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "n1", 0, "700x8"),
                gpu("DCGM_FI_DEV_POWER_USAGE", "n1", 1, "500x8"),
                gpu("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "n1", 1, "700x8"),
                {
                    "series": 'gpuconsole_findings{Hostname="n1",gpu="3",code="xid",'
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
                                "n2", 0, severity="warning", rule="gpu-temperature-high"
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
                                "n1", 0, severity="warning", rule="gpu-temperature-high"
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
                                "Hostname": "n1",
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
                                "n1", 0, severity="warning", rule="gpu-memory-high"
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
                                "n1", 0, severity="info", rule="gpu-power-at-limit"
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
                                "Hostname": "n1",
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
    result = run_tests(tmp_path, rules_yaml(DEFAULT_RULES), tests)
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
    result = run_tests(tmp_path, rules_yaml(DEFAULT_RULES), tests)
    assert result.returncode != 0
    assert "GpuTemperatureHigh" in result.stdout + result.stderr


@needs_promtool
def test_the_guides_rule_never_fires_on_a_pinned_gpu(tmp_path: Path) -> None:
    """rate() of a gauge pinned at 100 % is 0: the guide's rule stays silent; ours fires."""
    (tmp_path / "guide.yml").write_text(GUIDE_RULE)
    (tmp_path / "ours.yml").write_text(rules_yaml(DEFAULT_RULES))
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
    path.write_text(rules_yaml(rules, "hostname"))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    text = path.read_text()
    assert '"team": "ml-infra"' not in text  # labels are YAML keys, values quoted
    assert 'team: "ml-infra"' in text
    assert 'for: "1h30m"' in text


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuconsole", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_cli_rules_export_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "gpu.rules.yml"
    result = run_cli("rules", "export", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == rules_yaml(DEFAULT_RULES)
    stdout = run_cli("rules", "export", "--host-label", "hostname")
    assert stdout.returncode == 0
    assert "avg by (hostname)" in stdout.stdout


def test_cli_rules_export_bad_rule_is_one_line(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.toml"
    alerts.write_text('[[rule]]\nname = "gpu-hot"\nexpr = "temp > 85"\nseverity = "info"\n')
    result = run_cli("rules", "export", "--alerts", str(alerts))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"gpuconsole: {alerts}: rule 'gpu-hot': expr: unknown reading")
    assert len(result.stderr.strip().splitlines()) == 1
