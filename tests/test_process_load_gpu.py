"""Per-process SM % on a real NVIDIA GPU, judged by ``nvidia-smi pmon``; skipped where NVML or
torch's CUDA cannot be used (CI has no GPU). The comparison is the benchmark's
(benchmarks/process_load_vs_pmon.py), run here with fewer rounds."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuconsole.telemetry.nvml import nvml_unavailable_reason

REASON = nvml_unavailable_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(REASON is not None, reason=f"no usable NVIDIA GPU: {REASON}"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]
BENCHMARK = Path(__file__).parent.parent / "benchmarks" / "process_load_vs_pmon.py"


def test_a_busy_process_sm_percent_agrees_with_pmon_and_an_idle_one_is_idle(
    tmp_path: Path,
) -> None:
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, str(BENCHMARK), "--rounds", "5", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(result.stdout, result.stderr)
    assert out.exists(), result.stderr
    figures = json.loads(out.read_text())
    assert figures["failures"] == [], result.stdout
    assert result.returncode == 0
    busy = figures["seen"]["busy"]
    assert len(busy["local"]) == len(busy["agent"]) == len(busy["pmon"]) == 5
