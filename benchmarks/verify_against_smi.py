"""Check the console's local readings against nvidia-smi on a real GPU host, idle and under load.

    python benchmarks/verify_against_smi.py [--load-seconds 40] [--load-gib 8]

Reads every GPU with `gpuconsole snapshot --json` (a subprocess, as a user would run it) and with
`nvidia-smi --query-gpu` / `--query-compute-apps` at the same moment, first idle, then while a
torch matrix-multiply load (a child process holding --load-gib GiB) runs on GPU 0. Tolerances:
utilization within 5 points, memory exact in MiB (±1 for rounding), temperature within 2 °C,
power within 5 %, and the load's process found with its memory. Prints one line per check and
exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMI_FIELDS = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
# (what, snapshot field, nvidia-smi column, allowed difference for nvidia-smi's value)
TOLERANCES = (
    ("utilization %", "utilization_pct", "util", lambda _: 5),
    ("memory used MiB", "memory_used_mib", "used", lambda _: 1),
    ("memory total MiB", "memory_total_mib", "total", lambda _: 1),
    ("temperature °C", "temperature_c", "temp", lambda _: 2),
    ("power W", "power_w", "power", lambda watts: max(0.05 * watts, 1.0)),
)
LOAD = """
import sys, time, torch
gib, seconds = float(sys.argv[1]), float(sys.argv[2])
hold = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("loaded", flush=True)
end = time.time() + seconds
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""


def console_snapshot() -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    if out.returncode not in (0, 1, 2):
        raise SystemExit(f"gpuconsole snapshot failed ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout)


def smi_gpus() -> list[dict]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in out.stdout.strip().splitlines():
        index, uuid, util, used, total, temp, power = (v.strip() for v in line.split(","))
        rows.append(
            {
                "index": int(index),
                "uuid": uuid,
                "util": float(util),
                "used": float(used),
                "total": float(total),
                "temp": float(temp),
                "power": float(power),
            }
        )
    return rows


def smi_apps() -> dict[int, float]:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    )
    apps = {}
    for line in out.stdout.strip().splitlines():
        if line.strip():
            pid, used = (v.strip() for v in line.split(","))
            apps[int(pid)] = float(used)
    return apps


def compare(phase: str, ours: dict, theirs: list[dict], load_pid: int | None) -> list[str]:
    failures = []

    def check(name: str, ok: bool, detail: str) -> None:
        print(f"{phase:5} {'ok  ' if ok else 'FAIL'} {name}: {detail}")
        if not ok:
            failures.append(f"{phase} {name}")

    gpus = {g["index"]: g for g in ours["gpus"]}
    for smi in theirs:
        g = gpus[smi["index"]]
        i = smi["index"]
        check(f"GPU {i} uuid", g["uuid"] == smi["uuid"], f"{g['uuid']} vs {smi['uuid']}")
        for name, field, key, tolerance in TOLERANCES:
            ours_value, theirs_value = g[field], smi[key]
            ok = ours_value is not None and abs(ours_value - theirs_value) <= tolerance(
                theirs_value
            )
            check(f"GPU {i} {name}", ok, f"{ours_value} vs {theirs_value}")
    if load_pid is not None:
        apps = smi_apps()
        mine = {p["pid"]: p for p in ours["processes"]}
        found = mine.get(load_pid)
        check(
            "load process",
            found is not None
            and abs((found["used_memory_mib"] or 0) - apps.get(load_pid, -1)) <= 2,
            f"pid {load_pid}: ours {found and found['used_memory_mib']} MiB, "
            f"nvidia-smi {apps.get(load_pid)} MiB, command {found and found['command']!r}",
        )
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-seconds", type=float, default=40.0)
    parser.add_argument("--load-gib", type=float, default=8.0)
    args = parser.parse_args()
    failures = compare("idle", console_snapshot(), smi_gpus(), None)
    load = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(args.load_gib), str(args.load_seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert load.stdout is not None
        load.stdout.readline()
        time.sleep(5)  # let utilization and power settle under the load
        ours = console_snapshot()
        failures += compare("load", ours, smi_gpus(), load.pid)
    finally:
        load.kill()
        load.wait()
    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
