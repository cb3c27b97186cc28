"""Have the filesystems a job writes to (temp dirs, home, scratch mounts) room left?"""

from __future__ import annotations

from gpuconsole.actions.verify.judging import joined
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

DISK_FREE = Probe(
    "disk-free",
    "set --; "
    'for dir in /tmp /var/tmp "$TMPDIR" "$HOME" /raid /mnt /scratch /local; do'
    ' [ -n "$dir" ] && [ -d "$dir" ] && set -- "$@" "$dir"; done; '
    'command -v df >/dev/null 2>&1 || exit 127; df -P -k "$@"',
)
"""The filesystems a job writes to: temp dirs, home, the usual scratch mounts that exist."""


DISK_FAIL_FREE = 0.02
DISK_WARN_FREE = 0.10
DISK_WARN_GIB = 20


def _judge_disk_free(evidence: Evidence, context: Context) -> Verdict:
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
        return Verdict(Status.FAIL, f"nearly full: {joined(failing)}", tuple(lines), remedy)
    if warning:
        return Verdict(
            Status.WARN,
            f"low on space (under {DISK_WARN_FREE:.0%} or {DISK_WARN_GIB} GiB free): "
            f"{joined(warning)}",
            tuple(lines),
            remedy,
        )
    return Verdict(
        Status.PASS, f"{len(mounts)} filesystem(s) with room: " + joined(lines), tuple(lines)
    )


CHECKS: tuple[Check, ...] = (Check("disk-free", "Free disk space", (DISK_FREE,), _judge_disk_free),)
