"""The Prometheus source's rounds: the fast readings every round, each slow one every 30 s
(spread over the rounds, never all in one after the first), only what the console uses."""

from __future__ import annotations

import itertools
import re

import pytest

from gpuconsole.core.clock import ManualClock
from gpuconsole.telemetry import dcgm
from gpuconsole.telemetry.prometheus import (
    FAST_READINGS,
    SLOW_EVERY_SECONDS,
    SLOW_READINGS,
    PrometheusSource,
)

HOST = "n1"
MIB = 1048576


def sample(name: str, value: float, gpu: int = 0) -> dict:
    return {
        "metric": {"__name__": name, "hostname": HOST, "gpu": str(gpu)},
        "value": [0.0, repr(value)],
    }


class Recording:
    """A Prometheus API that records each query and answers with the samples whose names the
    query selects (as Prometheus would)."""

    url = "http://127.0.0.1:9090"

    def __init__(self, samples: list[dict]) -> None:
        self.samples = samples
        self.queries: list[tuple[float, str]] = []

    def query(self, promql: str, at: float) -> list[dict]:
        self.queries.append((at, promql))
        asked = set(re.findall(r"DCGM_FI_[A-Z0-9_]+", promql))
        return [s for s in self.samples if s["metric"]["__name__"] in asked]


def fields_asked(promql: str) -> set[str]:
    names = set(re.findall(r"DCGM_FI_[A-Z0-9_]+", promql))
    return {m.field for m in dcgm.BY_FIELD.values() if names & set(m.names)}


def rounds(source: PrometheusSource, clock: ManualClock, seconds: float, every: float) -> None:
    """Poll as the console does: every ``every`` seconds, each host read once."""
    for _ in range(int(seconds / every)):
        clock.advance(every)
        source.read(HOST)


CURRENT = [
    sample("DCGM_FI_DEV_GPU_UTIL_RATIO", 0.5),
    sample("DCGM_FI_DEV_FB_USED_BYTES", 1000 * MIB),
    sample("DCGM_FI_DEV_FB_FREE_BYTES", 3000 * MIB),
    sample("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 50),
    sample("DCGM_FI_DEV_ROW_REMAP_FAILED", 0),
]


def test_slow_readings_every_30_seconds_spread_over_the_rounds() -> None:
    clock = ManualClock(1000.0)
    api = Recording(CURRENT)
    source = PrometheusSource(api.url, api=api, clock=clock)
    source.read(HOST)
    first = [q for at, q in api.queries if at == 1000.0 and "max by" in q]
    assert len(first) == 1 and fields_asked(first[0]) == set(FAST_READINGS + SLOW_READINGS)
    asked_at: dict[str, list[float]] = {field: [] for field in SLOW_READINGS}
    identity_at = [at for at, q in api.queries if q.startswith("group by")]
    api.queries.clear()
    rounds(source, clock, 180, 5)
    for at, promql in api.queries:
        if promql.startswith("group by"):
            identity_at.append(at)
            continue
        asked = fields_asked(promql)
        assert set(FAST_READINGS) <= asked  # every round
        slow = asked & set(SLOW_READINGS)
        assert len(slow) <= 4, (at, slow)  # never all of them again
        for field in slow:
            asked_at[field].append(at)
    for field, times in asked_at.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert len(times) == 6 and all(gap == SLOW_EVERY_SECONDS for gap in gaps), field
    assert [b - a for a, b in itertools.pairwise(identity_at)] == [30.0] * 6


def test_only_what_the_console_uses_is_asked_for() -> None:
    clock = ManualClock(1000.0)
    api = Recording(CURRENT)
    source = PrometheusSource(api.url, api=api, clock=clock)
    rounds(source, clock, 60, 5)
    asked = set().union(*(fields_asked(q) for _, q in api.queries))
    assert asked == set(FAST_READINGS + SLOW_READINGS)


def test_slow_readings_are_kept_between_their_rounds_and_forgotten_when_gone() -> None:
    clock = ManualClock(1000.0)
    samples = [*CURRENT, sample("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", 700)]
    api = Recording(samples)
    source = PrometheusSource(api.url, api=api, clock=clock)
    gpu = source.read(HOST).gpus[0]
    assert gpu.power_limit_w == 700
    assert gpu.memory_total_mib == 4000  # used + free of one round: no capacity exported
    assert gpu.remap is not None and gpu.remap.failure is False
    samples.pop()  # the limit is no longer exported
    samples[1] = sample("DCGM_FI_DEV_FB_USED_BYTES", 2000 * MIB)
    samples[2] = sample("DCGM_FI_DEV_FB_FREE_BYTES", 2000 * MIB)
    rounds(source, clock, 5, 5)
    gpu = source.read(HOST).gpus[0]
    assert gpu.memory_used_mib == 2000  # fast: this round's
    assert gpu.power_limit_w == 700  # slow: kept until it is read again
    rounds(source, clock, 30, 5)
    gpu = source.read(HOST).gpus[0]
    assert gpu.power_limit_w is None
    assert gpu.memory_total_mib == 4000  # still used + free: 2000 + 2000 when free was read again
    samples.append(sample("DCGM_FI_DEV_FB_CAPACITY_BYTES", 4096 * MIB))
    rounds(source, clock, 30, 5)
    assert source.read(HOST).gpus[0].memory_total_mib == 4096  # the capacity, where exported


@pytest.mark.parametrize(
    ("name", "value", "field", "expected"),
    [
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", 0.25, "utilization_pct", 25.0),
        ("DCGM_FI_DEV_GPU_UTIL", 25, "utilization_pct", 25.0),
        ("DCGM_FI_DEV_FB_USED_BYTES", 80 * MIB, "memory_used_mib", 80.0),
        ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1410e6, "sm_clock_mhz", 1410.0),
        ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 2619e6, "memory_clock_mhz", 2619.0),
        ("DCGM_FI_DEV_BOARD_POWER_WATTS", 312.5, "power_w", 312.5),
        ("DCGM_FI_DEV_MEMORY_UTIL_RATIO", 0.5, "memory_utilization_pct", 50.0),
    ],
)
def test_units_of_both_generations(name: str, value: float, field: str, expected: float) -> None:
    api = Recording([sample("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 40), sample(name, value)])
    gpu = PrometheusSource(api.url, api=api, clock=ManualClock(0.0)).read(HOST).gpus[0]
    assert getattr(gpu, field) == expected


def test_the_enforced_limit_wins_over_the_requested_one_in_any_order() -> None:
    for order in (1, -1):
        limits = [
            sample("DCGM_FI_DEV_POWER_MGMT_LIMIT", 650),
            sample("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", 600),
            sample("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 550),
        ][::order]
        api = Recording([sample("DCGM_FI_DEV_GPU_TEMP", 40), *limits])
        gpu = PrometheusSource(api.url, api=api, clock=ManualClock(0.0)).read(HOST).gpus[0]
        assert gpu.power_limit_w == 550  # the classic name first, then 4.9's, then the requested


def test_an_unchanged_gpu_is_the_same_reading_again() -> None:
    """dcgm-exporter collects every 30 s: most rounds bring the same values, and the GPU's state
    is then the very object of the last round (not built nor vetted again)."""
    clock = ManualClock(1000.0)
    samples = [*CURRENT, sample("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 60, gpu=1)]
    api = Recording(samples)
    source = PrometheusSource(api.url, api=api, clock=clock)
    first = source.read(HOST)
    rounds(source, clock, 5, 5)
    second = source.read(HOST)
    assert second.time > first.time
    assert second.gpus[0] is first.gpus[0] and second.gpus[1] is first.gpus[1]
    samples[3] = sample("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 51)
    rounds(source, clock, 5, 5)
    third = source.read(HOST)
    assert third.gpus[0].temperature_c == 51 and third.gpus[1] is first.gpus[1]


def test_a_gpu_label_out_of_range_is_left_out() -> None:
    api = Recording(
        [
            sample("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 40),
            {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "hostname": HOST, "gpu": float("inf")},
             "value": [0.0, "5"]},
        ]
    )  # fmt: skip
    snapshot = PrometheusSource(api.url, api=api, clock=ManualClock(0.0)).read(HOST)
    assert [gpu.index for gpu in snapshot.gpus] == [0]
