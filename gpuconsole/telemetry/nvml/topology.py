"""The GPU x GPU links of this host, each GPU's CPUs and NUMA node, read through NVML."""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pynvml

from gpuconsole.core.model import Topology
from gpuconsole.telemetry.kernel_log import PciAddress, pci_address
from gpuconsole.telemetry.nvml.mapping import (
    UNKNOWN_LINK,
    Handle,
    _nvml,
    _text,
    ancestor_word,
    cpu_ranges,
    set_bits,
)

SWITCH = -1
"""The peer of an NVLink that ends at an NVSwitch rather than at a GPU."""

_NODE_WORDS = 4  # 64-bit words of NUMA node mask asked for: up to 256 nodes


def link_peer(
    remote_type: int | None, remote: PciAddress | None, gpus: Mapping[PciAddress, int]
) -> int | None:
    """Where one active NVLink ends: a GPU's index, `SWITCH`, or None (a CPU, a GPU not seen).

    Drivers that cannot say the remote's type get it from its PCI address: an end that is none
    of the GPUs is taken for an NVSwitch.
    """
    if remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
        return SWITCH
    if remote is not None and remote in gpus:
        return gpus[remote]
    if remote_type in (None, pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN):
        return SWITCH
    return None


def nvlink_words(peers: Sequence[Iterable[int]]) -> dict[tuple[int, int], str]:
    """``NV<links>`` for each pair of GPUs that NVLink joins; ``peers[i]`` holds the far end of
    each active link of GPU ``i`` (see `link_peer`).

    Links between the two GPUs count first. Through NVSwitches every GPU reaches every other one
    that also has switch links, at the pace of the one with fewer: that is how nvidia-smi shows
    an HGX board (NV18 between every pair of H100s or H200s).
    """
    counts = [Counter(ends) for ends in peers]
    words: dict[tuple[int, int], str] = {}
    for a, b in itertools.combinations(range(len(counts)), 2):
        links = max(counts[a][b], counts[b][a]) or min(counts[a][SWITCH], counts[b][SWITCH])
        if links:
            words[a, b] = words[b, a] = f"NV{links}"
    return words


def topology_matrix(
    pcie: Sequence[Sequence[str]], nvlinks: Mapping[tuple[int, int], str]
) -> tuple[tuple[str, ...], ...]:
    """The GPU x GPU matrix: "X" on the diagonal, NVLink where there is one, else the PCIe path."""
    size = len(pcie)
    return tuple(
        tuple("X" if a == b else nvlinks.get((a, b), pcie[a][b]) for b in range(size))
        for a in range(size)
    )


def sysfs_pci_name(bus_id: str) -> str | None:
    """NVML's "00000000:3B:00.0" as sysfs names the device: "0000:3b:00.0"."""
    address = pci_address(bus_id)
    if address is None:
        return None
    domain, bus, device = address
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


# --- topology ------------------------------------------------------------------------------------


def _nvlink_peers(handle: Handle, gpus: Mapping[PciAddress, int]) -> list[int]:
    """The far end (`link_peer`) of each active NVLink of one GPU."""
    peers = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        if _nvml(pynvml.nvmlDeviceGetNvLinkState, handle, link) != pynvml.NVML_FEATURE_ENABLED:
            continue
        remote_pci = _nvml(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        remote = None if remote_pci is None else pci_address(_text(remote_pci.busId))
        remote_type = _nvml(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        peer = link_peer(remote_type, remote, gpus)
        if peer is not None:
            peers.append(peer)
    return peers


def _cpu_affinity(handle: Handle) -> str | None:
    words = max(1, -(-(os.cpu_count() or 1) // 64))
    mask = _nvml(pynvml.nvmlDeviceGetCpuAffinity, handle, words)
    return None if mask is None else cpu_ranges(list(mask))


def sysfs_numa_node(bus_id: str | None) -> int | None:
    """The NUMA node the kernel puts the GPU's PCI device on; None where it does not say (-1)."""
    name = None if bus_id is None else sysfs_pci_name(bus_id)
    if name is None:
        return None
    try:
        node = int(Path("/sys/bus/pci/devices", name, "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return None if node < 0 else node


def _numa_node(handle: Handle, bus_id: str | None) -> int | None:
    """nvidia-smi's "NUMA Affinity": the one NUMA node NVML gives the GPU's memory affinity to,
    else the kernel's word for it.

    On a host of one NUMA node NVML says node 0 where sysfs says -1 (seen on an H200 VM).
    nvmlDeviceGetNumaNodeId is not this: it is nvidia-smi's "GPU NUMA ID", the node of the
    GPU's own memory on the platforms where that is one (Grace Hopper).
    """
    mask = _nvml(
        pynvml.nvmlDeviceGetMemoryAffinity, handle, _NODE_WORDS, pynvml.NVML_AFFINITY_SCOPE_NODE
    )
    nodes = [] if mask is None else set_bits(list(mask))
    return nodes[0] if len(nodes) == 1 else sysfs_numa_node(bus_id)


def read_topology(handles: Sequence[Handle], bus_ids: Sequence[str | None]) -> Topology:
    """The GPU x GPU links, each GPU's CPUs and NUMA node; a pair NVML cannot place is "N/A"."""
    size = len(handles)
    pcie = [[UNKNOWN_LINK] * size for _ in range(size)]
    for a, b in itertools.combinations(range(size), 2):
        level = _nvml(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
        pcie[a][b] = pcie[b][a] = ancestor_word(level)
    gpus = {address: i for i, bus in enumerate(bus_ids) if bus and (address := pci_address(bus))}
    peers = [_nvlink_peers(handle, gpus) for handle in handles]
    return Topology(
        matrix=topology_matrix(pcie, nvlink_words(peers)),
        cpu_affinity=tuple(_cpu_affinity(handle) for handle in handles),
        numa_affinity=tuple(_numa_node(h, bus) for h, bus in zip(handles, bus_ids, strict=True)),
    )
