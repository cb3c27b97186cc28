"""`gpuconsole grafana export`: a dashboard over the same metrics, with valid PromQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from promserver import promtool, promtool_available

from gpuconsole.prom.grafana import UID, dashboard, dashboard_json, panels

needs_promtool = pytest.mark.skipif(not promtool_available(), reason="promtool is not installed")


def test_dashboard_model() -> None:
    model = dashboard()
    assert model["uid"] == UID
    variables = {v["name"]: v for v in model["templating"]["list"]}  # type: ignore[index]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["host"]["query"] == "label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)"
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
    text = dashboard_json("hostname")
    assert 'hostname=~\\"$host\\"' in text
    assert "Hostname" not in text


@needs_promtool
@pytest.mark.parametrize("host_label", ["Hostname", "hostname"])
def test_every_panel_query_is_valid_promql(tmp_path: Path, host_label: str) -> None:
    """promtool parses each query as a recording rule's expression."""
    exprs = [expr.replace("$host", ".*") for p in panels(host_label) for expr, _ in p.targets]
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
    result = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "grafana", "export", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == dashboard()
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
