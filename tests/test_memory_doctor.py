"""`gpuconsole memory` end to end on the CPU: real recipe runs for every trial, the choice, the
largest batch; and over the test sshd. Memory is the recipes' tensor accounting here (no CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sshd import user_env
from standin import write_standin_smi

from gpuconsole import paths

pytest.importorskip("torch")

TINY = ("--", "--tiny", "--device", "cpu")


def gpuconsole(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuconsole", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )


@pytest.fixture
def cpu_host(tmp_path: Path) -> dict[str, str]:
    """This machine as the host: the venv's python3 (the one with torch) first on PATH."""
    path = f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    return {**os.environ, "PATH": path, "HOME": str(tmp_path / "home")}


def test_every_fix_is_tried_and_the_cheapest_that_fits_is_chosen(cpu_host) -> None:
    done = gpuconsole("memory", "bert", "--target", "45%", "--steps", "3", "--json", *TINY,
                      env=cpu_host)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["memory_source"].startswith("tensor accounting (no CUDA)")
    assert report["batch_size"] == 8
    trials = {t["name"]: t for t in report["trials"]}
    first = [
        "fp32", "bf16", "bf16+checkpoint", "fp32+compress-bf16", "bf16+compress-fp8",
        "bf16+optimizer-in-backward", "bf16+micro-batch/2",
    ]  # fmt: skip
    assert [t["name"] for t in report["trials"]][: len(first)] == first  # no allocator: no
    assert all(t["error"] is None for t in report["trials"])  # expandable trials on a CPU
    peak = {name: trials[name]["peak_mib"] for name in first}
    assert peak["bf16+checkpoint"] < peak["bf16"] < peak["fp32"]
    assert peak["fp32+compress-bf16"] < peak["fp32"]
    assert peak["bf16+micro-batch/2"] < peak["bf16"]
    assert peak["bf16+optimizer-in-backward"] < peak["bf16"]  # fewer gradients at once
    target = report["target_mib"]
    assert target == pytest.approx(0.45 * peak["fp32"])
    chosen = trials[report["recommended"]]
    assert chosen["fits"] and chosen["peak_mib"] <= target
    fitting = [t for t in report["trials"] if t["fits"] and t["fixes"]["batch_size"] is None]
    # the fastest fitting set, unless a near-equal one needs fewer fixes or drifts the loss
    assert (
        chosen["samples_per_s"]
        >= 0.98 * max(t["samples_per_s"] for t in fitting if abs(t["loss_drift"] or 0) <= 0.01)
        or chosen["name"] == min(fitting, key=lambda t: t["name"].count("+"))["name"]
    )
    assert report["recommended_flags"][:2] == ["--no-compile", "--precision"]
    probes = [t for t in report["trials"] if t["fixes"]["batch_size"] is not None]
    largest = report["largest_batch"]
    assert largest >= 1
    over = [t["fixes"]["batch_size"] for t in probes if not t["fits"]]
    assert all(batch > largest for batch in over)
    assert "empty_cache" in report["notes"][-1]


def test_a_target_nothing_meets_says_so(cpu_host) -> None:
    done = gpuconsole("memory", "bert", "--target", "0.001", "--fixes", "bf16+checkpoint",
                      "--steps", "2", *TINY, env=cpu_host)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "nothing tried fits the target" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_apply_launches_the_recommendation_and_the_audit_log_has_both(
    cpu_host, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_standin_smi(bin_dir, gpus=1)  # the launch asks nvidia-smi for the host's GPUs
    log = tmp_path / "audit.jsonl"
    env = {**cpu_host, "PATH": f"{bin_dir}:{cpu_host['PATH']}", paths.AUDIT_LOG.variable: str(log)}
    done = gpuconsole("memory", "bert", "--fixes", "bf16+checkpoint", "--target", "0.03",
                      "--steps", "2", "--apply", *TINY, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    trials, launched = entries[:-2], entries[-2:]
    assert trials and [(e["action"], e["step"]) for e in trials] == [
        ("memory-trial", "install"),
        ("memory-trial", "run"),
    ] * (len(trials) // 2)
    assert [(e["action"], e["step"], e["exit_code"]) for e in launched] == [
        ("launch", "install", 0),
        ("launch", "run", 0),
    ]
    assert "--checkpoint-every 1" in launched[1]["command"]


def test_bad_memory_arguments_are_one_line(cpu_host) -> None:
    done = gpuconsole("memory", "bert", "--fixes", "bf16+zero3", *TINY, env=cpu_host)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gpuconsole: --fixes 'bf16+zero3': unknown fix 'zero3' (checkpoint, checkpoint/K, "
        "compress-bf16, compress-fp8, expandable, optimizer-in-backward, micro-batch/N)"
    )
    done = gpuconsole("memory", "bert", *TINY, "--batch-size", "4", env=cpu_host)
    assert done.returncode == 2 and "not after --" in done.stderr


def test_the_trials_run_over_ssh_with_the_inventorys_python(sshd, tmp_path: Path) -> None:
    sshd.ssh_config(["gpu-a"])
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(f'[hosts.gpu-a]\npython = "{sys.executable}"\n')
    env = user_env(sshd.home)
    done = gpuconsole("memory", "bert", "--host", "gpu-a", "--inventory", str(inventory),
                      "--fixes", "bf16+checkpoint", "--target", "0.03", "--steps", "2", "--json",
                      *TINY, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["host"] == "gpu-a" and report["recommended"] == "bf16+checkpoint"
    assert report["largest_batch"] > 8
