"""Shared fixtures: a fixed-clock simulated rack; config discovery kept out of the home dir."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import leftovers
import pytest
from leftovers import end_processes_of
from slurm import Slurm, running, slurm_available
from sshd import Sshd
from standin import write_standin_smi

from gpuconsole.core import paths
from gpuconsole.core.clock import ManualClock
from gpuconsole.telemetry.sim import SimRack, SimSource, demo_rack
from gpuconsole.ui.app import GpuConsoleApp

EPOCH = 1_767_225_600.0  # 2026-01-01 00:00 UTC
NOW = EPOCH + 900.0  # fifteen minutes into the simulation: jobs running, faults on


def pytest_configure(config: pytest.Config) -> None:
    # the session-wide check that no process the tests started outlives the run
    if not config.pluginmanager.has_plugin("leftovers"):
        config.pluginmanager.register(leftovers, "leftovers")


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(variable, str(tmp_path / variable.lower()))
    monkeypatch.delenv("NO_COLOR", raising=False)
    # ssh reads the real user's ~/.ssh/config whatever HOME says: no test may
    monkeypatch.setenv("GPUCONSOLE_SSH_CONFIG", os.devnull)


@pytest.fixture
def audit_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own audit log, ``audit.jsonl`` in its temporary folder (not yet made), named
    by ``GPUCONSOLE_AUDIT_LOG`` for the console in this process and the commands it starts."""
    path = tmp_path / "audit.jsonl"
    monkeypatch.setenv(paths.AUDIT_LOG.variable, str(path))
    return path


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def rack() -> SimRack:
    return demo_rack(hosts=6, seed=7, epoch=EPOCH)


@pytest.fixture
def make_app(rack: SimRack, clock: ManualClock) -> Callable[..., GpuConsoleApp]:
    """An app on the demo rack with a fixed clock; it polls only when a test tells it to."""

    def make(**options: object) -> GpuConsoleApp:
        return GpuConsoleApp(
            SimSource(rack, clock), auto_poll=False, background_start=False, **options
        )  # type: ignore[arg-type]

    return make


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A stand-in nvidia-smi directory, and the flag file that makes it hang. Afterwards no
    stand-in hangs on, and none of its tools runs (over ssh, their parents may be gone)."""
    directory = tmp_path / "remote-bin"
    directory.mkdir()
    hang = tmp_path / "hang"
    write_standin_smi(directory, gpus=8, hang_flag=hang)
    yield directory, hang
    hang.unlink(missing_ok=True)
    end_processes_of(directory)


@pytest.fixture
def sshd(tmp_path: Path, standin: tuple[Path, Path]) -> Iterator[Sshd]:
    """A private sshd on 127.0.0.1 whose sessions find the stand-in nvidia-smi first on PATH."""
    path = f"{standin[0]}:{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    server = Sshd(tmp_path / "sshd", env={"PATH": path}).start()
    yield server
    server.kill()


@pytest.fixture
def cpu_torch_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine as a GPU host for recipe runs on its CPU: a stand-in nvidia-smi naming one
    GPU, and the venv's python3 (the one with torch) first on PATH."""
    pytest.importorskip("torch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_standin_smi(bin_dir, gpus=1)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    yield
    end_processes_of(bin_dir)  # the stand-in, and any run the test started that still runs


@pytest.fixture
def slurm() -> Iterator[Slurm]:
    """A real single-node Slurm cluster on 127.0.0.1 (`tests/slurm.py`); its node is this
    machine. CI installs Slurm and must not skip these tests; elsewhere they skip without it."""
    if not slurm_available():
        if os.environ.get("CI"):
            pytest.fail("Slurm (slurmctld, slurmd, slurm-client, munge) is not installed")
        pytest.skip("needs Slurm and munge, run as root")
    yield from running()
