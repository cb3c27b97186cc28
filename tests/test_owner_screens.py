"""Who owns a GPU, on the screens: the host screen's process list (owner, SM and memory-controller
shares, age), the fleet's jobs column and drain marker, and taking a node out of its scheduler
from the host screen, on the demo rack (refused) and on a real single-node Slurm (`tests/slurm.py`),
where ``sinfo -R`` is the judge."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from notices import Notice, notices
from pilot_wait import until
from rich.cells import cell_len
from slurm import Slurm
from static_source import StaticSource
from test_app import cell_text

from gpuconsole.actions.service import ServiceResult
from gpuconsole.core.model import GpuProcess, GpuState, HostSnapshot, ProcessLoad, SlurmJob
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.telemetry.sim import SimSource
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.confirm import ConfirmScreen
from gpuconsole.ui.screens.host import HostScreen, process_columns
from gpuconsole.ui.screens.service import ReasonScreen, ServiceScreen
from gpuconsole.ui.widgets import cells
from gpuconsole.ui.widgets.keyed_table import KeyedTable

DRAINED = "h100-01"
"""The demo rack's host whose GPU 3 has fallen off the bus: its node is drained (`conftest`)."""
ACT_S = 30.0


def column_keys(screen: object, table: str) -> list[str]:
    shown = screen.query_one(f"#{table}", KeyedTable)  # type: ignore[attr-defined]
    return [key.value for key in shown.columns]


async def open_host(app: GpuConsoleApp, pilot: object, host: str) -> HostScreen:
    screen = HostScreen(host)
    app.push_screen(screen)
    await pilot.pause()  # type: ignore[attr-defined]
    return screen


# --- the cells ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "width", "shown"),
    [
        ("job 91352 train", 16, "job 91352 train"),  # fits: whole
        ("pod svc-train/pretrain-b2627", 16, "pod svc-train/…"),  # after the namespace
        ("pod svc-train/pretrain-b2627", 23, "pod svc-train/pretrain…"),  # before the suffix
        (
            "python3 -u resnet50_ddp.py --amp --batch-size 256",
            36,
            "python3 -u resnet50_ddp.py --amp…",
        ),
        ("python3 -u pretrain.py --config x.yaml", 18, "python3 -u pretra…"),  # a word lost
        ("abcdefghijklmnopqrstuvwxyz", 10, "abcdefghi…"),  # one long word: cut where it must
        ("日本語のテキストです", 9, "日本語の…"),  # measured in cells, not characters
    ],
)
def test_fit_cuts_between_words_where_it_loses_little(value: str, width: int, shown: str) -> None:
    assert cells.fit(value, width) == shown
    assert cell_len(shown) <= width


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.0, "0:00"),
        (450.0, "7:30"),
        (3599.9, "59:59"),
        (3600.0, "1h00m"),
        (86_399.0, "23h59m"),
        (3 * 86_400 + 4 * 3600 + 5, "3d04h"),
        (412 * 86_400.0, "412d"),
        (None, "N/A"),
        (-5.0, "N/A"),  # the host's clock ahead of its reading: unknown, not 0
    ],
)
def test_age_is_compact(seconds: float | None, shown: str) -> None:
    assert cells.age(seconds).plain == shown
    assert len(shown) <= 6


def test_a_share_not_sampled_is_na_and_a_sampled_zero_is_zero() -> None:
    assert cells.share(None).plain == "N/A"
    assert cells.share(0.0).plain == "  0%"


# --- the process list -----------------------------------------------------------------------------


async def test_the_process_list_shows_each_processs_job_load_and_age(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_host(app, pilot, DRAINED)
        snapshot = app.fleet.store.latest(DRAINED)
        assert snapshot is not None and snapshot.processes
        for p in snapshot.processes:
            key = f"{p.gpu}/{p.pid}"
            assert p.load is not None and p.load.sm_pct is not None
            assert cell_text(screen, "processes", key, "owner") == p.owner
            assert cell_text(screen, "processes", key, "sm") == f"{p.load.sm_pct:3.0f}%"
            assert cell_text(screen, "processes", key, "membw") == f"{p.load.memory_pct:3.0f}%"
        # bob's resnet50 job started 450 s before this reading (the simulation's fixed seed)
        bob = next(p for p in snapshot.processes if p.owner == "job 79564 resnet50_ddp")
        assert cell_text(screen, "processes", f"{bob.gpu}/{bob.pid}", "age") == "7:30"


async def test_a_process_without_load_or_start_reads_na_never_zero() -> None:
    gpu = GpuState(index=0, name="NVIDIA H200", utilization_pct=90.0)
    job = SlurmJob(41327, "llama-ft", "alice", "gpu", None, None, "RUNNING")
    unsampled = GpuProcess(101, 0, 4096.0, "alice", "python train.py", job=job)
    partial = GpuProcess(
        102, 0, 2048.0, "bob", "python eval.py", started=600.0, load=ProcessLoad(sm_pct=0.0)
    )
    snapshot = HostSnapshot("here", 1000.0, (gpu,), processes=(unsampled, partial))
    app = GpuConsoleApp(StaticSource(snapshot), auto_poll=False, background_start=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_host(app, pilot, "here")
        for column in ("sm", "membw", "age"):
            assert cell_text(screen, "processes", "0/101", column) == "N/A"
        assert cell_text(screen, "processes", "0/101", "owner") == "job 41327 llama-ft"
        assert cell_text(screen, "processes", "0/102", "sm") == "  0%"  # sampled idle: 0
        assert cell_text(screen, "processes", "0/102", "membw") == "N/A"
        assert cell_text(screen, "processes", "0/102", "age") == "6:40"
        assert cell_text(screen, "processes", "0/102", "owner") == "N/A"
        assert "enc" not in column_keys(screen, "processes")  # no process uses the encoder


async def test_the_narrow_list_keeps_owner_and_sm_and_gives_the_command_the_rest(
    make_app,
) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_host(app, pilot, DRAINED)
        keys = column_keys(screen, "processes")
        assert keys == ["gpu", "pid", "user", "sm", "memory", "owner", "command"]
        table = screen.query_one("#processes", KeyedTable)
        used = sum(column.width + 2 for column in table.columns.values())
        assert used <= 80
        for p in app.fleet.store.latest(DRAINED).processes:  # type: ignore[union-attr]
            owner = cell_text(screen, "processes", f"{p.gpu}/{p.pid}", "owner")
            if owner != p.owner:  # fitted: a head of it, and the ellipsis that says so
                assert owner.endswith("…") and len(owner) <= table.columns["owner"].width
                assert (p.owner or "").startswith(owner.removesuffix("…"))


async def test_video_engines_are_shown_where_a_process_uses_them() -> None:
    gpu = GpuState(index=0, name="NVIDIA L40S")
    load = ProcessLoad(sm_pct=12.0, memory_pct=8.0, encoder_pct=0.0, decoder_pct=63.0)
    decoder = GpuProcess(7, 0, 1024.0, "svc", "ffmpeg -hwaccel cuda -i in.mp4", load=load)
    snapshot = HostSnapshot("here", 1000.0, (gpu,), processes=(decoder,))
    app = GpuConsoleApp(StaticSource(snapshot), auto_poll=False, background_start=False)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_host(app, pilot, "here")
        assert cell_text(screen, "processes", "0/7", "dec") == " 63%"
        assert cell_text(screen, "processes", "0/7", "enc") == "  0%"
    assert [c.key for c in process_columns(160, video=False)].count("dec") == 0
    assert [c.key for c in process_columns(80, video=True)].count("dec") == 0


def test_the_columns_fit_every_width() -> None:
    for width in range(60, 241):
        for video in (False, True):
            columns = process_columns(width, video)
            assert {"owner", "sm", "command"} <= {c.key for c in columns}
            used = sum((c.width or 0) + 2 for c in columns)
            assert used <= max(width - 2, 80 - 2), width  # the command shrinks to its header


# --- the fleet ------------------------------------------------------------------------------------


async def test_the_fleet_marks_a_drained_node_and_the_host_says_why(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        states = {h: cell_text(app.screen, "fleet", h, "state") for h in app.fleet.store.hosts}
        assert states.pop(DRAINED) == "drain"
        assert set(states.values()) == {"live"}
        assert "jobs" not in column_keys(app.screen, "fleet")  # 120 columns: the problem's room
        screen = await open_host(app, pilot, DRAINED)
        header = str(screen.query_one("#host-info").render())
        node = app.fleet.store.latest(DRAINED).node  # type: ignore[union-attr]
        assert node is not None and node.reason == "GPU fell off the bus"
        assert f"\nslurm node {DRAINED} {node.described}" in header  # its own line
        assert node.described.endswith("(reason: GPU fell off the bus)")
        await pilot.press("escape")
        await pilot.press("slash", *"drain", "enter")
        await pilot.pause()
        assert [key.value for key in app.screen.query_one("#fleet", KeyedTable).rows] == [DRAINED]


async def test_the_wide_fleet_names_the_jobs_on_each_host_and_gpu(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        assert "jobs" in column_keys(app.screen, "fleet")
        # h100-01 runs bob's resnet50 on 3 GPUs, and two one-GPU jobs
        assert cell_text(app.screen, "fleet", DRAINED, "jobs") == "job 79564 resnet50_… +2"
        app.screen.expanded.add(DRAINED)  # type: ignore[attr-defined]
        app.screen.refresh_view(None)  # type: ignore[attr-defined]
        await pilot.pause()
        assert cell_text(app.screen, "fleet", f"{DRAINED}/0", "jobs") == "job 79564 resnet50_ddp"
        assert cell_text(app.screen, "fleet", f"{DRAINED}/3", "jobs") == "—"  # the lost GPU
        await pilot.press("slash", *"79564", "enter")
        await pilot.pause()
        rows = [key.value for key in app.screen.query_one("#fleet", KeyedTable).rows]
        assert [key for key in rows if "/" not in key] == [DRAINED]


# --- drain and resume -----------------------------------------------------------------------------


async def test_a_simulated_host_is_not_drained(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await open_host(app, pilot, DRAINED)
        for key in ("D", "U"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, HostScreen)
        shown = await notices(pilot)
        for change in ("drain", "resume"):
            said = f"nothing to {change}: {DRAINED} is simulated, and so is its scheduler node"
            assert Notice(said, "warning") in shown, shown


class ReachableRack:
    """The demo rack whose every host is reached as this machine: its actions run in this
    machine's shell, where the test's Slurm cluster answers."""

    def __init__(self, source: SimSource) -> None:
        self._source = source

    @property
    def hosts(self) -> tuple[str, ...]:
        return self._source.hosts

    def read(self, host: str) -> HostSnapshot:
        return self._source.read(host)

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        return self._source.backfill(host, seconds)

    def target_for(self, host: str) -> Target:
        return Target(host, None, Context(host))


@pytest.fixture
def reachable(slurm: Slurm, rack, clock, monkeypatch: pytest.MonkeyPatch) -> GpuConsoleApp:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    source = ReachableRack(SimSource(rack, clock))
    return GpuConsoleApp(source, auto_poll=False, background_start=False)  # type: ignore[arg-type]


def reasons(slurm: Slurm) -> list[str]:
    out = slurm.run("sinfo", "-R", "-h", "-n", slurm.node, "-o", "%E").stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def audit_entries() -> list[dict[str, object]]:
    path = Path(os.environ["XDG_STATE_HOME"]) / "gpuconsole" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def drain_until_asked(app: GpuConsoleApp, pilot: object, reason: str) -> ServiceScreen:
    """From the host screen: D, the reason, Enter; back once the yes/no question is up."""
    await open_host(app, pilot, DRAINED)
    await pilot.press("D")  # type: ignore[attr-defined]
    await until(pilot, lambda: isinstance(app.screen, ReasonScreen), ACT_S)  # type: ignore[arg-type]
    await pilot.press(*reason, "enter")  # type: ignore[attr-defined]
    await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), ACT_S)  # type: ignore[arg-type]
    panel = app.screen_stack[-2]
    assert isinstance(panel, ServiceScreen)
    return panel


async def test_drain_shows_the_exact_command_and_runs_nothing_without_a_yes(
    reachable: GpuConsoleApp, slurm: Slurm
) -> None:
    reason = "GPU 3 fell off the bus (o'neil)"
    command = f"scontrol update nodename={slurm.node} state=drain reason={shlex.quote(reason)}"
    async with reachable.run_test(size=(80, 24)) as pilot:
        panel = await drain_until_asked(reachable, pilot, reason)
        question = reachable.screen
        assert isinstance(question, ConfirmScreen)
        assert f"$ {command}" in question.detail
        assert question.question == f"Drain {slurm.node} on {DRAINED}?"
        await pilot.press("n")
        await until(pilot, lambda: panel.outcome is not None, ACT_S)
        assert panel.outcome == f"{DRAINED}: nothing run"
        assert f"$ {command}" in str(panel.query_one("#service-plan").render())
    assert reasons(slurm) == [] and audit_entries() == []


async def test_a_bad_reason_is_said_and_nothing_is_asked(reachable: GpuConsoleApp) -> None:
    async with reachable.run_test(size=(80, 24)) as pilot:
        await open_host(reachable, pilot, DRAINED)
        await pilot.press("D", "space", "enter")
        await pilot.pause()
        assert isinstance(reachable.screen, ReasonScreen)
        said = str(reachable.screen.query_one("#reason-error").render())
        assert "say why the node is taken out" in said
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(reachable.screen, HostScreen)
    assert audit_entries() == []


async def test_drain_then_resume_from_the_host_screen(
    reachable: GpuConsoleApp, slurm: Slurm
) -> None:
    reason = "PSU 2 failed"
    async with reachable.run_test(size=(120, 40)) as pilot:
        panel = await drain_until_asked(reachable, pilot, reason)
        await pilot.press("y")
        await until(pilot, lambda: panel.outcome is not None, ACT_S)
        assert isinstance(panel.outcome, ServiceResult) and panel.outcome.ok
        answer = str(panel.query_one("#service-answer").render())
        assert f"{DRAINED}: {slurm.node} is now drained, reason: {reason}" in answer
        assert reasons(slurm) == [reason]

        await pilot.press("escape")
        await pilot.press("U")
        await until(pilot, lambda: isinstance(reachable.screen, ConfirmScreen), ACT_S)
        assert f"scontrol update nodename={slurm.node} state=resume" in reachable.screen.detail
        resumed = reachable.screen_stack[-2]
        await pilot.press("y")
        await until(pilot, lambda: resumed.outcome is not None, ACT_S)
        assert resumed.outcome.ok
    assert reasons(slurm) == []
    logged = [(e["action"], e["host"], e["node"], e["exit_code"]) for e in audit_entries()]
    assert logged == [("drain", DRAINED, slurm.node, 0), ("resume", DRAINED, slurm.node, 0)]
    assert audit_entries()[0]["reason"] == reason
