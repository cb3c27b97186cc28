"""The command lines that launch a recipe, through the engines admins already run: plain python
for one GPU, `torchrun` on one host (the best-connected GPUs of its topology), `torchrun` with
c10d rendezvous across hosts, and `srun` on a Slurm login node starting torchrun on each node.

Facts: torchrun's c10d flags and the Slurm pattern as in shared/reference/gpu-facts.md
("Launching on existing engines"). Every value is validated, then quoted.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuconsole.core.model import TooManySets, Topology

RECIPE_DIR = "$HOME/.cache/gpuconsole/recipes"
"""Where recipes are written on a host (the shell expands $HOME)."""
RDZV_PORT = 29400
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")
_JOB = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_HEREDOC_END = "GPUCONSOLE_RECIPE_END"


class LaunchError(ValueError):
    """A launch that cannot be built; the message is one line naming the bad value."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What to run: a recipe, its preset, how many steps, and extra recipe arguments."""

    recipe: str
    preset: str = "tuned"
    steps: int | None = None
    extra: tuple[str, ...] = ()

    def arguments(self) -> list[str]:
        args = ["--preset", self.preset]
        if self.steps is not None:
            args += ["--steps", str(self.steps)]
        return [*args, *self.extra]


def choose_gpus(topology: Topology | None, gpus: Sequence[int], wanted: int) -> tuple[int, ...]:
    """``wanted`` of the GPUs that answer (``gpus``, by index): all of them, else the
    best-connected set of them as the topology screen ranks it (`Topology.best_sets`, the GPUs
    that do not answer left out), else (no topology, or too many sets to rank) the first ones."""
    answering = tuple(sorted(set(gpus)))
    if not 1 <= wanted <= len(answering):
        raise LaunchError(f"--gpus {wanted}: the host has {len(answering)} GPU(s) that answer")
    if wanted == len(answering):
        return answering
    if wanted >= 2 and topology is not None and answering[-1] < topology.gpu_count:
        silent = set(range(topology.gpu_count)) - set(answering)
        with contextlib.suppress(TooManySets):
            return topology.best_sets(wanted, limit=1, leave_out=silent)[0].gpus
    return answering[:wanted]


def script_path(recipe: str) -> str:
    return f"{RECIPE_DIR}/{recipe}.py"


def install_command(files: Mapping[str, str]) -> str:
    """Write the recipe's files to the host (here-documents: no second channel, no scp). Each
    file is written aside and renamed into place, so a run already reading it (another node
    sharing this home over NFS, say) never sees half a file; the first failure stops it."""
    parts = [f'mkdir -p "{RECIPE_DIR}" || exit 1']
    for name, text in files.items():
        _check(_FILE, name, "file name")
        if _HEREDOC_END in text:
            raise LaunchError(f"{name} contains the line {_HEREDOC_END}")
        final, aside = f'"{RECIPE_DIR}/{name}"', f'"{RECIPE_DIR}/.{name}.$$"'
        parts.append(
            f"cat > {aside} <<'{_HEREDOC_END}' && mv -f {aside} {final} || exit 1\n"
            f"{text.rstrip()}\n{_HEREDOC_END}"
        )
    return "\n".join(parts) + "\n"


def single_host_command(spec: LaunchSpec, gpus: Sequence[int], python: str = "python3") -> str:
    """One host: python for one GPU, torchrun --standalone for several; only ``gpus`` visible.
    ``python`` is the host's interpreter that has torch (the inventory's `python`)."""
    visible = ",".join(str(g) for g in gpus)
    script = f'"{script_path(spec.recipe)}"'
    args = " ".join(shlex.quote(a) for a in spec.arguments())
    env = f"CUDA_VISIBLE_DEVICES={visible} PYTHONUNBUFFERED=1"
    if len(gpus) == 1:
        return f"{env} exec {python} -u {script} {args}"
    runner = f"{python} -m torch.distributed.run --standalone --nproc-per-node {len(gpus)}"
    return f"{env} exec {runner} {script} {args}"


def node_command(
    spec: LaunchSpec,
    nodes: Sequence[str],
    gpus_per_node: int,
    head: str,
    job_id: str,
    python: str = "python3",
    is_head: bool = False,
    port: int = RDZV_PORT,
    local_addr: str | None = None,
) -> str:
    """One node of a multi-node run: torchrun with c10d rendezvous at ``head``:``port``.

    ``head`` is an address every node reaches (not an SSH alias: torchrun resolves it on each
    node). The head hosts the rendezvous store and the others only join it, said explicitly
    (`is_host`): torchrun's own guess, from whether ``head`` names this machine, fails on
    multi-homed hosts and where several nodes share an address. ``local_addr`` is this node's
    address as the others reach it: the node that becomes rank 0 serves the workers' store there
    (torchrun's default is the node's FQDN, which need not resolve elsewhere)."""
    for name in nodes:
        _check(_HOST, name, "host")
    endpoint = f"{_address(head)}:{_port(port)}"
    _check(_JOB, job_id, "job id")
    script = f'"{script_path(spec.recipe)}"'
    args = " ".join(shlex.quote(a) for a in spec.arguments())
    runner = (
        f"{python} -m torch.distributed.run --nnodes {len(nodes)} --nproc-per-node "
        f"{gpus_per_node} --rdzv-backend c10d --rdzv-endpoint {endpoint} "
        f"--rdzv-id {job_id} --rdzv-conf is_host={'true' if is_head else 'false'}"
    )
    if local_addr is not None:
        _address(local_addr)
        runner += f" --local-addr {local_addr.strip('[]')}"
    return f"PYTHONUNBUFFERED=1 exec {runner} {script} {args}"


def slurm_command(
    spec: LaunchSpec, nodes: int, gpus_per_node: int, job_id: str, python: str = "python3"
) -> str:
    """Run on a Slurm login node: `srun` allocates the nodes (one task each) and streams their
    output back; each task starts torchrun with rendezvous at the job's first node, which hosts
    the store (its `SLURM_NODEID` is 0). The recipe is written to the login node's home, which
    the compute nodes share, as on every Slurm cluster whose jobs read $HOME."""
    _check(_JOB, job_id, "job id")
    if nodes < 1 or gpus_per_node < 1:
        raise LaunchError(f"slurm: {nodes} node(s) × {gpus_per_node} GPU(s) is not a job")
    args = " ".join(shlex.quote(a) for a in spec.arguments())
    task = (
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1); '
        'if [ "$SLURM_NODEID" = 0 ]; then host=true; else host=false; fi; '
        f"exec {python} -m torch.distributed.run --nnodes {nodes} --nproc-per-node "
        f'{gpus_per_node} --rdzv-backend c10d --rdzv-endpoint "$head:{RDZV_PORT}" '
        f'--rdzv-id {job_id} --rdzv-conf "is_host=$host" "{script_path(spec.recipe)}" {args}'
    )
    return (
        f"PYTHONUNBUFFERED=1 exec srun --job-name=gpuconsole-{spec.recipe} --nodes={nodes} "
        f"--ntasks-per-node=1 --gpus-per-node={gpus_per_node} --exclusive "
        f"bash -c {shlex.quote(task)}"
    )


def _address(value: str) -> str:
    """A host name or IP address as it goes before `:port` (an IPv6 address in brackets)."""
    bare = value.strip("[]")
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        _check(_HOST, value, "host")
        return value
    return f"[{ip}]" if ip.version == 6 else str(ip)


def _port(value: int) -> int:
    if not 1 <= value <= 65535:
        raise LaunchError(f"rendezvous port {value} is not a TCP port")
    return value


def _check(pattern: re.Pattern[str], value: str, what: str) -> None:
    if not pattern.fullmatch(value):
        raise LaunchError(f"{what} {value!r} is not a plain name")
