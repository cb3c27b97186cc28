"""The console's cost of watching N SSH hosts at 1 Hz, against the naive way, in one run.

    python benchmarks/ssh_fanout.py [--hosts 8,32,128] [--gpus 8] [--warm-up 5] [--seconds 20]

For each N it starts a private OpenSSH sshd on 127.0.0.1 (the hosts are N connections to it)
and measures, over the same window after a warm-up:

- the console: a process holding the console's data path for N hosts (the supervisor with one
  connection and one agent per host, in the agent's simulated mode with --gpus GPUs; a poll of
  every host into the fleet store with the health rules each second); its CPU per host-tick, its
  RSS, and the delay from a reading's time on the host to its arrival in the store;
- the naive way: every second, for every host, `ssh host nvidia-smi --query-gpu=... --format=csv`
  (up to 32 at once; a stand-in nvidia-smi on the far side prints a fixed 8-GPU CSV, so the far
  side costs as little as it can); the CPU of the ssh client processes per host-tick, and how
  many host-ticks it managed per second.

Prints a table, then one JSON line with every figure. Needs sshd and ssh-keygen (openssh-server).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from sshd import Sshd, _user  # noqa: E402

NAIVE_FIELDS = "index,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
NAIVE_ROW = "{i}, 87, 61234, 81559, 64, 512.31"
START_TIMEOUT_S = 240.0
"""Every host's agent started before measuring (each login runs the user's shell rc files)."""
NAIVE_AT_ONCE = 32
"""ssh processes at once in the naive way (a shell loop would run one at a time)."""


def console_role(args: argparse.Namespace) -> None:
    """The measured console process: supervisor + store, one poll per second; prints delays."""
    from gpuconsole.fleet.poller import collect, ingest
    from gpuconsole.fleet.store import FleetStore
    from gpuconsole.hosts.inventory import HostDefaults
    from gpuconsole.hosts.source import SshSource
    from gpuconsole.hosts.ssh import SshSettings
    from gpuconsole.hosts.supervisor import Supervisor

    home = Path(args.home)
    defaults = HostDefaults(user=_user(), port=args.port, connect_timeout=30.0)
    entries = [defaults.entry(f"host-{i:03d}", "127.0.0.1") for i in range(args.count)]
    sent: dict[tuple[str, float], float] = {}

    def on_reading(host: str, reading: object) -> None:
        sent_at = getattr(reading, "sent_at", None)
        if sent_at is not None:
            sent[(host, reading.snapshot.time)] = sent_at  # type: ignore[attr-defined]

    settings = SshSettings(
        known_hosts=home / ".ssh" / "known_hosts",
        client_keys=(home / ".ssh" / "id_ed25519",),
        config_files=(),
    )
    supervisor = Supervisor(
        entries, settings, interval=1.0, agent_mode="sim", agent_gpus=args.gpus,
        on_reading=on_reading,
    )  # fmt: skip
    source = SshSource(supervisor)
    store = FleetStore(source.hosts)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and not all(
        supervisor.link(e.name).latest is not None for e in entries
    ):
        time.sleep(0.5)
    print("ready", flush=True)
    delays: list[float] = []
    end = time.monotonic() + args.warm_up + args.seconds
    next_tick = time.monotonic()
    while time.monotonic() < end:
        readings = collect(source)
        ingest(store, readings)
        arrived = time.time()
        for reading in readings:
            if reading.snapshot is not None:
                sent_at = sent.pop((reading.host, reading.snapshot.time), None)
                if sent_at is not None:
                    delays.append(arrived - sent_at)
        next_tick += 1.0
        time.sleep(max(0.0, next_tick - time.monotonic()))
    live = sum(store.status(h).state.value == "live" for h in store.hosts)
    print(json.dumps({"delays": delays, "live": live}), flush=True)
    source.close()


def measure_console(server: Sshd, count: int, args: argparse.Namespace) -> dict[str, float]:
    child = subprocess.Popen(
        [
            sys.executable, __file__, "--role", "console", "--home", str(server.home),
            "--port", str(server.port), "--count", str(count), "--gpus", str(args.gpus),
            "--warm-up", str(args.warm_up), "--seconds", str(args.seconds),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        raise SystemExit("the console process did not get ready")
    watched = psutil.Process(child.pid)
    time.sleep(args.warm_up)
    before = watched.cpu_times()
    time.sleep(args.seconds)
    after = watched.cpu_times()
    rss = watched.memory_info().rss
    result = json.loads(child.stdout.readline())
    child.wait()
    cpu = (after.user - before.user) + (after.system - before.system)
    delays = sorted(result["delays"])
    return {
        "cpu_pct_of_core": 100 * cpu / args.seconds,
        "cpu_ms_per_host_tick": 1000 * cpu / (count * args.seconds),
        "rss_mib": rss / 2**20,
        "delay_ms_median": 1000 * statistics.median(delays) if delays else float("nan"),
        "delay_ms_p95": 1000 * delays[int(0.95 * (len(delays) - 1))] if delays else float("nan"),
        "live_hosts": result["live"],
    }


def measure_naive(server: Sshd, count: int, args: argparse.Namespace) -> dict[str, float]:
    """One `ssh … nvidia-smi` per host per second (all hosts of a tick at once)."""
    command = [
        "ssh", "-F", "/dev/null", "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={server.known_hosts}", "-i", str(server.client_key),
        "-p", str(server.port), f"{_user()}@127.0.0.1",
        f"nvidia-smi --query-gpu={NAIVE_FIELDS} --format=csv,noheader,nounits",
    ]  # fmt: skip

    def one() -> bool:
        try:
            done = subprocess.run(command, capture_output=True, timeout=10, check=False)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0 and done.stdout.count(b"\n") == args.gpus

    with ThreadPoolExecutor(max_workers=min(count, NAIVE_AT_ONCE)) as pool:
        end_warm = time.monotonic() + args.warm_up
        while time.monotonic() < end_warm:
            list(pool.map(lambda _: one(), range(count)))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        ok = 0
        next_tick = start
        while time.monotonic() - start < args.seconds:
            ok += sum(pool.map(lambda _: one(), range(count)))
            next_tick += 1.0
            time.sleep(max(0.0, next_tick - time.monotonic()))
        elapsed = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "cpu_pct_of_core": 100 * cpu / elapsed,
        "cpu_ms_per_host_tick": 1000 * cpu / max(ok, 1),
        "host_ticks_per_s": ok / elapsed,
    }


def standin_smi(directory: Path, gpus: int) -> Path:
    """A shell nvidia-smi that prints a fixed CSV: the cheapest far side there can be."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    rows = "\n".join(NAIVE_ROW.format(i=i) for i in range(gpus))
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{rows}\nEOF\n")
    script.chmod(0o755)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="8,32,128")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--warm-up", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "console":
        console_role(args)
        return 0
    counts = [int(n) for n in args.hosts.split(",")]
    figures: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        bin_dir = standin_smi(Path(scratch) / "bin", args.gpus)
        python_dir = os.path.dirname(sys.executable)
        path = f"{bin_dir}:{python_dir}:/usr/local/bin:/usr/bin:/bin"
        server = Sshd(Path(scratch) / "sshd", env={"PATH": path}).start()
        try:
            for count in counts:
                console = measure_console(server, count, args)
                naive = measure_naive(server, count, args)
                figures[str(count)] = {"console": console, "naive": naive}
                ratio = naive["cpu_ms_per_host_tick"] / console["cpu_ms_per_host_tick"]
                print(
                    f"{count:4d} hosts: console {console['cpu_pct_of_core']:5.1f} % of a core, "
                    f"{console['cpu_ms_per_host_tick']:.3f} ms/host-tick, "
                    f"RSS {console['rss_mib']:.0f} MiB, delay median "
                    f"{console['delay_ms_median']:.0f} ms p95 {console['delay_ms_p95']:.0f} ms, "
                    f"{console['live_hosts']:.0f} live | naive {naive['cpu_pct_of_core']:5.1f} %, "
                    f"{naive['cpu_ms_per_host_tick']:.2f} ms/host-tick, "
                    f"{naive['host_ticks_per_s']:.1f} host-ticks/s | naive/console {ratio:.0f}x",
                    flush=True,
                )
        finally:
            server.kill()
    print(json.dumps({"gpus": args.gpus, "seconds": args.seconds, "figures": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
