"""``nvidia-smi topo -m`` read into a `Topology`."""

from __future__ import annotations

import re

from gpuconsole.core.model import Topology
from gpuconsole.telemetry.smi.values import MAX_ENTRIES, SmiParseError, _integer, _text, check_size

# --- topo -m -------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CELLS = re.compile(r"\t| {2,}")
_GPU_LABEL = re.compile(r"GPU\d+")


def _topo_rows(text: str) -> list[list[str]]:
    """The cells of each line up to the legend, colour codes stripped, blank lines left out."""
    check_size(text, "the topo -m output")
    rows = []
    for line in _ANSI.sub("", text).splitlines():
        if line.strip().startswith("Legend"):
            break
        if line.strip():
            rows.append([cell.strip() for cell in _CELLS.split(line)])
        if len(rows) > MAX_ENTRIES:
            raise SmiParseError(f"topo -m of more than {MAX_ENTRIES} rows: not one host's")
    return rows


def parse_topo_m(text: str) -> Topology:
    """``nvidia-smi topo -m``: the GPU x GPU matrix with each GPU's CPU and NUMA affinity.

    Cells are tab-separated as nvidia-smi prints them, or two or more spaces apart as text
    pasted from a terminal. NIC rows and columns are left out. nvidia-smi leaves an empty cell
    before "GPU NUMA ID", so the affinity cells meet their headers once empty cells are dropped.
    """
    rows = _topo_rows(text)
    header = [cell for cell in rows[0] if cell] if rows else []
    links = header.index("CPU Affinity") if "CPU Affinity" in header else len(header)
    columns = [i for i, name in enumerate(header[:links]) if _GPU_LABEL.fullmatch(name)]
    if not columns:
        raise SmiParseError("not nvidia-smi topo -m output: no GPU0, GPU1... header")
    matrix, affinities = [], []
    for cells in rows[1:]:
        if not _GPU_LABEL.fullmatch(cells[0]):
            continue
        row = cells[1 : 1 + links]
        if len(row) < links:
            raise SmiParseError(f"topo -m row {cells[0]} has {len(row)} links for {links} columns")
        matrix.append(tuple(row[i] for i in columns))
        affinities.append(
            dict(zip(header[links:], [c for c in cells[1 + links :] if c], strict=False))
        )
    if len(matrix) != len(columns):
        raise SmiParseError(f"topo -m has {len(matrix)} GPU rows for {len(columns)} GPU columns")
    return Topology(
        matrix=tuple(matrix),
        cpu_affinity=tuple(_text(a.get("CPU Affinity")) for a in affinities),
        numa_affinity=tuple(_numa_node(a.get("NUMA Affinity")) for a in affinities),
    )


def _numa_node(text: str | None) -> int | None:
    try:
        return _integer(text)
    except ValueError as error:
        raise SmiParseError(f"topo -m NUMA Affinity: {error}") from None
