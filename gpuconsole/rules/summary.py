"""Per-host aggregates for the fleet view, computed from one snapshot."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from statistics import fmean

from gpuconsole.core.model import HostSnapshot


@dataclass(frozen=True, slots=True)
class HostSummary:
    """What the fleet row of a host shows. Aggregates skip GPUs that report no value."""

    gpu_count: int
    lost_gpus: int
    model: str | None
    utilization_mean: float | None
    utilization_max: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    hottest_c: float | None
    hottest_gpu: int | None
    power_w: float | None
    power_limit_w: float | None


def short_model(name: str | None) -> str | None:
    """'NVIDIA H100 80GB HBM3' → 'H100 80GB HBM3': on a GPU console the vendor says nothing."""
    if name is None:
        return None
    return name.removeprefix("NVIDIA ").strip() or name


def summarize(snapshot: HostSnapshot) -> HostSummary:
    gpus = snapshot.gpus
    utils = [g.utilization_pct for g in gpus if g.utilization_pct is not None]
    used = [g.memory_used_mib for g in gpus if g.memory_used_mib is not None]
    total = [g.memory_total_mib for g in gpus if g.memory_total_mib is not None]
    power = [g.power_w for g in gpus if g.power_w is not None]
    limits = [g.power_limit_w for g in gpus if g.power_limit_w is not None]
    temps = [(g.temperature_c, g.index) for g in gpus if g.temperature_c is not None]
    models = Counter(short_model(g.name) for g in gpus if g.name)
    hottest = max(temps, default=None)
    return HostSummary(
        gpu_count=len(gpus),
        lost_gpus=sum(g.lost for g in gpus),
        model=models.most_common(1)[0][0] if models else None,
        utilization_mean=fmean(utils) if utils else None,
        utilization_max=max(utils, default=None),
        memory_used_mib=sum(used) if used else None,
        memory_total_mib=sum(total) if total else None,
        hottest_c=hottest[0] if hottest else None,
        hottest_gpu=hottest[1] if hottest else None,
        power_w=sum(power) if power else None,
        power_limit_w=sum(limits) if limits else None,
    )
