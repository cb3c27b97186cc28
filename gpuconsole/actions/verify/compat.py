"""The compatibility tables and fleet thresholds (gpuconsole/data/compatibility.toml) as lookups.

Versions are compared as tuples of numbers: "12.10" is newer than "12.9", and a driver
"580.65.06" is (580, 65, 6).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_TABLES = Path(__file__).resolve().parent.parent.parent / "data" / "compatibility.toml"
_NUMBERS = re.compile(r"\d+(?:\.\d+)*")

Version = tuple[int, ...]


def version(text: str | None) -> Version | None:
    """The leading dotted number of ``text`` ("12.4.131" -> (12, 4, 131)); None if there is none."""
    if not text:
        return None
    match = _NUMBERS.search(text)
    return tuple(int(part) for part in match.group().split(".")) if match else None


def short(text: str | None, parts: int = 2) -> Version | None:
    """The first ``parts`` numbers: "12.4.131" -> (12, 4)."""
    full = version(text)
    return full[:parts] if full else None


@cache
def _tables() -> dict[str, Any]:
    return tomllib.loads(_TABLES.read_text(encoding="utf-8"))


def min_driver_for_cuda(cuda: str) -> str | None:
    """The minimum driver of the newest table row at or below ``cuda`` ("12.5" -> 12.4's)."""
    wanted = short(cuda)
    if wanted is None:
        return None
    rows = sorted((short(k), v) for k, v in _tables()["cuda_min_driver"].items())
    at_or_below = [driver for key, driver in rows if key is not None and key <= wanted]
    return at_or_below[-1] if at_or_below else None


def minor_compat_floor(cuda: str) -> str | None:
    """The driver floor for minor-version compatibility within ``cuda``'s major version."""
    parts = version(cuda)
    return _tables()["cuda_minor_compat_floor"].get(str(parts[0])) if parts else None


@dataclass(frozen=True, slots=True)
class CudaSupport:
    """Whether a driver runs a CUDA version: fully, with minor-version compatibility, or not."""

    full: bool
    minor_compatible: bool
    min_driver: str | None
    floor: str | None


def driver_runs_cuda(driver: str, cuda: str) -> CudaSupport:
    have = version(driver)
    need, floor = min_driver_for_cuda(cuda), minor_compat_floor(cuda)
    full = have is not None and need is not None and have >= (version(need) or ())
    compatible = have is not None and floor is not None and have >= (version(floor) or ())
    return CudaSupport(full, compatible, need, floor)


@dataclass(frozen=True, slots=True)
class TorchBuilds:
    stable: tuple[str, ...]
    experimental: tuple[str, ...]
    cudnn: str | None


def torch_builds(torch_version: str) -> TorchBuilds | None:
    """The CUDA builds of a PyTorch release ("2.4.1+cu121" -> the 2.4 row), None if unknown."""
    key = short(torch_version)
    if key is None:
        return None
    row = _tables()["torch_cuda"].get(".".join(map(str, key)))
    if row is None:
        return None
    return TorchBuilds(tuple(row["stable"]), tuple(row["experimental"]), row.get("cudnn"))


def _by_model(table: str, gpu_name: str | None) -> float | None:
    if not gpu_name:
        return None
    for model, value in _tables()[table].items():
        if model.casefold() in gpu_name.casefold():
            return float(value)
    return None


def allreduce_floor(gpu_name: str | None) -> float | None:
    """8-GPU NCCL all-reduce bus bandwidth (GB/s) a healthy node reaches, if known."""
    return _by_model("allreduce_busbw_gbs", gpu_name)
