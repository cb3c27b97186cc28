"""The local host's source: NVML when it loads, else nvidia-smi, else a plain reason why not."""

from __future__ import annotations

from gpuconsole.telemetry import Source, SourceError


def local_source() -> Source:
    """NVML in-process (the fast path); `nvidia-smi` where only the tool works.

    Raises `SourceError` with one line that says why neither works (no driver, no GPU, a
    driver/library mismatch), so that the caller can say so plainly and point to `--demo`.
    """
    from gpuconsole.telemetry.nvml import NvmlSource, nvml_unavailable_reason
    from gpuconsole.telemetry.smi import SmiSource

    reason = nvml_unavailable_reason()
    if reason is None:
        return NvmlSource()
    smi = SmiSource()
    try:
        smi.read(smi.hosts[0])
    except SourceError as error:
        raise SourceError(f"{reason}; {error}") from None
    return smi
