"""The memory doctor's runs: the trials on one GPU of a host, the checkpoint interval chosen for
the target, the recommendation, the largest batch that fits, and where the memory went."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuconsole.actions.launch.commands import LaunchError, LaunchSpec, single_host_command
from gpuconsole.actions.launch.run import Event, run_recipe
from gpuconsole.actions.memory.trials import (
    ADAMW_RECIPES,
    FIRST_BUDGET,
    PROBE,
    REPEAT,
    STEADY,
    TRIAL,
    Fixes,
    Trial,
    batch_granule,
    budget_for_target,
    checkpoint_interval,
    climb_base,
    combinations,
    default_target_mib,
    first_trials,
    fits,
    leaner,
    next_batch,
    recommend,
    trial_from_summary,
)
from gpuconsole.actions.session import HostShell, open_shell
from gpuconsole.hosts.ssh import ConnectFailure, SshSettings
from gpuconsole.hosts.targets import Target

ACTION = "memory-trial"
"""What the trials' writes and runs are logged as."""
EMPTY_CACHE_TRUTH = (
    "torch.cuda.empty_cache() returns the allocator's cached blocks to the driver, for other "
    "processes and later phases; it does not lower a running step's peak, so it is not a trial"
)


class MemoryDoctorError(Exception):
    """The trials cannot run at all (no torch, a bad argument, an unreachable host)."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """How long each run is: trials measure until their speed is steady (the halves of their
    measured steps within ``steady_within``, up to 4 × ``steps``), probes measure just a peak.
    ``batch_probes`` bounds the search for the largest batch (0: none)."""

    steps: int = 20
    warmup: int = 3
    probe_steps: int = 2
    steady_within: float = STEADY
    batch_probes: int = 8


@dataclass(slots=True)
class MemoryReport:
    host: str
    recipe: str
    batch_size: int | None = None
    target_mib: float | None = None
    trials: list[Trial] = field(default_factory=list)
    recommended: Trial | None = None
    largest_batch: Trial | None = None
    sites: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    preset: str = "tuned"
    amp: str = "bf16"


@dataclass(frozen=True, slots=True)
class DoctorRequest:
    """What to try: every fix (``only`` None) or these sets, against a target in GiB or as a share
    of the fp32 run's peak (``target_share``); neither: the card less the guide's reserve. The
    trials run the job as its ``preset`` launches it: compiled where the preset compiles."""

    recipe: str
    target_gib: float | None = None
    target_share: float | None = None
    only: tuple[Fixes, ...] | None = None
    amp: str = "bf16"
    batch_size: int | None = None
    gpu: int = 0
    extra: tuple[str, ...] = ()
    schedule: Schedule = Schedule()
    preset: str = "tuned"


def launch_spec(request: DoctorRequest, report: MemoryReport) -> LaunchSpec | None:
    """The job launched with the recommended fixes, as the trials ran it; None: nothing fits."""
    if report.recommended is None:
        return None
    flags = report.recommended.fixes.arguments(report.batch_size or 1)
    return LaunchSpec(request.recipe, request.preset, extra=(*flags, *request.extra))


class _Runner:
    """Runs one set of fixes on the host and reads the trial from its summary."""

    def __init__(
        self,
        shell: HostShell,
        target: Target,
        request: DoctorRequest,
        on_line: Callable[[str], None],
    ) -> None:
        self.shell, self.target, self.request, self.on_line = shell, target, request, on_line
        self.python = target.entry.python if target.entry else "python3"

    async def run(
        self,
        fixes: Fixes,
        batch: int | None,
        steps: int,
        warmup: int,
        steady: float | None = None,
        history: bool = False,
    ) -> tuple[Trial, list[Event]]:
        """One run; ``history`` records the allocations, eagerly (a compiled graph's allocations
        have no line of the recipe to name)."""
        args = fixes.arguments(batch) if batch else _without_batch(fixes.arguments(1))
        args += ["--warmup-steps", str(warmup), "--steps", str(steps), "--log-every", "1000"]
        if steady is not None:
            args += ["--steady-within", f"{steady:g}"]
        if history:
            args += ["--memory-history", "--no-compile"]
        spec = LaunchSpec(
            self.request.recipe, self.request.preset, extra=(*args, *self.request.extra)
        )
        command = single_host_command(spec, (self.request.gpu,), self.python)
        events: list[Event] = []
        result = await run_recipe(self.shell, spec, command, events.append, self.on_line)
        if result.summary is None:
            trial = Trial(fixes, error_kind=result.error_kind, error=result.error)
        else:
            trial = trial_from_summary(fixes, result.summary)
        return trial, events


def _without_batch(args: list[str]) -> list[str]:
    """The flags without --batch-size: the recipe's own batch (the first run learns it)."""
    index = args.index("--batch-size")
    return args[:index] + args[index + 2 :]


async def run_doctor(
    target: Target,
    request: DoctorRequest,
    *,
    on_trial: Callable[[Trial], None] = lambda _trial: None,
    on_line: Callable[[str], None] = lambda _line: None,
    settings: SshSettings | None = None,
) -> MemoryReport:
    """Every trial on ``target``, then the choice; `MemoryDoctorError` when none can run."""
    if any(a == "--batch-size" or a.startswith("--batch-size=") for a in request.extra):
        raise MemoryDoctorError("give the job's batch as --batch-size of `memory`, not after --")
    report = MemoryReport(
        target.name, request.recipe, request.batch_size, preset=request.preset, amp=request.amp
    )
    schedule = request.schedule
    try:
        async with open_shell(target, ACTION, settings) as shell:
            runner = _Runner(shell, target, request, on_line)

            async def trial(fixes: Fixes, batch: int | None = None, role: str = TRIAL) -> Trial:
                probe = role == PROBE
                steps = schedule.probe_steps if probe else schedule.steps
                warmup = 1 if probe else schedule.warmup
                steady = None if probe else schedule.steady_within
                batch = batch or report.batch_size
                if fixes.micro_batches > 1 and batch is None:
                    done = Trial(fixes, error_kind="usage", error="the job's batch is unknown")
                else:
                    done, events = await runner.run(fixes, batch, steps, warmup, steady)
                    report.batch_size = report.batch_size or _batch_of(events)
                done = replace(done, role=role)
                report.trials.append(done)
                on_trial(done)
                return done

            baseline, *listed = request.only or (Fixes(),)
            first = await trial(baseline)
            if not first.ok and first.error_kind != "oom":
                raise MemoryDoctorError(f"{request.recipe} on {target.name}: {first.error}")
            _refuse_compilers_fixes_on_an_eager_job(first, listed, request.recipe)
            cuda, compiled = first.source.startswith("CUDA"), bool(first.compiled)
            explore = request.only is None
            if explore:
                listed = first_trials(request.amp, compiled, allocator=cuda)[1:]
            for fixes in listed:
                await trial(fixes)
            await _choose(report, request, trial, cuda, explore=explore, compiled=compiled)
            await _repeat(report, request, trial)
            if cuda:
                await _record_sites(report, runner)
    except ConnectFailure as failure:
        raise MemoryDoctorError(failure.reason) from None
    except LaunchError as error:
        raise MemoryDoctorError(str(error)) from None
    report.notes.append(EMPTY_CACHE_TRUTH)
    return report


def _refuse_compilers_fixes_on_an_eager_job(
    first: Trial, listed: Sequence[Fixes], recipe: str
) -> None:
    """The sets given that only a compiled job can run (a memory budget, CUDA graphs), refused
    once the first trial shows the job runs eagerly, rather than each failing as a trial."""
    if first.compiled is not False:
        return
    names = [f.name for f in listed if f.cuda_graphs or f.memory_budget is not None]
    if names:
        raise MemoryDoctorError(
            f"--fixes {', '.join(names)}: torch.compile's fixes, and {recipe} runs eagerly "
            "here (--preset baseline or --no-compile): leave them out, or compile the job"
        )


async def _choose(
    report: MemoryReport,
    request: DoctorRequest,
    trial: Callable[..., Any],
    allocator: bool,
    explore: bool = True,
    compiled: bool = False,
) -> None:
    """The checkpoint interval and the compiler's memory budget for the target; when nothing
    tried fits, the smallest activation fix with more fixes added one at a time (`combinations`)
    up to the first set that fits, and that set less each fix it may not need (`leaner`); the
    recommendation, and where the job is ``compiled`` on CUDA (an ``allocator``) the same set
    with CUDA graphs (`_with_cuda_graphs`); the largest batch. Sets given by the user (not
    ``explore``) are only chosen among."""
    target = _target_mib(request, report.trials)
    report.target_mib = target
    if target is None:
        report.notes.append(
            "no target: give --target GiB (a share like 20% needs the fp32 trial's peak; "
            "the card's size needs CUDA)"
        )
        return
    if explore:
        await _estimated(report, request.amp, target, trial)
    report.recommended = recommend(report.trials, target)
    base = climb_base(report.trials, request.amp)
    if explore and report.recommended is None and base is not None:
        adamw = request.recipe in ADAMW_RECIPES
        for fixes in combinations(base.fixes, allocator, adamw):
            done = _find(report.trials, fixes) or await trial(fixes)
            if fits(done, target):
                for lean in leaner(fixes, base.fixes):
                    if _find(report.trials, lean) is None:
                        await trial(lean)
                break
        report.recommended = recommend(report.trials, target)
    if explore and compiled and allocator:
        await _with_cuda_graphs(report, target, trial)
    chosen = report.recommended or _smallest(report.trials)
    if chosen is not None and report.batch_size and request.schedule.batch_probes:
        report.largest_batch = await _largest_batch(
            chosen, report.batch_size, target, trial, request.schedule.batch_probes
        )


async def _with_cuda_graphs(report: MemoryReport, target: float, trial: Callable[..., Any]) -> None:
    """The recommended set again with its compiled graphs replayed as CUDA graphs, recommended
    instead where it still fits and is faster (by more than `SAME_SPEED`, as any added fix must
    be). The fixes that fit a tight target (checkpointing, 8-bit moments) add host work to each
    step, and a compiled step whose host cannot keep up loses what the GPU could do; CUDA
    graphs launch each graph at once. Not with compression, which runs eagerly."""
    chosen = report.recommended
    if chosen is None or chosen.fixes.compress or chosen.fixes.cuda_graphs:
        return
    graphs = replace(chosen.fixes, cuda_graphs=True)
    if _find(report.trials, graphs) is None:
        await trial(graphs)
    report.recommended = recommend(report.trials, target)


async def _estimated(
    report: MemoryReport, amp: str, target: float, trial: Callable[..., Any]
) -> None:
    """The sparsest checkpointing and the largest compiler budget estimated to fit the target,
    each from the two runs that bracket it (no second budget where the first one's gradients
    were not the job's: its figures are what the report needs of it)."""
    mixed = Fixes(precision=amp)
    plain = _find(report.trials, mixed)
    every = _find(report.trials, replace(mixed, checkpoint_every=1))
    budgeted = _find(report.trials, replace(mixed, memory_budget=FIRST_BUDGET))
    if plain is not None and every is not None:
        k = checkpoint_interval(plain, every, target)
        if k is not None:
            await trial(replace(mixed, checkpoint_every=k))
    if plain is not None and budgeted is not None and budgeted.unsound is None:
        budget = budget_for_target(plain, budgeted, target)
        if budget is not None:
            await trial(replace(mixed, memory_budget=budget))


async def _largest_batch(
    base: Trial, batch: int, target_mib: float, trial: Callable[..., Any], probes: int
) -> Trial | None:
    """Search for the largest batch under the target with ``base``'s fixes (micro-batches aside:
    a batch search is of what one step holds), in multiples of `batch_granule`, with probes that
    measure a peak only; then measure the largest batch found as a trial, for its speed. None:
    not even a batch of one fits."""
    fixes = replace(base.fixes, micro_batches=1)
    granule = batch_granule(batch)
    fitting, failing = (batch, None) if fits(base, target_mib) else (0, batch)
    best: Trial | None = base if fitting else None
    last = base
    for _ in range(probes):
        size = next_batch(fitting, failing, last, target_mib, granule)
        if size is None or size < 1:
            break
        last = await trial(replace(fixes, batch_size=size), size, PROBE)
        if fits(last, target_mib):
            fitting, best = size, last
        else:
            failing = size
    if best is None or best.role != PROBE:
        return best
    measured = await trial(best.fixes, best.fixes.batch_size)
    return measured if fits(measured, target_mib) else best


async def _repeat(report: MemoryReport, request: DoctorRequest, trial: Callable[..., Any]) -> None:
    """Run the recommended set and mixed precision alone again: how far apart two runs of one
    set are is what the speeds in the report can be trusted to."""
    sets = [Fixes(precision=request.amp)]
    if report.recommended is not None and report.recommended.fixes not in sets:
        sets.append(report.recommended.fixes)
    for fixes in sets:
        if _find(report.trials, fixes) is not None:
            await trial(fixes, role=REPEAT)


async def _record_sites(report: MemoryReport, runner: _Runner) -> None:
    """Where the fp32 run's memory was at its peak, from an eager run that records it."""
    fp32 = Fixes()
    recorded, events = await runner.run(fp32, report.batch_size, 2, 1, history=True)
    sites = next((e for e in events if e["event"] == "memory_sites"), None)
    report.sites = {**sites, "fixes": f"{fp32.name} (eager)"} if sites else None
    if sites is None:
        report.notes.append(f"no memory history of {fp32.name}: {recorded.error}")


def _target_mib(request: DoctorRequest, trials: Sequence[Trial]) -> float | None:
    if request.target_gib:
        return request.target_gib * 1024
    if request.target_share:
        fp32 = _find(trials, Fixes())
        return fp32.peak_mib * request.target_share if fp32 and fp32.peak_mib else None
    return default_target_mib(trials)


def _find(trials: Sequence[Trial], fixes: Fixes) -> Trial | None:
    return next((t for t in trials if t.fixes == fixes and t.ok and t.role == TRIAL), None)


def _smallest(trials: Sequence[Trial]) -> Trial | None:
    measured = [t for t in trials if t.ok and t.role == TRIAL and t.fixes.batch_size is None]
    return min(measured, key=lambda t: t.peak_mib or 0.0) if measured else None


def _batch_of(events: Sequence[Event]) -> int | None:
    summary = next((e for e in events if e["event"] == "summary"), None)
    knobs = summary.get("knobs", {}) if summary else {}
    batch, accumulate = knobs.get("batch_size"), knobs.get("accumulate", 1)
    return batch * accumulate if isinstance(batch, int) else None
