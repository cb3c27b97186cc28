"""A hostile host watched over a real sshd: what its users and its driver send stays data.

The host's nvidia-smi (a stand-in first on the session's PATH) names GPUs with escape sequences
and reports impossible values; one of its users runs a process whose command line holds an OSC
52, a window title, a screen clear and a newline that would forge a line. The console's model,
the console's screen in a pseudo-terminal (both renderers) and the subcommands' printed output
are scanned: nothing but the console's own escape sequences reaches the terminal.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import GPUCONSOLE, gpuconsole
from hostile import (
    CLEAR,
    HOSTILE_SMI_FIELDS,
    TITLE,
    UNENDING,
    foreign_sequences,
    plain_output_faults,
    run_in_pty,
    start_hostile_process,
    unsafe_texts,
)
from sshd import Sshd, sshd_available, user_env
from standin import write_standin_smi

from gpuconsole.core.model import HostSnapshot
from gpuconsole.hosts.inventory import HostDefaults
from gpuconsole.hosts.source import SshSource
from gpuconsole.hosts.supervisor import Backoff, Supervisor
from gpuconsole.rules.health import evaluate
from gpuconsole.ui.terminal import PLAIN_OUTPUT_ENV

needs_sshd = pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")

ROOT = Path(__file__).resolve().parent.parent
XDG_DIRS = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")


@pytest.fixture
def hostile_sshd(tmp_path: Path) -> Iterator[Sshd]:
    """A private sshd whose sessions find the hostile nvidia-smi first on PATH, with the hostile
    process running and listed on GPU 0."""
    bin_dir = tmp_path / "hostile-bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "hostile.pid"
    write_standin_smi(bin_dir, hostile_fields=HOSTILE_SMI_FIELDS, hostile_pid_file=pid_file)
    job = start_hostile_process(pid_file)
    path = f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    server = Sshd(tmp_path / "sshd", env={"PATH": path}).start()
    server.ssh_config(["gpu-test"])
    yield server
    server.kill()
    job.kill()
    job.wait()


def _env(server: Sshd, tmp_path: Path) -> dict[str, str]:
    env = {
        **user_env(server.home),
        "TERM": "xterm-256color",
        "COLORTERM": "truecolor",
        "LANG": "C.UTF-8",
        **{name: str(tmp_path / name.lower()) for name in XDG_DIRS},
    }
    for name in ("SSH_AUTH_SOCK", "NO_COLOR", PLAIN_OUTPUT_ENV, "TEXTUAL_DRIVER"):
        env.pop(name, None)
    return env


def _read(server: Sshd) -> HostSnapshot:
    settings = server.settings(keepalive_interval=1.0, keepalive_count_max=2)
    user = server.home.owner()
    host = HostDefaults(user=user, port=server.port, connect_timeout=5.0).entry(
        "gpu-test", "127.0.0.1"
    )
    supervisor = Supervisor(
        [host], settings, interval=0.3, agent_mode="smi", backoff=Backoff(0.2, 1.0)
    )
    source = SshSource(supervisor)
    try:
        source.settle(20)
        link = supervisor.link("gpu-test")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pending = link.pending
            if pending is not None and any(
                "hostile" in (p.command or "") for p in pending.processes
            ):
                break
            time.sleep(0.1)
        return source.read("gpu-test")
    finally:
        source.close()


@needs_sshd
def test_the_hostile_hosts_readings_are_data(hostile_sshd: Sshd) -> None:
    snapshot = _read(hostile_sshd)
    assert unsafe_texts(snapshot) == []
    gpus = {g.index: g for g in snapshot.gpus}
    assert "␛]0;owned␇" in (gpus[0].name or "") and "␛[2J" in (gpus[0].name or "")
    assert "␛]52;c;" in (gpus[1].name or "")
    assert gpus[3].temperature_c is None  # 100000 °C
    assert gpus[4].memory_used_mib is None  # -5 MiB
    assert gpus[5].ecc is None or gpus[5].ecc.volatile_uncorrected is None  # ECC -5
    assert 7 not in gpus and max(gpus) < 1024  # GPU index 10**18
    assert snapshot.bad_values >= 4
    (job,) = [p for p in snapshot.processes if "hostile-job" in (p.command or "")]
    assert "␛]52;c;SE9TVElMRQ==␛\\" in (job.command or "")
    assert "ok␊CRIT GPU 0 forged line" in (job.command or "")
    codes = {f.code for f in evaluate(snapshot)}
    assert "bad-value-from-host" in codes
    assert "ecc-uncorrectable" not in codes  # -5 uncorrectable errors is not a finding


@needs_sshd
@pytest.mark.parametrize("plain", [False, True], ids=["cell-diffing", "textual-plain"])
def test_the_console_writes_none_of_it_to_the_terminal(
    hostile_sshd: Sshd, tmp_path: Path, plain: bool
) -> None:
    env = _env(hostile_sshd, tmp_path)
    if plain:
        env[PLAIN_OUTPUT_ENV] = "1"
    keys = [(12.0, b"\r"), (15.0, b"\t"), (17.0, b"t"), (19.0, b"\x1b"), (20.0, b"\x1b")]
    keys += [(21.0, b"T"), (23.0, b"\x1b"), (24.0, b"q")]
    output, screen = run_in_pty([*GPUCONSOLE, "--hosts", "gpu-test"], env, keys, cwd=ROOT)
    assert b"gpu-test" in output, output[-2000:]
    assert foreign_sequences(output) == []
    shown = "\n".join(screen.display)
    assert "gpu-test" in shown, shown  # the last screen drawn, the fleet, names the host
    assert b"\x1b[?1049l" in output  # and `q` left the alternate screen, as a console quits
    # The host screen showed the hostile names as visible text: ␛ where the ESC was.
    assert "␛]0;owned".encode() in output or "␛]52".encode() in output


@needs_sshd
def test_subcommands_print_it_as_visible_text(hostile_sshd: Sshd, tmp_path: Path) -> None:
    env = _env(hostile_sshd, tmp_path)
    runs = {
        "snapshot": ["snapshot", "--hosts", "gpu-test", "--host", "gpu-test"],
        "snapshot --json": ["snapshot", "--json", "--hosts", "gpu-test", "--host", "gpu-test"],
        "hosts check": ["hosts", "check", "--hosts", "gpu-test"],
    }
    for what, args in runs.items():
        done = gpuconsole(*args, env=env, timeout=90)
        assert done.returncode in (0, 1, 2), (what, done.stderr)
        assert plain_output_faults(done.stdout + done.stderr) == [], what
        if what == "snapshot":
            assert "␛]0;owned␇" in done.stdout
            (line,) = [line for line in done.stdout.splitlines() if "hostile-job" in line]
            assert "forged line" in line  # on the process's own line, not a line of its own
        if what == "snapshot --json":
            data = json.loads(done.stdout)
            assert unsafe_texts(data) == []
            assert data["bad_values"] >= 4


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_triage_of_a_doctored_dump_prints_it_as_visible_text(tmp_path: Path, as_json: bool) -> None:
    """A `-q` dump from a ticket whose driver version (printed by triage) and GPU name hold a
    title, a screen clear and an OSC that never ends (XML cannot hold these characters; `-q`
    text can)."""
    real = (ROOT / "tests" / "fixtures" / "nvidia-smi" / "h200-q-loaded.txt").read_text()
    doctored = tmp_path / "ticket-1234.txt"
    doctored.write_text(
        real.replace(": 580.159.04\n", f": 580.159.04{TITLE}{CLEAR}{UNENDING}\n", 1).replace(
            ": NVIDIA H200\n", f": NVIDIA H200{TITLE}{CLEAR}\n", 1
        )
    )
    args = ["triage", "--from", str(doctored), *(["--json"] if as_json else [])]
    done = gpuconsole(*args)
    assert done.returncode in (0, 1, 2), done.stderr
    assert plain_output_faults(done.stdout + done.stderr) == []
    shown = json.loads(done.stdout)["driver_version"] if as_json else done.stdout
    assert "580.159.04␛]0;owned␇␛[2J" in shown
