"""Where the console's first frame goes: the stages from the interpreter's start to the first
painted screen, on this host's GPUs (NVML, else nvidia-smi), else on the demo rack.

    python benchmarks/startup_stages.py [--demo] [--profile N]

Stages, each in seconds since the process was started (the script runs itself as a child and
hands it the moment it started it):

- ``interpreter``: Python itself up, before the first import of gpuconsole;
- ``cli``: `gpuconsole.cli.main` imported (what every subcommand pays);
- ``app``: `gpuconsole.ui.app` imported (Textual and the screens);
- ``source``: the local source made (NVML initialised, its devices found);
- ``constructed``: the `GpuConsoleApp` made;
- ``first_frame``: the fleet screen painted once (headless: compositing, no terminal).

``--profile N`` prints the N functions with the most cumulative time (cProfile) over the same
start. The pty-measured first frame (`console_cost.py`) adds the terminal's writes to these.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

STARTED_ENV = "STARTUP_STAGES_STARTED"
REPO = Path(__file__).resolve().parent.parent


def since_start() -> float:
    return round(time.time() - float(os.environ[STARTED_ENV]), 3)


def stages(demo: bool) -> dict[str, float]:
    marks = {"interpreter": since_start()}
    import gpuconsole.cli.main  # noqa: F401

    marks["cli"] = since_start()
    from gpuconsole.ui.app import GpuConsoleApp

    marks["app"] = since_start()
    from gpuconsole.telemetry import Source, SourceError

    source: Source
    try:
        if demo:
            raise SourceError("the demo was asked for")
        from gpuconsole.telemetry.local import local_source

        source = local_source()
    except SourceError:
        from gpuconsole.core.clock import wall_clock
        from gpuconsole.telemetry.sim import SimSource, demo_rack

        source = SimSource(demo_rack(epoch=wall_clock() - 900), wall_clock)
    marks["source"] = since_start()
    app = GpuConsoleApp(source)
    marks["constructed"] = since_start()

    def painted() -> None:
        marks["first_frame"] = since_start()
        app.exit()

    app.call_after_refresh(painted)
    app.run(headless=True, size=(160, 48))
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.child:
        command = [sys.executable, __file__, "--child", *sys.argv[1:]]
        # The checkout's own package, installed or not: the child's path starts at the repository.
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, STARTED_ENV: repr(time.time())}
        raise SystemExit(subprocess.run(command, env=env).returncode)
    if not args.profile:
        print(json.dumps(stages(args.demo)))
        return
    import cProfile
    import pstats

    profile = cProfile.Profile()
    marks = profile.runcall(stages, args.demo)
    print(json.dumps(marks))
    pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    main()
