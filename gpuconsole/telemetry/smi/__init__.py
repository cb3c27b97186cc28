"""nvidia-smi's outputs read into the snapshot model, and `SmiSource`: the local host through
nvidia-smi, for where NVML cannot be loaded in-process.

Formats: ``--query-gpu`` and ``--query-compute-apps`` CSV (with or without header and units),
``-q -x`` XML, ``-q`` text and ``topo -m``. The layouts follow outputs captured on an NVIDIA H200
(driver 580, ``tests/fixtures/nvidia-smi/``); the older spellings of a few fields are read too
(``clocks_throttle_reasons``, ``power_readings``, an absolute slowdown temperature, single/double
bit ECC totals). A value nvidia-smi cannot give ("N/A", "[Not Supported]", ...) is None, never 0.

The package, one job a module: ``values`` (the value helpers and `SmiParseError`), ``dump``
(``-q -x`` XML and ``-q`` text), ``topo`` (``topo -m``), ``query`` (the CSV queries) and
``source`` (`SmiSource` and running nvidia-smi).
"""

from gpuconsole.telemetry.smi.dump import parse_dump, parse_q_text, parse_xml, read_dump
from gpuconsole.telemetry.smi.query import (
    QUERY_COMPUTE_APPS_FIELDS,
    QUERY_GPU_FIELDS,
    gpu_index_map,
    parse_compute_apps_csv,
    parse_query_gpu_csv,
)
from gpuconsole.telemetry.smi.source import Runner, SmiSource, run_command
from gpuconsole.telemetry.smi.topo import parse_topo_m
from gpuconsole.telemetry.smi.values import SmiParseError

__all__ = [
    "QUERY_COMPUTE_APPS_FIELDS",
    "QUERY_GPU_FIELDS",
    "Runner",
    "SmiParseError",
    "SmiSource",
    "gpu_index_map",
    "parse_compute_apps_csv",
    "parse_dump",
    "parse_q_text",
    "parse_query_gpu_csv",
    "parse_topo_m",
    "parse_xml",
    "read_dump",
    "run_command",
]
