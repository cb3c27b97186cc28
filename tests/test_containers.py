"""Container ids from /proc/PID/cgroup.

The cgroup files below are written from the documented layouts, not captured: Docker's cgroup
drivers (``systemd``: ``docker-<id>.scope``; ``cgroupfs``: ``/docker/<id>``), the kubelet's pod
cgroups (``kubepods-<qos>-pod<uid with _>.slice`` or ``/kubepods/<qos>/pod<uid>``) with
containerd's ``cri-containerd-<id>.scope`` and CRI-O's ``crio-<id>.scope``, and podman's
``libpod-<id>.scope``; cgroup v1 has one ``id:controllers:path`` line per hierarchy, v2 one
``0::path`` line.
"""

from __future__ import annotations

import os

import pytest

from gpuconsole.telemetry.containers import container_of, container_of_pid

ID = "4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"
SHORT = ID[:12]
UID = "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d"
SLICE_UID = UID.replace("-", "_")

V1_DOCKER = "\n".join(
    f"{n}:{controllers}:/docker/{ID}"
    for n, controllers in (
        (12, "pids"),
        (11, "memory"),
        (10, "devices"),
        (9, "cpu,cpuacct"),
        (1, "name=systemd"),
    )
)
V1_K8S_CGROUPFS = "\n".join(
    f"{n}:{controllers}:/kubepods/besteffort/pod{UID}/{ID}"
    for n, controllers in ((11, "memory"), (10, "devices"), (1, "name=systemd"))
)


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        (f"0::/system.slice/docker-{ID}.scope\n", f"docker:{SHORT}"),
        (f"0::/docker/{ID}\n", f"docker:{SHORT}"),
        (V1_DOCKER, f"docker:{SHORT}"),
        (
            f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{ID}.scope\n",
            f"docker:{SHORT}",
        ),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{SLICE_UID}.slice/cri-containerd-{ID}.scope\n",
            f"k8s-pod:{UID}/containerd:{SHORT}",
        ),
        (
            f"0::/kubepods.slice/kubepods-pod{SLICE_UID}.slice/cri-containerd-{ID}.scope\n",
            f"k8s-pod:{UID}/containerd:{SHORT}",
        ),
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{SLICE_UID}.slice/crio-{ID}.scope\n",
            f"k8s-pod:{UID}/cri-o:{SHORT}",
        ),
        (V1_K8S_CGROUPFS, f"k8s-pod:{UID}"),
        (
            # A static pod's uid is the hash of its manifest, not a UUID.
            f"0::/kubepods/burstable/pod0123456789abcdef0123456789abcdef/{ID}\n",
            "k8s-pod:0123456789abcdef0123456789abcdef",
        ),
        (
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/"
            f"libpod-{ID}.scope/container\n",
            f"podman:{SHORT}",
        ),
    ],
)
def test_container_of_names_the_runtime_and_pod(cgroup: str, expected: str) -> None:
    assert container_of(cgroup) == expected


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/init.scope\n",
        "0::/\n",
        "1:name=systemd:/system.slice/sshd.service\n11:memory:/system.slice/sshd.service\n",
        f"0::/system.slice/docker-{ID[:-1]}.scope\n",  # 63 hex digits: not a container id
        # CRI-O's conmon monitors a container from beside it; it is not the container.
        f"0::/system.slice/crio-conmon-{ID}.scope\n",
        "",
        "not a cgroup file\n",
    ],
)
def test_container_of_is_none_outside_containers(cgroup: str) -> None:
    assert container_of(cgroup) is None


def test_container_of_pid_reads_proc_or_gives_none() -> None:
    mine = container_of_pid(os.getpid())
    assert mine is None or ":" in mine
    assert container_of_pid(2**31 - 1) is None
