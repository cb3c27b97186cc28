"""The training recipes, run on the CPU as a host runs them: a copy of each script in a temp dir,
started with python3 (or torchrun), read back as JSON lines from its stdout."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpuconsole.recipes import HARNESS, RECIPES, recipe_files  # noqa: E402

FAST = ("--tiny", "--device", "cpu", "--no-compile")  # compiling for a CPU takes minutes


@pytest.fixture(scope="module")
def recipe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripts and their harness alone in a directory, nothing of gpuconsole beside them."""
    directory = tmp_path_factory.mktemp("host")
    for path in (*RECIPES.values(), HARNESS):
        shutil.copy(path, directory / path.name)
    return directory


Outcome = tuple[int, list[dict[str, Any]], str]  # exit status, stdout's events, stderr


@pytest.fixture(scope="module")
def run_recipe(recipe_dir: Path) -> Callable[..., Outcome]:
    """Run a recipe once per distinct command line (results are shared within the module)."""
    cache: dict[tuple[str, ...], Outcome] = {}

    def run(name: str, *args: str, torchrun: int = 0) -> Outcome:
        key = (name, str(torchrun), *args)
        if key not in cache:
            launcher = [sys.executable]
            if torchrun:
                launcher += ["-m", "torch.distributed.run", "--standalone"]
                launcher += ["--nproc-per-node", str(torchrun)]
            command = [*launcher, f"{name}.py", *args]
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            done = subprocess.run(
                command, cwd=recipe_dir, env=env, capture_output=True, text=True, timeout=120
            )
            lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
            cache[key] = (done.returncode, lines, done.stderr)
        return cache[key]

    return run


def only_summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    summaries = [event for event in events if event["event"] == "summary"]
    assert len(summaries) == 1, events
    return summaries[0]


def load(recipe_dir: Path, name: str) -> ModuleType:
    """Import a copied recipe by path, to call its knob resolution directly."""
    if str(recipe_dir) not in sys.path:
        sys.path.insert(0, str(recipe_dir))  # where the recipe finds its harness
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", recipe_dir / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_registry_names_the_three_scripts_and_their_harness() -> None:
    assert set(RECIPES) == {"resnet50", "bert", "detection"}
    files = recipe_files("bert")
    assert files["bert.py"] == RECIPES["bert"].read_text(encoding="utf-8")
    assert files["_recipe_harness.py"] == HARNESS.read_text(encoding="utf-8")
    with pytest.raises(KeyError, match="unknown recipe 'vgg'"):
        recipe_files("vgg")


def test_registry_does_not_import_torch() -> None:
    probe = "import sys, gpuconsole.recipes; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize("path", [*RECIPES.values(), HARNESS], ids=lambda p: p.name)
def test_script_imports_only_the_standard_library_torch_and_the_harness(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            top |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module.split(".")[0])
    # imported inside functions, with a fallback or an error
    optional = {"torchvision", "PIL", "torchao"}
    allowed = {"torch", "__future__", HARNESS.stem}
    foreign = top - set(sys.stdlib_module_names) - allowed - optional
    assert not foreign


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_prints_steps_then_a_summary(run_recipe, name: str) -> None:
    code, events, stderr = run_recipe(name, *FAST, "--steps", "3", "--warmup-steps", "1")
    assert code == 0, stderr
    steps = [event for event in events if event["event"] == "step"]
    assert [event["phase"] for event in steps][:2] == ["warmup", "measured"]
    assert steps[-1]["step"] == 4
    assert all(event["samples_per_s"] > 0 and event["recipe"] == name for event in steps)
    summary = only_summary(events)
    assert events[-1] is summary
    assert summary["recipe"] == name and summary["preset"] == "tuned"
    assert summary["steps"] == 3 and summary["warmup_steps"] == 1
    assert summary["world_size"] == 1 and summary["samples_per_s"] > 0
    assert summary["memory_source"] == "process-rss-high-water" and summary["peak_memory_mib"] > 0
    assert summary["loss_first"] == steps[0]["loss"] and summary["loss_last"] == steps[-1]["loss"]
    knobs = summary["knobs"]
    assert knobs["precision"] == "bf16" and knobs["compile"] is False
    assert knobs["device"] == "cpu" and knobs["cudnn_benchmark"] is True


def test_summary_knobs_follow_explicit_flags(run_recipe) -> None:
    flags = ("--preset", "baseline", "--precision", "bf16", "--channels-last", "--batch-size", "4")
    code, events, stderr = run_recipe("resnet50", *FAST, *flags, "--steps", "1")
    assert code == 0, stderr
    knobs = only_summary(events)["knobs"]
    assert knobs["preset"] == "baseline" and knobs["precision"] == "bf16"
    assert knobs["channels_last"] is True and knobs["batch_size"] == 4
    assert knobs["cudnn_benchmark"] is False and knobs["fused_optimizer"] is False


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_presets_differ(recipe_dir: Path, name: str) -> None:
    module = load(recipe_dir, name)
    baseline = module.parse_knobs(["--preset", "baseline", "--device", "cuda"])
    tuned = module.parse_knobs(["--preset", "tuned", "--device", "cuda"])
    assert (baseline["precision"], baseline["tf32"], baseline["compile"]) == ("fp32", False, False)
    assert (tuned["precision"], tuned["tf32"], tuned["compile"]) == ("bf16", True, True)
    assert (baseline["cudnn_benchmark"], tuned["cudnn_benchmark"]) == (False, True)
    assert (baseline["fused_optimizer"], tuned["fused_optimizer"]) == (False, True)
    assert baseline["compile_mode"] is None and tuned["compile_mode"] == "default"
    if name != "bert":  # channels_last does not apply to a transformer
        assert (baseline["channels_last"], tuned["channels_last"]) == (False, True)


def test_compile_mode_is_a_knob(recipe_dir: Path) -> None:
    module = load(recipe_dir, "resnet50")
    knobs = module.parse_knobs(["--compile-mode", "max-autotune-no-cudagraphs", "--device", "cuda"])
    assert knobs["compile"] is True and knobs["compile_mode"] == "max-autotune-no-cudagraphs"


def test_bert_compiles_for_changing_lengths_only_when_they_change(recipe_dir: Path) -> None:
    module = load(recipe_dir, "bert")
    assert module.parse_knobs(["--padding", "dynamic"])["compile_dynamic"] is True
    assert module.parse_knobs(["--padding", "fixed"])["compile_dynamic"] is False
    assert module.parse_knobs(["--preset", "baseline"])["compile_dynamic"] is None


def test_detection_splits_the_guide_batch_over_gpus(
    recipe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load(recipe_dir, "detection")
    monkeypatch.setenv("WORLD_SIZE", "8")
    knobs = module.parse_knobs(["--device", "cpu"])
    assert knobs["batch_size"] == 4 and knobs["accumulate"] == 4 and knobs["image_size"] == 640


def test_fp16_on_a_cpu_is_refused(run_recipe) -> None:
    code, events, _ = run_recipe("resnet50", *FAST, "--precision", "fp16")
    assert code == 2
    assert events == [
        {
            "event": "error",
            "kind": "usage",
            "message": "fp16 needs --device cuda (GradScaler); use bf16 on a CPU",
            "rank": 0,
        }
    ]


def test_bad_argument_is_an_error_event(run_recipe) -> None:
    code, events, _ = run_recipe("bert", "--precision", "fp64")
    assert code == 2
    assert events[0]["event"] == "error" and events[0]["kind"] == "usage"
    assert "fp64" in events[0]["message"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_missing_cuda_is_reported(run_recipe) -> None:
    code, events, _ = run_recipe("detection", "--tiny", "--device", "cuda")
    assert code == 1
    assert len(events) == 1 and events[0]["kind"] == "no-cuda"


def test_bert_dynamic_padding_pads_less_than_fixed(run_recipe) -> None:
    runs = {}
    for padding in ("dynamic", "fixed"):
        code, events, stderr = run_recipe(
            "bert", *FAST, "--steps", "3", "--padding", padding, "--pad-multiple", "8"
        )
        assert code == 0, stderr
        runs[padding] = only_summary(events)
    assert runs["fixed"]["mean_padded_len"] == 128  # the tiny --max-len
    assert runs["dynamic"]["knobs"]["pad_multiple"] == 8
    assert runs["dynamic"]["mean_padded_len"] < 0.8 * runs["fixed"]["mean_padded_len"]
    assert runs["dynamic"]["knobs"]["padding"] == "dynamic"
    assert runs["dynamic"]["tokens_per_s"] > 0


def test_detection_steps_the_optimizer_every_fourth_micro_batch(run_recipe) -> None:
    schedule = ("--steps", "10", "--warmup-steps", "2", "--log-every", "6", "--workers", "1")
    code, events, stderr = run_recipe("detection", *FAST, *schedule, "--accumulate", "4")
    assert code == 0, stderr
    summary = only_summary(events)
    assert summary["optimizer_steps"] == 3  # 12 micro-batches
    assert summary["knobs"]["samples_per_optimizer_step"] == 4 * summary["knobs"]["batch_size"]
    code, events, stderr = run_recipe("detection", *FAST, *schedule, "--accumulate", "1")
    assert code == 0, stderr
    assert only_summary(events)["optimizer_steps"] == 12


def test_activation_checkpointing_keeps_the_arithmetic(run_recipe) -> None:
    """Recomputing in backward must give the same gradients, hence the same later losses; with
    bert the head's loss is then also computed in checkpointed chunks."""
    plain = ("--precision", "fp32", "--steps", "2", "--warmup-steps", "0")
    losses = []
    for extra in ((), ("--checkpoint-every", "1")):
        code, events, stderr = run_recipe("bert", *FAST, *plain, *extra)
        assert code == 0, stderr
        summary = only_summary(events)
        assert summary["knobs"]["checkpoint_every"] == (1 if extra else 0)
        losses.append(summary["loss_last"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_the_heads_loss_in_checkpointed_chunks_is_the_whole_loss(recipe_dir: Path) -> None:
    bert = load(recipe_dir, "bert")
    knobs = bert.parse_knobs(list(FAST))
    runtime = bert.start_runtime(knobs)
    batch = next(bert.token_batches(knobs, runtime, []))
    rows = batch.data[2].numel()  # prediction slots: the rows of the head's logits
    torch.manual_seed(0)
    whole = bert.MaskedLanguageModel(knobs)
    chunked = bert.MaskedLanguageModel(knobs, loss_rows=rows // 4 + 1)
    chunked.load_state_dict(whole.state_dict())
    results = []
    for model in (whole, chunked):
        torch.manual_seed(1)  # the same dropout masks
        loss = model(*batch.data)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss_whole, grads_whole), (loss_chunked, grads_chunked) = results
    assert torch.allclose(loss_whole, loss_chunked, rtol=1e-5)
    for one, other in zip(grads_whole, grads_chunked, strict=True):
        assert torch.allclose(one, other, rtol=1e-4, atol=1e-7)
    assert bert.loss_rows({**knobs, "checkpoint_every": 0}) == 0
    assert bert.loss_rows({**knobs, "checkpoint_every": 1}) * 4 * knobs["vocab"] <= 64 * 2**20


def test_the_optimizer_in_backward_keeps_the_arithmetic_and_fewer_gradients(run_recipe) -> None:
    """The same losses as the plain step; the tensor accounting's gradient peak is one block's
    gradients, not the model's: the largest, the word embeddings (2,000 × 64 when tiny), whose
    gradient is complete only at the end of backward (the decoder shares them)."""
    plain = ("--precision", "fp32", "--steps", "3", "--warmup-steps", "0")
    summaries = []
    in_backward = ("--optimizer-in-backward",)
    # and inside the nested backward of reentrant checkpoints
    for extra in ((), in_backward, (*in_backward, "--checkpoint-every", "1")):
        code, events, stderr = run_recipe("bert", *FAST, *plain, *extra)
        assert code == 0, stderr
        summaries.append(only_summary(events))
    stepped, in_backward, checkpointed = summaries
    assert stepped["loss_last"] == pytest.approx(in_backward["loss_last"], rel=1e-5)
    assert checkpointed["loss_last"] == pytest.approx(in_backward["loss_last"], rel=1e-5)
    assert in_backward["optimizer_steps"] == stepped["optimizer_steps"] == 3
    assert in_backward["gradient_peak_mib"] == 2000 * 64 * 4 / 2**20
    assert stepped["gradient_peak_mib"] > 1.8 * in_backward["gradient_peak_mib"]
    assert in_backward["model_state_mib"] == pytest.approx(stepped["model_state_mib"])
    code, events, _ = run_recipe("bert", *FAST, "--optimizer-in-backward", "--accumulate", "2")
    assert code == 2
    assert events[-1]["kind"] == "usage" and "drop --accumulate" in events[-1]["message"]


def test_checkpointing_under_torchrun(run_recipe) -> None:
    """DistributedDataParallel with checkpointed blocks and bert's chunked head, whose chunks
    share the word embeddings (a parameter must be marked ready once a step)."""
    args = (*FAST, "--steps", "2", "--batch-size", "4", "--checkpoint-every", "1")
    code, events, stderr = run_recipe("bert", *args, torchrun=2)
    assert code == 0, stderr
    assert only_summary(events)["world_size"] == 2


def test_torchrun_two_processes(run_recipe) -> None:
    args = (*FAST, "--steps", "2", "--batch-size", "4")
    code, events, stderr = run_recipe("resnet50", *args, torchrun=2)
    assert code == 0, stderr
    summary = only_summary(events)
    assert summary["world_size"] == 2
    assert summary["knobs"]["global_batch"] == 8
    assert all(event["event"] in ("step", "summary") for event in events)


@pytest.mark.skipif(importlib.util.find_spec("PIL") is not None, reason="Pillow is installed")
def test_image_folder_without_pillow_says_so(run_recipe, recipe_dir: Path) -> None:
    (recipe_dir / "images" / "cat").mkdir(parents=True, exist_ok=True)
    code, events, _ = run_recipe("resnet50", *FAST, "--data", str(recipe_dir / "images"))
    assert code == 1
    assert events[0]["kind"] == "dependency" and "Pillow" in events[0]["message"]


def test_image_folder_is_read(run_recipe, recipe_dir: Path) -> None:
    image = pytest.importorskip("PIL.Image")
    root = recipe_dir / "folder"
    for label, colour in (("red", (255, 0, 0)), ("blue", (0, 0, 255))):
        (root / label).mkdir(parents=True, exist_ok=True)
        for index in range(4):
            image.new("RGB", (40 + index, 36), colour).save(root / label / f"{index}.png")
    data = ("--data", str(root), "--batch-size", "4", "--workers", "1", "--steps", "2")
    code, events, stderr = run_recipe("resnet50", *FAST, *data)
    assert code == 0, stderr
    summary = only_summary(events)
    assert summary["knobs"]["data"] == str(root) and summary["knobs"]["workers"] == 1


def test_a_steady_figure_takes_more_steps_and_keeps_the_step_its_loss_is_read_at(
    run_recipe,
) -> None:
    """--steady-within measures more rounds of --steps until the halves agree (here never: up
    to --max-steps); the loss compared between runs is the one after warm-up and --steps."""
    plain = ("--precision", "fp32", "--steps", "4", "--warmup-steps", "1")
    code, events, stderr = run_recipe("bert", *FAST, *plain)
    assert code == 0, stderr
    once = only_summary(events)
    code, events, stderr = run_recipe(
        "bert", *FAST, *plain, "--steady-within", "1e-9", "--max-steps", "10"
    )
    assert code == 0, stderr
    longer = only_summary(events)
    assert (once["steps"], longer["steps"]) == (4, 10)
    assert longer["loss_after_steps"] == once["loss_after_steps"] == once["loss_last"]
    assert 0 <= longer["spread"] < 2 and once["spread"] is not None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--activation-memory-budget", "0.5"), "is torch.compile's partitioner: add --compile"),
        (("--compile-mode", "reduce-overhead"), "--compile-mode is torch.compile's: add --compile"),
        (("--activation-memory-budget", "0"), "not a share above 0"),
        (("--selective-checkpoint",), "add --checkpoint-every K"),
        (("--offload-optimizer", "--optimizer-in-backward"), "drop --optimizer-in-backward"),
        (("--offload-optimizer", "--accumulate", "2"), "--offload-optimizer steps on every"),
    ],
)
def test_memory_fixes_that_cannot_run_are_usage_errors(
    run_recipe, flags: tuple[str, ...], message: str
) -> None:
    code, events, _ = run_recipe("bert", *FAST, *flags)
    assert code == 2
    assert events[-1]["kind"] == "usage" and message in events[-1]["message"]


def test_the_optimizer_on_the_host_keeps_the_arithmetic(run_recipe) -> None:
    """The same losses as AdamW on the device; the device holds the parameters alone."""
    plain = ("--precision", "fp32", "--steps", "3", "--warmup-steps", "0")
    summaries = []
    for extra in ((), ("--offload-optimizer",), ("--offload-optimizer", "--checkpoint-every", "1")):
        code, events, stderr = run_recipe("bert", *FAST, *plain, *extra)
        assert code == 0, stderr
        summaries.append(only_summary(events))
    stepped, offloaded, checkpointed = summaries
    assert offloaded["loss_last"] == pytest.approx(stepped["loss_last"], rel=1e-5)
    assert checkpointed["loss_last"] == pytest.approx(stepped["loss_last"], rel=1e-5)
    assert offloaded["model_state_mib"] == offloaded["parameters_mib"]
    assert stepped["model_state_mib"] == pytest.approx(3 * stepped["parameters_mib"], rel=0.01)
    assert offloaded["host_state_mib"] >= 4 * offloaded["parameters_mib"]
    assert offloaded["tensor_peak_mib"] < stepped["tensor_peak_mib"]


def test_a_compiled_recipe_takes_the_compilers_fixes(run_recipe) -> None:
    """Compiled (with the partitioner and no generated code), checkpointed selectively, under a
    memory budget: it runs, and says that bert's dropout is recomputed under the budget."""
    flags = ("--tiny", "--device", "cpu", "--compile", "--compile-backend",
             "aot_eager_decomp_partition", "--checkpoint-every", "1", "--selective-checkpoint",
             "--activation-memory-budget", "0.5", "--steps", "2")  # fmt: skip
    code, events, stderr = run_recipe("bert", *flags)
    assert code == 0, stderr
    knobs = only_summary(events)["knobs"]
    assert knobs["compile"] is True and knobs["compile_backend"] == "aot_eager_decomp_partition"
    assert knobs["selective_checkpoint"] is True and knobs["activation_memory_budget"] == 0.5
    assert knobs["budget_recomputes_dropout"] is True
