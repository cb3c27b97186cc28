"""The agent's NVML reader (`Nvml`, `NvmlDevice`) against the stand-in libnvidia-ml
(tests/nvml_standin.py): every key of an nvml-mode entry, what it asks once and what every
reading, MIG devices, lost GPUs, and its ctypes structs held to NVML's (pynvml's) layout.
`NvmlSource`, which runs the same reader in the console's process, is tested in
tests/test_nvml_fake.py."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpuconsole.telemetry import agent as agent_module
from gpuconsole.telemetry.agent import (
    GPU_KEYS,
    Nvml,
    cuda_version_text,
    field_number,
    merge_running,
    process_details,
)
from tests.nvml_standin import (
    GIB,
    StandinLibrary,
    h200,
    in_mig_mode,
    mig_device,
    refuse,
)

H200_ENTRY: dict[str, Any] = {
    "index": 0,
    "lost": False,
    "name": "NVIDIA H200",
    "uuid": "GPU-00000000-1111-2222-3333-444444444444",
    "pci_bus_id": "0000BEEF:18:00.0",
    "serial": "1654922000000",
    "vbios_version": "96.00.A5.00.01",
    "utilization_pct": 87,
    "memory_utilization_pct": 41,
    "memory_used_mib": 80000.0,  # the _v2 call's, without the driver's reservation
    "memory_total_mib": 143771.0,
    "temperature_c": 61,
    "slowdown_temperature_c": 89,
    "shutdown_temperature_c": 95,
    "power_w": 612.34,
    "power_limit_w": 700.0,
    "power_limit_min_w": 200.0,
    "power_limit_max_w": 700.0,
    "power_limit_default_w": 700.0,
    "sm_clock_mhz": 1980,
    "sm_clock_max_mhz": 1980,
    "sm_clock_application_mhz": 1980,
    "memory_clock_mhz": 3201,
    "memory_clock_max_mhz": 3201,
    "memory_clock_application_mhz": 3201,
    "fan_pct": 30,
    "pcie_tx_kib_s": 7712,
    "pcie_rx_kib_s": 15966,
    "pstate": 0,
    "throttle_mask": pynvml.nvmlClocksEventReasonSwPowerCap,
    "compute_mode": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    "recovery_action": 1,  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
    "ecc": {
        "volatile_corrected": 3,
        "volatile_uncorrected": 0,
        "aggregate_corrected": 12,
        "aggregate_uncorrected": 1,
    },
    "remap": {"correctable": 2, "uncorrectable": 0, "pending": True, "failure": False},
    "retired_pages_pending": False,
    "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16},
    "persistence_mode": True,
    "mig_mode": False,
    "mig_instances": [],
}
"""What `h200(0)` reads as, with a fan at 30 %: a value for every key."""


def busy_h200s(count: int) -> StandinLibrary:
    tables = [h200(index) for index in range(count)]
    for table in tables:
        table["nvmlDeviceGetFanSpeed"] = 30
    return StandinLibrary(tables)


def test_a_gpu_entry_has_every_key_each_read_by_its_call() -> None:
    nvml = Nvml(busy_h200s(1))
    (gpu,), (process,) = nvml.read()
    assert gpu == H200_ENTRY
    assert set(GPU_KEYS) == set(H200_ENTRY)
    assert process == {
        "pid": os.getpid(),
        "gpu": 0,
        "used_memory_mib": 4096.0,
        "kind": "compute",
        "mig_instance": None,
        **process_details(os.getpid()),  # user, command, cgroup, start, Slurm job
        "load": None,  # the stand-in's GPU gives no process samples
    }
    assert (nvml.driver_version(), nvml.cuda_version()) == ("580.159.04", "13.0")


def test_what_cannot_change_is_asked_once_and_the_modes_every_ten_seconds() -> None:
    library = busy_h200s(2)
    nvml = Nvml(library)
    readings = [nvml.read()[0] for _ in range(3)]
    assert readings[0] == readings[2]
    once_a_gpu = (
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetComputeMode",
        "nvmlDeviceGetPersistenceMode",
    )
    assert {name: library.calls[name] for name in once_a_gpu} == dict.fromkeys(once_a_gpu, 2)
    twice_a_gpu = (  # SM and memory, or slowdown and shutdown
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetApplicationsClock",
    )
    assert {name: library.calls[name] for name in twice_a_gpu} == dict.fromkeys(twice_a_gpu, 4)
    assert library.calls["nvmlDeviceGetPowerUsage"] == 2 * 3
    assert library.calls["nvmlDeviceGetPcieThroughput"] == 2 * 2  # sampled once in 5 s


def test_a_call_refused_as_not_supported_is_not_made_again() -> None:
    library = StandinLibrary([h200(0)])  # no fan: not supported
    library.gpus[0]["nvmlDeviceGetPowerUsage"] = refuse(pynvml.NVML_ERROR_NO_PERMISSION)
    nvml = Nvml(library)
    for _ in range(3):
        (gpu,), _ = nvml.read()
        assert gpu["fan_pct"] is gpu["power_w"] is None
    assert library.calls["nvmlDeviceGetFanSpeed"] == 1
    assert library.calls["nvmlDeviceGetPowerUsage"] == 3  # another refusal may pass: asked again


def test_an_older_driver_is_read_with_the_older_calls() -> None:
    library = StandinLibrary([h200(0)])
    table = library.gpus[0]
    library.missing = {
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    }
    table["nvmlDeviceGetTemperature"] = {pynvml.NVML_TEMPERATURE_GPU: 61}
    table["nvmlDeviceGetCurrentClocksThrottleReasons"] = 0x4
    (gpu,), (process,) = Nvml(library).read()
    assert (gpu["temperature_c"], gpu["throttle_mask"]) == (61, 0x4)
    assert gpu["memory_used_mib"] == 80500.0  # version 1 counts the reserved memory as used
    assert (process["pid"], process["used_memory_mib"]) == (os.getpid(), 4096.0)
    assert library.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 2


def test_a_gpu_in_mig_mode_gives_its_instances_and_their_processes() -> None:
    library = StandinLibrary([h200(0)])
    in_mig_mode(library.gpus[0])
    library.migs[0] = [
        mig_device(1, "3g.71gb", 71_424, 30_000),
        mig_device(2, "1g.18gb", 17_664, 0),
    ]
    (gpu,), processes = Nvml(library).read()
    assert (gpu["mig_mode"], gpu["utilization_pct"], gpu["name"]) == (True, None, "NVIDIA H200")
    assert gpu["mig_instances"] == [
        {
            "gpu_instance_id": 1,
            "compute_instance_id": 0,
            "name": "NVIDIA H200 MIG 3g.71gb",
            "memory_total_mib": 71_424.0,
            "memory_used_mib": 30_000.0,
            "uuid": "MIG-00000001-aaaa-bbbb-cccc-dddddddddddd",
        },
        {
            "gpu_instance_id": 2,
            "compute_instance_id": 0,
            "name": "NVIDIA H200 MIG 1g.18gb",
            "memory_total_mib": 17_664.0,
            "memory_used_mib": 0.0,
            "uuid": "MIG-00000002-aaaa-bbbb-cccc-dddddddddddd",
        },
    ]
    assert [(p["pid"], p["gpu"], p["mig_instance"], p["used_memory_mib"]) for p in processes] == [
        (os.getpid(), 0, 1, None),
        (999_999, 0, 2, None),
    ]


def test_a_lost_gpu_keeps_its_identity_and_spares_the_others() -> None:
    library = busy_h200s(2)
    nvml = Nvml(library)
    before, _ = nvml.read()
    library.faults[1] = "lost"
    after, processes = nvml.read()
    assert after[0] == before[0]
    identity = {key: before[1][key] for key in agent_module.IDENTITY}
    assert identity["serial"] == "1654922000001"
    assert after[1] == dict.fromkeys(GPU_KEYS) | identity | {
        "index": 1,
        "lost": True,
        "mig_instances": [],
    }
    assert [p["gpu"] for p in processes] == [0]


def test_unknown_error_on_every_call_is_a_lost_gpu() -> None:
    library = busy_h200s(2)
    library.faults[1] = "unknown"
    gpus, _ = Nvml(library).read()
    assert gpus[0] == H200_ENTRY
    assert gpus[1] == dict.fromkeys(GPU_KEYS) | {"index": 1, "lost": True, "mig_instances": []}


def _counting_throughput(library: StandinLibrary) -> list[tuple[int, int]]:
    """Each sample the stand-in's GPU 0 gives one more than the last, in both directions;
    returns the list the samples go to."""
    samples: list[tuple[int, int]] = []

    def sampled(_: Any, direction: int) -> int:
        if direction == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            samples.append((len(samples) + 1, 0))
            return len(samples)
        return 1000 + len(samples)

    library.gpus[0]["nvmlDeviceGetPcieThroughput"] = sampled
    return samples


def test_the_traffic_is_sampled_once_in_its_interval_and_carried_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Readings within PCIE_SAMPLE_S of a sample carry it, and NVML is not asked; once the
    interval has passed, the next reading samples again."""
    library = busy_h200s(1)
    samples = _counting_throughput(library)
    nvml = Nvml(library)
    first, carried = (nvml.read()[0][0] for _ in range(2))
    assert len(samples) == 1
    assert (first["pcie_tx_kib_s"], carried["pcie_tx_kib_s"]) == (1, 1)
    monkeypatch.setattr(agent_module, "PCIE_SAMPLE_S", 0.0)
    again = nvml.read()[0][0]
    nvml.shutdown()
    assert len(samples) == 2
    assert (again["pcie_tx_kib_s"], again["pcie_rx_kib_s"]) == (2, 1002)


def test_a_gpu_back_from_lost_is_sampled_anew() -> None:
    """A lost GPU's reading carries no traffic, and the first reading after it samples again
    rather than carrying what the GPU moved before it was lost."""
    library = busy_h200s(1)
    samples = _counting_throughput(library)
    nvml = Nvml(library)
    nvml.read()
    library.faults[0] = "lost"
    lost = nvml.read()[0][0]
    del library.faults[0]
    back = nvml.read()[0][0]
    nvml.shutdown()
    assert lost["lost"] and lost["pcie_tx_kib_s"] is None
    assert (len(samples), back["pcie_tx_kib_s"]) == (2, 2)


def test_the_traffic_of_every_gpu_is_sampled_at_once() -> None:
    """NVML samples each direction for 20 ms before it answers: eight GPUs' sixteen samples,
    taken in turn, would add 320 ms to a reading."""
    library = busy_h200s(8)
    threads: set[str] = set()

    def sampled(_: Any, direction: int) -> int:
        threads.add(threading.current_thread().name)
        time.sleep(0.1)
        return 7712 if direction == pynvml.NVML_PCIE_UTIL_TX_BYTES else 15966

    for table in library.gpus:
        table["nvmlDeviceGetPcieThroughput"] = sampled
    nvml = Nvml(library)
    began = time.monotonic()
    gpus, _ = nvml.read()
    took = time.monotonic() - began
    nvml.shutdown()
    assert all(gpu["pcie_rx_kib_s"] == 15966 for gpu in gpus)
    assert took < 0.5  # 1.6 s in turn
    assert len(threads) == 16 and all(name.startswith("nvml-pcie") for name in threads)
    assert library.inits == 0


# --- NVML's layouts and numbers, as pynvml (nvidia-ml-py) has them --------------------------


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (agent_module._FieldValue, pynvml.c_nvmlFieldValue_t),
        (agent_module._Value, pynvml.c_nvmlValue_t),
        (agent_module._TemperatureV1, pynvml.c_nvmlTemperature_v1_t),
        (agent_module._ProcessInfo, pynvml.c_nvmlProcessInfo_v2_t),
        (agent_module._MemoryV2, pynvml.c_nvmlMemory_v2_t),
    ],
)
def test_the_structs_are_laid_out_as_nvml_h_says(ours: Any, theirs: Any) -> None:
    assert [name for name, _ in ours._fields_] == [name for name, _ in theirs._fields_]
    assert ctypes.sizeof(ours) == ctypes.sizeof(theirs)
    for name, _ in ours._fields_:
        mine, nvmls = getattr(ours, name), getattr(theirs, name)
        assert (mine.offset, mine.size) == (nvmls.offset, nvmls.size), name


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NOT_SUPPORTED"),
        ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_GPU_IS_LOST"),
        ("NVML_ERROR_UNKNOWN", "NVML_ERROR_UNKNOWN"),
        ("NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_FUNCTION_NOT_FOUND"),
        ("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
        ("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
        ("NVML_PCIE_UTIL_TX_BYTES", "NVML_PCIE_UTIL_TX_BYTES"),
        ("NVML_PCIE_UTIL_RX_BYTES", "NVML_PCIE_UTIL_RX_BYTES"),
        ("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
        ("NVML_FEATURE_ENABLED", "NVML_DEVICE_MIG_ENABLE"),
        ("NVML_MEMORY_V2", "nvmlMemory_v2"),
        ("NVML_TEMPERATURE_V1", "nvmlTemperature_v1"),
    ],
)
def test_the_numbers_are_nvmls(ours: str, theirs: str) -> None:
    assert getattr(agent_module, ours) == getattr(pynvml, theirs)


def test_the_value_members_follow_nvmls_value_types() -> None:
    members = agent_module.VALUE_MEMBERS
    for member in members:
        value_type = {
            "dVal": "DOUBLE",
            "uiVal": "UNSIGNED_INT",
            "ulVal": "UNSIGNED_LONG",
            "ullVal": "UNSIGNED_LONG_LONG",
            "sllVal": "SIGNED_LONG_LONG",
            "siVal": "SIGNED_INT",
            "usVal": "UNSIGNED_SHORT",
        }[member]
        assert (
            agent_module.VALUE_MEMBERS[getattr(pynvml, f"NVML_VALUE_TYPE_{value_type}")] == member
        )


def _field(value_type: int, member: str, number: float, result: int = pynvml.NVML_SUCCESS) -> Any:
    field = pynvml.c_nvmlFieldValue_t()
    field.valueType = value_type
    field.nvmlReturn = result
    setattr(field.value, member, number)
    return field


def test_field_number_reads_the_union_member_of_the_value_type() -> None:
    assert field_number(_field(pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 2)) == 2
    assert field_number(_field(pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**40)) == 2**40
    assert field_number(_field(pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 1.5)) == 1.5


def test_field_number_is_none_for_a_field_nvml_could_not_read() -> None:
    refused = _field(
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 0, pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    assert field_number(refused) is None
    assert field_number(_field(99, "uiVal", 2)) is None  # a value type this reader does not know


def test_merge_running_joins_compute_and_graphics() -> None:
    def process(pid: int, used: int) -> SimpleNamespace:
        return SimpleNamespace(pid=pid, usedGpuMemory=used)

    unknown = agent_module.NVML_VALUE_NOT_AVAILABLE
    merged = merge_running(
        [process(10, GIB), process(11, unknown)], [process(10, 2**20), process(12, 5)]
    )
    assert sorted(merged) == [
        (10, GIB, "compute+graphics"),
        (11, None, "compute"),
        (12, 5, "graphics"),
    ]


@pytest.mark.parametrize(
    ("version", "text"), [(12080, "12.8"), (12020, "12.2"), (13000, "13.0"), (11040, "11.4")]
)
def test_cuda_version_text(version: int, text: str) -> None:
    assert cuda_version_text(version) == text
