"""The memory doctor's choices, on trial tables written as a run would report them."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gpuconsole.actions.memory.session import DoctorRequest, MemoryReport, _choose
from gpuconsole.actions.memory.trials import (
    Fixes,
    Trial,
    checkpoint_interval,
    combinations,
    default_target_mib,
    first_trials,
    loss_drift,
    next_batch,
    parse_fixes,
    recommend,
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
    while (size := next_batch(fitting, failing, last, target)) is not None:
        probes += 1
        last = measure(size)
        fitting, failing = (size, failing) if fits(size) else (fitting, size)
    truth = max(b for b in range(1, 400) if fits(b))
    assert truth - max(1, truth // 16) <= fitting <= truth
    assert probes <= 8


def test_fix_names_read_back() -> None:
    for fixes in first_trials("bf16"):
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


def test_the_report_shows_reserved_and_allocated_peaks_and_the_model_states_floor() -> None:
    from gpuconsole.actions.memory.output import report_text
    from gpuconsole.actions.memory.session import MemoryReport

    fp32 = replace(TABLE[0], allocated_mib=11_000.0)
    report = MemoryReport("gpu01", "bert", 32, 2_400.0, [fp32, *TABLE[1:]], recommend(TABLE, 2_400))
    lines = report_text(report).splitlines()
    assert lines[1].split()[:3] == ["trial", "peak", "allocated"]
    assert lines[2].split()[:5] == ["fp32", "11.52", "GiB", "10.74", "GiB"]
    assert (
        "model state (parameters and optimizer state): 1.66 GiB, which no activation fix lowers"
        in lines
    )


def test_combinations_add_one_fix_at_a_time_least_intrusive_first() -> None:
    names = [fixes.name for fixes in combinations(CKPT, allocator=True)]
    assert names == [
        "bf16+checkpoint+expandable",
        "bf16+checkpoint+expandable+optimizer-in-backward",
        "bf16+checkpoint+compress-bf16+expandable+optimizer-in-backward",
        "bf16+checkpoint+compress-fp8+expandable+optimizer-in-backward",
    ]
    fp16 = [f.name for f in combinations(replace(CKPT, precision="fp16"), allocator=False)]
    assert fp16 == ["fp16+checkpoint+compress-bf16", "fp16+checkpoint+compress-fp8"]
    assert all(parse_fixes(name) for name in names)
    with pytest.raises(ValueError, match="choose one"):
        parse_fixes("bf16+optimizer-in-backward+micro-batch/2")


def _doctor_choice(measured: dict[str, tuple[float, float, float]], target: float) -> MemoryReport:
    """The doctor's choice after the first trials, a trial being a lookup in ``measured``
    (name: peak MiB, samples/s, loss); the names tried are the report's trials."""
    report = MemoryReport("gpu01", "bert", 32)
    report.trials = [trial(f, *measured[f.name][:2], loss=measured[f.name][2]) for f in
                     first_trials("bf16") if f.name in measured]  # fmt: skip

    async def run(fixes: Fixes, batch: int | None = None, probe: bool = False) -> Trial:
        peak, speed, loss = measured.get(fixes.name, (99_999.0, 1.0, 7.0))
        done = trial(fixes, peak, speed, loss=loss)
        report.trials.append(done)
        return done

    asyncio.run(_choose(report, DoctorRequest("bert", target_gib=target / 1024), run, True))
    return report


# The shape of the H200's figures: nothing alone fits 2,430 MiB; fp8 compression on top of
# checkpointing, stepping in backward and expandable segments does.
LADDER = {
    "fp32": (12_150.0, 137.0, 10.44),
    "bf16": (8_360.0, 800.0, 10.465),
    "bf16+checkpoint": (3_110.0, 560.0, 10.465),
    "bf16+checkpoint+expandable": (2_910.0, 565.0, 10.465),
    "bf16+checkpoint+expandable+optimizer-in-backward": (2_810.0, 565.0, 10.465),
    "bf16+checkpoint+compress-bf16+expandable+optimizer-in-backward": (2_530.0, 560.0, 10.465),
    "bf16+checkpoint+compress-fp8+expandable+optimizer-in-backward": (2_410.0, 558.0, 10.466),
}


def _tried(report: MemoryReport) -> list[str]:
    return [t.fixes.name for t in report.trials if t.fixes.batch_size is None]


def test_when_nothing_fits_fixes_are_combined_until_one_does() -> None:
    report = _doctor_choice(LADDER, 2_430.0)
    # each rung once, in order, up to the first fit; then that set less each earlier addition
    assert _tried(report)[-5:] == [
        *list(LADDER)[-3:],
        "bf16+checkpoint+compress-fp8+expandable",
        "bf16+checkpoint+compress-fp8+optimizer-in-backward",
    ]
    assert report.recommended.fixes.name == list(LADDER)[-1]  # neither leaner set fits
    # a looser target stops the climb at the first rung that fits
    report = _doctor_choice(LADDER, 2_850.0)
    assert _tried(report)[-2:] == [
        "bf16+checkpoint+expandable+optimizer-in-backward",
        "bf16+checkpoint+optimizer-in-backward",
    ]
    assert report.recommended.fixes.name == "bf16+checkpoint+expandable+optimizer-in-backward"


def test_a_fix_the_fitting_set_does_not_need_is_left_out() -> None:
    """fp8 compression saves enough without the step in backward, which costs throughput."""
    measured = {
        **LADDER,
        "bf16+checkpoint+compress-fp8+expandable": (2_420.0, 600.0, 10.466),
        "bf16+checkpoint+compress-fp8+optimizer-in-backward": (2_600.0, 540.0, 10.466),
    }
    report = _doctor_choice(measured, 2_430.0)
    assert report.recommended.fixes.name == "bf16+checkpoint+compress-fp8+expandable"
    # leaner but no faster (within SAME_SPEED): the set with fewer fixes still wins
    measured["bf16+checkpoint+compress-fp8+expandable"] = (2_420.0, 557.0, 10.466)
    report = _doctor_choice(measured, 2_430.0)
    assert report.recommended.fixes.name == "bf16+checkpoint+compress-fp8+expandable"
