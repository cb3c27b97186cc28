"""Which container a process runs in, read from its ``/proc/PID/cgroup``.

Container runtimes name the cgroup they put a container's processes in after the container's id,
and Kubernetes names the pod's cgroup after the pod's uid; both the systemd cgroup driver
(``docker-<id>.scope``, ``kubepods-besteffort-pod<uid with _>.slice``) and the cgroupfs driver
(``/docker/<id>``, ``/kubepods/besteffort/pod<uid>/<id>``) spell them, in cgroup v1 (one line per
hierarchy) and v2 (one ``0::`` line) alike. Ids are shortened to 12 hex digits, as ``docker ps``
prints them. The patterns live in the agent (`gpuconsole.telemetry.agent`), which reads the same
cgroups on SSH hosts.
"""

from __future__ import annotations

from pathlib import Path

from gpuconsole.telemetry.agent import cgroup_paths, pod_of, runtime_container

_SHORT_ID = 12


def _runtime_id(path: str) -> str | None:
    found = runtime_container(path)
    return None if found is None else f"{found[0]}:{found[1][:_SHORT_ID]}"


def _pod_uid(path: str) -> str | None:
    found = pod_of(path)
    return None if found is None else found[0]


def container_of(cgroup_text: str) -> str | None:
    """``docker:<id>``, ``containerd:<id>``, ``cri-o:<id>``, ``podman:<id>``, ``k8s-pod:<uid>``,
    or ``k8s-pod:<uid>/<runtime>:<id>`` when both show; None for a process in no container."""
    runtime = pod = None
    for path in cgroup_paths(cgroup_text):
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
