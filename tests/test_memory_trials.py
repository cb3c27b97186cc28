"""The memory doctor's choices, on trial tables written as a run would report them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuconsole.actions.memory.session import DoctorRequest, MemoryReport, _choose, _largest_batch
from gpuconsole.actions.memory.trials import (
    ADAMW_RECIPES,
    PROBE,
    TRIAL,
    UNSOUND_BUDGET,
    Fixes,
    Trial,
    agreement,
    batch_granule,
    budget_for_target,
    checkpoint_interval,
    climb_base,
    combinations,
    default_target_mib,
    first_trials,
    loss_drift,
    memory_parts,
    next_batch,
    parse_fix_list,
    parse_fixes,
    peak_inversions,
    recommend,
    what_stops,
)

FP32 = Fixes()
BF16 = Fixes(precision="bf16")
CKPT = replace(BF16, checkpoint_every=1)


def trial(fixes: Fixes, peak: float, speed: float, loss: float = 7.0, **kw: float) -> Trial:
    return Trial(fixes, peak, peak, speed, loss, "CUDA allocator: peak reserved", **kw)


# Shaped like BERT-base at sequence 512, batch 32 (GiB as MiB): fp32 large, bf16 about 2/3,
# checkpointing every block leaves the model state and one block's recompute.
TABLE = [
    trial(FP32, 11_800, 310.0, device_memory_mib=143_771.0, state_mib=1_700.0),
    trial(BF16, 7_900, 1_000.0),
    trial(CKPT, 2_000, 760.0),
    trial(Fixes(compress="bf16"), 7_400, 290.0, loss=7.002),
    trial(replace(BF16, compress="fp8"), 4_800, 800.0, loss=7.3),  # drifts 4 %: not chosen
    trial(replace(BF16, expandable=True), 7_700, 1_000.0),
    trial(replace(BF16, micro_batches=2), 4_900, 900.0),
    trial(replace(CKPT, expandable=True), 1_950, 755.0),
]


def test_the_cheapest_set_under_the_target_wins() -> None:
    assert recommend(TABLE, 2_400).fixes == CKPT  # expandable is as fast: fewer fixes win
    assert recommend(TABLE, 5_000).fixes == replace(BF16, micro_batches=2)
    # bf16 and bf16+expandable are equally fast: the plain one
    assert recommend(TABLE, 100_000).fixes == BF16
    assert recommend(TABLE, 1_000) is None


def test_a_compression_that_moves_the_loss_is_not_recommended() -> None:
    fp8 = TABLE[4]
    assert loss_drift(fp8, TABLE) == pytest.approx(0.3 / 7.0)
    assert loss_drift(TABLE[3], TABLE) == pytest.approx(0.002 / 7.0)
    assert recommend(TABLE, 4_850).fixes == CKPT  # the faster fp8 run drifts


def test_the_default_target_is_the_card_less_a_fifth() -> None:
    assert default_target_mib(TABLE) == pytest.approx(143_771.0 * 0.8)
    assert default_target_mib(TABLE[1:]) is None  # no trial knew the card


def test_the_checkpoint_interval_is_the_sparsest_that_fits() -> None:
    plain, every = TABLE[1], TABLE[2]  # 7,900 and 2,000 MiB
    assert checkpoint_interval(plain, every, 5_000) == 2  # 2,000 + 5,900 × (1 - 1/2) = 4,950
    assert checkpoint_interval(plain, every, 6_000) == 3  # 2,000 + 5,900 × 2/3 = 5,933
    assert checkpoint_interval(plain, every, 3_000) is None  # only every block fits
    assert checkpoint_interval(plain, every, 9_000) is None  # no checkpointing needed
    assert checkpoint_interval(plain, every, 1_000) is None  # nothing fits


@pytest.mark.parametrize("target", [3_000.0, 16_384.0, 40_000.0])
def test_the_batch_search_finds_the_largest_batch_that_fits(target: float) -> None:
    """Against a job whose peak is model state plus activations linear in the batch, with a
    little curvature so that the first linear guess is not exact."""

    def measure(batch: int) -> Trial:
        peak = 1_700 + 190 * batch + 0.4 * batch**2
        return replace(TABLE[1], peak_mib=peak, state_mib=1_700.0)

    def fits(batch: int) -> bool:
        return measure(batch).peak_mib <= target

    fitting, failing, last, probes = 32, None, measure(32), 0
    if not fits(32):
        fitting, failing = 0, 32
    while (size := next_batch(fitting, failing, last, target, 8)) is not None:
        probes += 1
        last = measure(size)
        fitting, failing = (size, failing) if fits(size) else (fitting, size)
    truth = max(b for b in range(1, 400) if fits(b))
    assert truth - max(8, truth // 16) <= fitting <= truth
    assert probes <= 8


def test_fix_names_read_back() -> None:
    for fixes in first_trials("bf16", compiled=True):
        assert parse_fixes(fixes.name) == fixes
    assert parse_fixes("fp16+checkpoint/3+micro-batch/4") == Fixes(
        precision="fp16", checkpoint_every=3, micro_batches=4
    )
    with pytest.raises(ValueError, match="unknown fix 'zero3'"):
        parse_fixes("bf16+zero3")


def test_micro_batches_split_the_batch_and_accumulate() -> None:
    args = replace(BF16, micro_batches=4).arguments(32)
    assert args[args.index("--batch-size") + 1] == "8"
    assert args[args.index("--accumulate") + 1] == "4"


def test_the_report_shows_peaks_speeds_and_where_the_memory_goes() -> None:
    from gpuconsole.actions.memory.output import report_text

    fp32 = replace(TABLE[0], allocated_mib=11_000.0, compiled=True, spread=0.012)
    smallest = replace(TABLE[-1], state_mib=1_248.0, parameters_mib=416.0, compiled=True)
    trials = [fp32, *TABLE[1:-1], smallest]
    report = MemoryReport("gpu01", "bert", 32, 1_900.0, trials, recommend(trials, 1_900.0))
    lines = report_text(report).splitlines()
    assert lines[1].split()[:4] == ["trial", "mode", "peak", "allocated"]
    assert lines[2].split()[:7] == ["fp32", "compiled", "11.52", "GiB", "10.74", "GiB", "+0%"]
    assert "1.2%" in lines[2].split()  # the halves of its measured steps
    assert "recommended: nothing tried fits the target (shard the model: FSDP, ZeRO)" in lines
    where = lines.index("where the memory goes at the smallest peak, bf16+checkpoint+expandable "
                        "(1.90 GiB):")  # fmt: skip
    assert [line.split()[:3] for line in lines[where + 1 : where + 4]] == [
        ["parameters", "416.0", "MiB"],
        ["optimizer", "state", "832.0"],
        ["everything", "else", "702.0"],
    ]
    assert lines[where + 4].startswith("  over the target by 50.0 MiB: activations and the rest")


def test_what_keeps_a_peak_over_the_target() -> None:
    parts = memory_parts(trial(CKPT, 2_000.0, 500.0, state_mib=1_200.0, parameters_mib=400.0))
    assert (parts.optimizer_mib, parts.rest_mib) == (800.0, 800.0)
    assert what_stops(parts, 2_000.0) is None
    assert what_stops(parts, 1_500.0) == "the rest"
    assert what_stops(parts, 1_100.0) == "model state"
    assert what_stops(parts, 300.0) == "parameters"
    # the optimizer on the host: the device holds the parameters alone
    offloaded = replace(CKPT, offload_optimizer=True)
    parts = memory_parts(trial(offloaded, 1_300.0, 300.0, state_mib=400.0, parameters_mib=400.0))
    assert parts.optimizer_mib == 0.0 and what_stops(parts, 1_000.0) == "the rest"


def test_combinations_add_one_fix_at_a_time_least_intrusive_first() -> None:
    names = [fixes.name for fixes in combinations(CKPT, allocator=True)]
    assert names == [
        "bf16+checkpoint+expandable",
        "bf16+checkpoint+expandable+optimizer-in-backward",
        "bf16+checkpoint+expandable+optimizer-offload",
        "bf16+checkpoint+compress-bf16+expandable+optimizer-offload",
        "bf16+checkpoint+compress-fp8+expandable+optimizer-offload",
    ]
    fp16 = [f.name for f in combinations(replace(CKPT, precision="fp16"), allocator=False)]
    assert fp16 == ["fp16+checkpoint+compress-bf16", "fp16+checkpoint+compress-fp8"]
    assert all(parse_fixes(name) for name in names)
    with pytest.raises(ValueError, match="choose one"):
        parse_fixes("bf16+optimizer-in-backward+micro-batch/2")


def _doctor_choice(
    measured: dict[str, tuple[float, float, float]],
    target: float,
    compiled: bool = True,
    graphs: bool = False,
) -> MemoryReport:
    """The doctor's choice after the first trials, a trial being a lookup in ``measured``
    (name: peak MiB, samples/s, loss); the names tried are the report's trials. A set not in
    ``measured`` takes more than any card. With ``graphs`` the doctor knows the job compiled on
    CUDA, and tries CUDA graphs."""
    report = MemoryReport("gpu01", "bert", 32)
    report.trials = [trial(f, *measured[f.name][:2], loss=measured[f.name][2]) for f in
                     first_trials("bf16", compiled) if f.name in measured]  # fmt: skip

    async def run(fixes: Fixes, batch: int | None = None, role: str = TRIAL) -> Trial:
        peak, speed, loss = measured.get(fixes.name, (99_999.0, 1.0, 7.0))
        done = replace(trial(fixes, peak, speed, loss=loss), role=role)
        report.trials.append(done)
        return done

    request = DoctorRequest("bert", target_gib=target / 1024)
    asyncio.run(_choose(report, request, run, True, compiled=compiled and graphs))
    return report


# The shape of the H200's eager figures: nothing alone fits 2,430 MiB; the optimizer's state on
# the host on top of checkpointing and expandable segments does, but slowly; fp8 compression
# on top of that fits 1,750 MiB.
LADDER = {
    "fp32": (12_150.0, 137.0, 10.44),
    "bf16": (8_360.0, 800.0, 10.465),
    "bf16+checkpoint": (3_110.0, 560.0, 10.465),
    "bf16+checkpoint+expandable": (2_910.0, 565.0, 10.465),
    "bf16+checkpoint+expandable+optimizer-in-backward": (2_810.0, 555.0, 10.465),
    "bf16+checkpoint+expandable+optimizer-offload": (2_000.0, 300.0, 10.465),
    "bf16+checkpoint+compress-bf16+expandable+optimizer-offload": (1_800.0, 250.0, 10.465),
    "bf16+checkpoint+compress-fp8+expandable+optimizer-offload": (1_700.0, 240.0, 10.466),
}


def _tried(report: MemoryReport) -> list[str]:
    return [t.fixes.name for t in report.trials if t.fixes.batch_size is None]


def test_when_nothing_fits_fixes_are_combined_until_one_does() -> None:
    report = _doctor_choice(LADDER, 1_750.0)
    # each rung once, in order, up to the first fit; then that set less each earlier addition
    assert _tried(report)[-7:] == [
        *list(LADDER)[-4:],
        "bf16+checkpoint+compress-fp8+expandable+optimizer-in-backward",
        "bf16+checkpoint+compress-fp8+expandable",
        "bf16+checkpoint+compress-fp8+optimizer-offload",
    ]
    assert report.recommended.fixes.name == list(LADDER)[-1]  # no leaner set fits
    # a looser target stops the climb at the first rung that fits; the leaner sets already
    # tried (the rungs below it) are not tried again
    report = _doctor_choice(LADDER, 2_430.0)
    assert _tried(report)[-2:] == [
        "bf16+checkpoint+expandable+optimizer-offload",
        "bf16+checkpoint+optimizer-offload",
    ]
    assert report.recommended.fixes.name == "bf16+checkpoint+expandable+optimizer-offload"


def test_a_fix_the_fitting_set_does_not_need_is_left_out() -> None:
    """fp8 compression saves enough with the optimizer stepped in backward on the device, which
    costs far less throughput than stepping on the host."""
    measured = {
        **LADDER,
        "bf16+checkpoint+compress-fp8+expandable+optimizer-in-backward": (1_740.0, 420.0, 10.466),
        "bf16+checkpoint+compress-fp8+expandable": (1_900.0, 430.0, 10.466),
    }
    report = _doctor_choice(measured, 1_750.0)
    assert report.recommended.fixes.name == (
        "bf16+checkpoint+compress-fp8+expandable+optimizer-in-backward"
    )
    # leaner but no faster (within SAME_SPEED): the set with fewer fixes still wins
    measured["bf16+checkpoint+compress-fp8+expandable"] = (1_745.0, 415.0, 10.466)
    report = _doctor_choice(measured, 1_750.0)
    assert report.recommended.fixes.name == "bf16+checkpoint+compress-fp8+expandable"


def test_the_climb_starts_from_the_smallest_sound_activation_fix() -> None:
    """A memory budget that left less than checkpointing is where the climb starts, and it adds
    no compression (the budget is the compiler's, compression runs eagerly); a budget whose
    gradients are wrong is never a base."""
    budget = replace(BF16, memory_budget=0.5)
    measured = {**LADDER, budget.name: (2_950.0, 700.0, 10.465)}
    report = _doctor_choice(measured, 1_750.0)
    climbed = [name for name in _tried(report) if "memory-budget/0.5+" in name]
    assert climbed == [
        "bf16+memory-budget/0.5+expandable",
        "bf16+memory-budget/0.5+expandable+optimizer-8bit",
        "bf16+memory-budget/0.5+expandable+optimizer-in-backward",
        "bf16+memory-budget/0.5+expandable+optimizer-offload",
    ]
    # the same runs, the budget's gradients wrong (dropout recomputed): checkpointing is the base
    report = MemoryReport("gpu01", "bert", 32)
    report.trials = [
        trial(Fixes(), 12_150.0, 137.0),
        replace(trial(budget, 2_950.0, 700.0), unsound=UNSOUND_BUDGET),
        trial(CKPT, 3_110.0, 560.0),
    ]
    assert climb_base(report.trials, "bf16").fixes == CKPT
    assert recommend(report.trials, 3_000.0) is None  # the budget fits but is unsound


def test_the_fixes_that_work_with_the_compiler_read_back_and_become_flags() -> None:
    fixes = parse_fixes("bf16+selective-checkpoint/2+memory-budget/0.25+optimizer-offload")
    assert fixes == Fixes(
        precision="bf16",
        checkpoint_every=2,
        selective=True,
        memory_budget=0.25,
        offload_optimizer=True,
    )
    assert parse_fixes(fixes.name) == fixes and fixes.count == 4
    args = fixes.arguments(32)
    assert args[args.index("--checkpoint-every") + 1] == "2"
    assert "--selective-checkpoint" in args and "--offload-optimizer" in args
    assert args[args.index("--activation-memory-budget") + 1] == "0.25"
    assert "--no-compile" not in args  # the preset decides: the job as it runs
    # compression runs eagerly, whatever the preset
    assert parse_fixes("bf16+compress-fp8").arguments(32)[-2:] == [
        "--no-compile",
        "--no-expandable-segments",
    ]
    assert parse_fix_list(" bf16, bf16+checkpoint ,") == (BF16, CKPT)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("bf16+memory-budget/0", "unknown fix 'memory-budget/0'"),  # 0 is refused
        ("bf16+memory-budget/1", "unknown fix 'memory-budget/1'"),  # 1 is no budget
        ("bf16+optimizer-offload+optimizer-in-backward", "already steps each block"),
        ("bf16+optimizer-offload+micro-batch/2", "optimizer-offload steps at every backward"),
        ("bf16+memory-budget/0.5+compress-fp8", "compression runs eagerly"),
        ("bf16+optimizer-offload+optimizer-8bit", "narrows it on the GPU"),
    ],
)
def test_sets_that_cannot_run_are_refused_by_name(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fixes(name)


def test_the_first_trials_follow_the_job() -> None:
    compiled = [f.name for f in first_trials("bf16", compiled=True, allocator=True)]
    assert compiled[:5] == [
        "fp32", "bf16", "bf16+checkpoint", "bf16+selective-checkpoint", "bf16+memory-budget/0.5",
    ]  # fmt: skip
    assert {"bf16+optimizer-offload", "bf16+optimizer-in-backward"} <= set(compiled)
    eager = [f.name for f in first_trials("bf16", compiled=False, allocator=False)]
    assert not any("memory-budget" in n or "expandable" in n for n in eager)
    fp16 = [f.name for f in first_trials("fp16", compiled=True)]
    assert not any("optimizer" in n for n in fp16)  # no step in backward with loss scaling


def test_the_budget_for_the_target_is_read_off_the_line_through_two_runs() -> None:
    plain = trial(BF16, 8_000.0, 1_000.0)
    half = trial(replace(BF16, memory_budget=0.5), 6_000.0, 950.0)
    # 6,000 + (5,000 - 6,000) / (8,000 - 6,000) × ... below 0.5: 0.25
    assert budget_for_target(plain, half, 5_000.0) == 0.25
    assert budget_for_target(plain, half, 7_000.0) == 0.75
    assert budget_for_target(plain, half, 6_050.0) is None  # rounds down to 0.5: tried
    assert budget_for_target(plain, half, 9_000.0) is None  # no budget needed
    assert budget_for_target(plain, half, 100.0) == 0.05  # never below the grid
    assert budget_for_target(plain, replace(half, peak_mib=8_100.0), 5_000.0) is None


def _search(peak: Callable[[int], float], batch: int, target: float, probes: int) -> tuple:
    """The session's batch search against a job whose peak at batch b is ``peak(b)``: the
    largest batch it found, and the batches it ran, in order."""
    ran: list[tuple[int, str]] = []

    def measured(fixes: Fixes, size: int) -> Trial:
        return replace(trial(fixes, peak(size), 100.0), state_mib=peak(0))

    async def run(fixes: Fixes, size: int | None = None, role: str = TRIAL) -> Trial:
        ran.append((size, role))
        return replace(measured(fixes, size), role=role)

    base = measured(BF16, batch)
    found = asyncio.run(_largest_batch(base, batch, target, run, probes))
    return found, ran


@settings(max_examples=200, deadline=None)
@given(
    state=st.floats(0, 4_000),
    per_sample=st.floats(1, 400),
    curvature=st.floats(0, 2),
    batch=st.sampled_from([1, 5, 8, 12, 16, 32, 64]),
    room=st.floats(0.5, 600),
)
def test_the_batch_search_is_monotone_and_finds_the_largest_batch(
    state: float, per_sample: float, curvature: float, batch: int, room: float
) -> None:
    """For any job whose peak rises with the batch: every batch probed lies between the largest
    known to fit and the smallest known not to, in multiples of 8 for a job whose batch is one
    (once at least 8 fits), and the search ends within a sixteenth of the true largest batch."""

    def peak(size: int) -> float:
        return state + per_sample * size + curvature * size**2

    target = state + per_sample * room
    found, ran = _search(peak, batch, target, probes=24)
    probes = [size for size, role in ran if role == PROBE]
    granule = batch_granule(batch)
    fitting, failing = (batch, None) if peak(batch) <= target else (0, batch)
    for size in probes:
        assert size > fitting and (failing is None or size < failing)
        assert fitting < granule or size % granule == 0
        fitting, failing = (size, failing) if peak(size) <= target else (fitting, size)
    truth = max((b for b in range(1, 700) if peak(b) <= target), default=0)
    if truth == 0:
        assert found is None
        return
    largest = found.fixes.batch_size or batch
    assert peak(largest) <= target
    assert truth - max(granule, truth // 16) <= largest <= truth
    if largest != batch:  # the largest found is measured again, as a trial, for its speed
        assert ran[-1] == (largest, TRIAL) and found.role == TRIAL


def test_a_search_stops_at_its_probe_budget() -> None:
    found, ran = _search(lambda b: 100.0 + b, 8, 10_000.0, probes=2)
    # the linear guess (9,600: 97 % of the room) fits, the next an eighth above does not
    assert ran == [(9_600, PROBE), (10_800, PROBE), (9_600, TRIAL)]
    assert found.fixes.batch_size == 9_600


@given(st.lists(st.tuples(st.integers(1, 512), st.floats(0, 1e6)), max_size=12))
def test_peak_inversions_name_every_fall_and_nothing_else(points: list) -> None:
    inversions = peak_inversions(points)
    peaks: dict[int, list[float]] = {}
    for batch, peak in points:
        peaks.setdefault(batch, []).append(peak)
    for smaller, larger in inversions:
        assert smaller < larger
        assert min(peaks[larger]) < max(peaks[smaller])
    by_batch = [max(peaks[b]) for b in sorted(peaks)]
    lowest = [min(peaks[b]) for b in sorted(peaks)]
    rising = all(lowest[i] >= max(by_batch[:i]) for i in range(1, len(by_batch)))
    assert (not inversions) == rising


@given(st.lists(st.floats(0, 1e6), max_size=12))
def test_peaks_that_rise_with_the_batch_have_no_inversion(peaks: list) -> None:
    assert peak_inversions(list(enumerate(sorted(peaks), 1))) == []


@given(st.floats(1, 1e4), st.floats(1, 1e4))
def test_two_runs_agree_by_their_gap_over_their_mean(a: float, b: float) -> None:
    gap = agreement(trial(BF16, 1.0, a), trial(BF16, 1.0, b))
    assert gap == pytest.approx(agreement(trial(BF16, 1.0, b), trial(BF16, 1.0, a)))
    assert 0 <= gap < 2 and (gap == 0) == (a == b)
    assert agreement(trial(BF16, 1.0, a), Trial(BF16, error="oom")) is None


# --- AdamW's moments in 8 bits ---------------------------------------------------------------


def test_eight_bit_moments_are_a_rung_after_expandable_segments_where_the_optimizer_is_adamw() -> (
    None
):
    eight = "bf16+checkpoint+expandable+optimizer-8bit"
    names = [f.name for f in combinations(CKPT, allocator=True, adamw=True)]
    assert names[:3] == ["bf16+checkpoint+expandable", eight, names[2]]
    assert "optimizer-8bit" not in names[2]  # the rungs after it go back to AdamW's own
    assert eight not in [f.name for f in combinations(CKPT, allocator=True)]  # SGD recipes
    fixes = parse_fixes(eight)
    assert fixes.optimizer_8bit and fixes.name == eight and fixes.count == 4
    assert "--optimizer-8bit" in fixes.arguments(32)
    assert "--optimizer-8bit" not in replace(fixes, optimizer_8bit=False).arguments(32)


def test_eight_bit_moments_are_recommended_only_with_the_loss_of_the_set_without_them() -> None:
    base = replace(CKPT, expandable=True)
    eight = replace(base, optimizer_8bit=True)
    offload = replace(base, offload_optimizer=True)
    table = [trial(base, 2_900, 760.0, loss=10.46), trial(offload, 2_000, 300.0, loss=10.46)]
    close = [*table, trial(eight, 2_300, 720.0, loss=10.461)]
    assert loss_drift(close[-1], close) == pytest.approx(0.001 / 10.46)
    assert recommend(close, 2_400).fixes == eight  # fits, and faster than the host's step
    drifting = [*table, trial(eight, 2_300, 720.0, loss=10.7)]
    assert recommend(drifting, 2_400).fixes == offload


def test_the_doctor_climbs_to_eight_bit_moments_and_stops_there_when_they_fit() -> None:
    measured = {**LADDER, "bf16+checkpoint+expandable+optimizer-8bit": (2_300.0, 720.0, 10.465)}
    report = _doctor_choice(measured, 2_430.0)
    assert _tried(report)[-3:] == [
        "bf16+checkpoint+expandable",
        "bf16+checkpoint+expandable+optimizer-8bit",
        "bf16+checkpoint+optimizer-8bit",  # the earlier addition left out, as for every fit
    ]
    assert report.recommended.fixes.name == "bf16+checkpoint+expandable+optimizer-8bit"


def test_the_adamw_recipes_are_those_whose_source_steps_adamw() -> None:
    from pathlib import Path

    import gpuconsole.recipes

    folder = Path(gpuconsole.recipes.__file__).parent
    stepping = {
        path.stem
        for path in folder.glob("*.py")
        if "make_optimizer(torch.optim.AdamW" in path.read_text().replace("\n", "")
    }
    assert stepping == ADAMW_RECIPES


# --- CUDA graphs -------------------------------------------------------------------------------


def test_cuda_graphs_are_the_compilers_reduce_overhead_mode_and_not_with_compression() -> None:
    fixes = parse_fixes("bf16+checkpoint+expandable+optimizer-8bit+cuda-graphs")
    assert fixes.cuda_graphs and fixes.count == 5
    assert fixes.name == "bf16+checkpoint+expandable+optimizer-8bit+cuda-graphs"
    arguments = fixes.arguments(32)
    assert arguments[arguments.index("--compile-mode") + 1] == "reduce-overhead"
    assert "--compile-mode" not in replace(fixes, cuda_graphs=False).arguments(32)
    with pytest.raises(ValueError, match="compression runs eagerly: choose one"):
        parse_fixes("bf16+compress-fp8+cuda-graphs")


# The H100's shape: checkpointing with 8-bit moments fits 2,430 MiB but the host holds its step
# back; CUDA graphs take a little more memory.
FITS_SLOWLY = {
    **LADDER,
    "bf16+checkpoint+expandable+optimizer-8bit": (2_300.0, 560.0, 10.465),
    "bf16+checkpoint+optimizer-8bit": (2_590.0, 660.0, 10.465),
}
EIGHT = "bf16+checkpoint+expandable+optimizer-8bit"


@pytest.mark.parametrize(
    ("graphs", "recommended"),
    [
        ((2_350.0, 760.0, 10.465), EIGHT + "+cuda-graphs"),  # fits and is faster: taken
        ((2_350.0, 565.0, 10.465), EIGHT),  # within SAME_SPEED: the set with fewer fixes
        ((2_500.0, 760.0, 10.465), EIGHT),  # faster but over the target
    ],
    ids=["faster", "same-speed", "too-big"],
)
def test_where_the_job_compiles_on_cuda_the_recommended_set_is_tried_with_cuda_graphs(
    graphs: tuple[float, float, float], recommended: str
) -> None:
    report = _doctor_choice({**FITS_SLOWLY, EIGHT + "+cuda-graphs": graphs}, 2_430.0, graphs=True)
    assert _tried(report)[-1] == EIGHT + "+cuda-graphs"  # once, after the climb
    assert _tried(report).count(EIGHT + "+cuda-graphs") == 1
    assert report.recommended.fixes.name == recommended


def test_cuda_graphs_are_not_tried_on_an_eager_job_or_with_compression() -> None:
    eager = _doctor_choice(FITS_SLOWLY, 2_430.0, compiled=False, graphs=True)
    assert not any("cuda-graphs" in name for name in _tried(eager))
    compressed = {**LADDER, "bf16+checkpoint+compress-bf16+expandable+optimizer-offload": (
        1_700.0, 250.0, 10.465)}  # fmt: skip
    report = _doctor_choice(compressed, 1_750.0, graphs=True)
    assert report.recommended.fixes.compress == "bf16"
    assert not any("cuda-graphs" in name for name in _tried(report))
