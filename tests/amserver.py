"""A private Alertmanager on 127.0.0.1 for tests, and amtool to ask it what it holds.

Each instance keeps its storage (silences, the notification log) in its own directory, listens
on a free loopback port with clustering off, routes every alert to a receiver that notifies no
one, and is killed by `kill` (SIGKILL: what it held in memory, its alerts, is gone). Both
binaries come from Debian's `prometheus-alertmanager` package (installed by `.ci/run`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from promserver import free_port, start_until_ready

ALERTMANAGER = (
    shutil.which("prometheus-alertmanager")
    or shutil.which("alertmanager")
    or "/usr/bin/prometheus-alertmanager"
)
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"


def alertmanager_available() -> bool:
    return Path(ALERTMANAGER).exists() and Path(AMTOOL).exists()


def require_alertmanager() -> None:
    """Skip where Alertmanager is not installed; CI installs it and must not skip."""
    if alertmanager_available():
        return
    if os.environ.get("CI"):
        pytest.fail("prometheus-alertmanager (Alertmanager and amtool) is not installed")
    pytest.skip("needs Alertmanager and amtool (Debian package prometheus-alertmanager)")


class Alertmanager:
    """One Alertmanager; `start` again after `kill` brings it back on the same port and
    storage, empty of alerts as a restarted Alertmanager is."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = directory / "alertmanager.yml"
        self.config.write_text(  # JSON is YAML
            json.dumps({"route": {"receiver": "nobody"}, "receivers": [{"name": "nobody"}]})
        )
        self.log = directory / "alertmanager.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Alertmanager:
        self._process = start_until_ready(
            "alertmanager",
            [
                ALERTMANAGER,
                f"--config.file={self.config}",
                f"--storage.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            self.log,
            self.url,
            timeout,
            poll=0.1,
            append=True,
        )
        return self

    def kill(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        self._process = None

    def amtool(self, *args: str) -> list[dict[str, object]]:
        """``amtool ARGS -o json`` against this Alertmanager, decoded."""
        result = subprocess.run(
            [AMTOOL, *args, f"--alertmanager.url={self.url}", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def alerts(self, *matchers: str) -> list[dict[str, object]]:
        """The active alerts (amtool's default: not silenced, not inhibited) that match."""
        return self.amtool("alert", "query", *matchers)

    def every_alert(self) -> list[dict[str, object]]:
        """What ``GET /api/v2/alerts`` holds: active, silenced and inhibited alerts."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as response:
            return json.loads(response.read())

    def silences(self) -> list[dict[str, object]]:
        return self.amtool("silence", "query")

    def received(self, status: str) -> float:
        """How many ``firing`` or ``resolved`` alerts the API has taken since the start
        (``alertmanager_alerts_received_total``): what each POST brought, counted by the
        Alertmanager itself."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        wanted = f'alertmanager_alerts_received_total{{status="{status}",version="v2"}} '
        return next(
            float(line[len(wanted) :]) for line in text.splitlines() if line.startswith(wanted)
        )

    def wait_for(
        self,
        ask: Callable[[], list[dict[str, object]]],
        until: Callable[[list[dict[str, object]]], bool],
        timeout: float = 30.0,
    ) -> list[dict[str, object]]:
        """Ask (``alerts``, say) until ``until`` holds of the answer; the answer."""
        deadline = time.monotonic() + timeout
        while True:
            answer = ask()
            if until(answer):
                return answer
            if time.monotonic() > deadline:
                raise TimeoutError(f"after {timeout:g} s Alertmanager holds {answer!r}")
            time.sleep(0.1)
