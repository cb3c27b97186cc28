"""The recipes' memory knobs, in-process: saved-tensor compression and accounting, checkpointing
every k-th block, and the summary of a recorded allocation history."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuconsole.recipes import HARNESS

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    sys.path.insert(0, str(HARNESS.parent))
    try:
        return importlib.import_module("_recipe_harness")
    finally:
        sys.path.remove(str(HARNESS.parent))


def _mlp(width: int = 256, depth: int = 4) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def _saved_peak(
    harness: ModuleType, compress: str | None, rows: int = 1024
) -> tuple[float, torch.Tensor, float]:
    """Activations of ``rows`` × 256 in fp32."""
    model = _mlp()
    x = torch.randn(rows, 256)
    saved = harness.SavedActivations(compress)
    with saved:
        loss = model(x).square().mean()
    live = saved.live_bytes
    loss.backward()
    gradient = model[0].weight.grad.clone()
    assert saved.live_bytes == 0  # backward let go of everything it kept
    return saved.peak_bytes, gradient, live


def test_saved_activations_are_counted_and_narrowed(harness: ModuleType) -> None:
    plain, exact, live = _saved_peak(harness, None)
    assert plain == live > 0
    # fp32 activations of 1024×256: every Linear and GELU keeps its input, the square its own;
    # the weights Linear saves (transposed views) are references, not counted
    assert plain == 9 * 1024 * 256 * 4
    half, bf16_grad, _ = _saved_peak(harness, "bf16")
    quarter, fp8_grad, _ = _saved_peak(harness, "fp8")
    assert half == pytest.approx(plain / 2, rel=0.05)
    assert quarter == pytest.approx(plain / 4, rel=0.05)
    # narrower activations, nearly the same gradients
    assert torch.allclose(bf16_grad, exact, rtol=0.05, atol=1e-4)
    assert (fp8_grad - exact).norm() / exact.norm() < 0.15
    assert not torch.equal(fp8_grad, exact)
    # tensors under 4,096 elements are not worth a conversion: left as they are
    small, _, _ = _saved_peak(harness, None, rows=8)
    assert _saved_peak(harness, "fp8", rows=8)[0] == small


def test_autocasts_copies_of_weights_are_counted_not_narrowed(harness: ModuleType) -> None:
    """Under autocast a Linear saves bf16 copies of its input and, where that input needs a
    gradient, of its weight: compression narrows the inputs (activations) and keeps the
    weight's copy as it is."""
    torch.manual_seed(0)
    first, second = (torch.nn.Linear(256, 256, bias=False) for _ in range(2))
    saved = harness.SavedActivations("fp8")
    with saved, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = second(first(torch.randn(1024, 256))).float().sum()  # .float, .sum save nothing
    loss.backward()
    assert saved.peak_bytes == 2 * 1024 * 256 * 1 + 256 * 256 * 2


def test_every_kth_block_is_checkpointed(harness: ModuleType) -> None:
    model = _mlp(depth=6)
    linears = [(model, index) for index in range(0, len(model), 2)]  # six blocks
    assert harness.checkpoint_blocks(linears, 2) == 3
    kinds = [type(model[index]).__name__ for _, index in linears]
    assert kinds == ["Checkpointed", "Linear"] * 3
    assert harness.checkpoint_blocks(linears, 0) == 0


def _event(action: str, addr: int, size: int, filename: str, line: int) -> dict[str, object]:
    frames = [{"filename": "/x/torch/nn/modules/linear.py", "line": 125, "name": "forward"}]
    frames.append({"filename": filename, "line": line, "name": "forward"})
    return {"action": action, "addr": addr, "size": size, "frames": frames}


def test_the_allocation_history_names_the_sites_live_at_the_peak(harness: ModuleType) -> None:
    """A trace written in the form `torch.cuda.memory._snapshot()` returns: three allocations
    live together at the peak; one freed before; one allocated after the peak."""
    mib = 2**20
    trace = [
        _event("alloc", 1, 100 * mib, "/h/bert.py", 117),
        _event("free_requested", 1, 100 * mib, "/h/bert.py", 117),
        _event("free_completed", 1, 100 * mib, "/h/bert.py", 117),
        _event("alloc", 2, 300 * mib, "/h/bert.py", 117),
        _event("alloc", 3, 200 * mib, "/h/bert.py", 140),
        {"action": "alloc", "addr": 4, "size": 50 * mib, "frames": []},
        _event("free_completed", 3, 200 * mib, "/h/bert.py", 140),
        _event("alloc", 5, 120 * mib, "/h/bert.py", 150),
    ]
    summary = harness.allocation_sites({"segments": [], "device_traces": [trace]})
    assert summary["peak_mib"] == pytest.approx(550)
    sites = [(s["site"], s["mib"], s["allocations"]) for s in summary["sites"]]
    assert sites == [
        ("bert.py:117 forward", 300, 1),
        ("bert.py:140 forward", 200, 1),
        ("autograd's backward (no Python frame)", 50, 1),
    ]


def _twin_mlps() -> tuple[torch.nn.Sequential, torch.nn.Sequential]:
    first = _mlp(width=64, depth=4)
    second = _mlp(width=64, depth=4)
    second.load_state_dict(first.state_dict())
    return first, second


def _adamw_knobs(in_backward: bool) -> dict[str, object]:
    return {"fused_optimizer": False, "optimizer_in_backward": in_backward}


def test_the_optimizer_stepped_in_backward_takes_the_same_steps(harness: ModuleType) -> None:
    plain_model, model = _twin_mlps()
    plain = harness.make_optimizer(torch.optim.AdamW, plain_model, _adamw_knobs(False), lr=0.01)
    stepping = harness.make_optimizer(torch.optim.AdamW, model, _adamw_knobs(True), lr=0.01)
    assert len(stepping.optimizers) == 4  # one per Linear: GELUs have no parameters
    gradient_bytes = sum(p.numel() * 4 for p in model.parameters())
    for step in range(3):
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(step))
        plain_model(x).square().mean().backward()
        plain.step()
        plain.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        # every block has stepped during backward and let go of its gradients
        assert all(p.grad is None for p in model.parameters())
        stepping.step()
        stepping.zero_grad()
    for mine, theirs in zip(model.parameters(), plain_model.parameters(), strict=True):
        assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-7)
        assert len(stepping.state[mine]) == len(plain.state[theirs])  # step, exp_avg, exp_avg_sq
    # at most one block's gradients at once (each Linear's weight and bias), not the model's
    assert stepping.peak_gradient_bytes == (64 * 64 + 64) * 4 < gradient_bytes
    assert stepping.live_gradient_bytes == 0


def test_a_block_whose_parameters_got_no_gradient_steps_at_the_loops_step(
    harness: ModuleType,
) -> None:
    """Half of the first block unused: its group never completes in backward, and the
    training loop's step finishes it, as a plain optimizer steps what has a gradient."""

    class Branches(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    torch.manual_seed(1)
    model = torch.nn.Sequential(Branches(), torch.nn.Linear(8, 1))
    before = model[0].used.weight.detach().clone()
    stepping = harness.make_optimizer(torch.optim.SGD, model, _adamw_knobs(True), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    assert model[0].used.weight.grad is not None  # waiting for its group
    assert torch.equal(model[0].used.weight.detach(), before)
    stepping.step()
    assert model[0].used.weight.grad is None
    assert not torch.equal(model[0].used.weight.detach(), before)
    assert stepping.live_gradient_bytes == 0


def test_checkpoint_inputs_are_counted_and_narrowed(harness: ModuleType) -> None:
    """A checkpoint keeps its block's input, saved like any activation: the meter sees it, and
    compression narrows it."""

    def peak(compress: str | None) -> int:
        flat = _mlp(width=256, depth=6)
        model = torch.nn.Sequential(*(flat[i : i + 2] for i in range(0, len(flat), 2)))
        harness.checkpoint_blocks([(model, index) for index in range(len(model))], 1)
        x = torch.randn(1024, 256, requires_grad=True)
        saved = harness.SavedActivations(compress)
        with saved:
            loss = model(x * 2).sum()  # neither the product nor the sum saves a tensor
        loss.backward()
        return saved.peak_bytes

    plain = peak(None)
    assert plain == 6 * 1024 * 256 * 4  # the six blocks' inputs, nothing from inside them
    assert peak("bf16") == plain // 2


def test_a_block_whose_input_needs_no_gradient_still_trains_its_parameters(
    harness: ModuleType,
) -> None:
    """The reentrant kind would leave them without gradient; `recompute` takes the other."""
    torch.manual_seed(0)
    block = harness.Checkpointed(torch.nn.Linear(8, 8))
    block(torch.randn(4, 8)).sum().backward()  # the input: data, no gradient wanted
    assert block.inner.weight.grad is not None
    assert block.inner.weight.grad.abs().sum() > 0


@given(
    st.lists(st.floats(1e-4, 10.0), min_size=2, max_size=40),
    st.integers(1, 256),
    st.floats(0.01, 100.0),
)
def test_the_halves_spread_is_a_symmetric_share_that_scale_does_not_change(
    harness: ModuleType, seconds: list[float], batch: int, scale: float
) -> None:
    samples = [batch] * len(seconds)
    spread = harness.halves_spread(seconds, samples)
    assert 0 <= spread < 2
    assert spread == pytest.approx(harness.halves_spread(seconds[::-1], samples))
    scaled = harness.halves_spread([s * scale for s in seconds], samples)
    assert scaled == pytest.approx(spread, abs=1e-9)
    assert harness.halves_spread([seconds[0]] * len(seconds), samples) == pytest.approx(0)


def test_the_halves_spread_compares_the_two_halves(harness: ModuleType) -> None:
    # 10 samples a step: 100/s in the first half, 80/s in the second; the middle step is out
    seconds = [0.1, 0.1, 5.0, 0.125, 0.125]
    assert harness.halves_spread(seconds, [10] * 5) == pytest.approx(20 / 90)
    assert harness.halves_spread([0.1], [10]) is None


def test_more_steps_are_measured_until_the_speed_is_steady(harness: ModuleType) -> None:
    knobs = {"steps": 20, "steady_within": 0.05, "max_steps": None}
    assert harness.more_steps(knobs, 20, 0.04) == 0
    assert harness.more_steps(knobs, 20, 0.08) == 20
    assert harness.more_steps(knobs, 20, None) == 20  # too few steps to say
    assert harness.more_steps(knobs, 70, 0.08) == 10  # up to 4 × --steps
    assert harness.more_steps(knobs, 80, 0.08) == 0
    assert harness.more_steps({**knobs, "max_steps": 30}, 20, 0.08) == 10
    assert harness.more_steps({**knobs, "steady_within": None}, 20, 0.5) == 0


def test_a_memory_budget_of_zero_is_refused(harness: ModuleType) -> None:
    """At 0 torch's partitioner skips its search, and the ban on recomputing random operations
    with it (see `share`)."""
    import argparse

    assert harness.share("0.05") == 0.05 and harness.share("1") == 1.0
    for text in ("0", "-0.1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            harness.share(text)


class _Block(torch.nn.Module):
    """A transformer-like feed-forward block: matmuls with cheap operations between them."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.norm, self.drop = torch.nn.LayerNorm(width), torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.drop(self.down(torch.nn.functional.gelu(self.up(x)))))


def _blocks(dropout: float = 0.0, depth: int = 3, width: int = 64) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(_Block(width, dropout) for _ in range(depth)))


def _saved_and_gradients(
    harness: ModuleType,
    model: torch.nn.Module,
    every: int = 0,
    selective: bool = False,
    backend: str | None = None,
) -> tuple[int, torch.Tensor]:
    harness.checkpoint_blocks([(model, i) for i in range(len(model))], every, selective)
    run = model
    if backend is not None:
        torch._dynamo.reset()
        run = torch.compile(model, backend=backend)
    saved = harness.SavedActivations(None)
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    torch.manual_seed(2)  # the same dropout masks in every run
    with saved:
        loss = run(x * 1.0).square().mean()
    loss.backward()
    saved.release_held()
    assert saved.live_bytes == 0
    gradients = torch.cat([p.grad.flatten() for p in model.parameters()])
    return saved.peak_bytes, gradients


def test_a_selective_checkpoint_keeps_the_matmuls_and_the_gradients(harness: ModuleType) -> None:
    """Kept: each block's input and what its two matmuls made; recomputed: GELU, dropout, the
    addition and the norm. Less than no checkpoint, more than a whole one, the same gradients."""
    none, exact = _saved_and_gradients(harness, _blocks(0.1))
    whole, whole_gradients = _saved_and_gradients(harness, _blocks(0.1), 1)
    selective, selective_gradients = _saved_and_gradients(harness, _blocks(0.1), 1, True)
    assert whole < selective < none
    rows, width = 512, 64
    assert whole == 4 * rows * width * 4  # the three blocks' inputs, and what square keeps
    assert selective == whole + 3 * rows * (4 * width + width) * 4  # + up's and down's outputs
    assert torch.allclose(whole_gradients, exact) and torch.allclose(selective_gradients, exact)


@pytest.mark.parametrize(("every", "selective"), [(1, False), (1, True)])
def test_compiled_checkpoints_recompute_dropout_as_forward_drew_it(
    harness: ModuleType, every: int, selective: bool
) -> None:
    """Under torch.compile (aot_eager_decomp_partition: the partitioner, no generated code) a
    checkpoint, whole or selective, is a region the partitioner recomputes with forward's random
    state: the gradients are those of the compiled model without checkpoints."""
    backend = "aot_eager_decomp_partition"
    plain_saved, exact = _saved_and_gradients(harness, _blocks(0.1), backend=backend)
    saved, gradients = _saved_and_gradients(harness, _blocks(0.1), every, selective, backend)
    assert saved < plain_saved  # the compiled graph's saved tensors pass through the hooks
    assert torch.allclose(gradients, exact, rtol=1e-5, atol=1e-7)


def test_a_memory_budget_saves_activations_and_is_flagged_with_dropout(
    harness: ModuleType,
) -> None:
    """The compiler's budget saves less; without dropout the gradients stay exact, with dropout
    the recipe says it recomputes random operations (pytorch/pytorch#190758)."""
    import torch._functorch.config as functorch_config

    backend = "aot_eager_decomp_partition"
    plain_saved, exact = _saved_and_gradients(harness, _blocks(0.0), backend=backend)
    knobs = {"activation_memory_budget": 0.3, "compile_backend": backend, "compile_mode": None}
    try:
        model = _blocks(0.0)
        torch._dynamo.reset()
        compiled = harness.compiled(model, knobs)
        saved = harness.SavedActivations(None)
        x = torch.randn(512, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        with saved:
            loss = compiled(x * 1.0).square().mean()
        loss.backward()
        gradients = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert saved.peak_bytes < plain_saved
        assert torch.allclose(gradients, exact, rtol=1e-5, atol=1e-7)
        assert knobs["budget_recomputes_dropout"] is False
        harness.compiled(_blocks(0.1), knobs)
        assert knobs["budget_recomputes_dropout"] is True
    finally:
        functorch_config.activation_memory_budget = 1.0


def test_the_optimizer_on_the_host_takes_the_same_steps(harness: ModuleType) -> None:
    """AdamW's state and the master parameters on the host, each block stepped by the worker as
    backward completes it: the same parameters as the plain optimizer, no optimizer state on the
    device, at most one block's gradients at once."""
    plain_model, model = _twin_mlps()
    plain = harness.make_optimizer(torch.optim.AdamW, plain_model, _adamw_knobs(False), lr=0.01)
    knobs = {"fused_optimizer": False, "offload_optimizer": True}
    offloaded = harness.make_optimizer(torch.optim.AdamW, model, knobs, lr=0.01)
    assert isinstance(offloaded, harness.HostOffload) and len(offloaded.optimizers) == 4
    for step in range(3):
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(step))
        plain_model(x).square().mean().backward()
        plain.step()
        plain.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        assert all(p.grad is None for p in model.parameters())  # sent to the host
        offloaded.step()
        offloaded.zero_grad()
    for mine, theirs in zip(model.parameters(), plain_model.parameters(), strict=True):
        assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-7)
    assert offloaded.state == {}
    parameter_bytes = sum(p.numel() * 4 for p in model.parameters())
    # on the host: master parameters, gradient buffers and the two moments
    assert offloaded.host_bytes >= 4 * parameter_bytes
    assert offloaded.peak_gradient_bytes == (64 * 64 + 64) * 4


def test_eight_bit_moments_hold_a_quarter_of_adamws_and_step_as_it_does(
    harness: ModuleType,
) -> None:
    """torchao's AdamW8bit: the moments' bytes fall to about a quarter (8-bit codes and a scale
    per 256), and the steps go where AdamW's go (the quantization moves single weights by up to
    a quarter of a step, not the update's direction)."""
    pytest.importorskip("torchao")
    plain_model, model = _mlp(width=256, depth=2), _mlp(width=256, depth=2)
    model.load_state_dict(plain_model.state_dict())  # weights of 65,536: a map's 1 KiB is small
    plain = harness.make_optimizer(torch.optim.AdamW, plain_model, _adamw_knobs(False), lr=0.01)
    knobs = {"fused_optimizer": True, "optimizer_8bit": True}
    eight = harness.make_optimizer(torch.optim.AdamW, model, knobs, lr=0.01)
    from torchao.optim import AdamW8bit

    assert isinstance(eight, AdamW8bit) and knobs["fused_optimizer"] is False
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    for step in range(3):
        x = torch.randn(16, 256, generator=torch.Generator().manual_seed(step))
        for net, optimizer in ((plain_model, plain), (model, eight)):
            net(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def moments(optimizer: torch.optim.Optimizer) -> int:
        return sum(
            harness.tensor_bytes(state[key])
            for state in optimizer.state.values()
            for key in ("exp_avg", "exp_avg_sq")
        )

    assert moments(eight) < 0.3 * moments(plain)
    mine = torch.cat([p.detach().flatten() for p in model.parameters()]) - start
    theirs = torch.cat([p.detach().flatten() for p in plain_model.parameters()]) - start
    assert torch.nn.functional.cosine_similarity(mine, theirs, dim=0) > 0.99
    assert (mine - theirs).abs().mean() < 0.05 * theirs.abs().mean()


def _step_on_fixed_gradients(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int
) -> None:
    for step in range(steps):
        for index, parameter in enumerate(model.parameters()):
            seed = torch.Generator().manual_seed(1000 * step + index)
            parameter.grad = torch.randn(parameter.shape, generator=seed)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_eight_bit_moments_step_as_torchao_and_adamw_do_with_one_compiled_wrapper(
    harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness's loop gives, bit for bit, torchao's parameters and moments where torchao
    quantizes them (weights of 4,096 elements and more) and torch's multi-tensor AdamW's where
    it keeps them in fp32 (the biases), while torch.compile wraps torchao's update once for all
    parameters and steps (torchao's loop wraps it anew per parameter per step, a host cost that
    bound BERT's step). Each parameter gets the same gradients in all three runs, so that one
    kind's arithmetic does not reach the other through the network."""
    pytest.importorskip("torchao")
    from torchao.optim import AdamW8bit

    torchao_model, adamw_model, mine_model = (_mlp(width=256, depth=2) for _ in range(3))
    adamw_model.load_state_dict(torchao_model.state_dict())
    mine_model.load_state_dict(torchao_model.state_dict())
    torchao_optimizer = AdamW8bit(torchao_model.parameters(), lr=0.01)
    adamw = torch.optim.AdamW(adamw_model.parameters(), lr=0.01, foreach=True)
    _step_on_fixed_gradients(torchao_model, torchao_optimizer, steps=3)
    _step_on_fixed_gradients(adamw_model, adamw, steps=3)
    wraps = []
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **kw: wraps.append(a) or compile_(*a, **kw))
    knobs = {"fused_optimizer": False, "optimizer_8bit": True}
    mine = harness.make_optimizer(torch.optim.AdamW, mine_model, knobs, lr=0.01)
    _step_on_fixed_gradients(mine_model, mine, steps=3)
    assert len(wraps) == 1
    kinds = []
    for theirs, own, ours in zip(
        torchao_model.parameters(), adamw_model.parameters(), mine_model.parameters(), strict=True
    ):
        quantized = theirs.numel() >= 4096
        kinds.append(quantized)
        expected, state = (theirs, torchao_optimizer.state) if quantized else (own, adamw.state)
        assert torch.equal(expected, ours)
        for key in ("exp_avg", "exp_avg_sq"):
            wanted, got = state[expected][key], mine.state[ours][key]
            if quantized:
                wanted, got = wanted.dequantize(), got.dequantize()
            assert type(got) is torch.Tensor and torch.equal(wanted, got)
        assert float(mine.state[ours]["step"]) == 3
    assert set(kinds) == {True, False}  # both kinds were stepped


def test_eight_bit_moments_keep_torchaos_own_loop_where_its_layout_differs(
    harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torchao without the update function the harness's loop calls: its own optimizer,
    slower on the host but right."""
    adam = pytest.importorskip("torchao.optim.adam")
    monkeypatch.delattr(adam, "single_param_adam")
    knobs = {"fused_optimizer": False, "optimizer_8bit": True}
    optimizer = harness.make_optimizer(torch.optim.AdamW, _mlp(width=8, depth=1), knobs, lr=0.1)
    assert type(optimizer) is adam.AdamW8bit


def test_eight_bit_moments_are_adamws_alone_and_need_torchao(
    harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _mlp(width=8, depth=1)
    knobs = {"fused_optimizer": False, "optimizer_8bit": True}
    with pytest.raises(harness.RecipeError, match="this recipe steps SGD") as refused:
        harness.make_optimizer(torch.optim.SGD, model, knobs, lr=0.1)
    assert refused.value.kind == "usage"
    monkeypatch.setitem(sys.modules, "torchao.optim", None)  # as if torchao were not installed
    with pytest.raises(harness.RecipeError, match="needs torchao") as missing:
        harness.make_optimizer(torch.optim.AdamW, model, knobs, lr=0.1)
    assert missing.value.kind == "dependency"
