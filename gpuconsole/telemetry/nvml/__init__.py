"""The local host read in-process through NVML.

This is the fast path: a reading is a few dozen library calls per GPU, where nvidia-smi spawns a
process that initialises the driver's library each time. The GPUs are read by the agent's ctypes
reader (`gpuconsole.telemetry.agent.Nvml`), the one an SSH host's agent reads them with; the
topology and the XID events through ``pynvml`` (the nvidia-ml-py package).

Every field has its own call. A call the GPU or the driver refuses (not supported, no permission,
a function this driver lacks) gives None for that field alone, never 0 and never a dropped GPU. A
GPU that answers "GPU is lost", or "unknown error" to every call, is reported ``lost`` with what
was known of it; the other GPUs are read as usual.
"""

from gpuconsole.telemetry.nvml.mapping import (
    ANCESTOR_WORDS,
    COMPUTE_MODES,
    RECOVERY_ACTIONS,
    THROTTLE_BITS,
    UNKNOWN_LINK,
    Handle,
    ancestor_word,
    compute_mode_name,
    cpu_ranges,
    init_failure_reason,
    mig_profile,
    pstate_name,
    recovery_action_name,
    set_bits,
    throttle_codes,
)
from gpuconsole.telemetry.nvml.source import NvmlSource, nvml_unavailable_reason
from gpuconsole.telemetry.nvml.topology import (
    SWITCH,
    link_peer,
    nvlink_words,
    read_topology,
    sysfs_numa_node,
    sysfs_pci_name,
    topology_matrix,
)
from gpuconsole.telemetry.nvml.xids import XidWatcher, merge_xids

__all__ = [
    "ANCESTOR_WORDS",
    "COMPUTE_MODES",
    "RECOVERY_ACTIONS",
    "SWITCH",
    "THROTTLE_BITS",
    "UNKNOWN_LINK",
    "Handle",
    "NvmlSource",
    "XidWatcher",
    "ancestor_word",
    "compute_mode_name",
    "cpu_ranges",
    "init_failure_reason",
    "link_peer",
    "merge_xids",
    "mig_profile",
    "nvlink_words",
    "nvml_unavailable_reason",
    "pstate_name",
    "read_topology",
    "recovery_action_name",
    "set_bits",
    "sysfs_numa_node",
    "sysfs_pci_name",
    "throttle_codes",
    "topology_matrix",
]
