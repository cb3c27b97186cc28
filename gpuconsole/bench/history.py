"""Recipe runs kept in SQLite, and the regression judgement of a run against that history.

A run is judged three ways: against the median of the same host's earlier runs, against the
median of other hosts with the same GPU model (SuperBench flags a node that falls 5-10 % below a
baseline; we flag more than 10 %), and, for information only, against published or measured
figures in `gpuconsole/data/throughput_references.toml`.
"""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Literal

from gpuconsole.core import paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SCHEMA_VERSION = 1
REGRESSION_RATIO = 0.9
MIN_RUNS = 3

_REFERENCES = Path(__file__).resolve().parent.parent / "data" / "throughput_references.toml"
_UNITS = {"resnet50": "img/s", "detection": "img/s", "bert": "seq/s"}

_SCHEMA = """
CREATE TABLE runs (
    run_id INTEGER PRIMARY KEY,
    time REAL NOT NULL,
    host TEXT NOT NULL,
    gpu_model TEXT,
    driver TEXT,
    torch TEXT,
    recipe TEXT NOT NULL,
    preset TEXT NOT NULL,
    knobs TEXT NOT NULL,
    samples_per_s REAL,
    peak_memory_mib REAL,
    world_size INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
    message TEXT
);
CREATE INDEX runs_by_recipe ON runs (recipe, preset, host, time);
"""
_COLUMNS = (
    "time, host, gpu_model, driver, torch, recipe, preset, knobs, samples_per_s, "
    "peak_memory_mib, world_size, status, message"
)


class HistoryError(Exception):
    """The history database cannot be used; the message names the file, which is left as it is."""


def unit(recipe: str) -> str:
    """What one sample is for ``recipe``: images for vision recipes, sequences for BERT."""
    return _UNITS.get(recipe, "samples/s")


def canonical_json(value: Mapping[str, Any]) -> str:
    """Knobs as stored: sorted keys and no spaces, so equal knobs are equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class BenchResult:
    time: float
    host: str
    gpu_model: str | None
    driver: str | None
    torch: str | None
    recipe: str
    preset: str
    knobs: dict[str, Any]
    samples_per_s: float | None
    peak_memory_mib: float | None
    world_size: int
    status: Literal["ok", "failed"]
    message: str | None = None
    run_id: int | None = None

    @classmethod
    def from_summary(
        cls, summary: Mapping[str, Any], *, host: str, driver: str | None, time: float
    ) -> BenchResult:
        """A successful run from a recipe's final `{"event": "summary", ...}` line.

        ``samples_per_s`` is the total over ``world_size`` GPUs; it is null when no step was
        measured (every step was warm-up), and such a run is never judged.
        """
        if summary.get("event") != "summary":
            raise ValueError(f"not a recipe summary line: event is {summary.get('event')!r}")
        try:
            recipe, preset, rate = summary["recipe"], summary["preset"], summary["samples_per_s"]
        except KeyError as missing:
            raise ValueError(f"recipe summary line lacks {missing}") from None
        peak = summary.get("peak_memory_mib")  # absent where the recipe could not measure it
        return cls(
            time=time,
            host=host,
            gpu_model=summary.get("device_name"),
            driver=driver,
            torch=summary.get("torch"),
            recipe=recipe,
            preset=preset,
            knobs=dict(summary.get("knobs") or {}),
            samples_per_s=None if rate is None else float(rate),
            peak_memory_mib=None if peak is None else float(peak),
            world_size=int(summary.get("world_size", 1)),
            status="ok",
        )


class BenchHistory:
    """Every recipe run, newest first on reading. Opens a connection per call (worker-safe)."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else paths.BENCH_DB.path()

    def record(self, result: BenchResult) -> BenchResult:
        """Store ``result``; returns it with its `run_id`."""
        row = (
            result.time,
            result.host,
            result.gpu_model,
            result.driver,
            result.torch,
            result.recipe,
            result.preset,
            canonical_json(result.knobs),
            result.samples_per_s,
            result.peak_memory_mib,
            result.world_size,
            result.status,
            result.message,
        )
        with self._connect() as db:
            cursor = db.execute(
                f"INSERT INTO runs ({_COLUMNS}) VALUES ({', '.join('?' * 13)})", row
            )
            run_id = cursor.lastrowid
        return replace(result, run_id=run_id)

    def runs(
        self,
        host: str | None = None,
        recipe: str | None = None,
        preset: str | None = None,
        limit: int = 200,
    ) -> list[BenchResult]:
        """Stored runs matching every filter given, newest first, at most ``limit``."""
        filters = {"host": host, "recipe": recipe, "preset": preset}
        wanted = {column: value for column, value in filters.items() if value is not None}
        where = " AND ".join(f"{column} = ?" for column in wanted) or "1"
        query = (
            f"SELECT run_id, {_COLUMNS} FROM runs WHERE {where} "
            "ORDER BY time DESC, run_id DESC LIMIT ?"
        )
        with self._connect() as db:
            rows = db.execute(query, (*wanted.values(), limit)).fetchall()
        return [_from_row(row) for row in rows]

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection to a database with our schema; every sqlite failure becomes HistoryError.

        The file is read before anything is written to it, so a file that is not a database
        fails on that read and is never touched.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(sqlite3.connect(self.path, timeout=10.0)) as db:
                _prepare(db, self.path)
                with db:
                    yield db
        except (sqlite3.Error, OSError) as error:
            raise HistoryError(
                f"cannot use bench history {self.path}: {error} "
                "(left as it is; move it aside to start a new history)"
            ) from error


def _prepare(db: sqlite3.Connection, path: Path) -> None:
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise HistoryError(
            f"bench history {path} has schema version {version}, newer than this gpuconsole "
            f"reads ({SCHEMA_VERSION}); upgrade gpuconsole"
        )
    if version == SCHEMA_VERSION:
        return
    if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise HistoryError(f"{path} is an SQLite database but not a gpuconsole bench history")
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")


def _from_row(row: tuple[Any, ...]) -> BenchResult:
    (run_id, time, host, gpu_model, driver, torch, recipe, preset, knobs, rate, peak, world,
     status, message) = row  # fmt: skip
    return BenchResult(
        time=time,
        host=host,
        gpu_model=gpu_model,
        driver=driver,
        torch=torch,
        recipe=recipe,
        preset=preset,
        knobs=json.loads(knobs),
        samples_per_s=rate,
        peak_memory_mib=peak,
        world_size=world,
        status=status,
        message=message,
        run_id=run_id,
    )


# --- judging a run ---------------------------------------------------------------------------

ComparisonKind = Literal["host-median", "peer-median", "reference"]


@dataclass(frozen=True, slots=True)
class Comparison:
    """One baseline a run was held against; ``baseline`` and ``ratio`` are None when none was."""

    kind: ComparisonKind
    baseline: float | None
    ratio: float | None
    flagged: bool
    message: str


@dataclass(frozen=True, slots=True)
class Judgement:
    comparisons: tuple[Comparison, ...] = field(default_factory=tuple)

    @property
    def flagged(self) -> bool:
        return any(c.flagged for c in self.comparisons)


@dataclass(frozen=True, slots=True)
class Reference:
    """A published or measured figure (a row of throughput_references.toml)."""

    recipe: str
    gpu: str
    world_size: int
    samples_per_s: float
    what: str
    source: str

    def fits(self, gpu_model: str) -> bool:
        """Every word of ``gpu`` appears as a whole word in the device name, in any case."""
        return all(
            re.search(rf"(?<![a-z0-9]){re.escape(word)}(?![a-z0-9])", gpu_model, re.IGNORECASE)
            for word in self.gpu.split()
        )


@cache
def references() -> tuple[Reference, ...]:
    rows = tomllib.loads(_REFERENCES.read_text(encoding="utf-8"))["reference"]
    return tuple(Reference(**{**row, "samples_per_s": float(row["samples_per_s"])}) for row in rows)


def judge(result: BenchResult, history: Sequence[BenchResult]) -> Judgement:
    """Hold ``result`` against its host's median, its peers' median and the reference figures.

    Only successful runs enter a median. A failed result is not judged: it has no throughput.
    """
    if result.status != "ok" or result.samples_per_s is None:
        return Judgement()
    rate = result.samples_per_s
    usable = [
        run
        for run in history
        if run.status == "ok"
        and (run.samples_per_s or 0) > 0
        and (run.recipe, run.preset, run.world_size)
        == (result.recipe, result.preset, result.world_size)
    ]
    own = [run for run in usable if run.host == result.host and run.time < result.time]
    peers = [
        run
        for run in usable
        if run.host != result.host
        and result.gpu_model is not None
        and run.gpu_model == result.gpu_model
    ]
    return Judgement(
        (
            _against_median(result, rate, own, "host-median", "this host's median", ""),
            _against_median(
                result,
                rate,
                peers,
                "peer-median",
                "the peer median",
                f" on other {_gpu(result)} hosts",
            ),
            *_against_references(result, rate),
        )
    )


def _against_median(
    result: BenchResult,
    rate: float,
    runs: list[BenchResult],
    kind: ComparisonKind,
    name: str,
    where: str,
) -> Comparison:
    if len(runs) < MIN_RUNS:
        return Comparison(
            kind,
            None,
            None,
            False,
            f"no comparison with {name}: {_runs(len(runs), kind)}{where} of this recipe, "
            f"preset and world size, {MIN_RUNS} needed",
        )
    median = statistics.median(run.samples_per_s for run in runs if run.samples_per_s)
    ratio = rate / median
    return Comparison(
        kind,
        median,
        ratio,
        ratio < REGRESSION_RATIO,
        f"{_rate(rate, result.recipe)} is {_relation(ratio)} {name} of {median:,.0f} "
        f"over {len(runs)} runs{where}",
    )


def _against_references(result: BenchResult, rate: float) -> list[Comparison]:
    rows = [
        ref
        for ref in references()
        if ref.recipe == result.recipe
        and ref.world_size == result.world_size
        and result.gpu_model is not None
        and ref.fits(result.gpu_model)
    ]
    if not rows:
        return [
            Comparison(
                "reference",
                None,
                None,
                False,
                f"no published or measured reference for {result.recipe} on "
                f"{result.world_size} × {_gpu(result)}",
            )
        ]
    return [
        Comparison(
            "reference",
            ref.samples_per_s,
            rate / ref.samples_per_s,
            False,
            f"{_rate(rate, result.recipe)} is {rate / ref.samples_per_s * 100:.0f} % of "
            f"{_rate(ref.samples_per_s, ref.recipe)} for {ref.what} on {ref.world_size} × "
            f"{ref.gpu} ({ref.source}); a reference only, the settings differ",
        )
        for ref in rows
    ]


def _rate(value: float, recipe: str) -> str:
    return f"{value:,.0f} {unit(recipe)}"


def _runs(count: int, kind: ComparisonKind) -> str:
    earlier = "earlier " if kind == "host-median" else ""
    return f"{count} {earlier}ok run{'s' * (count != 1)}"


def _gpu(result: BenchResult) -> str:
    return (result.gpu_model or "unknown GPU").removeprefix("NVIDIA ")


def _relation(ratio: float) -> str:
    """'12 % below' / '3 % above' / 'level with'; one decimal near the 10 % line, so a flagged
    run never reads '10 % below'."""
    percent = abs(1 - ratio) * 100
    if percent < 0.5:
        return "level with"
    shown = f"{percent:.1f}" if 9.5 <= percent < 10.5 else f"{percent:.0f}"
    return f"{shown} % {'below' if ratio < 1 else 'above'}"
