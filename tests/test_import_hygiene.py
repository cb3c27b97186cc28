"""Core modules never import Textual: headless commands and scripts stay light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CORE_MODULES = (
    "gpuconsole.model",
    "gpuconsole.limits",
    "gpuconsole.untrusted",
    "gpuconsole.private_files",
    "gpuconsole.global_options",
    "gpuconsole.terminal.plain",
    "gpuconsole.clock",
    "gpuconsole.store",
    "gpuconsole.poller",
    "gpuconsole.summary",
    "gpuconsole.fleet_view",
    "gpuconsole.health",
    "gpuconsole.xid",
    "gpuconsole.telemetry",
    "gpuconsole.telemetry.sim",
    "gpuconsole.telemetry.smi",
    "gpuconsole.telemetry.smi_xml",
    "gpuconsole.telemetry.nvml",
    "gpuconsole.telemetry.kernel_log",
    "gpuconsole.telemetry.containers",
    "gpuconsole.telemetry.local",
    "gpuconsole.telemetry.prometheus",
    "gpuconsole.alerts.config",
    "gpuconsole.alerts.engine",
    "gpuconsole.fleet",
    "gpuconsole.prom.exporter",
    "gpuconsole.prom.rules_export",
    "gpuconsole.prom.grafana",
    "gpuconsole.commands.exporter",
    "gpuconsole.commands.export",
    "gpuconsole.hosts.inventory",
    "gpuconsole.hosts.ssh",
    "gpuconsole.hosts.supervisor",
    "gpuconsole.hosts.source",
    "gpuconsole.hosts.check",
    "gpuconsole.telemetry.wire",
    "gpuconsole.actions.processes",
    "gpuconsole.actions.session",
    "gpuconsole.actions.bundle.live",
    "gpuconsole.actions.verify.checks",
    "gpuconsole.actions.verify.runner",
    "gpuconsole.actions.verify.output",
    "gpuconsole.actions.repair.session",
    "gpuconsole.actions.repair.output",
    "gpuconsole.actions.launch.session",
    "gpuconsole.actions.launch.output",
    "gpuconsole.bench.history",
    "gpuconsole.bench.output",
    "gpuconsole.audit",
    "gpuconsole.jsonout",
    "gpuconsole.cli_output",
    "gpuconsole.cli",
)

PROBE = """
import importlib, sys
importlib.import_module(sys.argv[1])
print(sys.argv[1] in sys.modules)
print(sorted(m for m in sys.modules if m == "textual" or m.startswith("textual.")))
"""


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_does_not_import_textual(module: str) -> None:
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
        [sys.executable, "-c", PROBE, "gpuconsole.app"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "'textual'" in result.stdout.splitlines()[1]


CONSOLE_WITHOUT_SSH = """
import sys
from gpuconsole.app import GpuConsoleApp
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
