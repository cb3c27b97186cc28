"""Has the kernel logged an XID error since boot? What each XID means and what to do about it is
NVIDIA's XID catalog as shared/reference/gpu-facts.md keeps it ("XID errors"), through
`gpuconsole.core.xid`."""

from __future__ import annotations

from collections import Counter

from gpuconsole.actions.verify.judging import joined
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.actions.verify.probes import SMI_QUERY, gpu_rows
from gpuconsole.core import xid
from gpuconsole.core.model import Severity
from gpuconsole.hosts.targets import Context
from gpuconsole.telemetry.kernel_log import parse_xid_lines

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


def _fails_node(info: xid.XidInfo) -> bool:
    """Fleet checks fail a node on these; so do XIDs whose GPU needs a reset, unless the catalog
    blames the application."""
    return info.fleet_flags or (xid.severity(info.xid) is Severity.CRITICAL and not info.app_error)


def _judge_xid_log(evidence: Evidence, context: Context) -> Verdict:
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
        for r in gpu_rows(evidence)
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
    summary = (
        f"XID {joined(map(str, numbers))} in the kernel log since boot ({len(events)} line(s))"
    )
    if failing:
        return Verdict(Status.FAIL, summary, evidence_lines, actions)
    return Verdict(
        Status.WARN,
        summary + ": application errors, the GPU keeps working",
        evidence_lines,
        actions,
    )


CHECKS: tuple[Check, ...] = (
    Check("xid-log", "XID errors since boot", (KERNEL_XIDS, SMI_QUERY), _judge_xid_log),
)
