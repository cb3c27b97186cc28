"""Checks of the GPUs' hardware and the system around them: memory health, links, the fabric,
the kernel's XID log, local disks.

Facts come from shared/reference/gpu-facts.md (fleet health checks, NVIDIA's XID catalog,
through `gpuconsole.core.xid`) and from the PCIe specification's rates. The bandwidth floors are
shares of the link's theoretical rate (`gpuconsole.rules.limits`) and, when several hosts are
verified together, of their peers' median (`peers`). Three probes load the host (host<->device
copies, peer copies, a disk read): they are `heavy`, so the runner runs them alone, after the
rest. The copy probes run a short ``python3`` script that uses torch when the host's Python has
it.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
import statistics
from collections import Counter
from collections.abc import Iterable

from gpuconsole.actions.verify.model import (
    Check,
    CommandOutput,
    Evidence,
    Figure,
    Probe,
    Status,
    Verdict,
)
from gpuconsole.actions.verify.probes import SMI_QUERY, smi_rows
from gpuconsole.core import xid
from gpuconsole.core.model import Severity
from gpuconsole.hosts.targets import Context
from gpuconsole.rules.limits import LINK_FAIL_FRACTION, LINK_PASS_FRACTION
from gpuconsole.telemetry.kernel_log import parse_xid_lines, pci_address


def _smi(arguments: str) -> str:
    return f"command -v nvidia-smi >/dev/null 2>&1 || exit 127; nvidia-smi {arguments}"


def _python(script: str) -> str:
    return f"command -v python3 >/dev/null 2>&1 || exit 127; exec python3 -c {shlex.quote(script)}"


# --- probes -------------------------------------------------------------------------------------

ECC_COUNTS = Probe(
    "ecc-counts",
    _smi(
        "--query-gpu=index,ecc.errors.uncorrected.volatile.total,"
        "ecc.errors.uncorrected.aggregate.total,ecc.errors.corrected.volatile.total"
        " --format=csv,noheader,nounits"
    ),
)
"""Per GPU: uncorrectable errors since the driver loaded, over the GPU's life, correctable ones."""

REMAPPED_ROWS = Probe(
    "remapped-rows",
    _smi(
        "--query-remapped-rows=gpu_bus_id,remapped_rows.correctable,"
        "remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure"
        " --format=csv,noheader"
    ),
)
"""Per GPU (Ampere and later): rows remapped for correctable and uncorrectable errors, whether a
remap waits for a reset, whether one failed."""

NVLINK_STATUS = Probe("nvlink-status", _smi("nvlink -s"))
"""Per GPU a header, then ``Link N: 26.562 GB/s`` or ``Link N: <inactive>``; nothing at all on GPUs
without NVLink."""

SMI_DETAILS = Probe("smi-details", _smi("-q"))
"""nvidia-smi's full report; read here for each GPU's ``Fabric`` state (Hopper and later)."""

NVSWITCHES = Probe(
    "nvswitches",
    "ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null; "
    "ls /dev 2>/dev/null | grep '^nvidia-nvswitch[0-9]' || true",
)
"""The NVSwitches the driver found (their PCI addresses, their device nodes); empty elsewhere."""

FABRIC_MANAGER = Probe(
    "fabric-manager-service",
    "command -v systemctl >/dev/null 2>&1 || exit 127; systemctl is-active nvidia-fabricmanager",
)

XID_LOG_LINES = 2000
KERNEL_XIDS = Probe(
    "kernel-xids",
    "if command -v journalctl >/dev/null 2>&1"
    ' && [ -n "$(journalctl -k -b -q --no-pager -n 1 2>/dev/null)" ]; then'
    ' echo "source: journalctl -k -b";'
    " journalctl -k -b -q --no-pager -o short-unix"
    f' | grep -F "NVRM: Xid" | tail -n {XID_LOG_LINES};'
    " exit 0; fi; "
    "command -v dmesg >/dev/null 2>&1"
    ' || { echo "neither journalctl (with kernel messages) nor dmesg is available" >&2;'
    " exit 127; }; "
    "if ! dmesg >/dev/null 2>&1; then dmesg 2>&1 >/dev/null | head -n 1 >&2; exit 77; fi; "
    'echo "source: dmesg"; '
    f'dmesg | grep -F "NVRM: Xid" | tail -n {XID_LOG_LINES}; exit 0',
)
"""This boot's NVRM Xid lines from the journal, else from dmesg (the ring buffer may have
wrapped); exit 77 with dmesg's complaint when this user may not read the kernel log."""
_LOG_UNREADABLE = 77

NVME = Probe(
    "nvme-namespaces",
    "for block in /sys/block/nvme*; do"
    ' [ -e "$block" ] || continue; name=${block##*/};'
    " case $name in *c*) continue ;; esac;"
    ' sectors=$(cat "$block/size" 2>/dev/null || echo 0);'
    ' transport=$(cat "$block/device/transport" 2>/dev/null || echo unknown);'
    ' model=$(cat "$block/device/model" 2>/dev/null);'
    ' echo "$name $transport $((sectors * 512)) $model";'
    " done",
)
"""One line per NVMe namespace: name, transport (pcie = local), bytes, model. Multipath's hidden
per-controller paths (nvme0c0n1) are left out."""

DISK_FREE = Probe(
    "disk-free",
    "set --; "
    'for dir in /tmp /var/tmp "$TMPDIR" "$HOME" /raid /mnt /scratch /local; do'
    ' [ -n "$dir" ] && [ -d "$dir" ] && set -- "$@" "$dir"; done; '
    'command -v df >/dev/null 2>&1 || exit 127; df -P -k "$@"',
)
"""The filesystems a job writes to: temp dirs, home, the usual scratch mounts that exist."""

_COPY_PRELUDE = """
import json, os, subprocess, sys, threading, time
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

def finish(report):
    print(json.dumps(report))
    sys.exit(0)

try:
    import torch
except Exception as error:
    finish({"skip": "torch is not importable by %s (%s)" % (sys.executable, error)})
if not torch.cuda.is_available():
    finish({"skip": "torch %s sees no CUDA device" % torch.__version__})

def smi(fields):
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=" + fields, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line]

def identities():
    # torch device -> (nvidia-smi index, uuid, PCI bus id), matched by uuid, else by position
    rows = [r for r in smi("index,uuid,pci.bus_id") if len(r) == 3]
    by_uuid = {r[1]: r for r in rows}
    found = []
    for device in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        uuid = None if uuid is None else "GPU-" + str(uuid).replace("GPU-", "")
        row = by_uuid.get(uuid) or (rows[device] if uuid is None and device < len(rows) else None)
        found.append((int(row[0]), row[1], row[2]) if row else (device, uuid, None))
    return found

def gbs(size, reps, seconds):
    return round(size * reps / seconds / 1e9, 1)
"""
"""What both copy scripts share: the JSON answer, torch or a skip, nvidia-smi's view of the GPUs.
CUDA_DEVICE_ORDER=PCI_BUS_ID numbers torch's devices as nvidia-smi does."""

_HOST_DEVICE_SCRIPT = (
    _COPY_PRELUDE
    + """
SIZE, REPS = 256 << 20, 8

def local_cpus(bus_id):
    # nvidia-smi's 00000000:3B:00.0 is sysfs's 0000:3b:00.0
    try:
        domain, bus, rest = bus_id.lower().split(":")
        with open("/sys/bus/pci/devices/%s:%s:%s/local_cpulist" % (domain[-4:], bus, rest)) as f:
            text = f.read().strip()
        cpus = set()
        for part in text.split(","):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
        return cpus
    except (OSError, ValueError):
        return set()

def timed(copy, device):
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(REPS):
        copy()
    torch.cuda.synchronize(device)
    return gbs(SIZE, REPS, time.perf_counter() - start)

def link_under_load(device, uuid, index, host, gpu):
    # an idle link drops to a lower generation: read it while copies keep it busy
    sample = []
    reader = threading.Thread(target=lambda: sample.extend(
        smi("index,uuid,pcie.link.gen.current,pcie.link.width.current")))
    reader.start()
    while reader.is_alive():
        gpu.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
    for row in sample:
        if len(row) == 4 and (row[1] == uuid if uuid else row[0] == str(index)):
            return {"pcie_gen": int(row[2]) if row[2].isdigit() else None,
                    "pcie_width": int(row[3]) if row[3].isdigit() else None}
    return {}

everything = os.sched_getaffinity(0)
gpus = []
for device, (index, uuid, bus_id) in enumerate(identities()):
    entry = {"index": index, "uuid": uuid, "name": torch.cuda.get_device_name(device)}
    try:
        # pinned memory on the GPU's own NUMA node, as a well-placed data loader has it
        os.sched_setaffinity(0, (local_cpus(bus_id or "") & everything) or everything)
        host = torch.empty(SIZE, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(SIZE, dtype=torch.uint8, device=device)
        gpu.copy_(host)
        host.copy_(gpu)
        entry.update(link_under_load(device, uuid, index, host, gpu))
        entry["h2d_gbs"] = timed(lambda: gpu.copy_(host, non_blocking=True), device)
        entry["d2h_gbs"] = timed(lambda: host.copy_(gpu, non_blocking=True), device)
        del host, gpu
        torch.cuda.empty_cache()
    except Exception as error:
        entry["error"] = "%s: %s" % (type(error).__name__, error)
    finally:
        os.sched_setaffinity(0, everything)
    gpus.append(entry)
finish({"torch": torch.__version__, "gpus": gpus})
"""
)

HOST_DEVICE_BANDWIDTH = Probe(
    "host-device-bandwidth", _python(_HOST_DEVICE_SCRIPT), timeout=90.0, heavy=True
)
"""Per GPU: 8 timed copies of a 256 MiB pinned buffer each way (the buffer on the GPU's NUMA
node), and the PCIe generation and width nvidia-smi reads while copies run. Prints one JSON line:
{"torch", "gpus": [{"index", "uuid", "name", "h2d_gbs", "d2h_gbs", "pcie_gen", "pcie_width"}]},
or {"skip": why}. About a second per GPU after torch's import and CUDA's start."""

_P2P_SCRIPT = (
    _COPY_PRELUDE
    + """
SIZE, REPS = 64 << 20, 5

count = torch.cuda.device_count()
if count < 2:
    finish({"skip": "torch sees %d GPU: peer copies need two" % count})
labels = [index for index, _, _ in identities()]
sources = [torch.empty(SIZE, dtype=torch.uint8, device=d) for d in range(count)]
targets = [torch.empty(SIZE, dtype=torch.uint8, device=d) for d in range(count)]
pairs = []
for src in range(count):
    for dst in range(count):
        if src == dst:
            continue
        entry = {"src": labels[src], "dst": labels[dst],
                 "peer": bool(torch.cuda.can_device_access_peer(src, dst))}
        try:
            targets[dst].copy_(sources[src])
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            start = time.perf_counter()
            for _ in range(REPS):
                targets[dst].copy_(sources[src], non_blocking=True)
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            entry["gbs"] = gbs(SIZE, REPS, time.perf_counter() - start)
        except Exception as error:
            entry["error"] = "%s: %s" % (type(error).__name__, error)
        pairs.append(entry)
finish({"torch": torch.__version__, "pairs": pairs})
"""
)

P2P_BANDWIDTH = Probe(
    "p2p-bandwidth",
    "gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c .); "
    '[ "$gpus" -ge 2 ] || {'
    """ printf '{"skip": "nvidia-smi lists %s GPU: peer copies need two"}\\n' "$gpus";"""
    " exit 0; }; " + _python(_P2P_SCRIPT),
    timeout=90.0,
    heavy=True,
)
"""Every ordered GPU pair: whether peer access is possible, and GB/s of 5 timed 64 MiB copies.
Prints {"torch", "pairs": [{"src", "dst", "peer", "gbs"}]} or {"skip": why}; on a host with
fewer than two GPUs it skips before torch's import (seconds)."""

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


# --- shared readers -----------------------------------------------------------------------------

_HUNG_SMI = (
    "a hung nvidia-smi usually means a GPU stopped answering: look for XID 79 in `dmesg`, "
    "then drain and reboot the node"
)


def _smi_unusable(output: CommandOutput, what: str) -> Verdict | None:
    """The verdict when nvidia-smi gave nothing to judge; None when it answered.

    A failing nvidia-smi is a skip here: the driver checks report why it fails.
    """
    if output.timed_out:
        return Verdict(
            Status.FAIL,
            f"nvidia-smi did not answer ({what}): {output.stderr.strip()}",
            (),
            _HUNG_SMI,
        )
    if output.missing:
        return Verdict(Status.SKIP, f"nvidia-smi is not installed: no {what} to check")
    if not output.ok:
        return Verdict(
            Status.SKIP,
            f"nvidia-smi failed (exit {output.exit_code}) on the {what}; the driver checks say why",
            output.lines(3),
        )
    return None


def _csv(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in row]
        for row in csv.reader(text.splitlines(), skipinitialspace=True)
        if row
    ]


def _int(text: str | None) -> int | None:
    """A count or a number nvidia-smi printed; None for "[N/A]", "[Not Supported]" and the like."""
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _gpu_rows(evidence: Evidence) -> list[dict[str, str]]:
    return smi_rows(evidence[SMI_QUERY.name])


def _index_by_bus(rows: Iterable[dict[str, str]]) -> dict[tuple[int, int, int], str]:
    """PCI address (domain, bus, device) -> nvidia-smi index, to name GPUs in bus-id outputs."""
    found = {}
    for row in rows:
        address = pci_address(row.get("pci.bus_id", ""))
        if address is not None:
            found[address] = row.get("index", "?")
    return found


def _gpu_label(bus_id: str, by_bus: dict[tuple[int, int, int], str]) -> str:
    index = by_bus.get(pci_address(bus_id) or (-1, -1, -1))
    return f"GPU {index} ({bus_id})" if index is not None else f"GPU {bus_id}"


def _json_report(output: CommandOutput) -> dict[str, object] | None:
    """The JSON line a copy script printed last; None when there is none."""
    for line in reversed(output.stdout.splitlines()):
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except ValueError:
                return None
            return report if isinstance(report, dict) else None
    return None


def _script_unusable(output: CommandOutput, what: str) -> tuple[Verdict | None, dict[str, object]]:
    """A copy script's report, or the verdict when it gave none (no python3, a crash, a skip)."""
    if output.timed_out:
        verdict = Verdict(
            Status.WARN,
            f"the {what} did not finish: {output.stderr.strip()}",
            output.lines(),
            "run the probe command by hand on the host to see where it stalls "
            "(torch's first import can be slow on a network filesystem; a CUDA call that never "
            "returns points at the GPU: see xid-log)",
        )
        return verdict, {}
    if output.missing:
        return Verdict(Status.SKIP, f"python3 is not installed: no {what}"), {}
    report = _json_report(output)
    if report is None:
        verdict = Verdict(
            Status.WARN,
            f"the {what} failed (exit {output.exit_code}) without a result",
            tuple(output.stderr.strip().splitlines()[-4:]) or output.lines(),
            "run the probe command by hand on the host and read its traceback",
        )
        return verdict, {}
    if "skip" in report:
        return Verdict(Status.SKIP, f"no {what}: {report['skip']}"), {}
    return None, report


def _loaded_gpus(output: CommandOutput) -> list[dict[str, object]]:
    """The host-device script's per-GPU entries; [] when it did not run or skipped."""
    report = _json_report(output) if output.ok else None
    gpus = report.get("gpus") if report else None
    return [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []


def _matching(row: dict[str, str], loaded: list[dict[str, object]]) -> dict[str, object] | None:
    """The copy script's entry for an nvidia-smi row: same uuid, else same index."""
    for entry in loaded:
        if entry.get("uuid") and entry.get("uuid") == row.get("uuid"):
            return entry
    for entry in loaded:
        if not entry.get("uuid") and str(entry.get("index")) == row.get("index"):
            return entry
    return None


def _join(items: Iterable[str]) -> str:
    return ", ".join(items)


# --- persistence-mode ---------------------------------------------------------------------------


def judge_persistence(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[SMI_QUERY.name]
    if trouble := _smi_unusable(output, "GPU query"):
        return trouble
    rows = smi_rows(output)
    if not rows:
        return Verdict(Status.SKIP, "nvidia-smi listed no GPU")
    lines = tuple(
        f"GPU {row.get('index')} ({row.get('pci.bus_id')}): "
        f"persistence mode {row.get('persistence_mode')}"
        for row in rows
    )
    off = [r.get("index", "?") for r in rows if r.get("persistence_mode") == "Disabled"]
    if off:
        return Verdict(
            Status.WARN,
            f"persistence mode is off on GPU {_join(off)} of {len(rows)}: each CUDA start "
            "re-initialises the GPU (seconds), and its state is lost between jobs",
            lines,
            "enable and start the nvidia-persistenced daemon "
            "(`systemctl enable --now nvidia-persistenced`); `nvidia-smi -pm 1` is deprecated",
        )
    return Verdict(Status.PASS, f"persistence mode is on for all {len(rows)} GPU(s)", lines)


# --- ecc ----------------------------------------------------------------------------------------


def _ecc_counts(output: CommandOutput) -> dict[str, tuple[int | None, int | None, int | None]]:
    """index -> (uncorrectable since the driver loaded, uncorrectable lifetime, correctable since
    the driver loaded)."""
    if not output.ok:
        return {}
    return {
        row[0]: (_int(row[1]), _int(row[2]), _int(row[3]))
        for row in _csv(output.stdout)
        if len(row) == 4
    }


def judge_ecc(evidence: Evidence, context: Context) -> Verdict:
    query = evidence[SMI_QUERY.name]
    if trouble := _smi_unusable(query, "GPU query"):
        return trouble
    rows = smi_rows(query)
    if not rows:
        return Verdict(Status.SKIP, "nvidia-smi listed no GPU")
    counts = _ecc_counts(evidence[ECC_COUNTS.name])
    lines, failing, disabled, unsupported, lifetime = [], [], [], [], 0
    for row in rows:
        index, mode = row.get("index", "?"), row.get("ecc.mode.current", "")
        volatile, aggregate, corrected = counts.get(index, (None, None, None))
        lines.append(
            f"GPU {index}: ECC {mode}; uncorrectable {volatile} since driver load, {aggregate} "
            f"lifetime; correctable {corrected} since driver load"
        )
        if volatile:
            failing.append(f"GPU {index}: {volatile} uncorrectable")
        if mode == "Disabled":
            disabled.append(index)
        elif mode != "Enabled":
            unsupported.append(index)
        lifetime += aggregate or 0
    if not counts:
        lines.append(f"error counts unavailable: {_join(evidence[ECC_COUNTS.name].lines(2))}")
    if failing:
        return Verdict(
            Status.FAIL,
            f"uncorrectable ECC errors since the driver loaded: {_join(failing)}",
            tuple(lines),
            "drain the GPU's jobs (their results may be corrupt), read row-remap and xid-log, "
            "then reset it (`nvidia-smi -r -i <gpu>`); if errors return, replace the GPU (RMA)",
        )
    if disabled:
        return Verdict(
            Status.WARN,
            f"ECC is off on GPU {_join(disabled)}: memory errors would go unnoticed",
            tuple(lines),
            f"`nvidia-smi -i {disabled[0]} -e 1` for each such GPU (as root), then reboot: "
            "the mode changes at the next reset",
        )
    summary = f"ECC enabled on {len(rows) - len(unsupported)} GPU(s), no uncorrectable error"
    if unsupported:
        summary += f"; GPU {_join(unsupported)} has no ECC (a GPU model without it)"
    if lifetime:
        summary += f"; {lifetime} uncorrectable over the GPUs' lives (row-remap judges those)"
    return Verdict(Status.PASS, summary, tuple(lines))


# --- row-remap ----------------------------------------------------------------------------------

ROW_REMAP_UNCORRECTABLE_LIMIT = 512
"""More rows remapped for uncorrectable errors than this fails a fleet's node check."""


def _yes(text: str) -> bool:
    return text.strip().casefold() in {"yes", "1", "true"}


def judge_row_remap(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[REMAPPED_ROWS.name]
    if "not supported" in (output.stdout + output.stderr).casefold():
        return Verdict(
            Status.SKIP,
            "these GPUs do not remap rows (an Ampere-and-later feature; older GPUs retire pages)",
            output.lines(2),
        )
    if trouble := _smi_unusable(output, "remapped-rows query"):
        return trouble
    rows = [row for row in _csv(output.stdout) if len(row) == 5]
    if not rows:
        return Verdict(Status.SKIP, "nvidia-smi listed no GPU's remapped rows", output.lines(2))
    if all(_int(r[1]) is None and _int(r[2]) is None for r in rows):
        return Verdict(Status.SKIP, "these GPUs report no row remapping", output.lines(2))
    by_bus = _index_by_bus(_gpu_rows(evidence))
    lines, problems, remedies = [], [], []
    for bus_id, correctable, uncorrectable, pending, failure in rows:
        gpu = _gpu_label(bus_id, by_bus)
        lines.append(
            f"{gpu}: remapped rows {correctable} correctable, {uncorrectable} uncorrectable; "
            f"pending {pending}; failure {failure}"
        )
        if _yes(failure):
            problems.append(f"{gpu}: a row remap failed")
            remedies.append(
                f"{gpu}: reset it (`nvidia-smi -r -i <gpu>`); if the failure stays, it has run out "
                "of spare rows: drain it and contact NVIDIA support (RMA)"
            )
        if _yes(pending):
            problems.append(f"{gpu}: a row remap is pending")
            remedies.append(
                f"{gpu}: reset it when idle (`nvidia-smi -r -i <gpu>`) or reboot the node: "
                "NVML's recovery action for a pending remap is a reset"
            )
        if (_int(uncorrectable) or 0) > ROW_REMAP_UNCORRECTABLE_LIMIT:
            problems.append(
                f"{gpu}: {uncorrectable} rows remapped for uncorrectable errors "
                f"(> {ROW_REMAP_UNCORRECTABLE_LIMIT})"
            )
            remedies.append(f"{gpu}: drain it and replace it (RMA): its memory is wearing out")
    if problems:
        return Verdict(Status.FAIL, "; ".join(problems), tuple(lines), "; ".join(remedies))
    total = sum(_int(r[2]) or 0 for r in rows)
    return Verdict(
        Status.PASS,
        f"no remap pending or failed on {len(rows)} GPU(s); {total} row(s) remapped for "
        f"uncorrectable errors (limit {ROW_REMAP_UNCORRECTABLE_LIMIT} per GPU)",
        tuple(lines),
    )


# --- pcie-link ----------------------------------------------------------------------------------


def _link(gen: object, width: object) -> str:
    return f"Gen{gen} x{width}"


def judge_pcie_link(evidence: Evidence, context: Context) -> Verdict:
    query = evidence[SMI_QUERY.name]
    if trouble := _smi_unusable(query, "GPU query"):
        return trouble
    rows = smi_rows(query)
    if not rows:
        return Verdict(Status.SKIP, "nvidia-smi listed no GPU")
    loaded = _loaded_gpus(evidence[HOST_DEVICE_BANDWIDTH.name])
    lines, failures, idle = [], [], []
    for row in rows:
        index = row.get("index", "?")
        gen, gen_max = _int(row.get("pcie.link.gen.current")), _int(row.get("pcie.link.gen.max"))
        width = _int(row.get("pcie.link.width.current"))
        width_max = _int(row.get("pcie.link.width.max"))
        if None in (gen, gen_max, width, width_max):
            lines.append(f"GPU {index}: link not reported ({_link(gen, width)})")
            continue
        sample = _matching(row, loaded) or {}
        load_gen, load_width = sample.get("pcie_gen"), sample.get("pcie_width")
        line = f"GPU {index}: {_link(gen, width)} at rest of {_link(gen_max, width_max)}"
        if load_gen is not None:
            line += f"; {_link(load_gen, load_width)} under load"
        lines.append(line)
        seen_width = load_width if isinstance(load_width, int) else width
        if seen_width < width_max:
            failures.append(f"GPU {index} runs x{seen_width} of x{width_max}")
        if isinstance(load_gen, int):
            if load_gen < gen_max:
                failures.append(f"GPU {index} runs Gen{load_gen} of Gen{gen_max} under load")
        elif gen < gen_max:
            idle.append(f"GPU {index} Gen{gen} of Gen{gen_max}")
    if failures:
        return Verdict(
            Status.FAIL,
            f"PCIe link degraded: {_join(failures)}",
            tuple(lines),
            "power down, reseat the GPU (and its riser or cable), try another slot; check the "
            "BIOS's PCIe speed setting; `lspci -vv -s <bus>` shows LnkCap against LnkSta; "
            "a link that trains low again points at the slot, riser or GPU",
        )
    if idle:
        return Verdict(
            Status.PASS,
            f"link widths at their maximum; {_join(idle)} at rest, a normal power-saving "
            "downshift: its generation is re-read under load by the host-device-bandwidth test",
            tuple(lines),
        )
    return Verdict(Status.PASS, f"all {len(rows)} GPU link(s) at their maximum", tuple(lines))


# --- host-device-bandwidth ----------------------------------------------------------------------

PCIE_LANE_RATES: dict[int, tuple[float, float]] = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 236 / 256),
}
"""Per PCIe generation: the transfers per second of one lane (GT/s) and the share of the bits
sent that carry data. Generations 1 and 2 code 8 bits in 10 (8b/10b); 3 to 5 code 128 in 130
(128b/130b), each doubling the rate: 8, 16, 32 GT/s (the PCI Express Base Specification's rates,
as PCI-SIG publishes them). Generation 6 sends 64 GT/s in 256-byte flits, of which 236 bytes are
packet data (6 link-layer, 8 CRC, 6 FEC): 92.2 %, ~118 GB/s per direction at x16 (Glenn K.
Lockwood, "PCIe Gen6", glennklockwood.com/garden/PCIe-Gen6). shared/reference/gpu-facts.md
has no PCIe rates."""


def pcie_theoretical_gbs(gen: int | None, width: int | None) -> float | None:
    """GB/s one direction of a link carries at most: GT/s x lanes x encoding / 8 bits. Gen5 x16:
    32 x 16 x 128/130 / 8 = 63.0 GB/s; Gen4 x16 31.5; Gen5 x8 31.5. Packet headers and flow
    control take a further ~10 %, so healthy copies measure ~85-88 % of it. None for a
    generation or width not known."""
    if gen not in PCIE_LANE_RATES or width is None or width <= 0:
        return None
    transfers, encoding = PCIE_LANE_RATES[gen]
    return transfers * width * encoding / 8


def link_status(measured: float, theoretical: float) -> Status:
    """A copy's GB/s against its link's theoretical rate (`limits` says why these shares)."""
    share = measured / theoretical
    if share >= LINK_PASS_FRACTION:
        return Status.PASS
    if share >= LINK_FAIL_FRACTION:
        return Status.WARN
    return Status.FAIL


def _judged_link(
    row: dict[str, str] | None, entry: dict[str, object]
) -> tuple[int | None, int | None]:
    """The generation and width to judge a GPU's copies by: the most its link can train to with
    this GPU and system (nvidia-smi's ``.max``), so a link that trained at half its rate does not
    lower its own bar; the link seen under load where nvidia-smi gives no maximum."""
    gen = _int((row or {}).get("pcie.link.gen.max"))
    width = _int((row or {}).get("pcie.link.width.max"))
    if gen is None or width is None:
        load_gen, load_width = entry.get("pcie_gen"), entry.get("pcie_width")
        gen = load_gen if isinstance(load_gen, int) else None
        width = load_width if isinstance(load_width, int) else None
    return gen, width


_SLOW_COPIES = (
    "see pcie-link for a degraded link (reseat the GPU); check the GPU's NUMA node "
    "(`nvidia-smi topo -m`) and that jobs bind to it (numactl/CPU affinity); if the kernel runs "
    "the IOMMU in translated mode, boot with `iommu=pt`; make sure no other job was copying at "
    "the same time, then run the check again"
)


def judge_host_device_bandwidth(evidence: Evidence, context: Context) -> Verdict:
    verdict, report = _script_unusable(evidence[HOST_DEVICE_BANDWIDTH.name], "host<->device test")
    if verdict is not None:
        return verdict
    rows = _gpu_rows(evidence)
    entries = [g for g in report.get("gpus", []) if isinstance(g, dict)]  # type: ignore[union-attr]
    if not entries:
        return Verdict(Status.SKIP, "the host<->device test found no GPU")
    lines, broken, figures = [], [], []
    shares: list[float] = []
    low: dict[Status, list[str]] = {Status.WARN: [], Status.FAIL: []}
    for entry in entries:
        index, name = entry.get("index"), str(entry.get("name", ""))
        if "error" in entry:
            broken.append(f"GPU {index}: {entry['error']}")
            lines.append(f"GPU {index} ({name}): copy failed: {entry['error']}")
            continue
        row = next((r for r in rows if _matching(r, [entry]) is entry), None)
        gen, width = _judged_link(row, entry)
        link = _link(gen, width) if gen is not None and width is not None else "a link not reported"
        theoretical = pcie_theoretical_gbs(gen, width)
        judged = []
        for direction in ("H2D", "D2H"):
            value = entry.get(f"{direction.lower()}_gbs")
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                judged.append(f"{direction} {value} GB/s")
                continue
            status = None if theoretical is None else link_status(value, theoretical)
            figures.append(
                Figure(
                    f"GPU {index} {direction}",
                    f"{name} {direction} on {link}",
                    float(value),
                    "GB/s",
                    status in (None, Status.PASS),
                )
            )
            if theoretical is None:
                judged.append(f"{direction} {value:g} GB/s")
                continue
            shares.append(value / theoretical)
            judged.append(f"{direction} {value:g} GB/s ({value / theoretical:.1%})")
            if status in low:
                low[status].append(
                    f"GPU {index} {direction} {value:g} GB/s = {value / theoretical:.1%} of "
                    f"{link}'s {theoretical:.1f} GB/s"
                )
        load_gen, load_width = entry.get("pcie_gen"), entry.get("pcie_width")
        under_load = f"; {_link(load_gen, load_width)} under load" if load_gen is not None else ""
        line = f"GPU {index} ({name}): {_join(judged)}"
        if theoretical is None:
            lines.append(f"{line}; link not reported: no theoretical rate to judge by{under_load}")
        else:
            lines.append(
                f"{line} of the {theoretical:.1f} GB/s per direction a {link} link carries in "
                f"theory (pass >= {LINK_PASS_FRACTION:.0%}, fail < {LINK_FAIL_FRACTION:.0%})"
                + under_load
            )
    found = tuple(figures)
    if broken:
        return Verdict(
            Status.FAIL,
            f"host<->device copies failed: {_join(broken)}",
            tuple(lines),
            "read xid-log and the kernel log for this GPU; reset it (`nvidia-smi -r -i <gpu>`) "
            "or reboot, then run the check again",
            found,
        )
    failing, warning = low[Status.FAIL], low[Status.WARN]
    if failing or warning:
        bands = [(LINK_FAIL_FRACTION, failing), (LINK_PASS_FRACTION, warning)]
        problems = [f"under {share:.0%}: {'; '.join(items)}" for share, items in bands if items]
        return Verdict(
            Status.FAIL if failing else Status.WARN,
            "host<->device bandwidth low for the link's theoretical rate, " + "; ".join(problems),
            tuple(lines),
            _SLOW_COPIES,
            found,
        )
    if not shares:
        return Verdict(
            Status.SKIP,
            "copies measured, but nvidia-smi reported no PCIe link to judge them by",
            tuple(lines),
            figures=found,
        )
    least = min(f.value for f in figures)
    return Verdict(
        Status.PASS,
        f"host<->device copies at {least:.1f} GB/s or more on {len(entries)} GPU(s), "
        f"{min(shares):.1%} or more of their links' theoretical rate "
        f"(pass >= {LINK_PASS_FRACTION:.0%})",
        tuple(lines),
        figures=found,
    )


# --- nvlink -------------------------------------------------------------------------------------

_GPU_HEADER = re.compile(r"^GPU (?P<index>\d+): (?P<rest>.*)$")
_LINK_LINE = re.compile(r"^\s*Link (?P<link>\d+): (?P<state>.+?)\s*$")
_SPEED = re.compile(r"^(?P<speed>[\d.]+) GB/s$")


def _nvlinks(text: str) -> dict[str, dict[int, str]]:
    """GPU index -> {link number: "26.562 GB/s" | "<inactive>" | other state}."""
    gpus: dict[str, dict[int, str]] = {}
    current: dict[int, str] | None = None
    for line in text.splitlines():
        if header := _GPU_HEADER.match(line.strip()):
            current = gpus.setdefault(header["index"], {})
        elif (link := _LINK_LINE.match(line)) and current is not None:
            current[int(link["link"])] = link["state"]
    return gpus


_FABRIC_STATES = {"completed", "in progress", "not started"}
"""Fabric states a GPU reports only on an NVSwitch system; others print N/A or Not Supported."""
_FABRIC_FINE = {"success", "n/a", ""}


def _fabric_states(details: CommandOutput) -> list[tuple[str, str, str]]:
    """(GPU bus id, fabric state, fabric status) per GPU in `nvidia-smi -q`'s text."""
    found, bus, in_fabric, state = [], "", False, ""
    for line in details.stdout.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if line.startswith("GPU ") and not line.startswith(" "):
            bus, in_fabric = line[4:].strip(), False
        elif line.strip() == "Fabric":
            in_fabric = True
        elif in_fabric and key == "State":
            state = value
        elif in_fabric and key == "Status":
            found.append((bus, state, value))
            in_fabric = False
    return found


def _nvswitch_signals(evidence: Evidence) -> list[str]:
    """Why this looks like an NVSwitch system: the driver's NVSwitch devices, or a GPU whose
    fabric state is one that only NVSwitch systems report. GPU names are not used: an H100 SXM
    calls itself "H100 80GB HBM3", without "SXM"."""
    signals = [
        f"NVSwitch: {line}"
        for line in evidence[NVSWITCHES.name].stdout.splitlines()
        if line.strip()
    ]
    signals += [
        f"GPU {bus}: fabric state {state}"
        for bus, state, _ in _fabric_states(evidence[SMI_DETAILS.name])
        if state.casefold() in _FABRIC_STATES
    ]
    return signals


def judge_nvlink(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[NVLINK_STATUS.name]
    if trouble := _smi_unusable(output, "NVLink status"):
        return trouble
    gpus = _nvlinks(output.stdout)
    links = {(gpu, n): state for gpu, states in gpus.items() for n, state in states.items()}
    if not links:
        return Verdict(
            Status.SKIP, "these GPUs have no NVLink (nvidia-smi nvlink -s lists no link)"
        )
    active = {key: m["speed"] for key, state in links.items() if (m := _SPEED.match(state))}
    down = sorted(key for key in links if key not in active)
    lines = []
    for gpu, states in gpus.items():
        off = [str(n) for n in states if (gpu, n) in down]
        line = f"GPU {gpu}: {len(states) - len(off)} of {len(states)} links active"
        lines.append(line + (f"; inactive: {_join(off)}" if off else ""))
    problems = []
    nvswitch = _nvswitch_signals(evidence)
    if down and (nvswitch or active):
        # On an NVSwitch board every link is wired. Elsewhere (NVLink bridges on PCIe cards) a
        # link may be unwired on every GPU alike; one down where the same link works on another
        # GPU is a bridge or a link that failed.
        working = {n for _, n in active}
        suspect = [(g, n) for g, n in down if nvswitch or n in working]
        if suspect:
            problems.append(f"link(s) down: {_join(f'GPU {g} link {n}' for g, n in suspect)}")
    if active:
        usual, _ = Counter(active.values()).most_common(1)[0]
        odd = [
            f"GPU {g} link {n} at {s} GB/s" for (g, n), s in sorted(active.items()) if s != usual
        ]
        if odd:
            problems.append(f"link speed differs from the others' {usual} GB/s: {_join(odd)}")
        lines.append(f"active links run at {usual} GB/s" + (" (others differ)" if odd else ""))
    if problems:
        return Verdict(
            Status.FAIL,
            "; ".join(problems),
            tuple(lines + nvswitch[:3]),
            "`nvidia-smi nvlink -e` for the links' error counters; reset the GPUs "
            "(`nvidia-smi -r`) or reboot; on a bridged PCIe pair, reseat the NVLink bridge; "
            "if a link stays down, run NVIDIA's NVLink troubleshooting (`dcgmi diag -r 2`) and "
            "contact the vendor",
        )
    if not active:
        return Verdict(
            Status.SKIP,
            f"no NVLink connected: all {len(links)} link(s) inactive (no bridge fitted)",
            tuple(lines),
        )
    unwired = f"; {len(down)} link(s) unwired on every GPU alike" if down else ""
    return Verdict(
        Status.PASS,
        f"{len(active)} NVLink link(s) active at {usual} GB/s on {len(gpus)} GPU(s){unwired}",
        tuple(lines),
    )


# --- p2p-bandwidth ------------------------------------------------------------------------------

P2P_FAR_BELOW = 0.5
"""A pair is far below the others when it copies at under half the median pair's GB/s."""


def judge_p2p_bandwidth(evidence: Evidence, context: Context) -> Verdict:
    if context.expected_gpus is not None and context.expected_gpus < 2:
        return Verdict(Status.SKIP, "fewer than two GPUs expected: no peer copies")
    verdict, report = _script_unusable(evidence[P2P_BANDWIDTH.name], "peer copy test")
    if verdict is not None:
        return verdict
    pairs = [p for p in report.get("pairs", []) if isinstance(p, dict)]  # type: ignore[union-attr]
    if not pairs:
        return Verdict(Status.SKIP, "the peer copy test measured no pair")
    measured = [float(p["gbs"]) for p in pairs if isinstance(p.get("gbs"), (int, float))]
    median = statistics.median(measured) if measured else 0.0
    lines, no_peer, slow, broken = [], [], [], []
    for pair in pairs:
        label = f"GPU {pair.get('src')}->{pair.get('dst')}"
        peer = "peer" if pair.get("peer") else "no peer access"
        if "error" in pair:
            broken.append(f"{label}: {pair['error']}")
            lines.append(f"{label}: {peer}, copy failed: {pair['error']}")
            continue
        lines.append(f"{label}: {pair.get('gbs')} GB/s, {peer}")
        if not pair.get("peer"):
            no_peer.append(label)
        gbs = pair.get("gbs")
        if isinstance(gbs, (int, float)) and gbs < P2P_FAR_BELOW * median:
            slow.append(f"{label} {gbs} GB/s")
    if broken:
        return Verdict(
            Status.FAIL,
            f"peer copies failed: {_join(broken)}",
            tuple(lines),
            "read xid-log for these GPUs; reset them (`nvidia-smi -r`) or reboot, then re-run",
        )
    problems = []
    if no_peer:
        problems.append(f"no peer access for {_join(no_peer)} (copies go through host memory)")
    if slow:
        problems.append(
            f"far below the median {median:.1f} GB/s (under {P2P_FAR_BELOW:.0%} of it): "
            + _join(slow)
        )
    if problems:
        return Verdict(
            Status.WARN,
            "; ".join(problems),
            tuple(lines),
            "`nvidia-smi topo -m` and `nvidia-smi topo -p2p r` show the path per pair; on "
            "bare metal disable PCIe ACS in the BIOS (it forces peer traffic through the root "
            "complex); in a VM peer access needs the hypervisor's support; a slow NVLink pair: "
            "see nvlink",
        )
    return Verdict(
        Status.PASS,
        f"{len(pairs)} GPU pairs with peer access; {min(measured):.1f}/{median:.1f}/"
        f"{max(measured):.1f} GB/s min/median/max",
        tuple(lines),
    )


# --- fabric-manager -----------------------------------------------------------------------------


def judge_fabric_manager(evidence: Evidence, context: Context) -> Verdict:
    signals = _nvswitch_signals(evidence)
    if not signals:
        return Verdict(
            Status.SKIP,
            "not an NVSwitch system (no NVSwitch device, no GPU reports a fabric state): "
            "no Fabric Manager needed",
        )
    states = _fabric_states(evidence[SMI_DETAILS.name])
    service = evidence[FABRIC_MANAGER.name]
    active = service.stdout.strip().splitlines()[:1] == ["active"]
    lines = [*signals[:4], *(f"GPU {b}: fabric state {s}, status {st}" for b, s, st in states)]
    lines.append(
        "systemctl is-active nvidia-fabricmanager: "
        + ("systemctl not found" if service.missing else service.stdout.strip() or "(nothing)")
    )
    unfinished = [
        f"GPU {bus}: {state}, status {status}"
        for bus, state, status in states
        if state.casefold() in _FABRIC_STATES
        and (state.casefold() != "completed" or status.casefold() not in _FABRIC_FINE)
    ]
    problems = []
    if not service.missing and not active:
        problems.append(f"nvidia-fabricmanager is {service.stdout.strip() or 'not running'}")
    if unfinished:
        problems.append(f"fabric not initialised ({_join(unfinished)})")
    if problems:
        driver = next((r.get("driver_version") for r in _gpu_rows(evidence)), None) or "<driver>"
        return Verdict(
            Status.FAIL,
            "; ".join(problems) + ": CUDA fails with error 802 (system not yet initialized)",
            tuple(lines),
            f"install nvidia-fabricmanager at exactly the driver's version {driver} (e.g. "
            f"`apt install nvidia-fabricmanager-{driver.split('.')[0]}={driver}-1`), then "
            "`systemctl enable --now nvidia-fabricmanager`; `journalctl -u nvidia-fabricmanager` "
            "says why it stopped",
        )
    initialised = [s for s in states if s[1].casefold() == "completed"]
    if not active and not initialised:
        return Verdict(
            Status.WARN,
            "NVSwitch system, but neither the service nor the GPUs say whether the fabric is up",
            tuple(lines),
            "check by hand: `nvidia-smi -q | grep -A 2 Fabric`, and Fabric Manager's log "
            "(/var/log/fabricmanager.log); a CUDA program failing with error 802 means it is down",
        )
    done = f"fabric initialised on {len(initialised)} GPU(s)" if initialised else ""
    running = "nvidia-fabricmanager active" if active else ""
    return Verdict(
        Status.PASS, "NVSwitch system: " + _join(filter(None, (running, done))), tuple(lines)
    )


# --- xid-log ------------------------------------------------------------------------------------


def _fails_node(info: xid.XidInfo) -> bool:
    """Fleet checks fail a node on these; so do XIDs whose GPU needs a reset, unless the catalog
    blames the application."""
    return info.fleet_flags or (xid.severity(info.xid) is Severity.CRITICAL and not info.app_error)


def judge_xid_log(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[KERNEL_XIDS.name]
    if output.timed_out:
        return Verdict(
            Status.WARN,
            f"reading the kernel log timed out: {output.stderr.strip()}",
            (),
            "run `journalctl -k -b | grep 'NVRM: Xid'` (or `dmesg`) by hand on the host",
        )
    if output.missing:
        return Verdict(Status.SKIP, "neither journalctl nor dmesg is available on this host")
    if output.exit_code == _LOG_UNREADABLE:
        return Verdict(
            Status.SKIP,
            f"this user may not read the kernel log ({output.stderr.strip() or 'not permitted'}); "
            "run as root or in the adm/systemd-journal group",
        )
    if not output.ok:
        return Verdict(
            Status.SKIP,
            f"the kernel log could not be read (exit {output.exit_code})",
            output.lines(2),
        )
    bus_to_gpu = {
        r["pci.bus_id"]: int(r["index"])
        for r in _gpu_rows(evidence)
        if r.get("index", "").isdigit() and r.get("pci.bus_id")
    }
    events = parse_xid_lines(output.stdout, bus_to_gpu)
    source = next((line for line in output.lines(1) if line.startswith("source:")), "source: ?")
    if not events:
        return Verdict(Status.PASS, f"no XID error since boot ({source})", (source,))
    counts = Counter((e.xid, e.gpu) for e in events)
    lines = []
    for (number, gpu), count in sorted(
        counts.items(), key=lambda item: (item[0][0], str(item[0][1]))
    ):
        info = xid.describe(number)
        lines.append(
            f"XID {number} x{count} on GPU {'?' if gpu is None else gpu}: {info.meaning}"
            + (" (a fleet check fails the node)" if info.fleet_flags else "")
            + (" (an application error)" if info.app_error else "")
        )
    raw = [line for line in output.stdout.splitlines() if "NVRM: Xid" in line]
    evidence_lines = (source, *lines, *raw[-3:])
    numbers = sorted({number for number, _ in counts})
    failing = [xid.describe(n) for n in numbers if _fails_node(xid.describe(n))]
    actions = "; ".join(
        f"XID {info.xid}: {info.action}" for info in (failing or [xid.describe(n) for n in numbers])
    )
    summary = f"XID {_join(map(str, numbers))} in the kernel log since boot ({len(events)} line(s))"
    if failing:
        return Verdict(Status.FAIL, summary, evidence_lines, actions)
    return Verdict(
        Status.WARN,
        summary + ": application errors, the GPU keeps working",
        evidence_lines,
        actions,
    )


# --- nvme ---------------------------------------------------------------------------------------


def judge_nvme(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[NVME.name]
    namespaces = []
    for line in output.stdout.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) >= 3 and parts[2].isdigit():
            name, transport, size = parts[:3]
            model = parts[3].strip() if len(parts) == 4 else ""
            namespaces.append((name, transport, int(size), model))
    local = [n for n in namespaces if n[1] not in {"tcp", "rdma", "fc", "loop"}]
    lines = tuple(
        f"{name}: {size / 1e12:.2f} TB, {transport}, {model or 'model unknown'}"
        for name, transport, size, model in namespaces
    )
    if not local:
        remote = f" ({len(namespaces)} over a network)" if namespaces else ""
        return Verdict(
            Status.SKIP,
            f"no local NVMe{remote}: not every node has it; jobs stage data elsewhere",
            lines,
        )
    total = sum(n[2] for n in local) / 1e12
    return Verdict(
        Status.PASS, f"{len(local)} local NVMe namespace(s), {total:.2f} TB in all", lines
    )


# --- disk-free ----------------------------------------------------------------------------------

DISK_FAIL_FREE = 0.02
DISK_WARN_FREE = 0.10
DISK_WARN_GIB = 20


def judge_disk_free(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[DISK_FREE.name]
    if output.timed_out:
        return Verdict(
            Status.WARN,
            f"df did not answer: {output.stderr.strip()}",
            (),
            "a hung df usually means a network filesystem stopped answering: `mount`, then "
            "check the NFS/Lustre server",
        )
    mounts: dict[str, tuple[str, int, int]] = {}
    for line in output.stdout.splitlines()[1:]:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[2].isdigit() and parts[3].isdigit():
            mounts.setdefault(parts[5], (parts[0], int(parts[2]), int(parts[3])))
    if not mounts:
        return Verdict(Status.SKIP, "df printed no filesystem", output.lines(2))
    lines, failing, warning = [], [], []
    for mount, (device, used, available) in mounts.items():
        share = available / (used + available) if used + available else 0.0
        gib = available / (1 << 20)
        lines.append(f"{mount} ({device}): {gib:.1f} GiB free, {share:.0%}")
        if share < DISK_FAIL_FREE:
            failing.append(f"{mount} {share:.0%} free")
        elif share < DISK_WARN_FREE or gib < DISK_WARN_GIB:
            warning.append(f"{mount} {gib:.1f} GiB ({share:.0%}) free")
    remedy = (
        "find what fills it: `du -xh -d 1 <mount> | sort -h | tail`; remove old checkpoints, "
        "caches (~/.cache/pip, ~/.cache/huggingface) and unused container images "
        "(`docker system prune`)"
    )
    if failing:
        return Verdict(Status.FAIL, f"nearly full: {_join(failing)}", tuple(lines), remedy)
    if warning:
        return Verdict(
            Status.WARN,
            f"low on space (under {DISK_WARN_FREE:.0%} or {DISK_WARN_GIB} GiB free): "
            f"{_join(warning)}",
            tuple(lines),
            remedy,
        )
    return Verdict(
        Status.PASS, f"{len(mounts)} filesystem(s) with room: " + _join(lines), tuple(lines)
    )


# --- disk-read ----------------------------------------------------------------------------------

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


def judge_disk_read(evidence: Evidence, context: Context) -> Verdict:
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


# --- the checks ---------------------------------------------------------------------------------

CHECKS: tuple[Check, ...] = (
    Check("persistence-mode", "Persistence mode", (SMI_QUERY,), judge_persistence),
    Check("ecc", "ECC mode and errors", (SMI_QUERY, ECC_COUNTS), judge_ecc),
    Check("row-remap", "Memory row remapping", (REMAPPED_ROWS, SMI_QUERY), judge_row_remap),
    Check("pcie-link", "PCIe link", (SMI_QUERY, HOST_DEVICE_BANDWIDTH), judge_pcie_link),
    Check(
        "host-device-bandwidth",
        "Host<->device copy bandwidth",
        (HOST_DEVICE_BANDWIDTH, SMI_QUERY),
        judge_host_device_bandwidth,
        peer_remedy="compare this host with its peers: the GPU's NUMA node (`nvidia-smi topo "
        "-m`) and the jobs' CPU binding, the kernel's IOMMU mode (`iommu=pt`), BIOS PCIe "
        "settings and firmware versions; make sure no other job was copying, then run the "
        "check again",
    ),
    Check("nvlink", "NVLink links", (NVLINK_STATUS, SMI_DETAILS, NVSWITCHES), judge_nvlink),
    Check("p2p-bandwidth", "GPU peer copies", (P2P_BANDWIDTH,), judge_p2p_bandwidth),
    Check(
        "fabric-manager",
        "Fabric Manager (NVSwitch systems)",
        (NVSWITCHES, SMI_DETAILS, FABRIC_MANAGER, SMI_QUERY),
        judge_fabric_manager,
    ),
    Check("xid-log", "XID errors since boot", (KERNEL_XIDS, SMI_QUERY), judge_xid_log),
    Check("nvme", "Local NVMe", (NVME,), judge_nvme),
    Check("disk-free", "Free disk space", (DISK_FREE,), judge_disk_free),
    Check("disk-read", "Temp disk read throughput", (DISK_READ,), judge_disk_read),
)
