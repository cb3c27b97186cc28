"""`gpuconsole grafana export`: a dashboard over the same metrics, with valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from promserver import promtool, promtool_available

from gpuconsole.prom.grafana import UID, dashboard, dashboard_json, panels
from gpuconsole.telemetry import dcgm

DIALECTS = {
    "classic-Hostname": dcgm.Dialect.of("classic", "Hostname"),
    "classic": dcgm.Dialect.of("classic"),
    "4.9": dcgm.Dialect.of("4.9"),
    "both": dcgm.Dialect.of("both"),
}

needs_promtool = pytest.mark.skipif(not promtool_available(), reason="promtool is not installed")


def test_dashboard_model() -> None:
    model = dashboard(DIALECTS["4.9"])
    assert model["uid"] == UID
    variables = {v["name"]: v for v in model["templating"]["list"]}  # type: ignore[index]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["host"]["query"] == "label_values(DCGM_FI_DEV_GPU_UTIL_RATIO, hostname)"
    found = model["panels"]
    assert isinstance(found, list) and len(found) == len(panels())
    assert len({p["id"] for p in found}) == len(found)
    cells = set()
    for panel in found:
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_guide_thresholds_are_drawn() -> None:
    by_title = {p["title"]: p for p in dashboard()["panels"]}  # type: ignore[union-attr]

    def steps(title: str) -> list[float]:
        defaults = by_title[title]["fieldConfig"]["defaults"]
        return [s["value"] for s in defaults["thresholds"]["steps"] if s["value"] is not None]

    assert 85.0 in steps("GPU temperature")
    assert 80.0 in steps("GPU memory used")
    assert 90.0 in steps("GPU utilization")


def test_host_label_choice() -> None:
    text = dashboard_json(DIALECTS["classic-Hostname"])
    assert 'Hostname=~\\"$host\\"' in text
    assert "hostname" not in text and "_RATIO" not in text
    assert dashboard(DIALECTS["classic-Hostname"])["templating"]["list"][1]["query"] == (  # type: ignore[index]
        "label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)"
    )


def test_generations_and_two_host_labels() -> None:
    """4.9: its names, in the console's units; both: each reading under either name, the host
    under either label, the host variable made of whichever label a series carries."""
    current = {p.title: p.targets[0][0] for p in panels(DIALECTS["4.9"])}
    assert current["GPU utilization"] == '(DCGM_FI_DEV_GPU_UTIL_RATIO{hostname=~"$host"} * 100)'
    assert current["SM clock"] == '(DCGM_FI_DEV_SM_CLOCK_HERTZ{hostname=~"$host"} / 1000000)'
    assert "DCGM_FI_DEV_FB_USED_BYTES" in current["GPU memory used"]
    both = {p.title: p.targets[0][0] for p in panels(DIALECTS["both"])}
    assert both["GPU temperature"] == (
        '(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$host|",hostname=~"$host|"} or '
        'DCGM_FI_DEV_GPU_TEMP_CELSIUS{Hostname=~"$host|",hostname=~"$host|"})'
    )
    host = dashboard(DIALECTS["both"])["templating"]["list"][1]  # type: ignore[index]
    assert host["query"] == (
        "query_result(count by (Hostname, hostname) "
        '({__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_GPU_UTIL_RATIO"}))'
    )
    assert re.search(host["regex"].strip("/"), '{hostname="gpu-7"} 8').group(1) == "gpu-7"
    power = next(p for p in panels(DIALECTS["4.9"]) if p.title == "Power draw against the limit")
    assert "does not collect by default" in power.description


@needs_promtool
@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_panel_query_is_valid_promql(tmp_path: Path, dialect: str) -> None:
    """promtool parses each query as a recording rule's expression."""
    exprs = [
        expr.replace("$host", ".*") for p in panels(DIALECTS[dialect]) for expr, _ in p.targets
    ]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"panel:query{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "panels.yml"
    path.write_text(json.dumps(rules))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout
    path.write_text(json.dumps(rules).replace("sum by", "sum byy"))
    assert promtool("check", "rules", str(path)).returncode != 0


def test_cli_grafana_export(tmp_path: Path) -> None:
    out = tmp_path / "dashboard.json"
    result = gpuconsole("grafana", "export", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == dashboard(DIALECTS["4.9"])  # dcgm-exporter 4.9 by default
    both = gpuconsole("grafana", "export", "--dcgm-exporter", "both")
    assert both.returncode == 0, both.stderr
    assert json.loads(both.stdout) == dashboard(DIALECTS["both"])
    unwritable = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuconsole",
            "grafana",
            "export",
            "-o",
            str(tmp_path / "no/x.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unwritable.returncode == 3
    assert unwritable.stderr.strip() == (
        f"gpuconsole: {tmp_path / 'no/x.json'}: No such file or directory"
    )
