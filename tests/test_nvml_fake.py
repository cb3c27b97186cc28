"""`NvmlSource` over the stand-in libnvidia-ml (tests/nvml_standin.py), with pynvml answering
from the same tables for the topology and the XID events.

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

from gpuconsole.core.model import (
    EccCounts,
    GpuProcess,
    GpuState,
    MigInstance,
    PcieLink,
    RowRemap,
    XidEvent,
)
from gpuconsole.telemetry import agent as agent_module
from gpuconsole.telemetry.containers import container_of_pid
from gpuconsole.telemetry.nvml import NvmlSource, XidWatcher
from tests.nvml_standin import (
    FAULTS,
    StandinLibrary,
    h200,
    in_mig_mode,
    mig_device,
    refuse,
)

HOST = "gpu01"


class FakeNvml(StandinLibrary):
    """The stand-in libnvidia-ml with ``count`` H200s, as the library pynvml loaded (the one
    `NvmlSource` reads the GPUs through), and pynvml's device calls answering from the same
    tables for the topology and the XID events: ``events`` are the XID events to deliver."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
        super().__init__([h200(i) for i in range(count)])
        self.events: list[Any] = []
        for name in dir(pynvml):
            if name.startswith("nvmlDevice"):
                monkeypatch.setattr(pynvml, name, self._pynvml_answer(name))
        monkeypatch.setattr(pynvml, "nvmlLib", self)
        monkeypatch.setattr(pynvml, "nvmlInit", self._pynvml_init)
        monkeypatch.setattr(pynvml, "nvmlShutdown", self._pynvml_shutdown)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", self._pynvml_handle)
        monkeypatch.setattr(pynvml, "nvmlEventSetCreate", lambda: "event set")
        monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", lambda *_: None)
        monkeypatch.setattr(pynvml, "nvmlEventSetWait", self._wait)
        monkeypatch.setattr(pynvml, "nvmlEventSetFree", lambda _: None)

    def _pynvml_init(self) -> None:
        self.inits += 1

    def _pynvml_shutdown(self) -> None:
        self.inits -= 1

    def _pynvml_handle(self, index: int) -> int:
        if index in self.handle_errors:
            raise pynvml.NVMLError(self.handle_errors[index])
        return index + 1  # the handle the library gives

    def _pynvml_answer(self, name: str) -> Callable[..., Any]:
        def answer(handle: int, *args: Any) -> Any:
            if handle - 1 in self.faults:
                raise pynvml.NVMLError(FAULTS[self.faults[handle - 1]])
            return self._answer(name, self.gpus[handle - 1], handle, args)

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
            serial="1654922000000",
            vbios_version="96.00.A5.00.01",
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
            retired_pages_pending=False,
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


def test_an_older_driver_is_read_with_the_older_calls(nvml: FakeNvml, source: MakeSource) -> None:
    nvml.missing = {"nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons"}
    table = nvml.gpus[0]
    table["nvmlDeviceGetTemperature"] = table["nvmlDeviceGetTemperatureV"]
    table["nvmlDeviceGetCurrentClocksThrottleReasons"] = table[
        "nvmlDeviceGetCurrentClocksEventReasons"
    ]
    gpu = source().read(HOST).gpus[0]
    assert (gpu.temperature_c, gpu.throttle_reasons) == (61.0, ("sw-power-cap",))


def test_mig_instances_and_their_processes(nvml: FakeNvml, source: MakeSource) -> None:
    in_mig_mode(nvml.gpus[0])
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


def test_limits_are_read_once_and_the_traffic_once_in_its_interval(
    nvml: FakeNvml, source: MakeSource, monkeypatch: pytest.MonkeyPatch
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
    first, carried = (nvml_source.read(HOST).gpus[0] for _ in range(2))
    monkeypatch.setattr(agent_module, "PCIE_SAMPLE_S", 0.0)
    again = nvml_source.read(HOST).gpus[0]
    assert (first.pcie_tx_kib_s, first.pcie_rx_kib_s) == (7712.0, 15966.0)
    assert (carried.pcie_tx_kib_s, carried.pcie_rx_kib_s) == (7712.0, 15966.0)
    assert (again.pcie_tx_kib_s, again.pcie_rx_kib_s) == (6862.0, 15676.0)
    assert again.power_limit_min_w == first.power_limit_min_w == 200.0
    assert nvml.asked["nvmlDeviceGetPowerManagementLimitConstraints"] == 1
    assert nvml.asked["nvmlDeviceGetPowerManagementDefaultLimit"] == 1
    assert nvml.asked["nvmlDeviceGetApplicationsClock"] == 2  # SM and memory, for 10 s
    assert asked == {tx: 2, rx: 2}


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
    give = nvml.nvmlDeviceGetHandleByIndex_v2
    tries: Counter[int] = Counter()

    def refused_once(index: int, handle: Any) -> int:
        tries[index] += 1
        if tries[index] == 1:
            return pynvml.NVML_ERROR_NO_PERMISSION
        return give(index, handle)

    monkeypatch.setattr(nvml, "nvmlDeviceGetHandleByIndex_v2", refused_once)
    nvml_source = source()
    first = nvml_source.read(HOST).gpus[0]
    assert (first.name, first.pcie_tx_kib_s) == ("NVIDIA H200", None)
    assert nvml_source.read(HOST).gpus[0].pcie_tx_kib_s == 7712.0


def test_a_change_of_mig_mode_asks_again_what_was_not_supported(
    nvml: FakeNvml, source: MakeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_module, "MODE_REFRESH_S", 0.0)
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
        serial="1654922000001",
        vbios_version="96.00.A5.00.01",
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
    assert nvml.inits == 0  # pynvml's and the reader's, each shut down


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
    assert nvml.inits == 2  # pynvml's and the reader's
    nvml_source.close()
    assert nvml.inits == 0
    assert nvml_source.read(HOST).gpus[0].name == "NVIDIA H200"
    nvml_source.close()
    assert nvml.inits == 0
