"""A stand-in ``nvidia-smi`` for tests on machines without NVIDIA's: `write_standin_smi`.

It answers the calls gpuconsole makes, in nvidia-smi's formats (as the fixtures captured on an
H200 show them): the summary table's header, ``--query-gpu`` and ``--query-compute-apps`` as CSV
(with or without header and units), ``topo -m`` and ``-lms`` streaming. Values are synthetic,
H200-like and vary with time. While the hang flag file exists it hangs, as nvidia-smi does on a
GPU that fell off the bus. It imports only the standard library, so it starts in milliseconds.

Its processes are its parent (the caller, so that /proc has something real to say) on GPU 0
and, where there is a second GPU, a pid that cannot exist (above Linux's highest pid) on GPU 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

MISSING_PID = 4_194_305
"""Above PID_MAX_LIMIT (2^22): no process can have it."""

_SCRIPT = r"""#!{python} -IS
import math
import os
import sys
import time

GPUS = {gpus}
SEED = {seed}
HANG_FLAG = {hang_flag!r}
MISSING_PID = {missing_pid}
HOSTILE_PID_FILE = {hostile_pid_file!r}
DRIVER, CUDA = "580.159.04", "13.0"
MEMORY_MIB = 143771


def hang_while_flagged():
    while HANG_FLAG and os.path.exists(HANG_FLAG):
        time.sleep(0.05)


def uuid(i):
    return "GPU-%08x-%04x-4c3e-9d1b-%012x" % (SEED, i, 0x5EED00 + i)


def load(i):
    return 0.5 + 0.45 * math.sin(time.time() / 7.0 + i + SEED)


# field -> (unit in the header, value of GPU i)
GPU_FIELDS = {{
    "index": ("", lambda i: str(i)),
    "name": ("", lambda i: "NVIDIA H200"),
    "uuid": ("", uuid),
    "pci.bus_id": ("", lambda i: "00000000:%02X:00.0" % (0x18 + 0x10 * i)),
    "driver_version": ("", lambda i: DRIVER),
    "serial": ("", lambda i: str(1653724055739 + i)),
    "vbios_version": ("", lambda i: "96.00.A5.00.1A"),
    "power.min_limit": ("W", lambda i: "200.00"),
    "power.max_limit": ("W", lambda i: "700.00"),
    "power.default_limit": ("W", lambda i: "700.00"),
    "clocks.applications.graphics": ("MHz", lambda i: "1980"),
    "clocks.applications.memory": ("MHz", lambda i: "3201"),
    "retired_pages.pending": ("", lambda i: "[N/A]"),
    "utilization.gpu": ("%", lambda i: str(round(100 * load(i)))),
    "utilization.memory": ("%", lambda i: str(round(60 * load(i)))),
    "memory.used": ("MiB", lambda i: str(round(MEMORY_MIB * 0.7 * load(i)))),
    "memory.total": ("MiB", lambda i: str(MEMORY_MIB)),
    "temperature.gpu": ("", lambda i: str(round(30 + 40 * load(i)))),
    "power.draw": ("W", lambda i: "%.2f" % (100 + 590 * load(i))),
    "power.limit": ("W", lambda i: "700.00"),
    "clocks.current.sm": ("MHz", lambda i: "1980"),
    "clocks.max.sm": ("MHz", lambda i: "1980"),
    "clocks.current.memory": ("MHz", lambda i: "3201"),
    "clocks.max.memory": ("MHz", lambda i: "3201"),
    "pstate": ("", lambda i: "P0"),
    "fan.speed": ("%", lambda i: "[N/A]"),
    "clocks_event_reasons.active": ("", lambda i: "0x0000000000000004"),
    "ecc.errors.corrected.volatile.total": ("", lambda i: "0"),
    "ecc.errors.uncorrected.volatile.total": ("", lambda i: "0"),
    "ecc.errors.corrected.aggregate.total": ("", lambda i: "0"),
    "ecc.errors.uncorrected.aggregate.total": ("", lambda i: "0"),
    "pcie.link.gen.current": ("", lambda i: "5"),
    "pcie.link.gen.max": ("", lambda i: "5"),
    "pcie.link.width.current": ("", lambda i: "16"),
    "pcie.link.width.max": ("", lambda i: "16"),
    "persistence_mode": ("", lambda i: "Enabled"),
    "compute_mode": ("", lambda i: "Default"),
    "mig.mode.current": ("", lambda i: "Disabled"),
}}


def processes():
    rows = [(os.getppid(), "python3", 0, 1002)]
    if GPUS > 1:
        rows.append((MISSING_PID, "train", 1, 2048))
    if HOSTILE_PID_FILE and os.path.exists(HOSTILE_PID_FILE):
        with open(HOSTILE_PID_FILE) as pid:
            rows.append((int(pid.read()), "\x1b]52;c;SE9TVElMRQ==\x07", 0, 512))
    return rows


# What a hostile or broken host answers instead, GPU by GPU (see tests/hostile.py).
HOSTILE_FIELDS = {hostile_fields!r}
if HOSTILE_FIELDS:
    for _name, _values in HOSTILE_FIELDS.items():
        _unit, _plain = GPU_FIELDS[_name]
        GPU_FIELDS[_name] = (_unit, lambda i, v=_values, p=_plain: v.get(str(i)) or p(i))


APP_FIELDS = {{
    "pid": ("", lambda p: str(p[0])),
    "process_name": ("", lambda p: p[1]),
    "gpu_uuid": ("", lambda p: uuid(p[2])),
    "gpu_bus_id": ("", lambda p: GPU_FIELDS["pci.bus_id"][1](p[2])),
    "used_gpu_memory": ("MiB", lambda p: str(p[3])),
    "used_memory": ("MiB", lambda p: str(p[3])),
}}


def csv_text(table, names, items, formats):
    unknown = [name for name in names if name not in table]
    if unknown:
        print('Field "%s" is not a valid field to query.' % unknown[0])
        sys.exit(2)
    lines = []
    if "noheader" not in formats:
        lines.append(", ".join(
            name + (" [%s]" % table[name][0] if table[name][0] else "") for name in names
        ))
    for item in items:
        cells = []
        for name in names:
            unit, value = table[name]
            text = value(item)
            if unit and "nounits" not in formats and not text.startswith("["):
                text += " " + unit
            cells.append(text)
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def topology():
    names = ["GPU%d" % i for i in range(GPUS)]
    lines = ["\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for a in range(GPUS):
        links = ["X" if a == b else "NV18" for b in range(GPUS)]
        node = a * 2 // max(GPUS, 2)
        cpus = "%d-%d" % (node * 48, node * 48 + 47)
        lines.append("GPU%d\t" % a + "\t".join(links) + "\t%s\t%d\t\tN/A" % (cpus, node))
    lines += ["", "Legend:", "", "  X    = Self"]
    lines.append("  NV#  = Connection traversing a bonded set of # NVLinks")
    return "\n".join(lines) + "\n"


def summary():
    rule = "+" + "-" * 89 + "+"
    header = "| NVIDIA-SMI %s             Driver Version: %s     CUDA Version: %s     |" % (
        DRIVER, DRIVER, CUDA
    )
    return "\n".join([rule, header, rule]) + "\n"


def option(args, prefix):
    return next((arg[len(prefix):] for arg in args if arg.startswith(prefix)), None)


def main(args):
    hang_while_flagged()
    if args[:2] == ["topo", "-m"]:
        sys.stdout.write(topology())
        return 0
    formats = (option(args, "--format=") or "").split(",")
    apps = option(args, "--query-compute-apps=")
    if apps is not None:
        sys.stdout.write(csv_text(APP_FIELDS, apps.split(","), processes(), formats))
        return 0
    query = option(args, "--query-gpu=")
    if query is None:
        sys.stdout.write(summary())
        return 0
    if "-lms" not in args:
        sys.stdout.write(csv_text(GPU_FIELDS, query.split(","), range(GPUS), formats))
        return 0
    period = int(args[args.index("-lms") + 1]) / 1000.0
    try:
        while True:
            hang_while_flagged()
            sys.stdout.write(csv_text(GPU_FIELDS, query.split(","), range(GPUS), formats))
            sys.stdout.flush()
            time.sleep(period)
    except BrokenPipeError:
        return 0


sys.exit(main(sys.argv[1:]))
"""


def write_standin_smi(
    directory: Path,
    *,
    gpus: int = 8,
    hang_flag: Path | None = None,
    seed: int = 0,
    hostile_fields: dict[str, dict[str, str]] | None = None,
    hostile_pid_file: Path | None = None,
) -> Path:
    """Write an executable ``directory/nvidia-smi`` run by this Python (``sys.executable``), so
    that it works where no python3 is on PATH. It hangs while ``hang_flag`` exists.

    ``hostile_fields`` maps a ``--query-gpu`` field to the text some GPUs give instead (by
    index), and ``hostile_pid_file`` names a file holding the pid of a process listed on GPU 0
    with a hostile process name: a host whose users or driver send what they like."""
    path = directory / "nvidia-smi"
    path.write_text(
        _SCRIPT.format(
            python=sys.executable,
            gpus=gpus,
            seed=seed,
            hang_flag=None if hang_flag is None else str(hang_flag),
            missing_pid=MISSING_PID,
            hostile_fields=hostile_fields or {},
            hostile_pid_file=None if hostile_pid_file is None else str(hostile_pid_file),
        )
    )
    path.chmod(0o755)
    return path
