"""What deciding as ssh does costs per connection, against ssh itself, in one run.

    python benchmarks/ssh_connect_cost.py [--rounds 30] [--known-hosts-lines 10000]

Starts a private OpenSSH sshd on 127.0.0.1 and a known_hosts file of N other hosts' lines
plus this server's, then measures, each the median of --rounds:

- `ssh -G` alone (the settings the console asks for);
- the console's plan: `ssh -G` plus the known_hosts files read for the host (no packet sent);
- the console's whole connection: plan, key exchange, host key decided, login, closed;
- the judge: `ssh -o BatchMode=yes HOST true` on the same files (a process, a login, a command).

Prints one JSON line. Needs sshd and ssh-keygen (openssh-server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from sshd import Sshd, _user, keygen  # noqa: E402

from gpuconsole.hosts import ssh  # noqa: E402
from gpuconsole.hosts.inventory import HostDefaults  # noqa: E402


def median_ms(rounds: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--known-hosts-lines", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        server = Sshd(root / "sshd").start()
        try:
            other = " ".join(Path(f"{keygen(root / 'other')}.pub").read_text().split()[:2])
            known = root / "known_hosts"
            lines = [f"gpu{n:05d}.example {other}" for n in range(args.known_hosts_lines)]
            host_key = " ".join(Path(f"{server.host_key}.pub").read_text().split()[:2])
            known.write_text("\n".join([*lines, f"[127.0.0.1]:{server.port} {host_key}"]) + "\n")
            config = root / "config"
            config.write_text(
                f"Host gpu\n  HostName 127.0.0.1\n  Port {server.port}\n  User {_user()}\n"
                f"  IdentityFile {server.client_key}\n  IdentitiesOnly yes\n"
                f"  IdentityAgent none\n  UserKnownHostsFile {known}\n"
            )
            settings = ssh.SshSettings(config_file=config)
            entry = HostDefaults().entry("gpu", "gpu")

            async def connect_once() -> None:
                connection = await ssh.connect(entry, settings)
                connection.close()
                await connection.wait_closed()

            def judge() -> None:
                subprocess.run(
                    ["ssh", "-F", str(config), "-o", "BatchMode=yes", "gpu", "true"],
                    check=True,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                )

            figures = {
                "known_hosts_lines": args.known_hosts_lines + 1,
                "rounds": args.rounds,
                "ssh_G_ms": median_ms(
                    args.rounds,
                    lambda: subprocess.run(
                        ["ssh", "-G", "-F", str(config), "gpu"], check=True, capture_output=True
                    ),
                ),
                "console_plan_ms": median_ms(args.rounds, lambda: ssh._plan(entry, settings)),
                "console_connect_ms": median_ms(args.rounds, lambda: asyncio.run(connect_once())),
                "ssh_batchmode_true_ms": median_ms(args.rounds, judge),
            }
        finally:
            server.kill()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
