"""Simulated GPU hosts for the demo (``gpuconsole --demo``) and for snapshot tests.

A reading is a pure function of (seed, epoch, faults, time): the same rack read at the same time
gives an equal `HostSnapshot`, whatever was read before. Every source of variation comes from
stable keys, never from `hash()` (which Python salts per process):

- the workload (which jobs run on which GPUs, and when) from `random.Random` seeded with strings;
- the per-second noise from a SplitMix64 hash of (GPU key, step);
- the one true state, each GPU's temperature, is integrated in fixed 1-second steps from the
  rack's epoch and cached per host, so that reading forward costs only the new steps.

Time is quantised to steps: a reading at ``t`` shows step ``floor(t - epoch)``, and a fault set
``since`` a time takes effect from the first step at or after it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from gpuconsole.core.clock import Clock
from gpuconsole.core.model import (
    EccCounts,
    GpuProcess,
    GpuState,
    HostSnapshot,
    KubePod,
    PcieLink,
    ProcessLoad,
    RowRemap,
    SchedulerNode,
    SlurmJob,
    Topology,
    XidEvent,
)
from gpuconsole.telemetry import SourceError

DEFAULT_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z

FAULTS: dict[str, str] = {
    "thermal-throttle": "cooling fails on one GPU: it runs above its slowdown temperature, slowed",
    "xid-79": "one GPU falls off the bus (XID 79): it stops answering and its processes vanish",
    "ecc-uncorrectable": "one GPU hits a double-bit ECC error (XID 48): a row remap awaits a reset",
    "pcie-degraded": "one GPU's PCIe link trains at half its width",
    "host-unresponsive": "the whole host stops answering",
    "memory-leak": "a process on one GPU leaks memory until it is killed (OOM), then restarts",
    "stuck-process": "an idle zombie notebook kernel holds most of one GPU's memory",
}
_HOST_FAULTS = frozenset({"host-unresponsive"})


class HostUnreachable(SourceError):
    """A simulated host does not answer (the ``host-unresponsive`` fault)."""


# --- hardware profiles ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HostProfile:
    """One kind of GPU server: its cards, their limits, and how they are wired.

    Datacenter cards are passively cooled (the chassis fans are not the GPU's), so no profile
    reports a fan speed.
    """

    name: str
    gpu_name: str
    gpu_count: int
    memory_total_mib: int
    power_limit_w: float
    """The board's default and highest power limit, and the one enforced."""
    power_limit_min_w: float
    sm_clock_max_mhz: int
    memory_clock_max_mhz: int
    sm_clock_application_mhz: int
    memory_clock_application_mhz: int
    """The default application clocks (nobody set others with ``nvidia-smi -ac``)."""
    slowdown_temperature_c: float
    shutdown_temperature_c: float
    pcie_max_gen: int
    pcie_max_width: int
    topology: Topology
    pci_bus_ids: tuple[str, ...]
    idle_power_w: float
    sm_clock_idle_mhz: int
    memory_clock_idle_mhz: int
    thermal_resistance_c_per_w: float
    """Steady-state degrees above the inlet air per watt drawn, with healthy cooling."""
    has_row_remap: bool
    """HBM parts remap rows; GDDR parts (L40S) report no remap state."""
    driver_version: str
    cuda_version: str
    vbios_version: str
    """In NVIDIA's form; made up, as the cards' serial numbers are."""


def _matrix(count: int, link: Callable[[int, int], str]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple("X" if a == b else link(a, b) for b in range(count)) for a in range(count))


def _bus_ids(*buses: int) -> tuple[str, ...]:
    return tuple(f"00000000:{bus:02X}:00.0" for bus in buses)


def _h100_link(a: int, b: int) -> str:
    """HGX H100: every GPU reaches every other through the NVSwitches, 18 links each."""
    return "NV18"


def _a100_link(a: int, b: int) -> str:
    """A100 PCIe server: two sockets, GPUs 0-3 on socket 0 and 4-7 on socket 1.

    Each socket has two host bridges with one PCIe switch each: on socket 0 switch A holds GPUs 0
    and 2, switch B holds 1 and 3 (socket 1 likewise: 4/6 and 5/7). NVLink bridges join the
    physically adjacent cards 0-1, 2-3, 4-5, 6-7, which sit under different switches. Hence:
    bridged pairs NV12; 0-2 and 1-3 PIX; 0-3 and 1-2 NODE; across the sockets SYS.
    """
    if a // 2 == b // 2:
        return "NV12"
    if a // 4 != b // 4:
        return "SYS"
    return "PIX" if a % 2 == b % 2 else "NODE"


def _l40s_link(a: int, b: int) -> str:
    """L40S server: one socket, two host bridges, a PCIe switch under each holding two GPUs."""
    return "PIX" if a // 2 == b // 2 else "NODE"


PROFILES: dict[str, HostProfile] = {
    "h100-sxm-8": HostProfile(
        name="h100-sxm-8",
        gpu_name="NVIDIA H100 80GB HBM3",
        gpu_count=8,
        memory_total_mib=81559,
        power_limit_w=700.0,
        # The limits, application clocks and the 6 °C from slowdown to shutdown are those of
        # the H200 the fixtures were captured on (its SXM board and GH100 are the H100's):
        # tests/fixtures/nvidia-smi/h200-q.xml (Min Power Limit, Applications Clocks at the
        # Max Clocks, the T.Limit margins -2 and -8 °C).
        power_limit_min_w=200.0,
        sm_clock_max_mhz=1980,
        memory_clock_max_mhz=2619,
        sm_clock_application_mhz=1980,
        memory_clock_application_mhz=2619,
        slowdown_temperature_c=87.0,
        shutdown_temperature_c=93.0,
        pcie_max_gen=5,
        pcie_max_width=16,
        topology=Topology(
            _matrix(8, _h100_link),
            cpu_affinity=("0-55,112-167",) * 4 + ("56-111,168-223",) * 4,
            numa_affinity=(0,) * 4 + (1,) * 4,
        ),
        pci_bus_ids=_bus_ids(0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB),
        idle_power_w=72.0,
        sm_clock_idle_mhz=345,
        memory_clock_idle_mhz=2619,
        thermal_resistance_c_per_w=0.057,
        has_row_remap=True,
        driver_version="570.133.20",
        cuda_version="12.8",
        vbios_version="96.00.74.00.0C",
    ),
    "a100-pcie-8": HostProfile(
        name="a100-pcie-8",
        gpu_name="NVIDIA A100 80GB PCIe",
        gpu_count=8,
        memory_total_mib=81920,
        power_limit_w=300.0,
        power_limit_min_w=150.0,  # nominal: half the limit, as no dump of this card was found
        sm_clock_max_mhz=1410,
        memory_clock_max_mhz=1512,
        # The A100-SXM4's (same GA100) in tests/fixtures/nvidia-smi/a100-sxm4-mig-510.xml:
        # Graphics at 1095 MHz, Memory at its maximum; shutdown 92 °C beside slowdown 89 °C.
        sm_clock_application_mhz=1095,
        memory_clock_application_mhz=1512,
        slowdown_temperature_c=89.0,
        shutdown_temperature_c=92.0,
        pcie_max_gen=4,
        pcie_max_width=16,
        topology=Topology(
            _matrix(8, _a100_link),
            cpu_affinity=("0-31,64-95",) * 4 + ("32-63,96-127",) * 4,
            numa_affinity=(0,) * 4 + (1,) * 4,
        ),
        # Switch A of socket 0 is bus 0x1A/0x1C, switch B 0x3B/0x3D; socket 1 mirrors at 0x9A...
        pci_bus_ids=_bus_ids(0x1A, 0x3B, 0x1C, 0x3D, 0x9A, 0xBB, 0x9C, 0xBD),
        idle_power_w=45.0,
        sm_clock_idle_mhz=210,
        memory_clock_idle_mhz=1512,
        thermal_resistance_c_per_w=0.143,
        has_row_remap=True,
        driver_version="550.144.03",
        cuda_version="12.4",
        vbios_version="92.00.45.00.06",
    ),
    "l40s-4": HostProfile(
        name="l40s-4",
        gpu_name="NVIDIA L40S",
        gpu_count=4,
        memory_total_mib=46068,
        power_limit_w=350.0,
        power_limit_min_w=100.0,  # nominal, as no dump of this card was found
        sm_clock_max_mhz=2520,
        memory_clock_max_mhz=9001,
        sm_clock_application_mhz=2520,  # nominal: the maximum clocks, as the H200's are
        memory_clock_application_mhz=9001,
        slowdown_temperature_c=90.0,
        # Ada's 10 °C from slowdown to shutdown: the T.Limit margins -2 and -12 °C of the RTX
        # 4070 in tests/fixtures/nvidia-smi/rtx4070-laptop-wddm-q.txt.
        shutdown_temperature_c=100.0,
        pcie_max_gen=4,
        pcie_max_width=16,
        topology=Topology(
            _matrix(4, _l40s_link), cpu_affinity=("0-63",) * 4, numa_affinity=(0,) * 4
        ),
        pci_bus_ids=_bus_ids(0x03, 0x04, 0x43, 0x44),
        idle_power_w=33.0,
        sm_clock_idle_mhz=210,
        memory_clock_idle_mhz=405,
        thermal_resistance_c_per_w=0.126,
        has_row_remap=False,
        driver_version="570.133.20",
        cuda_version="12.8",
        vbios_version="95.02.5D.00.02",
    ),
}


@dataclass(frozen=True)
class ActiveFault:
    """A fault injected into a host: on one GPU, or on the whole host when ``gpu`` is None."""

    fault: str
    gpu: int | None
    since: float


# --- stable randomness ---------------------------------------------------------------------------

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_UNIT = 1.0 / 4294967296.0


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a stable, well-spread 64-bit hash of an integer."""
    x = (x + _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _digest(key: str, size: int) -> str:
    return hashlib.blake2b(key.encode(), digest_size=size).hexdigest()


def _gpu_uuid(key: str) -> str:
    h = _digest(f"uuid:{key}", 16)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _serial(key: str) -> str:
    """Thirteen digits, as NVIDIA's boards print theirs."""
    return str(1_320_000_000_000 + int(_digest(f"serial:{key}", 8), 16) % 10**11)


def _pid(key: str) -> int:
    return random.Random(f"pid:{key}").randint(10_000, 3_999_000)


# --- workload ------------------------------------------------------------------------------------

# How a host's GPUs are split into "lanes": each lane runs one job at a time on all its GPUs.
_LANE_PATTERNS: dict[int, tuple[tuple[tuple[int, ...], ...], ...]] = {
    8: (
        ((0, 1, 2, 3, 4, 5, 6, 7),),
        ((0, 1, 2, 3), (4, 5, 6, 7)),
        ((0, 1, 2, 3), (4, 5), (6,), (7,)),
        ((0, 1), (2, 3), (4, 5, 6, 7)),
    ),
    4: (((0, 1, 2, 3),), ((0, 1), (2, 3)), ((0,), (1,), (2, 3))),
}
_SOLO_JOBS = (
    ("alice", "python train.py --model llama-7b --bf16"),
    ("bob", "python finetune.py --model mistral-7b --lora-rank 16"),
    ("dave", "python train_resnet.py --arch resnet50 --batch-size 256 --amp"),
    ("erin", "python sweep.py --trial 17 --lr 3e-4"),
)
_GANG_JOBS = (
    ("svc-train", "torchrun --nproc-per-node={n} pretrain.py --config gpt-1.3b.yaml"),
    ("mlops", "torchrun --nproc-per-node={n} train.py --model llama-13b --fsdp"),
    ("alice", "deepspeed --num_gpus {n} train.py --zero-stage 2 --model llama-7b"),
    ("bob", "torchrun --nproc-per-node={n} resnet50_ddp.py --amp --batch-size 256"),
)
_CONTAINER_USERS = frozenset({"svc-train", "mlops"})
_CONTEXT_MIB = 9  # what the driver itself holds on a card with any process on it
_RANK0_EXTRA_MIB = 400  # rank 0 of a data-parallel job keeps a little more (metrics, checkpoints)


@dataclass(frozen=True)
class _Job:
    start: int
    end: int
    gpus: tuple[int, ...]
    pid: int
    user: str
    command: str
    container: str | None
    memory_fraction: float
    ramp_s: int
    intensity: float
    """Power demand at 100 % utilization as a share of the limit's headroom; > 1 hits the cap."""
    eval_period_s: int
    eval_s: int
    memory_util_pct: float
    slurm: SlurmJob | None
    """The Slurm job it runs as, where it is not in a container (its start filled in on use)."""
    pod: KubePod | None
    """The Kubernetes pod it runs in, where it runs in a container."""


def _iso(t: float) -> str:
    """A time as squeue prints a job's start (``2026-01-01T00:05:00``), in UTC here."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def _slurm_job(key: str, user: str, command: str) -> SlurmJob | None:
    """A Slurm job for a job outside a container, from a random stream of its own (so that the
    other draws, and the rack they make, stay as they were)."""
    if user in _CONTAINER_USERS:
        return None
    rng = random.Random(f"{key}:slurm")
    script = next((w for w in command.split() if w.endswith(".py")), "job.py")
    return SlurmJob(
        rng.randint(40_000, 99_999),
        script.removesuffix(".py"),
        user,
        "gpu",
        None,
        rng.choice(("1-00:00:00", "2-00:00:00", "12:00:00")),
        "RUNNING",
    )


def _pod(key: str, user: str, command: str) -> KubePod | None:
    """The pod of a job in a container, from a random stream of its own like `_slurm_job`."""
    if user not in _CONTAINER_USERS:
        return None
    rng = random.Random(f"{key}:pod")
    script = next((w for w in command.split() if w.endswith(".py")), "job.py")
    uid = "-".join(f"{rng.getrandbits(bits):0{bits // 4}x}" for bits in (32, 16, 16, 16, 48))
    name = f"{script.removesuffix('.py')}-{rng.getrandbits(20):05x}"
    return KubePod(uid, user, name, "trainer")


def worker_command(command: str) -> str:
    """What a launcher's worker runs as (its own argv): torchrun and deepspeed start
    ``python3 -u SCRIPT ARGS`` on each GPU; a plain command is its own."""
    words = command.split()
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script is None or words[0] not in ("torchrun", "deepspeed"):
        return command
    return " ".join(["python3", "-u", *words[script:]])


_STUCK_AGE_S = 3 * 86_400
"""How long before the simulation began the forgotten notebook kernel started."""


def _loaded(process: GpuProcess, gpu: GpuState) -> GpuProcess:
    """The process with its share of its GPU: the GPU's whole load, the only process on it."""
    load = ProcessLoad(gpu.utilization_pct, gpu.memory_utilization_pct, 0.0, 0.0)
    return dataclasses.replace(process, load=load)


_INFER_POD = KubePod("5f1c2e9a-7b3d-4c8e-9a61-2d4f8b0c7e13", "infer", "llama-13b-7d9f5", "server")
"""The leaking inference server's pod."""


class _Lane:
    """A lane's job schedule, generated lazily job by job from its own seeded key."""

    def __init__(self, gpus: tuple[int, ...], key: str) -> None:
        self.gpus = gpus
        self._key = key
        self._jobs: list[_Job] = []
        self._starts: list[int] = []

    def job_at(self, step: int) -> _Job | None:
        while not self._jobs or self._jobs[-1].end <= step:
            job = self._next_job()
            self._jobs.append(job)
            self._starts.append(job.start)
        i = bisect_right(self._starts, step) - 1
        return self._jobs[i] if i >= 0 and self._jobs[i].end > step else None

    def _next_job(self) -> _Job:
        rng = random.Random(f"{self._key}:job{len(self._jobs)}")
        duration = rng.randint(240, 1500)
        if self._jobs:
            start = self._jobs[-1].end + rng.randint(20, 150)
        elif rng.random() < 0.25:
            start = rng.randint(20, 120)
        else:  # already running when the simulation begins
            start = -rng.randint(60, duration - 30)
        user, command = rng.choice(_SOLO_JOBS if len(self.gpus) == 1 else _GANG_JOBS)
        return _Job(
            start=start,
            end=start + duration,
            gpus=self.gpus,
            pid=rng.randint(10_000, 3_999_000),
            user=user,
            command=command.format(n=len(self.gpus)),
            container=f"{user}-{rng.getrandbits(20):05x}" if user in _CONTAINER_USERS else None,
            memory_fraction=rng.uniform(0.35, 0.93),
            ramp_s=rng.randint(10, 30),
            intensity=rng.uniform(0.82, 1.3),
            eval_period_s=rng.randint(120, 420),
            eval_s=rng.randint(6, 20),
            memory_util_pct=rng.uniform(18.0, 60.0),
            slurm=_slurm_job(f"{self._key}:job{len(self._jobs)}", user, command),
            pod=_pod(f"{self._key}:job{len(self._jobs)}", user, command),
        )


# --- per-step physics ----------------------------------------------------------------------------

_NEVER = 1 << 62
_LOST, _IDLE, _JOB, _LEAK, _STUCK = "lost", "idle", "job", "leak", "stuck"
_LEAK_BASE_FRACTION = 0.3
_LEAK_MIB_PER_S = 768.0
_LEAK_HEADROOM_MIB = 512.0
_OOM_RESTART_S = 20  # the service manager restarts the killed process after this long
_STUCK_FRACTION = 0.6
_PCIE_IDLE_KIB_S = (888.0, 492.0)
"""What an idle GPU's link carries, TX and RX: the idle H200's (tests/fixtures/nvidia-smi/
h200-q.xml)."""
_PCIE_BUSY_KIB_S = (300_000.0, 1_500_000.0)
"""What a job adds at full utilization, TX and RX: nominal, a training job's input pipeline
(about 1.5 GB/s into the GPU, a fifth of that out)."""
_THROTTLE_START_BELOW_C = 2.0  # software thermal slowdown starts this far below the slowdown temp
_THROTTLE_SPAN_C = 10.0  # ... and would reach the floor this many degrees above that start
_THROTTLE_FLOOR = 0.3
_FAULTY_COOLING_OVERSHOOT_C = 40.0  # with failed cooling, full power would settle this far above


@dataclass(frozen=True)
class _GpuParams:
    """What distinguishes one card from its neighbours; fixed for the card's life."""

    uuid: str
    serial: str
    noise_key: int
    idle_power_w: float
    ambient_c: float
    k_healthy: float
    k_faulty: float
    alpha: float
    """Per-step weight of the first-order thermal lag, 1 - exp(-1/tau)."""
    volatile_corrected: int
    aggregate_corrected: int
    remap_correctable: int


class _Activity(NamedTuple):
    """What occupies a GPU during one step."""

    kind: str
    job: _Job | None = None
    cycle: int = 0
    """memory-leak: how many times the leaking process was killed before."""
    age: int = 0
    """memory-leak: seconds since the leaking process (re)started."""


_LOST_ACTIVITY, _IDLE_ACTIVITY, _STUCK_ACTIVITY = (
    _Activity(_LOST),
    _Activity(_IDLE),
    _Activity(_STUCK),
)


class _Drive(NamedTuple):
    """What one GPU did during one step, short of its temperature and processes."""

    activity: _Activity
    util: float
    memory_util: float
    power: float
    sm_clock: int
    memory_clock: int
    capped: bool
    sw_thermal: bool
    hw_thermal: bool

    @property
    def reasons(self) -> tuple[str, ...]:
        """The active clock-event reasons, in NVML's order."""
        flags = (
            ("gpu-idle", self.util == 0),
            ("sw-power-cap", self.capped),
            ("sw-thermal", self.sw_thermal),
            ("hw-thermal", self.hw_thermal),
        )
        return tuple(code for code, on in flags if on)


class _Cache(NamedTuple):
    step: int
    temps: list[float | None]
    drives: list[_Drive | None]


def _pcie_traffic(params: _GpuParams, step: int, util: float) -> tuple[float, float]:
    """(TX, RX) KiB/s at ``step``: the idle trickle and what the work adds in proportion to
    ``util``, each ±20 % from second to second (the step's noise hashed once more)."""
    x = _mix64(_mix64((params.noise_key + step * _GOLDEN) & _MASK))
    (idle_tx, idle_rx), (busy_tx, busy_rx) = _PCIE_IDLE_KIB_S, _PCIE_BUSY_KIB_S
    tx = (idle_tx + busy_tx * util / 100.0) * (0.8 + 0.4 * (x >> 32) * _UNIT)
    rx = (idle_rx + busy_rx * util / 100.0) * (0.8 + 0.4 * (x & 0xFFFFFFFF) * _UNIT)
    return float(round(tx)), float(round(rx))


def _thermal_factor(temp: float | None, slowdown: float) -> float:
    """The share of clock the firmware allows at ``temp``: 1 until close to the slowdown point."""
    if temp is None:
        return 1.0
    excess = temp - (slowdown - _THROTTLE_START_BELOW_C)
    return 1.0 if excess <= 0 else max(_THROTTLE_FLOOR, 1.0 - excess / _THROTTLE_SPAN_C)


class _HostSim:
    """One simulated host: its cards, their workload, injected faults and the cached state."""

    def __init__(self, name: str, profile: HostProfile, seed: int, epoch: float) -> None:
        self.name = name
        self.profile = profile
        self._epoch = epoch
        self._key = f"{seed}:{name}"
        rng = random.Random(f"{self._key}:host")
        ambient = rng.uniform(24.0, 29.0)
        self._gpus = tuple(self._card(g, ambient) for g in range(profile.gpu_count))
        patterns = _LANE_PATTERNS.get(
            profile.gpu_count, (tuple((g,) for g in range(profile.gpu_count)),)
        )
        self._lanes = tuple(
            _Lane(gpus, f"{self._key}:lane{i}") for i, gpus in enumerate(rng.choice(patterns))
        )
        self._lane_of = {g: i for i, lane in enumerate(self._lanes) for g in lane.gpus}
        total = profile.memory_total_mib
        self._leak_base = _LEAK_BASE_FRACTION * total
        self._leak_alive = int((total - _LEAK_HEADROOM_MIB - self._leak_base) / _LEAK_MIB_PER_S) + 1
        self._faults: dict[tuple[str, int | None], ActiveFault] = {}
        self._index_faults()

    def _card(self, g: int, host_ambient: float) -> _GpuParams:
        prof = self.profile
        rng = random.Random(f"{self._key}:{g}:card")
        ambient = host_ambient + rng.uniform(0.0, 2.5) + (1.5 if g % 4 >= 2 else 0.0)
        aggregate_corrected = rng.choice((0, 0, 0, 0, 0, 1, 2, 7, 23))
        return _GpuParams(
            uuid=_gpu_uuid(f"{self._key}:{g}"),
            serial=_serial(f"{self._key}:{g}"),
            noise_key=int(_digest(f"{self._key}:{g}:noise", 8), 16),
            idle_power_w=prof.idle_power_w * rng.uniform(0.9, 1.12),
            ambient_c=ambient,
            k_healthy=prof.thermal_resistance_c_per_w * rng.uniform(0.94, 1.07),
            k_faulty=(prof.slowdown_temperature_c + _FAULTY_COOLING_OVERSHOOT_C - ambient)
            / prof.power_limit_w,
            alpha=1.0 - math.exp(-1.0 / rng.uniform(22.0, 38.0)),
            volatile_corrected=min(aggregate_corrected, rng.choice((0, 0, 0, 1))),
            aggregate_corrected=aggregate_corrected,
            remap_correctable=1 if aggregate_corrected > 5 else 0,
        )

    # faults

    @property
    def faults(self) -> tuple[ActiveFault, ...]:
        return tuple(self._faults.values())

    def set_fault(self, fault: ActiveFault) -> None:
        self._faults[(fault.fault, fault.gpu)] = fault
        self._index_faults()

    def clear_fault(self, fault: str, gpu: int | None) -> None:
        self._faults.pop((fault, gpu), None)
        self._index_faults()

    def _step_of_since(self, since: float) -> int:
        return max(0, math.ceil(since - self._epoch))

    def _index_faults(self) -> None:
        """Index faults by GPU and step, and drop the cached state: a fault can rewrite history."""
        self._gpu_faults: dict[int, dict[str, int]] = {}
        self._down_from = _NEVER
        for f in self._faults.values():
            step = self._step_of_since(f.since)
            if f.gpu is None:
                self._down_from = step
            else:
                self._gpu_faults.setdefault(f.gpu, {})[f.fault] = step
        self._lost = {g: s["xid-79"] for g, s in self._gpu_faults.items() if "xid-79" in s}
        self._cache: _Cache | None = None

    def _fault_from(self, gpu: int, fault: str) -> int:
        return self._gpu_faults.get(gpu, {}).get(fault, _NEVER)

    # integration

    def snapshot(self, t: float) -> HostSnapshot:
        step = math.floor(t - self._epoch)
        if step < 0:
            raise ValueError(f"time {t} is before the simulation's epoch {self._epoch}")
        if step >= self._down_from:
            raise HostUnreachable(f"{self.name}: no answer within 2 s")
        cache = self._advance(step)
        gpus, processes = [], []
        for g, drive in enumerate(cache.drives):
            procs = () if drive is None else self._processes(g, step, drive)
            gpu = self._gpu_state(g, step, drive, cache.temps[g], procs)
            processes.extend(_loaded(p, gpu) for p in procs)
            gpus.append(gpu)
        prof = self.profile
        return HostSnapshot(
            host=self.name,
            time=t,
            gpus=tuple(gpus),
            processes=tuple(processes),
            topology=prof.topology,
            driver_version=prof.driver_version,
            cuda_version=prof.cuda_version,
            xid_events=self._xid_events(step),
            source="sim",
            node=self._node(step, busy=bool(processes)),
        )

    def _node(self, step: int, busy: bool) -> SchedulerNode:
        """The host's Slurm node (pods run beside Slurm's jobs, as on a shared rack): drained
        once a GPU has fallen off the bus, as an admin on call would have it; running jobs
        (MIXED), draining until they end, or IDLE."""
        state = "MIXED" if busy else "IDLE"
        if any(lost <= step for lost in self._lost.values()):
            return SchedulerNode("slurm", self.name, f"{state}+DRAIN", "GPU fell off the bus")
        return SchedulerNode("slurm", self.name, state)

    def _advance(self, step: int) -> _Cache:
        """Integrate from the cached step (or from the epoch, when asked for an earlier one)."""
        cache = self._cache
        if cache is None or cache.step > step:
            cache = _Cache(-1, [None] * self.profile.gpu_count, [])
        drives = cache.drives
        for s in range(cache.step + 1, step + 1):
            drives = self._step(s, cache.temps)
        self._cache = _Cache(step, cache.temps, drives)
        return self._cache

    def _step(self, step: int, temps: list[float | None]) -> list[_Drive | None]:
        jobs = [self._live_job(lane, step) for lane in self._lanes]
        drives: list[_Drive | None] = []
        for g, params in enumerate(self._gpus):
            activity = self._activity(g, step, jobs)
            if activity.kind == _LOST:
                drives.append(None)
                continue
            prev = temps[g]
            drive = self._drive(g, step, activity, prev)
            if prev is None:  # the first step starts from the healthy card's steady state
                prev = params.ambient_c + params.k_healthy * drive.power
            faulty = step >= self._fault_from(g, "thermal-throttle")
            k = params.k_faulty if faulty else params.k_healthy
            temps[g] = prev + (params.ambient_c + k * drive.power - prev) * params.alpha
            drives.append(drive)
        return drives

    def _live_job(self, lane: _Lane, step: int) -> _Job | None:
        """The lane's job at ``step``, unless one of its GPUs fell off the bus while it ran."""
        job = lane.job_at(step)
        if job is None:
            return None
        crashed = any(job.start < lost <= step and g in job.gpus for g, lost in self._lost.items())
        return None if crashed else job

    def _activity(self, g: int, step: int, jobs: list[_Job | None]) -> _Activity:
        faults = self._gpu_faults.get(g)
        if faults:
            if step >= faults.get("xid-79", _NEVER):
                return _LOST_ACTIVITY
            if step >= faults.get("stuck-process", _NEVER):
                return _STUCK_ACTIVITY
            leak_from = faults.get("memory-leak", _NEVER)
            if step >= leak_from:
                cycle, age = divmod(step - leak_from, self._leak_alive + _OOM_RESTART_S)
                return (
                    _Activity(_LEAK, None, cycle, age) if age < self._leak_alive else _IDLE_ACTIVITY
                )
        job = jobs[self._lane_of[g]]
        return _IDLE_ACTIVITY if job is None else _Activity(_JOB, job)

    def _drive(self, g: int, step: int, activity: _Activity, prev: float | None) -> _Drive:
        prof = self.profile
        params = self._gpus[g]
        x = _mix64((params.noise_key + step * _GOLDEN) & _MASK)
        u1, u2 = (x >> 32) * _UNIT, (x & 0xFFFFFFFF) * _UNIT
        util, memory_util, intensity = self._load(activity, step, u1)
        thermal = _thermal_factor(prev, prof.slowdown_temperature_c)
        idle_w, limit = params.idle_power_w, prof.power_limit_w
        capped = False
        if util > 0:
            dynamic = (limit - idle_w) * util / 100.0 * intensity * thermal * (0.985 + 0.03 * u2)
            power = idle_w + dynamic
            clock_share = thermal
            if power > limit:  # the power cap clocks the card down to stay at its limit
                capped = True
                power = limit * (0.986 + 0.012 * u2)
                clock_share *= (power - idle_w) / dynamic
            sm_clock = 15 * round(prof.sm_clock_max_mhz * clock_share / 15)
            sm_clock = max(prof.sm_clock_idle_mhz, sm_clock)
            memory_clock = prof.memory_clock_max_mhz
        else:
            power = idle_w * (0.97 + 0.06 * u2)
            sm_clock, memory_clock = prof.sm_clock_idle_mhz, prof.memory_clock_idle_mhz
        hot = prev is not None and prev >= prof.slowdown_temperature_c
        return _Drive(
            activity, util, memory_util, power, sm_clock, memory_clock, capped, thermal < 1.0, hot
        )

    @staticmethod
    def _load(activity: _Activity, step: int, u: float) -> tuple[float, float, float]:
        """(utilization %, memory-controller utilization %, power intensity) at ``step``."""
        job = activity.job
        if job is not None:
            phase = (step - job.start) % job.eval_period_s
            evaluating = phase >= job.eval_period_s - job.eval_s
            util = 20.0 + 25.0 * u if evaluating else 100.0 - 15.0 * u * u
            return util, job.memory_util_pct * util / 100.0, job.intensity
        if activity.kind == _LEAK:
            return 45.0 + 25.0 * u, 8.0 + 10.0 * u, 0.55
        return 0.0, 0.0, 0.0

    # what a snapshot shows

    def _processes(self, g: int, step: int, drive: _Drive) -> tuple[GpuProcess, ...]:
        total = self.profile.memory_total_mib
        activity = drive.activity
        job = activity.job
        if job is not None:
            rank = job.gpus.index(g)
            gang = len(job.gpus) > 1
            plateau = job.memory_fraction * total + (_RANK0_EXTRA_MIB if gang and rank == 0 else 0)
            ramp = min(1.0, (step - job.start + 1) / job.ramp_s)
            pid = job.pid + 1 + rank if gang else job.pid
            used = float(round(plateau * ramp))
            started = self._epoch + job.start
            slurm = job.slurm and dataclasses.replace(job.slurm, start=_iso(started))
            command = worker_command(job.command) if gang else job.command
            return (
                GpuProcess(
                    pid,
                    g,
                    used,
                    job.user,
                    command,
                    container=job.container,
                    job=slurm,
                    pod=job.pod,
                    started=started,
                ),
            )
        if activity.kind == _LEAK:
            used = float(round(self._leak_base + _LEAK_MIB_PER_S * activity.age))
            command = "python serve.py --model llama-2-13b --port 8000"
            pid = _pid(f"{self._key}:{g}:leak:{activity.cycle}")
            started = self._epoch + step - activity.age
            return (
                GpuProcess(
                    pid,
                    g,
                    used,
                    "svc-infer",
                    command,
                    container="infer-llama13b",
                    pod=_INFER_POD,
                    started=started,
                ),
            )
        if activity.kind == _STUCK:
            kernel = _digest(f"{self._key}:{g}:kernel", 4)
            command = (
                "python -m ipykernel_launcher -f "
                f"/home/carol/.local/share/jupyter/runtime/kernel-{kernel}.json"
            )
            pid = _pid(f"{self._key}:{g}:stuck")
            used = float(round(_STUCK_FRACTION * total))
            return (GpuProcess(pid, g, used, "carol", command, started=self._epoch - _STUCK_AGE_S),)
        return ()

    def _gpu_state(
        self,
        g: int,
        step: int,
        drive: _Drive | None,
        temp: float | None,
        procs: tuple[GpuProcess, ...],
    ) -> GpuState:
        prof = self.profile
        params = self._gpus[g]
        identity = {
            "index": g,
            "name": prof.gpu_name,
            "uuid": params.uuid,
            "pci_bus_id": prof.pci_bus_ids[g],
            "serial": params.serial,
            "vbios_version": prof.vbios_version,
        }
        if drive is None or temp is None:
            return GpuState(**identity, lost=True)
        busy = drive.util > 0
        used = sum(p.used_memory_mib or 0.0 for p in procs) + (_CONTEXT_MIB if procs else 0)
        ecc_hit = step >= self._fault_from(g, "ecc-uncorrectable")
        degraded = step >= self._fault_from(g, "pcie-degraded")
        tx, rx = _pcie_traffic(params, step, drive.util)
        return GpuState(
            **identity,
            utilization_pct=float(round(drive.util)),
            memory_utilization_pct=float(round(drive.memory_util)),
            memory_used_mib=float(used),
            memory_total_mib=float(prof.memory_total_mib),
            temperature_c=float(round(temp)),
            slowdown_temperature_c=prof.slowdown_temperature_c,
            shutdown_temperature_c=prof.shutdown_temperature_c,
            power_w=round(drive.power, 2),
            power_limit_w=prof.power_limit_w,
            power_limit_min_w=prof.power_limit_min_w,
            power_limit_max_w=prof.power_limit_w,
            power_limit_default_w=prof.power_limit_w,
            sm_clock_mhz=float(drive.sm_clock),
            sm_clock_max_mhz=float(prof.sm_clock_max_mhz),
            sm_clock_application_mhz=float(prof.sm_clock_application_mhz),
            memory_clock_mhz=float(drive.memory_clock),
            memory_clock_max_mhz=float(prof.memory_clock_max_mhz),
            memory_clock_application_mhz=float(prof.memory_clock_application_mhz),
            pstate="P0" if busy else "P8",
            fan_pct=None,
            throttle_reasons=drive.reasons,
            ecc=EccCounts(
                volatile_corrected=params.volatile_corrected,
                volatile_uncorrected=int(ecc_hit),
                aggregate_corrected=params.aggregate_corrected,
                aggregate_uncorrected=int(ecc_hit),
            ),
            remap=RowRemap(
                correctable=params.remap_correctable,
                uncorrectable=int(ecc_hit),
                pending=ecc_hit,
                failure=False,
            )
            if prof.has_row_remap
            else None,
            recovery_action="reset" if ecc_hit else "none",
            pcie=PcieLink(
                gen=prof.pcie_max_gen if busy else 1,
                width=prof.pcie_max_width // 2 if degraded else prof.pcie_max_width,
                max_gen=prof.pcie_max_gen,
                max_width=prof.pcie_max_width,
            ),
            pcie_tx_kib_s=tx,
            pcie_rx_kib_s=rx,
            persistence_mode=True,
            compute_mode="Default",
            mig_mode=False,
        )

    def _xid_events(self, step: int) -> tuple[XidEvent, ...]:
        """Every XID since the driver loaded: a fault's events stay in all later readings."""
        events = []
        for f in self._faults.values():
            if self._step_of_since(f.since) > step:
                continue
            if f.fault == "xid-79":
                events.append(XidEvent(79, f.gpu, f.since, "GPU has fallen off the bus."))
            elif f.fault == "ecc-uncorrectable":
                events.append(XidEvent(48, f.gpu, f.since, "Double-bit ECC error"))
                events.append(XidEvent(63, f.gpu, f.since, "Row remapping event: reset pending"))
        return tuple(sorted(events, key=lambda e: (e.time, e.gpu or 0, e.xid)))


# --- public API ----------------------------------------------------------------------------------


class SimRack:
    """A rack of simulated hosts that share a seed and an epoch."""

    def __init__(self, hosts: dict[str, str], seed: int = 0, epoch: float = DEFAULT_EPOCH) -> None:
        unknown = [p for p in hosts.values() if p not in PROFILES]
        if unknown:
            raise ValueError(
                f"unknown host profile {unknown[0]!r}; known profiles: {', '.join(PROFILES)}"
            )
        self._seed = seed
        self._epoch = epoch
        self._hosts = {
            name: _HostSim(name, PROFILES[key], seed, epoch) for name, key in hosts.items()
        }

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self._hosts)

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def epoch(self) -> float:
        return self._epoch

    def _host(self, host: str) -> _HostSim:
        try:
            return self._hosts[host]
        except KeyError:
            raise ValueError(f"unknown host {host!r}; the rack has {len(self._hosts)}") from None

    def profile(self, host: str) -> HostProfile:
        return self._host(host).profile

    def read(self, host: str, t: float) -> HostSnapshot:
        """The host's reading at ``t`` (not before the epoch); `HostUnreachable` while down."""
        return self._host(host).snapshot(t)

    def set_fault(
        self, host: str, fault: str, gpu: int | None = None, since: float | None = None
    ) -> None:
        """Inject ``fault`` from ``since`` (default: the epoch); setting it again moves it."""
        sim = self._host(host)
        self._check_fault(sim, fault, gpu)
        sim.set_fault(ActiveFault(fault, gpu, self._epoch if since is None else since))

    def clear_fault(self, host: str, fault: str, gpu: int | None = None) -> None:
        """Remove a fault, as if it never happened; clearing one that is not set does nothing."""
        sim = self._host(host)
        self._check_fault(sim, fault, gpu)
        sim.clear_fault(fault, gpu)

    def faults(self, host: str) -> tuple[ActiveFault, ...]:
        return self._host(host).faults

    @staticmethod
    def _check_fault(sim: _HostSim, fault: str, gpu: int | None) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known faults: {', '.join(FAULTS)}")
        count = sim.profile.gpu_count
        if fault in _HOST_FAULTS:
            if gpu is not None:
                raise ValueError(f"fault {fault!r} applies to a whole host, not to GPU {gpu}")
        elif gpu is None:
            raise ValueError(f"fault {fault!r} needs a GPU index (0-{count - 1} on {sim.name})")
        elif not 0 <= gpu < count:
            raise ValueError(f"{sim.name} has no GPU {gpu} (its GPUs are 0-{count - 1})")


class SimSource:
    """The `Source` over a `SimRack`, read at the times an injected clock gives."""

    def __init__(self, rack: SimRack, clock: Clock) -> None:
        self._rack = rack
        self._clock = clock

    @property
    def hosts(self) -> tuple[str, ...]:
        return self._rack.hosts

    @property
    def rack(self) -> SimRack:
        return self._rack

    def read(self, host: str) -> HostSnapshot:
        return self._rack.read(host, self._clock())

    def backfill(self, host: str, seconds: int) -> list[HostSnapshot]:
        """One reading a second over the last ``seconds``, oldest first.

        Readings before the epoch and while the host was unreachable are left out, as a real
        history would lack them.
        """
        now = self._clock()
        readings = []
        for back in range(seconds - 1, -1, -1):
            t = now - back
            if t < self._rack.epoch:
                continue
            try:
                readings.append(self._rack.read(host, t))
            except HostUnreachable:
                continue
        return readings


# Profiles in the order hosts are dealt out; H100s weigh most, as in a current fleet.
_DEMO_CYCLE = ("h100-sxm-8", "a100-pcie-8", "h100-sxm-8", "l40s-4", "a100-pcie-8", "h100-sxm-8")
# (fewest hosts in the rack for it to appear, host, fault, gpu, seconds after the epoch)
_DEMO_FAULTS: tuple[tuple[int, str, str, int | None, float], ...] = (
    (1, "a100-01", "thermal-throttle", 2, 0.0),
    (1, "h100-01", "xid-79", 3, 120.0),
    (12, "h100-03", "pcie-degraded", 1, 0.0),
    (12, "a100-02", "ecc-uncorrectable", 6, 240.0),
    (12, "l40s-02", "stuck-process", 0, 0.0),
    (24, "h100-05", "memory-leak", 4, 60.0),
    (24, "a100-04", "host-unresponsive", None, 420.0),
)


def demo_rack(hosts: int = 6, seed: int = 7, epoch: float = DEFAULT_EPOCH) -> SimRack:
    """A rack for the demo: hosts named ``h100-01``, ``a100-01``, ``l40s-01``..., a few faulty.

    The rack integrates from ``epoch``: a demo on the wall clock should pass an epoch a few
    minutes before now (history to show, little to integrate), not the default.
    """
    if hosts < 1:
        raise ValueError(f"a demo rack needs at least one host, not {hosts}")
    counts = Counter(_DEMO_CYCLE[i % len(_DEMO_CYCLE)] for i in range(hosts))
    width = max(2, len(str(max(counts.values()))))
    names = {
        f"{key.split('-')[0]}-{i:0{width}d}": key
        for key in PROFILES
        for i in range(1, counts[key] + 1)
    }
    rack = SimRack(names, seed=seed, epoch=epoch)
    for min_hosts, host, fault, gpu, delay in _DEMO_FAULTS:
        if hosts >= min_hosts and host in names:
            rack.set_fault(host, fault, gpu, since=epoch + delay)
    return rack
