"""The container, Slurm-job and owner parsers against real ``/proc/PID/cgroup`` texts, and the
pod lookup against real kubelet log paths.

Each file in ``tests/fixtures/cgroups/`` is a cgroup text copied from a public repository's test
data or tests: Slurm v1 and v2, Kubernetes pods under the systemd and cgroupfs drivers (v1 and v2),
Docker, and plain host processes. ``README.md`` there names the repository, commit and path of each.
``test_containers.py`` writes its cases from the documented layouts. These are texts that real
nodes wrote. The expected values below were read off the texts by hand, not produced by the code
under test. Where a parser gets a real text wrong, the case carries the right answer and a strict
xfail that says what goes wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuconsole.telemetry.agent import KubePods, containers_in, slurm_job_id
from gpuconsole.telemetry.containers import container_of

FIXTURES = Path(__file__).parent / "fixtures" / "cgroups"
# Above Linux's PID_MAX_LIMIT (2**22), so no process has it: slurm_job_id finds no environment to
# fall back on and answers from the cgroup text alone.
NO_SUCH_PID = 4194305

# file -> (container_of, slurm_job_id)
EXPECTED: dict[str, tuple[str | None, int | None]] = {
    "slurm-v1-job4824887.txt": (None, 4824887),
    "slurm-v2-job1320003-step0.txt": (None, 1320003),
    "k8s-systemd-v1-containerd-amzn2.txt": (
        "k8s-pod:7a96c459-d529-44ae-9f99-90d3798d6426/containerd:1d3d308a7d48",
        None,
    ),
    # cgroupfs names no runtime, so only the pod shows.
    "k8s-cgroupfs-v1-docker-gke.txt": ("k8s-pod:74c13223-5a00-11e9-b385-42010a80018d", None),
    "k8s-systemd-v2-crio-besteffort.txt": (
        "k8s-pod:dbdd9718-6f63-40ef-987e-34776599d7d6/cri-o:bdf2eeede455",
        None,
    ),
    "k8s-cgroupfs-v2-guaranteed.txt": ("k8s-pod:51b64565-2b17-4d46-83ac-22e398f2f7fb", None),
    "k8s-kind-v2-containerd.txt": (
        "k8s-pod:3cae2e45-052c-4b11-80d3-4d7b2d2d3464/containerd:2b1801045111",
        None,
    ),
    "k8s-kind-in-docker-v2-nested.txt": (
        "k8s-pod:eab5a334-93fe-48a8-b139-9e8079c1f163/containerd:99f3a16ea25b",
        None,
    ),
    "k8s-containerd-systemd-colon-v1.txt": (
        "k8s-pod:94598a35-ad1e-4a00-91b1-1db37e8f52f6/containerd:0ac322a00cf6",
        None,
    ),
    "docker-systemd-v2.txt": ("docker:b176419186d7", None),
    "docker-cgroupfs-v1.txt": ("docker:b29faf21b7ef", None),
    "docker-systemd-v1.txt": ("docker:67f98c9e6188", None),
    "host-v1-systemd-service.txt": (None, None),
    "host-v2-user-session.txt": (None, None),
}

# Real texts container_of reads wrong today: file -> what goes wrong.
CONTAINER_OF_WRONG = {
    "k8s-kind-in-docker-v2-nested.txt": (
        "the path holds two runtime ids, the kind node's docker-<id>.scope and, deeper, the "
        "pod's cri-containerd-<id>.scope; _runtime_id tries its patterns in a fixed order and "
        "takes the first that matches anywhere, so the outer docker id is paired with the pod"
    ),
    "k8s-containerd-systemd-colon-v1.txt": (
        "containerd with a systemd-form cgroup parent writes '<pod>.slice:cri-containerd:<id>' "
        "literally; no runtime pattern knows the ':cri-containerd:' separator, and the pod "
        "pattern wants '/' or the end after '.slice', so neither pod nor container is found"
    ),
}


def _text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="ascii")


def _container_cases() -> list[object]:
    cases: list[object] = []
    for name, (container, _) in EXPECTED.items():
        marks = []
        if name in CONTAINER_OF_WRONG:
            marks.append(pytest.mark.xfail(strict=True, reason=CONTAINER_OF_WRONG[name]))
        cases.append(pytest.param(name, container, id=name, marks=marks))
    return cases


def test_every_fixture_has_an_expectation_and_a_source() -> None:
    files = {path.name for path in FIXTURES.glob("*.txt")} - {"kubelet-logs.txt"}
    assert files == set(EXPECTED)
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    assert [name for name in sorted(files) if f"`{name}`" not in readme] == []


@pytest.mark.parametrize(("name", "expected"), _container_cases())
def test_container_of_reads_real_cgroup_texts(name: str, expected: str | None) -> None:
    assert container_of(_text(name)) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [pytest.param(name, job, id=name) for name, (_, job) in EXPECTED.items()],
)
def test_slurm_job_id_reads_real_cgroup_texts(name: str, expected: int | None) -> None:
    assert slurm_job_id(NO_SUCH_PID, _text(name)) == expected


_UID = r"(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})"
_NAME = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
_POD_LOG_DIR = re.compile(rf"/var/log/pods/{_NAME}_{_NAME}_{_UID}(?:/{_NAME}/[0-9]+\.log)?")
_CONTAINER_LOG = re.compile(rf"/var/log/containers/{_NAME}_{_NAME}_{_NAME}-[0-9a-f]{{64}}\.log")


def test_kubelet_log_names_follow_the_kubelet_layout() -> None:
    """The real kubelet log paths have the kubelet's shapes. A pod's directory ends in its uid,
    which is a UUID or a static pod's 32-hex hash (the two forms container_of takes). A
    container's log ends in its 64-hex id."""
    lines = (FIXTURES / "kubelet-logs.txt").read_text(encoding="ascii").splitlines()
    assert lines
    odd = [
        line
        for line in lines
        if not (_POD_LOG_DIR.fullmatch(line) or _CONTAINER_LOG.fullmatch(line))
    ]
    assert odd == []
    assert any(re.search(r"_[0-9a-f]{32}(?:/|$)", line) for line in lines)  # a static pod


# file -> (pod uid, its container's full id), and the Docker container's full id: what the agent
# looks up in the kubelet's logs and asks Docker about (containers_in), read off by hand.
OWNERS: dict[str, tuple[tuple[str, str] | None, str | None]] = {
    "slurm-v1-job4824887.txt": (None, None),
    "slurm-v2-job1320003-step0.txt": (None, None),
    "k8s-systemd-v1-containerd-amzn2.txt": (
        (
            "7a96c459-d529-44ae-9f99-90d3798d6426",
            "1d3d308a7d48a27814a68bf33a44acf4441c9c02463ca0bc1cdfdc8c0b4a8496",
        ),
        None,
    ),
    # The cgroupfs driver's container cgroup is the bare id below the pod's.
    "k8s-cgroupfs-v1-docker-gke.txt": (
        (
            "74c13223-5a00-11e9-b385-42010a80018d",
            "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376",
        ),
        None,
    ),
    "k8s-systemd-v2-crio-besteffort.txt": (
        (
            "dbdd9718-6f63-40ef-987e-34776599d7d6",
            "bdf2eeede4551b27acbbb05fb1b4f61925786681734bf128e68d39e17d115098",
        ),
        None,
    ),
    "k8s-cgroupfs-v2-guaranteed.txt": (
        (
            "51b64565-2b17-4d46-83ac-22e398f2f7fb",
            "65d752a38e1db784d521f48c3f1956f4f9a74ebb923377144f253f3aca9fa028",
        ),
        None,
    ),
    "k8s-kind-v2-containerd.txt": (
        (
            "3cae2e45-052c-4b11-80d3-4d7b2d2d3464",
            "2b180104511194aab36fd295d3e217439f3ddb5bc88277f37b4952abee85c40e",
        ),
        None,
    ),
    # The pod's own container is the one right below the pod; the docker id is the kind node,
    # a Docker container the process does run in.
    "k8s-kind-in-docker-v2-nested.txt": (
        (
            "eab5a334-93fe-48a8-b139-9e8079c1f163",
            "99f3a16ea25b7724cb56a4f0c0df1113ad9474fbf5545bead97fd5c7f61c13f4",
        ),
        "fd9d0ea06257a9780827cbc7fd92e3812a54fca26d63e191b73610d5d48b9cbd",
    ),
    "k8s-containerd-systemd-colon-v1.txt": (
        (
            "94598a35-ad1e-4a00-91b1-1db37e8f52f6",
            "0ac322a00cf64a4d58144a1974b993d91537f3ceec12928b10d881af6be8bbb2",
        ),
        None,
    ),
    "docker-systemd-v2.txt": (
        None,
        "b176419186d75a44628851daf7841d3374a2ec56d0b038ee3bd1e0c6d331e5b1",
    ),
    "docker-cgroupfs-v1.txt": (
        None,
        "b29faf21b7eff959f64b4192c34d5d67a707fe8561e9eaa608cb27693fba4242",
    ),
    "docker-systemd-v1.txt": (
        None,
        "67f98c9e6188f9c1818672a15dbe46237b6ee7e77f834d40d41c5fb3c2f84a2f",
    ),
    "host-v1-systemd-service.txt": (None, None),
    "host-v2-user-session.txt": (None, None),
}
OWNERS_WRONG = {
    "k8s-containerd-systemd-colon-v1.txt": CONTAINER_OF_WRONG[
        "k8s-containerd-systemd-colon-v1.txt"
    ],
}


_APISERVER_ID = "3959d7abfbd0221e5043fccbcb8040e9a1a4e6518dad483b7a33a131885e0283"
"""The apiserver container's id, from its log link's name in kubelet-logs.txt."""


def test_every_fixture_has_its_owners() -> None:
    assert set(OWNERS) == set(EXPECTED)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(
            name,
            expected,
            id=name,
            marks=[pytest.mark.xfail(strict=True, reason=OWNERS_WRONG[name])]
            if name in OWNERS_WRONG
            else [],
        )
        for name, expected in OWNERS.items()
    ],
)
def test_the_pod_and_docker_ids_of_real_cgroup_texts(
    name: str, expected: tuple[tuple[str, str] | None, str | None]
) -> None:
    assert containers_in(_text(name)) == expected


def test_the_pods_of_real_kubelet_log_names_are_looked_up(tmp_path: Path) -> None:
    """The real log paths laid out in a directory: each pod's directory and container directory
    made, each container's log link made as the kubelet links it. The pods are then found by
    uid, named as their directories say, and the apiserver's container by its id."""
    for path in (FIXTURES / "kubelet-logs.txt").read_text(encoding="ascii").splitlines():
        made = tmp_path / path.removeprefix("/var/log/")
        if path.startswith("/var/log/containers/"):
            made.parent.mkdir(parents=True, exist_ok=True)
            made.symlink_to(path)  # dangling here, as it is outside a node; the name is what counts
        elif path.endswith(".log"):
            made.parent.mkdir(parents=True, exist_ok=True)
            made.write_text("")
        else:
            made.mkdir(parents=True, exist_ok=True)
    apiserver = ("33d556edd3ae8ef21980288cef77ae8b", _APISERVER_ID)
    proxy = ("fc6ce579-e910-42df-9e63-0a733746df5b", None)
    absent = ("7a96c459-d529-44ae-9f99-90d3798d6426", None)
    found = KubePods(str(tmp_path)).lookup({apiserver, proxy, absent})
    assert found[apiserver] == {
        "uid": apiserver[0],
        "namespace": "kube-system",
        "name": "kube-apiserver-controlplane",
        "container": "kube-apiserver",
    }
    assert found[proxy] == {
        "uid": proxy[0],
        "namespace": "kube-system",
        "name": "kube-proxy-qkgmx",
        "container": None,  # its directory lists no container in the source
    }
    assert found[absent] == {"uid": absent[0], "namespace": None, "name": None, "container": None}
