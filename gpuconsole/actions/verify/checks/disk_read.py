"""Does the temp filesystem read fast enough to feed a data loader? The read loads the disk: the
probe is `heavy`, run alone after the light ones."""

from __future__ import annotations

import re
import shlex

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

_FADVISE_READ = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
total, start = 0, time.perf_counter()
while True:
    chunk = os.read(fd, 4 << 20)
    if not chunk:
        break
    total += len(chunk)
print("read: %d bytes copied, %.6f s" % (total, time.perf_counter() - start))
"""
"""Reads the file after dropping it from the page cache: for filesystems that refuse O_DIRECT."""

DISK_READ_MIB = 256
DISK_READ = Probe(
    "disk-read",
    "command -v dd >/dev/null 2>&1 || exit 127; "
    'dir=${TMPDIR:-/tmp}; file="$dir/gpuconsole-read.$$"; '
    "find \"$dir\" -maxdepth 1 -name 'gpuconsole-read.*' -mmin +60 -exec rm -f {} + 2>/dev/null; "
    "trap 'rm -f \"$file\"' EXIT; trap 'exit 143' HUP INT TERM; "
    'echo "dir: $dir ($(stat -f -c %T "$dir" 2>/dev/null || echo unknown filesystem))"; '
    f'if ! out=$(dd if=/dev/zero of="$file" bs=4M count={DISK_READ_MIB // 4} conv=fsync 2>&1);'
    ' then echo "$out" >&2; exit 1; fi; '
    'echo "write: $(echo "$out" | tail -n 1)"; '
    'if out=$(dd if="$file" of=/dev/null bs=4M iflag=direct 2>&1); then'
    ' echo "method: O_DIRECT"; echo "read: $(echo "$out" | tail -n 1)"; '
    "elif command -v python3 >/dev/null 2>&1; then"
    ' echo "method: page cache dropped, O_DIRECT refused: $(echo "$out" | tail -n 1)";'
    f' python3 -c {shlex.quote(_FADVISE_READ)} "$file" || exit 1; '
    'else echo "O_DIRECT refused and no python3 to drop the page cache" >&2; exit 1; fi',
    timeout=60.0,
    heavy=True,
)
"""Writes 256 MiB to the temp dir (fsync'd), reads it back past the page cache, removes it on
any exit (files a killed run left behind are removed an hour later). dd's own 'N bytes copied,
S s' lines carry the figures (GNU and busybox both print them)."""


DISK_READ_FLOOR_MBS = 500
"""Sequential MB/s a job's temp storage should reach to feed a data loader. Eight GPUs training
ResNet-50 at ~2,500 img/s each on ImageNet's ~110 kB JPEGs read ~2.2 GB/s in all but mostly from
the page cache; 500 MB/s is what one SATA SSD gives and what any NVMe far exceeds: below it the
temp dir is a spinning disk or a throttled network volume, too slow to stage a data set on."""
_COPIED = re.compile(r"(?P<bytes>\d+) bytes.*copied, (?P<seconds>[\d.]+) s")


def _throughput(output: CommandOutput, prefix: str) -> float | None:
    """MB/s from a `dd`-style 'N bytes ... copied, S s' line starting with ``prefix``."""
    for line in output.stdout.splitlines():
        if line.startswith(prefix) and (match := _COPIED.search(line)):
            seconds = float(match["seconds"])
            return int(match["bytes"]) / seconds / 1e6 if seconds > 0 else None
    return None


def _judge_disk_read(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[DISK_READ.name]
    if output.timed_out:
        return Verdict(
            Status.FAIL,
            f"writing and reading {DISK_READ_MIB} MiB did not finish: {output.stderr.strip()}",
            (),
            "the temp filesystem is far too slow or hung: `iostat -x 1` for a saturated disk, "
            "`mount` for a stale network mount; point TMPDIR at local storage",
        )
    if output.missing:
        return Verdict(Status.SKIP, "dd is not installed: no disk read test")
    where = next((line for line in output.lines(1) if line.startswith("dir:")), "dir: ?")
    read = _throughput(output, "read:")
    if not output.ok or read is None:
        return Verdict(
            Status.WARN,
            f"the disk read test failed (exit {output.exit_code})",
            output.lines() + tuple(output.stderr.strip().splitlines()[-2:]),
            "check that TMPDIR (or /tmp) is writable and has 256 MiB free; run the probe by hand",
        )
    write = _throughput(output, "write:")
    method = next((line for line in output.lines(6) if line.startswith("method:")), "method: ?")
    lines = (where, method, f"read {read:.0f} MB/s; write (fsync'd) {write or 0:.0f} MB/s")
    summary = f"sequential read {read:.0f} MB/s from {where[5:].strip()}"
    if read < DISK_READ_FLOOR_MBS:
        return Verdict(
            Status.WARN,
            f"{summary}: below {DISK_READ_FLOOR_MBS} MB/s, too slow to feed a data loader",
            lines,
            "stage data sets on local NVMe (see nvme) and point TMPDIR there; `iostat -x 1` "
            "shows whether another job saturates this disk",
        )
    return Verdict(Status.PASS, summary, lines)


CHECKS: tuple[Check, ...] = (
    Check("disk-read", "Temp disk read throughput", (DISK_READ,), _judge_disk_read),
)
