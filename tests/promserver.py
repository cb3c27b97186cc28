"""A private Prometheus server on 127.0.0.1 for tests and benchmarks, and the promtool checks.

Each instance keeps its storage in its own directory, listens on a free loopback port, scrapes
the given targets at a short interval and is killed by `stop`. Both binaries come from Debian's
`prometheus` package (installed by `.ci/run`).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def prometheus_available() -> bool:
    return Path(PROMETHEUS).exists()


def promtool_available() -> bool:
    return Path(PROMTOOL).exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=120
    )


class Prometheus:
    """One Prometheus server scraping ``targets`` (host:port) every ``interval`` seconds.

    Each scrape may take the whole interval: a scrape that times out marks every series of its
    target stale at once, so a slow exporter would make readings vanish between two scrapes.
    """

    def __init__(
        self,
        directory: Path,
        targets: Sequence[str],
        *,
        interval: float = 1.0,
        rule_files: Sequence[Path] = (),
        job: str = "gpus",
    ) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = directory / "prometheus.yml"
        self.config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {
                        "scrape_interval": f"{interval:g}s",
                        "scrape_timeout": f"{interval:g}s",
                        "evaluation_interval": f"{interval:g}s",
                    },
                    "rule_files": [str(path) for path in rule_files],
                    "scrape_configs": [
                        {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                    ],
                },
                indent=2,
            )
        )
        self._process: subprocess.Popen[bytes] | None = None
        self.log = directory / "prometheus.log"

    def start(self, timeout: float = 60.0) -> Prometheus:
        self._process = start_until_ready(
            "prometheus",
            [
                PROMETHEUS,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            self.log,
            self.url,
            timeout,
            poll=0.2,
        )
        return self

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of Prometheus's answer to ``GET /api/v1/{path}?{params}``."""
        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.loads(response.read())["data"]

    def query(self, promql: str) -> list[dict[str, object]]:
        return self.api("query", query=promql)["result"]

    def alerts(self) -> list[dict[str, object]]:
        """Every alert of the loaded rules that is pending or firing."""
        return self.api("alerts")["alerts"]

    def wait_for(self, promql: str, count: int = 1, timeout: float = 60.0) -> list[dict]:
        """Poll ``promql`` until it returns at least ``count`` samples."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if len(result) >= count:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{promql!r}: {len(result)} samples, wanted {count}")
            time.sleep(0.3)

    def stop(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        self._process = None


def start_until_ready(
    name: str,
    argv: list[str],
    log: Path,
    url: str,
    timeout: float,
    poll: float,
    *,
    append: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with its output in ``log`` and wait until ``url``/-/ready answers 200
    (Prometheus and Alertmanager both serve it). RuntimeError with the log's tail when it exits
    first; when it is not ready within ``timeout`` it is killed and RuntimeError says so."""
    with log.open("ab" if append else "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return process
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(poll)
    process.kill()
    process.wait(timeout=30)
    raise RuntimeError(f"{name} not ready within {timeout:.0f} s")
