"""The layers hold: the static import graph keeps the contracts in pyproject.toml (lint-imports),
and at run time the entry point and each command module load no Textual until a command that
shows a screen runs."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpuconsole.cli.commands

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
ENTRY_MODULES = (
    "gpuconsole.cli.main",
    *(
        f"gpuconsole.cli.commands.{m.name}"
        for m in pkgutil.iter_modules(gpuconsole.cli.commands.__path__)
    ),
)
"""What `gpuconsole SUBCOMMAND` imports before it runs: the static contracts cannot speak for
them (they import the app inside the console's runner), so they are probed at run time."""

PROBE = """
import importlib, sys
importlib.import_module(sys.argv[1])
print(sys.argv[1] in sys.modules)
print(sorted(m for m in sys.modules if m == "textual" or m.startswith("textual.")))
"""


def test_the_import_contracts_hold() -> None:
    result = subprocess.run(
        [str(LINT_IMPORTS)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_broken_contract_fails_lint_imports(tmp_path: Path) -> None:
    """The check can fail: the app does import Textual."""
    config = tmp_path / "contracts.ini"
    config.write_text(
        "[importlinter]\nroot_package = gpuconsole\ninclude_external_packages = True\n\n"
        "[importlinter:contract:probe]\nname = probe\ntype = forbidden\n"
        "source_modules = gpuconsole.ui.app\nforbidden_modules = textual\n"
    )
    result = subprocess.run(
        [str(LINT_IMPORTS), str(config)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0
    assert "BROKEN" in result.stdout


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_a_command_module_loads_no_textual_until_it_runs(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    imported, textual = result.stdout.splitlines()
    assert imported == "True"
    assert textual == "[]", f"{module} pulls in {textual}"


def test_probe_detects_textual() -> None:
    """The probe itself can fail: the app module does import Textual."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "gpuconsole.ui.app"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "'textual'" in result.stdout.splitlines()[1]


CONSOLE_WITHOUT_SSH = """
import sys
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.hosts.source import FleetSource
from gpuconsole.telemetry.local import local_source
from gpuconsole.telemetry.sim import SimSource
print(sorted(m for m in ("asyncssh", "cryptography", "prometheus_client") if m in sys.modules))
"""


def test_the_console_without_ssh_hosts_loads_no_ssh_library() -> None:
    """The demo and a lone local host never load asyncssh and cryptography (about 0.3 s of
    start-up and megabytes of RSS), nor the Prometheus client."""
    result = subprocess.run(
        [sys.executable, "-c", CONSOLE_WITHOUT_SSH], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


CONSOLE_START = """
import sys
import gpuconsole.cli.main
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.telemetry.local import local_source
print(sorted(m for m in ("urllib.request", "http.client", "email.parser") if m in sys.modules))
"""


def test_the_console_loads_the_http_client_only_to_send_or_query() -> None:
    """Every subcommand's options and the console itself load without Python's HTTP client
    (urllib.request with http.client and email, 23 modules): it loads with the first alert
    sent to Alertmanager or the first query of Prometheus."""
    result = subprocess.run(
        [sys.executable, "-c", CONSOLE_START], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


LATER = {
    "psutil": "signalling a process, or the first reading of this host (its XIDs' boot time)",
    "tomllib": "reading an inventory file",
    "secrets": "nothing: a temporary file's name takes os.urandom",
    "hashlib": "the demo's simulated rack, or an SSH host's known hosts",
    "gpuconsole.fleet.alerts.alertmanager": "an Alertmanager to send to",
}
"""Modules the console's first screen does not draw with, and what loads each."""

CONSOLE_FIRST_SCREEN = """
import sys
import gpuconsole.cli.main
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.telemetry.local import local_source
from gpuconsole.telemetry.nvml import NvmlSource
print(" ".join(sorted(m for m in sys.argv[1:] if m in sys.modules)))
"""


def test_the_console_loads_at_start_only_what_its_first_screen_draws() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CONSOLE_FIRST_SCREEN, *LATER],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    assert not loaded, {module: LATER[module] for module in loaded}
