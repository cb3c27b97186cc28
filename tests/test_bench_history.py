"""Bench history: SQLite round trips, filters, a corrupt file left alone, and regression flags."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpuconsole.bench.history import (
    BenchHistory,
    BenchResult,
    HistoryError,
    judge,
)
from gpuconsole.bench.output import history_json, history_text
from gpuconsole.core import paths

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC

SUMMARY_LINE = (
    '{"event":"summary","recipe":"resnet50","preset":"tuned",'
    '"knobs":{"precision":"bf16","channels_last":true,"compile":true,"batch_size":256},'
    '"samples_per_s":7123.4,"peak_memory_mib":34567.0,"steps":100,"world_size":1,'
    '"device_name":"NVIDIA H200","torch":"2.11.0+cu130","loss_first":6.9,"loss_last":6.1}'
)


def run(
    rate: float | None,
    *,
    host: str = "gpu01",
    time: float = T0,
    gpu: str | None = "NVIDIA H200",
    recipe: str = "resnet50",
    preset: str = "tuned",
    world_size: int = 1,
    status: str = "ok",
    message: str | None = None,
) -> BenchResult:
    return BenchResult(
        time=time,
        host=host,
        gpu_model=gpu,
        driver="570.133.20",
        torch="2.11.0+cu130",
        recipe=recipe,
        preset=preset,
        knobs={"precision": "bf16", "compile": True},
        samples_per_s=rate,
        peak_memory_mib=None if rate is None else 34_567.0,
        world_size=world_size,
        status=status,  # type: ignore[arg-type]
        message=message,
    )


def comparison(result: BenchResult, history: list[BenchResult], kind: str):
    (found,) = [c for c in judge(result, history).comparisons if c.kind == kind]
    return found


# --- storage -----------------------------------------------------------------------------------


def test_record_and_read_back_keeps_every_field(tmp_path: Path) -> None:
    history = BenchHistory(tmp_path / "bench.sqlite")
    original = replace(run(7123.4), knobs={"b": [1, 2], "a": {"nested": None}, "c": 0.5})

    stored = history.record(original)

    assert stored.run_id is not None
    assert history.runs() == [stored]
    assert replace(stored, run_id=None) == original


def test_knobs_are_stored_as_canonical_json(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "bench.sqlite"
    BenchHistory(path).record(replace(run(1.0), knobs={"z": 1, "a": True}))

    with sqlite3.connect(path) as db:
        (knobs,) = db.execute("SELECT knobs FROM runs").fetchone()
    assert knobs == '{"a":true,"z":1}'


def test_schema_version_and_wal_mode_are_set_on_first_use(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "bench.sqlite"
    BenchHistory(path).runs()

    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (1,)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_runs_are_newest_first_and_filtered(tmp_path: Path) -> None:
    history = BenchHistory(tmp_path / "bench.sqlite")
    for i, (host, recipe, preset) in enumerate(
        [
            ("gpu01", "resnet50", "tuned"),
            ("gpu02", "resnet50", "tuned"),
            ("gpu01", "bert", "tuned"),
            ("gpu01", "resnet50", "baseline"),
        ]
    ):
        history.record(run(1000.0 + i, host=host, recipe=recipe, preset=preset, time=T0 + i))

    assert [r.samples_per_s for r in history.runs()] == [1003.0, 1002.0, 1001.0, 1000.0]
    assert [r.samples_per_s for r in history.runs(host="gpu01")] == [1003.0, 1002.0, 1000.0]
    assert [r.samples_per_s for r in history.runs(recipe="resnet50")] == [1003.0, 1001.0, 1000.0]
    assert [r.samples_per_s for r in history.runs(host="gpu01", preset="tuned")] == [
        1002.0,
        1000.0,
    ]
    assert [r.samples_per_s for r in history.runs(limit=2)] == [1003.0, 1002.0]


def test_default_path_is_in_the_xdg_data_dir(tmp_path: Path) -> None:
    BenchHistory().record(run(1.0))

    assert (tmp_path / "xdg_data_home" / "gpuconsole" / "bench.sqlite").is_file()


def test_environment_variable_overrides_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "elsewhere" / "mine.sqlite"
    monkeypatch.setenv(paths.BENCH_DB.variable, str(path))

    BenchHistory().record(run(1.0))

    assert path.is_file()
    assert len(BenchHistory(path).runs()) == 1
    assert not (tmp_path / "xdg_data_home" / "gpuconsole" / "bench.sqlite").exists()


def test_a_corrupt_file_is_a_clear_error_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "bench.sqlite"
    garbage = bytes(range(256)) * 64
    path.write_bytes(garbage)
    history = BenchHistory(path)

    for attempt in (history.runs, lambda: history.record(run(1.0))):
        with pytest.raises(HistoryError) as raised:
            attempt()
        assert str(path) in str(raised.value)
        assert "\n" not in str(raised.value)

    assert path.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.sqlite"]


def test_another_programs_database_is_refused(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
    before = path.read_bytes()

    with pytest.raises(HistoryError, match="not a gpuconsole bench history"):
        BenchHistory(path).runs()
    assert path.read_bytes() == before


# --- summary lines -----------------------------------------------------------------------------


def test_from_summary_reads_a_recipe_summary_line() -> None:
    result = BenchResult.from_summary(
        json.loads(SUMMARY_LINE), host="gpu01", driver="570.133.20", time=T0
    )

    assert result == BenchResult(
        time=T0,
        host="gpu01",
        gpu_model="NVIDIA H200",
        driver="570.133.20",
        torch="2.11.0+cu130",
        recipe="resnet50",
        preset="tuned",
        knobs={"precision": "bf16", "channels_last": True, "compile": True, "batch_size": 256},
        samples_per_s=7123.4,
        peak_memory_mib=34567.0,
        world_size=1,
        status="ok",
    )


def test_a_summary_without_measured_steps_has_no_rate_and_is_not_judged() -> None:
    summary = {**json.loads(SUMMARY_LINE), "samples_per_s": None}

    result = BenchResult.from_summary(summary, host="gpu01", driver=None, time=T0 + 100)

    assert result.samples_per_s is None
    assert judge(result, host_history(8000, 8000, 8000)).comparisons == ()


def test_from_summary_refuses_other_lines() -> None:
    with pytest.raises(ValueError, match="not a recipe summary"):
        BenchResult.from_summary({"event": "step"}, host="h", driver=None, time=T0)
    with pytest.raises(ValueError, match="samples_per_s"):
        BenchResult.from_summary(
            {"event": "summary", "recipe": "bert", "preset": "tuned"},
            host="h",
            driver=None,
            time=T0,
        )


# --- judging -----------------------------------------------------------------------------------


def host_history(*rates: float, host: str = "gpu01") -> list[BenchResult]:
    return [run(rate, host=host, time=T0 + i) for i, rate in enumerate(rates)]


def test_a_run_well_below_its_hosts_median_is_flagged() -> None:
    earlier = host_history(7900, 7980, 8050, 7960, 8010)
    latest = run(7010, time=T0 + 100)

    found = comparison(latest, earlier, "host-median")

    assert found.flagged
    assert found.baseline == 7980
    assert found.ratio == pytest.approx(7010 / 7980)
    assert found.message == "7,010 img/s is 12 % below this host's median of 7,980 over 5 runs"
    assert judge(latest, earlier).flagged


def test_a_run_within_ten_percent_is_not_flagged() -> None:
    earlier = host_history(7900, 7980, 8050)
    latest = run(7200, time=T0 + 100)

    found = comparison(latest, earlier, "host-median")

    assert not found.flagged
    assert "9.8 % below" in found.message
    assert not judge(latest, earlier).flagged


def test_only_earlier_runs_of_the_same_host_recipe_preset_and_world_size_count() -> None:
    latest = run(7010, time=T0 + 100)
    others = [
        run(8000, time=T0 + 200),  # later
        run(8000, host="gpu02"),
        run(8000, recipe="bert"),
        run(8000, preset="baseline"),
        run(8000, world_size=8),
    ]
    found = comparison(latest, host_history(7000, 7020) + others, "host-median")

    assert found.baseline is None
    assert not found.flagged


def test_too_few_runs_give_no_comparison_and_say_why() -> None:
    latest = run(1000, time=T0 + 100)
    history = host_history(8000, 8000)

    own = comparison(latest, history, "host-median")
    peer = comparison(latest, history, "peer-median")

    assert (own.baseline, own.ratio, own.flagged) == (None, None, False)
    assert own.message.startswith("no comparison with this host's median: 2 earlier ok runs")
    assert "3 needed" in own.message
    assert (peer.baseline, peer.flagged) == (None, False)
    assert "0 ok runs on other H200 hosts" in peer.message
    assert not judge(latest, history).flagged


def test_failed_runs_never_enter_a_median() -> None:
    failed = [run(None, time=T0 + 10, status="failed", message="CUDA out of memory")]
    failed += [  # a run can fail after measuring some steps: its rate still stays out
        run(100, time=T0 + 11 + i, status="failed", message="NCCL timeout") for i in range(4)
    ]
    history = host_history(8000, 8000) + failed

    found = comparison(run(1000, time=T0 + 100), history, "host-median")

    assert found.baseline is None
    assert "2 earlier ok runs" in found.message


def test_a_failed_run_is_not_judged() -> None:
    failed = run(None, time=T0 + 100, status="failed", message="driver mismatch")

    assert judge(failed, host_history(8000, 8000, 8000)).comparisons == ()


def test_a_run_well_below_its_peers_is_flagged() -> None:
    peers = [run(8000 + 10 * i, host=f"gpu0{i + 2}", time=T0 + i) for i in range(4)]
    peers.append(run(100, host="gpu09", gpu="NVIDIA A100-SXM4-80GB"))  # another GPU model
    latest = run(7000, time=T0 + 100)

    found = comparison(latest, peers, "peer-median")

    assert found.flagged
    assert found.baseline == 8015
    assert found.message == (
        "7,000 img/s is 13 % below the peer median of 8,015 over 4 runs on other H200 hosts"
    )


def test_a_run_level_with_its_peers_is_not_flagged() -> None:
    peers = [run(8000, host=f"gpu0{i + 2}") for i in range(3)]

    found = comparison(run(7300), peers, "peer-median")

    assert found.ratio == pytest.approx(7300 / 8000)
    assert not found.flagged


def test_resnet50_on_an_h200_is_compared_with_the_measured_references() -> None:
    references = judge(run(6900), []).comparisons[2:]

    assert {c.baseline for c in references} == {2205, 2411, 4685, 6841}
    assert all(c.kind == "reference" and not c.flagged for c in references)
    best = next(c for c in references if c.baseline == 6841)
    assert best.ratio == pytest.approx(6900 / 6841)
    assert "101 % of 6,841 img/s" in best.message
    assert "torch.compile" in best.message
    assert "a reference only, the settings differ" in best.message


def test_a_run_far_below_every_reference_is_still_not_flagged() -> None:
    assert not judge(run(100), []).flagged


def test_references_match_gpu_model_and_world_size() -> None:
    a100 = judge(run(16_000, gpu="NVIDIA A100-SXM4-80GB", world_size=8), []).comparisons[2:]
    gh200 = judge(run(7000, gpu="NVIDIA GH200 480GB"), []).comparisons[2:]
    bert = judge(run(500, gpu="NVIDIA A100 80GB PCIe", recipe="bert"), []).comparisons[2:]

    assert {c.baseline for c in a100} == {7248, 16621}
    assert [c.baseline for c in gh200] == [None]
    assert gh200[0].message == "no published or measured reference for resnet50 on 1 × GH200 480GB"
    assert [c.baseline for c in bert] == [580]
    assert "500 seq/s" in bert[0].message


# --- output ------------------------------------------------------------------------------------


def test_history_text_marks_regressions_and_failures() -> None:
    earlier = host_history(7900, 7980, 8050, 7960, 8010)
    latest = replace(run(7010, time=T0 + 100), run_id=6)
    failed = replace(
        run(None, time=T0 + 101, status="failed", message="CUDA out of memory"), run_id=7
    )
    results = [failed, latest]

    text = history_text(results, [judge(r, earlier) for r in results])

    header, failed_row, latest_row, *notes = text.splitlines()
    assert header.split() == [
        "when",
        "host",
        "GPU",
        "recipe",
        "preset",
        "world",
        "throughput",
        "peak",
        "mem",
        "status",
        "flag",
    ]
    assert "N/A" in failed_row and "failed" in failed_row and "REGRESSION" not in failed_row
    assert "7,010.0 img/s" in latest_row and latest_row.endswith("REGRESSION")
    assert notes == [
        "run 7 failed: CUDA out of memory",
        "run 6 regression: 7,010 img/s is 12 % below this host's median of 7,980 over 5 runs",
    ]


def test_history_json_keeps_missing_values_as_null() -> None:
    failed = run(None, status="failed", message="timeout")

    (entry,) = history_json([failed])

    assert entry["samples_per_s"] is None
    assert entry["knobs"] == {"precision": "bf16", "compile": True}
    assert entry["unit"] == "img/s"
    assert json.loads(json.dumps(entry)) == entry


def test_bench_history_flags_a_run_as_launch_did_when_it_kept_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuconsole.cli.main import main

    monkeypatch.setenv(paths.BENCH_DB.variable, str(tmp_path / "bench.sqlite"))
    history = BenchHistory()
    for result in (*host_history(7900, 7980, 8050), run(7010, time=T0 + 100)):
        history.record(result)
    history.record(run(8000, time=T0 + 200))  # a later good run does not clear the flag

    assert main(["bench", "history"]) == 0

    lines = capsys.readouterr().out.splitlines()
    flagged = [line for line in lines if line.endswith("REGRESSION")]
    assert len(flagged) == 1 and "7,010.0 img/s" in flagged[0]
    assert lines[-1] == (
        "run 4 regression: 7,010 img/s is 12 % below this host's median of 7,980 over 3 runs"
    )
