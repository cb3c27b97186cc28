"""Which container a process runs in, read from its ``/proc/PID/cgroup``.

Container runtimes name the cgroup they put a container's processes in after the container's id,
and Kubernetes names the pod's cgroup after the pod's uid; both the systemd cgroup driver
(``docker-<id>.scope``, ``kubepods-besteffort-pod<uid with _>.slice``) and the cgroupfs driver
(``/docker/<id>``, ``/kubepods/besteffort/pod<uid>/<id>``) spell them, in cgroup v1 (one line per
hierarchy) and v2 (one ``0::`` line) alike. Ids are shortened to 12 hex digits, as ``docker ps``
prints them.
"""

from __future__ import annotations

import re
from pathlib import Path

_ID = r"([0-9a-f]{64})"
# (pattern, runtime) in the order they are tried on each cgroup path.
_RUNTIMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"(?:^|/)docker-{_ID}\.scope(?:/|$)"), "docker"),
    (re.compile(rf"/docker/{_ID}(?:/|$)"), "docker"),
    (re.compile(rf"(?:^|/)cri-containerd-{_ID}(?:\.scope)?(?:/|$)"), "containerd"),
    (re.compile(rf"(?:^|/)crio-{_ID}(?:\.scope)?(?:/|$)"), "cri-o"),
    (re.compile(rf"(?:^|/)libpod-{_ID}(?:\.scope)?(?:/|$)"), "podman"),
)
# A pod's uid: a UUID (dashes under cgroupfs, underscores in systemd slice names) or, for a static
# pod, the 32-hex hash of its manifest.
_POD = re.compile(
    r"kubepods\b.*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?(?:/|$)"
)
_SHORT_ID = 12


def _cgroup_paths(cgroup_text: str) -> list[str]:
    """The path of each ``hierarchy-id:controllers:path`` line."""
    return [line.split(":", 2)[2] for line in cgroup_text.splitlines() if line.count(":") >= 2]


def _runtime_id(path: str) -> str | None:
    for pattern, runtime in _RUNTIMES:
        match = pattern.search(path)
        if match:
            return f"{runtime}:{match.group(1)[:_SHORT_ID]}"
    return None


def _pod_uid(path: str) -> str | None:
    match = _POD.search(path)
    return match.group(1).replace("_", "-") if match else None


def container_of(cgroup_text: str) -> str | None:
    """``docker:<id>``, ``containerd:<id>``, ``cri-o:<id>``, ``podman:<id>``, ``k8s-pod:<uid>``,
    or ``k8s-pod:<uid>/<runtime>:<id>`` when both show; None for a process in no container."""
    runtime = pod = None
    for path in _cgroup_paths(cgroup_text):
        runtime = runtime or _runtime_id(path)
        pod = pod or _pod_uid(path)
    if pod and runtime:
        return f"k8s-pod:{pod}/{runtime}"
    if pod:
        return f"k8s-pod:{pod}"
    return runtime


def container_of_pid(pid: int) -> str | None:
    """The container of a running process; None when it is in none or cannot be read."""
    try:
        return container_of(Path(f"/proc/{pid}/cgroup").read_text())
    except (OSError, ValueError):
        return None
