"""`gpuconsole exporter` under a burst of scrapes: N scrapers connect at the same instant.

    python benchmarks/exporter_scrapers.py [--scrapers 200] [--rounds 5] [--timeout 10]
        [--root DIR]

Starts ``gpuconsole exporter --demo`` (six simulated hosts) from the checkout at ``--root``
(default: this one; give another checkout to measure it) on 127.0.0.1, in a process of its own,
and waits for its first readings. Each round, ``--scrapers`` threads wait on a barrier, then each
opens a connection and GETs /metrics with ``--timeout`` seconds for the whole request (10 s is
Prometheus's default scrape_timeout). A connection the listen backlog had no room for waits for
the kernel's SYN retry (1 s, then 3 s, 7 s ...), so a small backlog shows as scrapes that take a
second or more, or time out.

Prints, over all rounds: scrapes that succeeded, timed out, failed otherwise; the time to connect
(p50, max, how many took over 1 s: the backlog's doing) and for the whole scrape (p50, p99, max,
over 1 s: the backlog and the server's CPU). Then one JSON line with every figure. Loopback only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
READY_S = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


Result = tuple[str, float, float]
"""("ok" | "timeout" | "error: ...", seconds to connect, seconds for the whole scrape)."""


def scrape(port: int, timeout: float) -> Result:
    """One GET /metrics, ``timeout`` seconds for all of it (connect, request, response)."""
    start = time.perf_counter()
    connected = float("nan")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.connect()
        connected = time.perf_counter() - start
        connection.sock.settimeout(max(0.001, timeout - connected))
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        response.read()
        outcome = "ok" if response.status == 200 else f"error: HTTP {response.status}"
    except TimeoutError:
        outcome = "timeout"
    except OSError as error:
        outcome = f"error: {error}"
    finally:
        connection.close()
    return outcome, connected, time.perf_counter() - start


def burst(port: int, scrapers: int, timeout: float) -> list[Result]:
    barrier = threading.Barrier(scrapers)
    results: list[Result] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait()
        result = scrape(port, timeout)
        with lock:
            results.append(result)

    threads = [threading.Thread(target=one) for _ in range(scrapers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def wait_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the exporter exited with {process.returncode}")
        if scrape(port, 2.0)[0] == "ok":
            return
        time.sleep(0.2)
    raise SystemExit(f"the exporter did not answer within {READY_S:.0f} s")


def _quantile(values: list[float], share: float) -> float | None:
    return round(values[int(share * (len(values) - 1))], 3) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--scrapers", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout to run")
    args = parser.parse_args()
    port = free_port()
    command = [sys.executable, "-m", "gpuconsole", "exporter", "--demo"]
    command += ["--address", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(args.root.resolve())}
    process = subprocess.Popen(command, cwd=args.root, env=env, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, process)
        results = [r for _ in range(args.rounds) for r in burst(port, args.scrapers, args.timeout)]
    finally:
        process.terminate()
        process.wait(timeout=30)
    outcomes = [outcome for outcome, _, _ in results]
    latencies = sorted(seconds for outcome, _, seconds in results if outcome == "ok")
    connects = sorted(seconds for _, seconds, _ in results if seconds == seconds)  # not NaN
    figures = {
        "root": str(args.root),
        "scrapers": args.scrapers,
        "rounds": args.rounds,
        "timeout_s": args.timeout,
        "scrapes": len(results),
        "ok": outcomes.count("ok"),
        "timed_out": outcomes.count("timeout"),
        "failed": len(results) - outcomes.count("ok") - outcomes.count("timeout"),
        "not_connected": len(results) - len(connects),
        "connect_over_1s": sum(seconds > 1.0 for seconds in connects),
        "connect_p50_s": _quantile(connects, 0.5),
        "connect_max_s": _quantile(connects, 1.0),
        "over_1s": sum(seconds > 1.0 for seconds in latencies),
        "p50_s": _quantile(latencies, 0.5),
        "p99_s": _quantile(latencies, 0.99),
        "max_s": _quantile(latencies, 1.0),
    }
    for key, value in figures.items():
        print(f"{key:>10}: {value}")
    errors = sorted({o for o in outcomes if o.startswith("error")})
    if errors:
        print(f"    errors: {errors[:5]}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
