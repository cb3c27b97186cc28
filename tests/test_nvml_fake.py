"""`NvmlSource` over a stand-in for pynvml's calls.

What one healthy H200 cannot show is shown here: every field at once, MIG instances, an NVSwitch
board, XID events, and GPUs that stop answering. The stand-in answers with values of the kind an
H200 gives (its nvidia-smi outputs are in tests/fixtures/nvidia-smi/); any call it is not given
an answer for is refused as NVML refuses an unsupported one.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import psutil
import pynvml
import pytest

from gpuconsole.model import (
    EccCounts,
    GpuProcess,
    GpuState,
    MigInstance,
    PcieLink,
    RowRemap,
    XidEvent,
)
from gpuconsole.telemetry.containers import container_of_pid
from gpuconsole.telemetry.nvml import NvmlSource, XidWatcher
from gpuconsole.telemetry.nvml import device as nvml_device

MIB = 2**20
GIB = 2**30
HOST = "gpu01"
SM, MEM = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
CORRECTED, UNCORRECTED = (
    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
)
VOLATILE, AGGREGATE = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC


def refuse(code: int = pynvml.NVML_ERROR_NOT_SUPPORTED) -> Callable[..., Any]:
    def refused(*_: Any) -> Any:
        raise pynvml.NVMLError(code)

    return refused


def recovery_field(_: Any, ids: list[int]) -> list[Any]:
    field = pynvml.c_nvmlFieldValue_t()
    field.fieldId = ids[0]
    field.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    field.nvmlReturn = pynvml.NVML_SUCCESS
    field.value.uiVal = 1  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
    return [field]


def h200(index: int) -> dict[str, Any]:
    """The answers of one busy H200 on an NVSwitch board, by pynvml function name."""
    return {
        "nvmlDeviceGetName": "NVIDIA H200",
        "nvmlDeviceGetUUID": f"GPU-{index:08x}-1111-2222-3333-444444444444",
        "nvmlDeviceGetPciInfo": SimpleNamespace(busId=f"0000BEEF:{0x18 + index:02X}:00.0".encode()),
        "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=87, memory=41),
        # Version 2 (a version argument) leaves out the driver's reserved memory.
        "nvmlDeviceGetMemoryInfo": lambda _, *version: SimpleNamespace(
            total=143771 * MIB, used=(80000 if version else 80500) * MIB
        ),
        "nvmlDeviceGetTemperatureV": 61,
        # The H200's thresholds through NVML: slowdown 89 °C, shutdown 95 °C.
        "nvmlDeviceGetTemperatureThreshold": {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 95,
        },
        "nvmlDeviceGetPowerUsage": 612_340,
        "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetPowerManagementLimitConstraints": [200_000, 700_000],
        "nvmlDeviceGetPowerManagementDefaultLimit": 700_000,
        "nvmlDeviceGetClockInfo": {SM: 1980, MEM: 3201},
        "nvmlDeviceGetMaxClockInfo": {SM: 1980, MEM: 3201},
        "nvmlDeviceGetApplicationsClock": {SM: 1980, MEM: 3201},
        # KB/s over 20 ms, as the loaded H200's nvidia-smi -q gave them.
        "nvmlDeviceGetPcieThroughput": {
            pynvml.NVML_PCIE_UTIL_TX_BYTES: 7712,
            pynvml.NVML_PCIE_UTIL_RX_BYTES: 15966,
        },
        "nvmlDeviceGetPerformanceState": 0,
        "nvmlDeviceGetCurrentClocksEventReasons": pynvml.nvmlClocksEventReasonSwPowerCap,
        "nvmlDeviceGetEccMode": [1, 1],
        "nvmlDeviceGetTotalEccErrors": lambda _, kind, counter: {
            (CORRECTED, VOLATILE): 3,
            (UNCORRECTED, VOLATILE): 0,
            (CORRECTED, AGGREGATE): 12,
            (UNCORRECTED, AGGREGATE): 1,
        }[kind, counter],
        "nvmlDeviceGetRemappedRows": (2, 0, 1, 0),
        "nvmlDeviceGetFieldValues": recovery_field,
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetPersistenceMode": 1,
        "nvmlDeviceGetComputeMode": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        "nvmlDeviceGetMigMode": [0, 0],
        "nvmlDeviceGetComputeRunningProcesses": [
            SimpleNamespace(pid=os.getpid(), usedGpuMemory=4 * GIB)
        ],
        "nvmlDeviceGetGraphicsRunningProcesses": [],
        "nvmlDeviceGetTopologyCommonAncestor": pynvml.NVML_TOPOLOGY_SYSTEM,
        "nvmlDeviceGetNvLinkState": lambda _, link: 1 if link < 18 else refuse()(),
        "nvmlDeviceGetNvLinkRemoteDeviceType": pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
        "nvmlDeviceGetNvLinkRemotePciInfo": SimpleNamespace(busId=b"0000BEEF:A0:00.0"),
        "nvmlDeviceGetCpuAffinity": lambda _, words: [0xFFFF] + [0] * (words - 1),
        # GPUs 0 and 1 on NUMA node 0, the others on node 1.
        "nvmlDeviceGetMemoryAffinity": lambda _, words, scope: (
            [1 << (index >= 2)] + [0] * (words - 1)
        ),
    }


def mig_device(gpu_instance: int, profile: str, total_mib: int, used_mib: int) -> dict[str, Any]:
    return {
        "nvmlDeviceGetGpuInstanceId": gpu_instance,
        "nvmlDeviceGetComputeInstanceId": 0,
        "nvmlDeviceGetName": f"NVIDIA H200 MIG {profile}",
        "nvmlDeviceGetUUID": f"MIG-{gpu_instance:08x}-aaaa-bbbb-cccc-dddddddddddd",
        "nvmlDeviceGetMemoryInfo": SimpleNamespace(total=total_mib * MIB, used=used_mib * MIB),
        "nvmlDeviceGetComputeRunningProcesses": [
            SimpleNamespace(pid=os.getpid() if gpu_instance == 1 else 999_999, usedGpuMemory=None)
        ],
    }


class FakeNvml:
    """pynvml's calls answered from per-GPU tables: ``gpus[i]`` maps function names to answers
    (a value, a dict keyed by the call's second argument, or a function of the call's
    arguments); a function or a dict's key not there is refused as not supported. A GPU's
    ``fault`` makes every call on it fail: "lost" or "unknown"."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
        self.gpus = [h200(i) for i in range(count)]
        self.faults: dict[int, str] = {}
        self.handle_errors: dict[int, int] = {}
        self.migs: dict[int, list[dict[str, Any]]] = {}
        self.shutdowns = 0
        self.asked: Counter[str] = Counter()
        self.events: list[Any] = []
        for name in dir(pynvml):
            if name.startswith(("nvmlDevice", "nvmlGpuInstance", "nvmlEventSet")):
                monkeypatch.setattr(pynvml, name, self._answer(name))
        monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlShutdown", self._shutdown)
        monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "580.159.04")
        monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion", lambda: 13000)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(self.gpus))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", self._handle)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", self._mig_handle)
        monkeypatch.setattr(pynvml, "nvmlEventSetCreate", lambda: "event set")
        monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", lambda *_: None)
        monkeypatch.setattr(pynvml, "nvmlEventSetWait", self._wait)
        monkeypatch.setattr(pynvml, "nvmlEventSetFree", lambda _: None)

    def _shutdown(self) -> None:
        self.shutdowns += 1

    def _handle(self, index: int) -> int:
        if index in self.handle_errors:
            raise pynvml.NVMLError(self.handle_errors[index])
        return index + 1  # a pointer's value: NVML's handles are never NULL

    def _mig_handle(self, handle: int, slot: int) -> tuple[int, int]:
        if slot >= len(self.migs.get(handle - 1, ())):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return (handle - 1, slot)

    def _table(self, handle: int | tuple[int, int]) -> dict[str, Any]:
        gpu = handle[0] if isinstance(handle, tuple) else handle - 1
        fault = self.faults.get(gpu)
        if fault:
            code = {"lost": pynvml.NVML_ERROR_GPU_IS_LOST, "unknown": pynvml.NVML_ERROR_UNKNOWN}
            raise pynvml.NVMLError(code[fault])
        return self.migs[gpu][handle[1]] if isinstance(handle, tuple) else self.gpus[gpu]

    def _answer(self, name: str) -> Callable[..., Any]:
        def answer(handle: Any = None, *args: Any) -> Any:
            self.asked[name] += 1
            value = self._table(handle).get(name) if handle is not None else None
            if value is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if callable(value):
                return value(handle, *args)
            if isinstance(value, dict):
                if args[0] not in value:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
                return value[args[0]]
            return value

        return answer

    def _wait(self, _: Any, timeout_ms: int) -> Any:
        if self.events:
            return self.events.pop(0)
        time.sleep(min(timeout_ms, 10) / 1000)  # keeps close() quick; the loop is the same
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    return FakeNvml(monkeypatch, count=1)


MakeSource = Callable[..., NvmlSource]


@pytest.fixture
def source(monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeSource]:
    """Makes sources, and closes them before the stand-in goes: their XID watchers use it."""
    made: list[NvmlSource] = []

    def make(**options: Any) -> NvmlSource:
        options = {"clock": lambda: 1000.0, "kernel_log": lambda _: [], **options}
        made.append(NvmlSource(host=HOST, **options))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_a_reading_fills_every_field(nvml: FakeNvml, source: MakeSource) -> None:
    snapshot = source().read(HOST)
    assert (snapshot.host, snapshot.time, snapshot.source) == (HOST, 1000.0, "nvml")
    assert (snapshot.driver_version, snapshot.cuda_version) == ("580.159.04", "13.0")
    assert snapshot.gpus == (
        GpuState(
            index=0,
            name="NVIDIA H200",
            uuid="GPU-00000000-1111-2222-3333-444444444444",
            pci_bus_id="0000BEEF:18:00.0",
            utilization_pct=87.0,
            memory_utilization_pct=41.0,
            memory_used_mib=80000.0,
            memory_total_mib=143771.0,
            temperature_c=61.0,
            slowdown_temperature_c=89.0,
            shutdown_temperature_c=95.0,
            power_w=612.34,
            power_limit_w=700.0,
            power_limit_min_w=200.0,
            power_limit_max_w=700.0,
            power_limit_default_w=700.0,
            sm_clock_mhz=1980.0,
            sm_clock_max_mhz=1980.0,
            sm_clock_application_mhz=1980.0,
            memory_clock_mhz=3201.0,
            memory_clock_max_mhz=3201.0,
            memory_clock_application_mhz=3201.0,
            pstate="P0",
            fan_pct=None,
            throttle_reasons=("sw-power-cap",),
            ecc=EccCounts(3, 0, 12, 1),
            remap=RowRemap(correctable=2, uncorrectable=0, pending=True, failure=False),
            recovery_action="gpu-reset",
            pcie=PcieLink(gen=5, width=16, max_gen=5, max_width=16),
            pcie_tx_kib_s=7712.0,
            pcie_rx_kib_s=15966.0,
            persistence_mode=True,
            compute_mode="Exclusive_Process",
            mig_mode=False,
        ),
    )
    me = psutil.Process()
    assert snapshot.processes == (
        GpuProcess(
            pid=os.getpid(),
            gpu=0,
            used_memory_mib=4096.0,
            user=me.username(),
            command=" ".join(me.cmdline()),
            kind="compute",
            container=container_of_pid(os.getpid()),
            started=round(me.create_time(), 2),  # /proc's start, as the agent reads it
        ),
    )


def test_fields_the_gpu_refuses_are_none(nvml: FakeNvml, source: MakeSource) -> None:
    identity = ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo")
    nvml.gpus[0] = {name: nvml.gpus[0][name] for name in identity}
    (gpu,) = source().read(HOST).gpus
    assert gpu == GpuState(
        index=0, name="NVIDIA H200", uuid=gpu.uuid, pci_bus_id="0000BEEF:18:00.0"
    )


def test_ecc_disabled_gives_no_counts(nvml: FakeNvml, source: MakeSource) -> None:
    nvml.gpus[0]["nvmlDeviceGetEccMode"] = [0, 0]
    assert source().read(HOST).gpus[0].ecc is None


def test_older_bindings_fall_back_to_the_older_calls(nvml: FakeNvml, source: MakeSource) -> None:
    table = nvml.gpus[0]
    table["nvmlDeviceGetTemperature"] = table.pop("nvmlDeviceGetTemperatureV")
    table["nvmlDeviceGetCurrentClocksThrottleReasons"] = table.pop(
        "nvmlDeviceGetCurrentClocksEventReasons"
    )
    gpu = source().read(HOST).gpus[0]
    assert (gpu.temperature_c, gpu.throttle_reasons) == (61.0, ("sw-power-cap",))


def test_mig_instances_and_their_processes(nvml: FakeNvml, source: MakeSource) -> None:
    table = nvml.gpus[0]
    table["nvmlDeviceGetMigMode"] = [1, 1]
    table["nvmlDeviceGetMaxMigDeviceCount"] = 7
    del table["nvmlDeviceGetUtilizationRates"]  # NVML has none for a GPU in MIG mode
    nvml.migs[0] = [mig_device(1, "3g.71gb", 71_424, 30_000), mig_device(2, "1g.18gb", 17_664, 0)]
    snapshot = source().read(HOST)
    (gpu,) = snapshot.gpus
    assert (gpu.mig_mode, gpu.utilization_pct) == (True, None)
    assert gpu.mig_instances == (
        MigInstance(
            1, 0, "3g.71gb", 71_424.0, 30_000.0, "MIG-00000001-aaaa-bbbb-cccc-dddddddddddd"
        ),
        MigInstance(2, 0, "1g.18gb", 17_664.0, 0.0, "MIG-00000002-aaaa-bbbb-cccc-dddddddddddd"),
    )
    assert [(p.pid, p.mig_instance, p.used_memory_mib) for p in snapshot.processes] == [
        (os.getpid(), 1, None),
        (999_999, 2, None),
    ]
    assert snapshot.processes[1].user is None  # no such process here


def test_the_numa_node_comes_from_sysfs_where_nvml_gives_none(
    nvml: FakeNvml, source: MakeSource
) -> None:
    del nvml.gpus[0]["nvmlDeviceGetMemoryAffinity"]
    topology = source().read(HOST).topology
    assert topology is not None and topology.numa_affinity == (None,)  # no such device in sysfs


def test_what_cannot_change_is_asked_once(nvml: FakeNvml, source: MakeSource) -> None:
    nvml_source = source()
    for _ in range(3):
        nvml_source.read(HOST)
    asked = nvml.asked
    assert asked["nvmlDeviceGetFanSpeed"] == 1  # not supported: not asked again
    assert asked["nvmlDeviceGetMaxClockInfo"] == 2  # SM and memory, once
    assert asked["nvmlDeviceGetPowerManagementLimitConstraints"] == 1
    assert asked["nvmlDeviceGetTemperatureThreshold"] == 2  # slowdown and shutdown, once
    assert asked["nvmlDeviceGetName"] == 1
    assert asked["nvmlDeviceGetEccMode"] == asked["nvmlDeviceGetMigMode"] == 1  # for 10 s
    assert asked["nvmlDeviceGetPowerUsage"] == 3


def test_limits_are_read_once_and_the_traffic_every_reading(
    nvml: FakeNvml, source: MakeSource
) -> None:
    tx, rx = pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES
    readings = [{tx: 7712, rx: 15966}, {tx: 6862, rx: 15676}]
    asked: Counter[int] = Counter()

    def throughput(_: Any, direction: int) -> int:
        """Each direction's next figure: the two are asked on threads of their own."""
        asked[direction] += 1
        return readings[asked[direction] - 1][direction]

    nvml.gpus[0]["nvmlDeviceGetPcieThroughput"] = throughput
    nvml_source = source()
    first, again = (nvml_source.read(HOST).gpus[0] for _ in range(2))
    assert (first.pcie_tx_kib_s, first.pcie_rx_kib_s) == (7712.0, 15966.0)
    assert (again.pcie_tx_kib_s, again.pcie_rx_kib_s) == (6862.0, 15676.0)
    assert again.power_limit_min_w == first.power_limit_min_w == 200.0
    assert nvml.asked["nvmlDeviceGetPowerManagementLimitConstraints"] == 1
    assert nvml.asked["nvmlDeviceGetPowerManagementDefaultLimit"] == 1
    assert nvml.asked["nvmlDeviceGetApplicationsClock"] == 2  # SM and memory, for 10 s


def test_limits_and_traffic_the_gpu_does_not_support_are_none(
    nvml: FakeNvml, source: MakeSource
) -> None:
    table = nvml.gpus[0]
    for name in (
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetApplicationsClock",
        "nvmlDeviceGetPcieThroughput",
    ):
        del table[name]
    del table["nvmlDeviceGetTemperatureThreshold"][pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN]
    nvml_source = source()
    gpu = nvml_source.read(HOST).gpus[0]
    nvml_source.read(HOST)
    assert (gpu.slowdown_temperature_c, gpu.utilization_pct) == (89.0, 87.0)  # the rest is read
    for name in (
        "power_limit_min_w",
        "power_limit_max_w",
        "power_limit_default_w",
        "sm_clock_application_mhz",
        "memory_clock_application_mhz",
        "shutdown_temperature_c",
        "pcie_tx_kib_s",
        "pcie_rx_kib_s",
    ):
        assert getattr(gpu, name) is None, name
    assert nvml.asked["nvmlDeviceGetPcieThroughput"] == 2  # refused once: not asked again


def test_a_gpu_lost_while_its_traffic_is_sampled_is_lost(
    monkeypatch: pytest.MonkeyPatch, source: MakeSource
) -> None:
    """GPU_IS_LOST from the throughput, asked on the pool, marks the GPU lost as any call does."""
    nvml = FakeNvml(monkeypatch, count=2)
    nvml.gpus[1]["nvmlDeviceGetPcieThroughput"] = refuse(pynvml.NVML_ERROR_GPU_IS_LOST)
    gpus = source().read(HOST).gpus
    assert (gpus[0].lost, gpus[1].lost) == (False, True)
    assert gpus[0].pcie_tx_kib_s == 7712.0


def test_a_handle_got_only_on_the_second_try_gives_no_traffic_yet(
    nvml: FakeNvml, source: MakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML refused the GPU's handle when its traffic was asked for, then gave it: the reading
    has everything but the traffic, which the next reading has."""
    give = pynvml.nvmlDeviceGetHandleByIndex
    tries: Counter[int] = Counter()

    def refused_once(index: int) -> Any:
        tries[index] += 1
        if tries[index] == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return give(index)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", refused_once)
    nvml_source = source()
    first = nvml_source.read(HOST).gpus[0]
    assert (first.name, first.pcie_tx_kib_s) == ("NVIDIA H200", None)
    assert nvml_source.read(HOST).gpus[0].pcie_tx_kib_s == 7712.0


def test_a_change_of_mig_mode_asks_again_what_was_not_supported(
    nvml: FakeNvml, source: MakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml_device, "MODE_REFRESH_S", 0.0)
    table = nvml.gpus[0]
    utilization = table.pop("nvmlDeviceGetUtilizationRates")
    table["nvmlDeviceGetMigMode"] = [1, 1]
    nvml_source = source()
    assert nvml_source.read(HOST).gpus[0].utilization_pct is None
    table["nvmlDeviceGetMigMode"] = [0, 0]
    table["nvmlDeviceGetUtilizationRates"] = utilization
    assert nvml_source.read(HOST).gpus[0].utilization_pct == 87.0


def test_an_nvswitch_board(monkeypatch: pytest.MonkeyPatch, source: MakeSource) -> None:
    FakeNvml(monkeypatch, count=4)
    topology = source().read(HOST).topology
    assert topology is not None
    assert topology.matrix == tuple(
        tuple("X" if a == b else "NV18" for b in range(4)) for a in range(4)
    )
    assert topology.cpu_affinity == ("0-15",) * 4
    assert topology.numa_affinity == (0, 0, 1, 1)


def test_pcie_only_gpus(monkeypatch: pytest.MonkeyPatch, source: MakeSource) -> None:
    nvml = FakeNvml(monkeypatch, count=2)
    for table in nvml.gpus:
        del table["nvmlDeviceGetNvLinkState"]
    topology = source().read(HOST).topology
    assert topology is not None and topology.matrix == (("X", "SYS"), ("SYS", "X"))


def test_a_gpu_that_is_lost_keeps_its_identity_and_spares_the_others(
    monkeypatch: pytest.MonkeyPatch, source: MakeSource
) -> None:
    nvml = FakeNvml(monkeypatch, count=2)
    nvml_source = source()
    before = nvml_source.read(HOST)
    nvml.faults[1] = "lost"
    after = nvml_source.read(HOST)
    assert after.gpus[0] == before.gpus[0]
    assert after.gpus[1] == GpuState(
        index=1,
        name="NVIDIA H200",
        uuid=before.gpus[1].uuid,
        pci_bus_id="0000BEEF:19:00.0",
        lost=True,
    )
    assert [p.gpu for p in after.processes] == [0]


def test_unknown_error_on_every_call_is_a_lost_gpu(
    monkeypatch: pytest.MonkeyPatch, source: MakeSource
) -> None:
    nvml = FakeNvml(monkeypatch, count=2)
    nvml.faults[1] = "unknown"
    gpus = source().read(HOST).gpus
    assert gpus[0].name == "NVIDIA H200"
    assert gpus[1] == GpuState(index=1, lost=True)


@pytest.mark.parametrize(
    ("error", "lost"),
    [(pynvml.NVML_ERROR_GPU_IS_LOST, True), (pynvml.NVML_ERROR_NO_PERMISSION, False)],
)
def test_a_gpu_without_a_handle(
    monkeypatch: pytest.MonkeyPatch, error: int, lost: bool, source: MakeSource
) -> None:
    nvml = FakeNvml(monkeypatch, count=2)
    nvml.handle_errors[1] = error
    snapshot = source().read(HOST)
    assert snapshot.gpus[1] == GpuState(index=1, lost=lost)
    assert snapshot.gpus[0].name == "NVIDIA H200"
    assert snapshot.topology is None  # read once every GPU has a handle


def test_xid_events_from_nvml_and_the_kernel_log(nvml: FakeNvml, source: MakeSource) -> None:
    xid = pynvml.nvmlEventTypeXidCriticalError
    logged = XidEvent(63, 0, 10.0, "Row Remapper: New row marked for remapping")
    nvml.events.append(SimpleNamespace(eventType=xid, eventData=94, device=1))
    nvml_source = source(clock=time.time, kernel_log=lambda bus_to_gpu: [logged])
    nvml_source.read(HOST)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        events = nvml_source.read(HOST).xid_events
        if len(events) == 2:
            break
        time.sleep(0.02)
    nvml_source.close()
    assert events[0] == logged
    assert (events[1].xid, events[1].gpu) == (94, 0)
    assert nvml.shutdowns == 1


def test_xid_watcher_without_nvml_events(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", lambda *_: refuse()())
    watcher = XidWatcher({0: 1}, wait_ms=10)
    watcher.start()
    time.sleep(0.05)
    assert watcher.running
    watcher.stop()
    assert not watcher.running and watcher.events() == ()


def test_close_then_read_again(nvml: FakeNvml, source: MakeSource) -> None:
    nvml_source = source()
    nvml_source.read(HOST)
    nvml_source.close()
    assert nvml.shutdowns == 1
    assert nvml_source.read(HOST).gpus[0].name == "NVIDIA H200"
    nvml_source.close()
