"""Every check judged on what its probes printed on a real, healthy NVIDIA H200 host.

tests/fixtures/verify/h200-probes.json was recorded there with `scripts/record_probes.py`
(2026-12-02: one H200, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130, Ubuntu 24.04 VM).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.verify.checks import CHECKS
from gpuconsole.actions.verify.model import Status
from gpuconsole.actions.verify.runner import distinct_probes, judge_all
from gpuconsole.hosts.targets import Context

RECORDED = Path(__file__).parent / "fixtures" / "verify" / "h200-probes.json"
NEWER_THAN_THE_RECORDING = frozenset({"nvidia-pci"})
"""Probes added after the recording (2026-12-07: the NVIDIA devices on the PCI bus). Nothing is
made up for them: their checks must judge that host as `EXPECTED` without them."""

# What the checks said on that host; a skip there is a tool or a part the host lacks.
EXPECTED = {
    "driver-loaded": Status.PASS,
    "nvidia-smi": Status.PASS,
    "nvml-driver-match": Status.PASS,
    "gpu-count": Status.PASS,
    "cuda-driver": Status.PASS,
    "cuda-toolkit": Status.PASS,
    "cudnn": Status.PASS,
    "tensorrt": Status.SKIP,
    "pytorch": Status.PASS,
    "tensorflow": Status.SKIP,
    "nouveau": Status.PASS,
    "kernel-headers": Status.SKIP,
    "dkms": Status.SKIP,
    "secure-boot": Status.SKIP,
    "profiler": Status.PASS,
    "persistence-mode": Status.PASS,
    "ecc": Status.PASS,
    "row-remap": Status.PASS,
    "pcie-link": Status.PASS,
    "host-device-bandwidth": Status.PASS,
    "nvlink": Status.SKIP,
    "p2p-bandwidth": Status.SKIP,
    "fabric-manager": Status.SKIP,
    "xid-log": Status.PASS,
    "nvme": Status.SKIP,
    "disk-free": Status.PASS,
    "disk-read": Status.PASS,
}


def recorded() -> dict[str, CommandOutput]:
    return {
        name: CommandOutput(**fields) for name, fields in json.loads(RECORDED.read_text()).items()
    }


def test_the_recording_covers_every_probe() -> None:
    assert {p.name for p in distinct_probes(CHECKS)} == set(recorded()) | NEWER_THAN_THE_RECORDING


def test_a_healthy_h200_gets_no_false_failure() -> None:
    results = judge_all(CHECKS, recorded(), Context("h200", expected_gpus=1))
    assert {r.id: r.status for r in results} == EXPECTED
    bandwidth = next(r for r in results if r.id == "host-device-bandwidth")
    assert "55.1 GB/s" in bandwidth.summary


def test_the_same_host_expecting_eight_gpus_fails_the_count() -> None:
    results = judge_all(CHECKS, recorded(), Context("h200", expected_gpus=8))
    count = next(r for r in results if r.id == "gpu-count")
    assert count.status is Status.FAIL
    assert count.remediation
