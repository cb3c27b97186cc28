"""The pure parts of the NVML source: NVML's numbers and bitmasks as the model's words."""

from __future__ import annotations

import threading

import pynvml
import pytest

from gpuconsole.core.model import THROTTLE_REASONS, XidEvent
from gpuconsole.telemetry import SourceError
from gpuconsole.telemetry.nvml import (
    SWITCH,
    THROTTLE_BITS,
    NvmlSource,
    XidWatcher,
    ancestor_word,
    compute_mode_name,
    cpu_ranges,
    init_failure_reason,
    link_peer,
    merge_xids,
    mig_profile,
    nvlink_words,
    nvml_unavailable_reason,
    pstate_name,
    recovery_action_name,
    sysfs_numa_node,
    sysfs_pci_name,
    throttle_codes,
    topology_matrix,
)


def test_every_throttle_reason_of_the_model_has_its_nvml_bit() -> None:
    assert list(THROTTLE_BITS.values()) == list(THROTTLE_REASONS)
    assert all(bin(bit).count("1") == 1 for bit in THROTTLE_BITS)


@pytest.mark.parametrize(
    ("mask", "codes"),
    [
        (0, ()),
        (0x1, ("gpu-idle",)),
        (0x4, ("sw-power-cap",)),
        (0x8 | 0x20 | 0x40 | 0x80, ("hw-slowdown", "sw-thermal", "hw-thermal", "hw-power-brake")),
        (0x2 | 0x10 | 0x100, ("applications-clocks", "sync-boost", "display-clocks")),
        (0x200 | 0x400, ()),  # board limit and reliability: no code in the model
    ],
)
def test_throttle_codes(mask: int, codes: tuple[str, ...]) -> None:
    assert throttle_codes(mask) == codes


@pytest.mark.parametrize(
    ("level", "word"),
    [
        (pynvml.NVML_TOPOLOGY_INTERNAL, "PIX"),
        (pynvml.NVML_TOPOLOGY_SINGLE, "PIX"),
        (pynvml.NVML_TOPOLOGY_MULTIPLE, "PXB"),
        (pynvml.NVML_TOPOLOGY_HOSTBRIDGE, "PHB"),
        (pynvml.NVML_TOPOLOGY_NODE, "NODE"),
        (pynvml.NVML_TOPOLOGY_SYSTEM, "SYS"),
        (None, "N/A"),
        (99, "N/A"),
    ],
)
def test_ancestor_word(level: int | None, word: str) -> None:
    assert ancestor_word(level) == word


GPUS = {(0, 0x18, 0): 0, (0, 0x2A, 0): 1}


@pytest.mark.parametrize(
    ("remote_type", "remote", "peer"),
    [
        (pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, (0, 0x2A, 0), 1),
        (pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, (0, 0x90, 0), SWITCH),
        (pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, None, SWITCH),
        (None, (0, 0x18, 0), 0),  # the driver cannot say the type: the address tells
        (None, (0, 0x90, 0), SWITCH),  # ...and an end that is no GPU is a switch
        (pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU, (0, 0x04, 0), None),
        (pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, (0, 0x77, 0), None),  # a GPU this host hides
    ],
)
def test_link_peer(remote_type: int | None, remote: tuple[int, int, int] | None, peer) -> None:
    assert link_peer(remote_type, remote, GPUS) == peer


def test_nvlink_words_counts_direct_links_between_two_gpus() -> None:
    assert nvlink_words([[1, 1, 1, 1], [0, 0, 0, 0], []]) == {(0, 1): "NV4", (1, 0): "NV4"}


def test_nvlink_words_joins_every_pair_behind_nvswitches() -> None:
    words = nvlink_words([[SWITCH] * 18 for _ in range(8)])
    assert len(words) == 8 * 7
    assert set(words.values()) == {"NV18"}


def test_nvlink_words_behind_switches_go_at_the_pace_of_the_fewer_links() -> None:
    words = nvlink_words([[SWITCH] * 18, [SWITCH] * 12, []])
    assert words == {(0, 1): "NV12", (1, 0): "NV12"}


def test_nvlink_words_without_nvlink() -> None:
    assert nvlink_words([[], []]) == {}


def test_topology_matrix_overrides_pcie_with_nvlink() -> None:
    pcie = [["X", "NODE", "SYS"], ["NODE", "X", "SYS"], ["SYS", "SYS", "X"]]
    assert topology_matrix(pcie, nvlink_words([[1] * 4, [0] * 4, []])) == (
        ("X", "NV4", "SYS"),
        ("NV4", "X", "SYS"),
        ("SYS", "SYS", "X"),
    )


@pytest.mark.parametrize(
    ("mask", "text"),
    [
        ([0xFFFF], "0-15"),
        ([0x1], "0"),
        ([0b1011], "0-1,3"),
        ([(1 << 56) - 1, ((1 << 64) - 1) ^ ((1 << 48) - 1), (1 << 40) - 1], "0-55,112-167"),
        ([0, 1 << 63], "127"),
        ([0, 0], None),
        ([], None),
    ],
)
def test_cpu_ranges(mask: list[int], text: str | None) -> None:
    assert cpu_ranges(mask) == text


@pytest.mark.parametrize(("value", "name"), [(0, "P0"), (8, "P8"), (15, "P15"), (32, None)])
def test_pstate_name(value: int, name: str | None) -> None:
    assert pstate_name(value) == name


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (0, "none"),
        (1, "gpu-reset"),
        (2, "node-reboot"),
        (3, "drain-p2p"),
        (4, "drain-and-reset"),
        (42, "unknown-42"),
        (None, None),
    ],
)
def test_recovery_action_name(value: int | None, name: str | None) -> None:
    assert recovery_action_name(value) == name


def test_recovery_action_values_are_nvmls() -> None:
    for name, value in (
        ("NONE", 0),
        ("GPU_RESET", 1),
        ("NODE_REBOOT", 2),
        ("DRAIN_P2P", 3),
        ("DRAIN_AND_RESET", 4),
    ):
        assert getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{name}", value) == value


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (pynvml.NVML_COMPUTEMODE_DEFAULT, "Default"),
        (pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, "Exclusive_Process"),
        (pynvml.NVML_COMPUTEMODE_PROHIBITED, "Prohibited"),
        (None, None),
    ],
)
def test_compute_mode_name(value: int | None, name: str | None) -> None:
    assert compute_mode_name(value) == name


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H200 MIG 1g.18gb", "1g.18gb"),
        ("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", "1c.3g.20gb"),
        ("something else", "something else"),
        (None, None),
    ],
)
def test_mig_profile(name: str | None, profile: str | None) -> None:
    assert mig_profile(name) == profile


def test_sysfs_names() -> None:
    assert sysfs_pci_name("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_pci_name("00010000:01:00.0") == "10000:01:00.0"
    assert sysfs_pci_name("not a bus id") is None
    assert sysfs_numa_node(None) is None
    assert sysfs_numa_node("0000ffff:ff:1f.0") is None  # no such device


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "NVIDIA driver not loaded (libnvidia-ml.so not found)",
        ),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "NVML: Driver/library version mismatch"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded (no nvidia kernel module)"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "NVML: GPU is lost"),
    ],
)
def test_init_failure_reason(code: int, reason: str) -> None:
    assert init_failure_reason(pynvml.NVMLError(code)) == reason


def test_nvml_unavailable_reason_says_why_in_one_line() -> None:
    reason = nvml_unavailable_reason()
    if reason is None:
        pytest.skip("NVML works here: there is an NVIDIA GPU")
    assert reason.strip() and "\n" not in reason


def test_read_without_nvml_raises_source_error_with_the_reason() -> None:
    reason = nvml_unavailable_reason()
    if reason is None:
        pytest.skip("NVML works here: there is an NVIDIA GPU")
    source = NvmlSource(host="gpu01")
    with pytest.raises(SourceError) as raised:
        source.read("gpu01")
    assert str(raised.value) == f"gpu01: {reason}"


def test_read_of_another_host_is_refused() -> None:
    with pytest.raises(SourceError, match="only this host"):
        NvmlSource(host="gpu01").read("gpu02")


def test_merge_xids_prefers_the_logged_event() -> None:
    logged = XidEvent(79, 0, 100.0, "GPU has fallen off the bus.")
    same = XidEvent(79, 0, 102.0)
    later = XidEvent(79, 0, 200.0)
    other_gpu = XidEvent(79, 1, 100.5)
    assert merge_xids([logged, logged], [later, same, other_gpu]) == (logged, other_gpu, later)


def test_xid_watcher_reads_the_kernel_log_without_nvml_events() -> None:
    read = threading.Event()
    logged = XidEvent(48, 0, 1.0, "DBE")

    def kernel_log() -> list[XidEvent]:
        read.set()
        return [logged]

    watcher = XidWatcher({}, kernel_log, wait_ms=10)
    watcher.start()
    try:
        assert read.wait(5)
        assert watcher.running
    finally:
        watcher.stop()
    assert not watcher.running
    assert watcher.kernel_events() == (logged,)
    assert watcher.events() == ()
