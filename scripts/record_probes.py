"""Record what every verification probe prints on this host, as a fixture for the judges' tests.

    python scripts/record_probes.py OUT.json

Runs each distinct probe of every check once (as `gpuconsole verify` does) and writes
{probe name: {command, exit_code, stdout, stderr}}. Tests load such a file from a real host and
judge it, so that a check's verdict on real output stays what it was there.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path

from gpuconsole.actions.shell import LocalShell
from gpuconsole.actions.verify.checks import CHECKS
from gpuconsole.actions.verify.runner import distinct_probes, run_probes


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    outputs = asyncio.run(run_probes(LocalShell(), distinct_probes(CHECKS)))
    record = {name: asdict(output) for name, output in outputs.items()}
    Path(sys.argv[1]).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
