"""`gpuconsole memory` end to end on the CPU: real recipe runs for every trial, the choice, the
largest batch; and over the test sshd. Memory is the recipes' tensor accounting here (no CUDA)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from sshd import user_env
from standin import write_standin_smi

from gpuconsole.core import paths

pytest.importorskip("torch")

TINY = ("--", "--tiny", "--device", "cpu")
EAGER = ("--preset", "baseline")  # the job as the baseline preset runs it: compiling takes minutes
COMPILED = (*TINY, "--compile-backend", "aot_eager_decomp_partition")  # the partitioner, no code


RUN_S = 900  # a doctor's every trial is a recipe run on the CPU


@pytest.fixture
def cpu_host(tmp_path: Path) -> dict[str, str]:
    """This machine as the host: the venv's python3 (the one with torch) first on PATH."""
    path = f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    return {**os.environ, "PATH": path, "HOME": str(tmp_path / "home")}


def test_every_fix_is_tried_and_the_cheapest_that_fits_is_chosen(cpu_host) -> None:
    done = gpuconsole("memory", "bert", *EAGER, "--target", "45%", "--steps", "3", "--json",
                      *TINY, env=cpu_host, timeout=RUN_S)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["memory_source"].startswith("tensor accounting (no CUDA)")
    assert report["batch_size"] == 8 and report["preset"] == "baseline"
    trials = {t["name"]: t for t in report["trials"] if t["role"] == "trial"}
    first = [
        "fp32", "bf16", "bf16+checkpoint", "bf16+selective-checkpoint", "fp32+compress-bf16",
        "bf16+compress-fp8", "bf16+optimizer-in-backward", "bf16+optimizer-offload",
        "bf16+micro-batch/2",
    ]  # fmt: skip
    # no allocator on a CPU: no expandable trials; an eager job: no compiler's budget
    assert [t["name"] for t in report["trials"]][: len(first)] == first
    assert all(t["error"] is None and t["compiled"] is False for t in report["trials"])
    peak = {name: trials[name]["peak_mib"] for name in first}
    assert peak["bf16+checkpoint"] < peak["bf16+selective-checkpoint"] < peak["bf16"]
    assert peak["bf16"] < peak["fp32"] and peak["fp32+compress-bf16"] < peak["fp32"]
    assert peak["bf16+micro-batch/2"] < peak["bf16"]
    assert peak["bf16+optimizer-in-backward"] < peak["bf16"]  # fewer gradients at once
    assert peak["bf16+optimizer-offload"] < peak["bf16+optimizer-in-backward"]  # no moments
    target = report["target_mib"]
    assert target == pytest.approx(0.45 * peak["fp32"])
    chosen = trials[report["recommended"]]
    assert chosen["fits"] and chosen["peak_mib"] <= target
    fitting = [t for t in trials.values() if t["fits"] and t["fixes"]["batch_size"] is None]
    # the fastest fitting set, unless a near-equal one needs fewer fixes or drifts the loss
    assert (
        chosen["samples_per_s"]
        >= 0.98 * max(t["samples_per_s"] for t in fitting if abs(t["loss_drift"] or 0) <= 0.01)
        or chosen["name"] == min(fitting, key=lambda t: t["name"].count("+"))["name"]
    )
    assert report["recommended_flags"][:2] == ["--precision", "bf16"]
    # the preset decides, except for compression, which runs eagerly (the CPU's speeds decide
    # which set is chosen, so the rule is checked rather than one outcome)
    compresses = chosen["fixes"]["compress"] is not None
    assert ("--no-compile" in report["recommended_flags"]) == compresses
    # every trial measured until steady or 4 × --steps; the speeds of probes are not figures
    assert all(3 <= trials[name]["steps"] <= 12 and trials[name]["spread"] is not None
               for name in first)  # fmt: skip
    probes = [t for t in report["trials"] if t["role"] == "probe"]
    assert all(t["fixes"]["batch_size"] for t in probes)
    largest = report["largest_batch"]
    assert largest >= 8 and largest % 8 == 0  # the job's batch is a multiple of 8
    over = [t["fixes"]["batch_size"] for t in probes if not t["fits"]]
    assert all(batch > largest for batch in over)
    # the recommended set and mixed precision alone run a second time
    again = {t["name"] for t in report["trials"] if t["role"] == "repeat"}
    assert again == {"bf16", report["recommended"]}
    assert "empty_cache" in report["notes"][-1]


def test_a_compiled_job_is_tried_compiled_with_the_compilers_fixes(cpu_host) -> None:
    """The tuned preset compiles: the trials of the sets given run compiled, compression's
    eagerly; the memory budget's bert run recomputes dropout, so it is measured and shown but
    never recommended."""
    sets = "fp32,bf16,bf16+memory-budget/0.3,bf16+compress-fp8"
    done = gpuconsole("memory", "bert", "--fixes", sets, "--target", "90%", "--steps", "2",
                      "--batch-probes", "0", *COMPILED, env=cpu_host, timeout=RUN_S)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[:4]}
    assert [rows[name][1] for name in sets.split(",")] == [
        "compiled", "compiled", "compiled", "eager",
    ]  # fmt: skip
    assert "(unsound)" in " ".join(rows["bf16+memory-budget/0.3"])
    text = done.stdout
    assert "bert (tuned preset) on" in text
    assert "not recommended, under a memory budget torch's partitioner recomputes dropout" in text
    recommended = next(line for line in text.splitlines() if line.startswith("recommended:"))
    assert recommended.startswith("recommended: bf16") and "memory-budget" not in recommended
    assert "flags: --preset tuned --precision bf16" in text
    assert "run twice: bf16 at" in text
    assert "where the memory goes at the smallest peak" in text


def test_the_compilers_fixes_on_an_eager_job_are_one_line(cpu_host) -> None:
    """A memory budget and CUDA graphs need the job compiled: refused after the first trial
    shows it eager, not reported as trials that failed and a target nothing met."""
    done = gpuconsole("memory", "bert", *EAGER, "--fixes", "fp32,bf16+cuda-graphs,bf16",
                      "--steps", "2", "--batch-probes", "0", *TINY,
                      env=cpu_host, timeout=RUN_S)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (
        "gpuconsole: memory bert: --fixes bf16+cuda-graphs: torch.compile's fixes, and bert runs "
        "eagerly here (--preset baseline or --no-compile): leave them out, or compile the job"
    )


def test_a_target_nothing_meets_says_so(cpu_host) -> None:
    done = gpuconsole("memory", "bert", *EAGER, "--target", "0.001", "--fixes",
                      "bf16+checkpoint", "--steps", "2", *TINY,
                      env=cpu_host, timeout=RUN_S)  # fmt: skip
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
    done = gpuconsole("memory", "bert", *EAGER, "--fixes", "bf16+checkpoint", "--target",
                      "0.03", "--steps", "2", "--apply", *TINY, env=env, timeout=RUN_S)  # fmt: skip
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
    assert "--preset baseline" in launched[1]["command"]
    assert "--checkpoint-every 1" in launched[1]["command"]


def test_bad_memory_arguments_are_one_line(cpu_host) -> None:
    done = gpuconsole("memory", "bert", "--fixes", "bf16+zero3", *TINY, env=cpu_host, timeout=RUN_S)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gpuconsole: --fixes 'bf16+zero3': unknown fix 'zero3' (checkpoint, checkpoint/K, "
        "selective-checkpoint, selective-checkpoint/K, memory-budget/F, compress-bf16, "
        "compress-fp8, expandable, optimizer-in-backward, optimizer-offload, optimizer-8bit, "
        "cuda-graphs, micro-batch/N)"
    )
    done = gpuconsole("memory", "bert", *TINY, "--batch-size", "4", env=cpu_host, timeout=RUN_S)
    assert done.returncode == 2 and "not after --" in done.stderr


def test_the_trials_run_over_ssh_with_the_inventorys_python(sshd, tmp_path: Path) -> None:
    sshd.ssh_config(["gpu-a"])
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(f'[hosts.gpu-a]\npython = "{sys.executable}"\n')
    env = user_env(sshd.home)
    done = gpuconsole("memory", "bert", *EAGER, "--host", "gpu-a", "--inventory",
                      str(inventory), "--fixes", "bf16+checkpoint", "--target", "0.03", "--steps",
                      "2", "--json", *TINY, env=env, timeout=RUN_S)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["host"] == "gpu-a" and report["recommended"] == "bf16+checkpoint"
    assert report["largest_batch"] > 8
