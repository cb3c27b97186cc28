"""One launch, start to end: reach the hosts, choose the GPUs, build the command for the engine,
run it and follow it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuconsole.actions.launch.commands import (
    LaunchError,
    LaunchSpec,
    choose_gpus,
    node_command,
    single_host_command,
    slurm_command,
)
from gpuconsole.actions.launch.nodes import NodeAddress, node_addresses
from gpuconsole.actions.launch.run import Event, RunResult, run_on_nodes, run_recipe
from gpuconsole.actions.session import HostShell, open_shell
from gpuconsole.actions.shell import Shell
from gpuconsole.core.model import Topology
from gpuconsole.hosts.ssh import ConnectFailure, SshSettings
from gpuconsole.hosts.targets import Target
from gpuconsole.telemetry.smi.topo import parse_topo_m
from gpuconsole.telemetry.smi.values import SmiParseError

_GPU_QUERY = "nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader"
_SMI_LOST_GPU_EXIT = 15
"""nvidia-smi's exit status when a GPU fell off the bus (gpu-facts.md); the others still answer."""
_LOST_MARKS = frozenset({"[gpu is lost]", "[unknown error]"})
ACTION = "launch"
"""What a launch's writes and runs are logged as."""


@dataclass(frozen=True, slots=True)
class HostGpus:
    """What a launch needs to know of a host's GPUs."""

    indices: tuple[int, ...]
    """The GPUs that answer nvidia-smi; one fallen off the bus is not among them."""
    name: str | None
    driver: str | None
    topology: Topology | None

    @property
    def count(self) -> int:
        return len(self.indices)


@dataclass(frozen=True, slots=True)
class Launch:
    """Where and how: the engine (`python`, `torchrun`, `torchrun-nodes`, `srun`), the GPUs."""

    engine: str
    hosts: tuple[str, ...]
    gpus: tuple[int, ...]
    commands: dict[str, str]


async def host_gpus(shell: Shell) -> HostGpus:
    rows = await shell.run(_GPU_QUERY, 20.0)
    answering = _answering(rows.stdout)
    if not (rows.ok or (rows.exit_code == _SMI_LOST_GPU_EXIT and answering)):
        raise LaunchError(
            f"nvidia-smi does not answer: {(rows.stderr or rows.stdout).strip()[:160]}"
        )
    topo = await shell.run("nvidia-smi topo -m", 20.0)
    topology = None
    if topo.ok:
        with contextlib.suppress(SmiParseError):
            topology = parse_topo_m(topo.stdout)
    name = answering[0][1] if answering and len(answering[0]) > 1 else None
    driver = answering[0][2] if answering and len(answering[0]) > 2 else None
    return HostGpus(tuple(int(row[0]) for row in answering), name, driver, topology)


def _answering(stdout: str) -> list[list[str]]:
    """The rows of the GPU query that answer: a GPU fallen off the bus prints "Unable to
    determine the device handle..." instead of its row, or NVML's error words in its fields."""
    rows = [[cell.strip() for cell in line.split(",")] for line in stdout.splitlines()]
    return [
        row
        for row in rows
        if row[0].isdecimal() and not any(cell.casefold() in _LOST_MARKS for cell in row[1:])
    ]


def plan_launch(
    spec: LaunchSpec,
    hosts: Sequence[str],
    gpus: HostGpus,
    wanted: int | None,
    slurm_nodes: int | None,
    job_id: str,
    pythons: Mapping[str, str],
    addresses: Mapping[str, NodeAddress] | None = None,
) -> Launch:
    """The engine and command per host: srun on a Slurm login node, torchrun with c10d across
    several hosts (meeting at the first one's ``addresses`` entry), else one host's
    best-connected GPUs."""
    if slurm_nodes is not None:
        if wanted is None:
            raise LaunchError("--slurm needs --gpus: the GPUs per node (a login node has none)")
        command = slurm_command(spec, slurm_nodes, wanted, job_id, pythons[hosts[0]])
        return Launch("srun", (hosts[0],), (), {hosts[0]: command})
    if len(hosts) > 1:
        if addresses is None:
            raise LaunchError("a multi-node run needs each node's address")
        per_node = wanted or gpus.count
        head = addresses[hosts[0]]
        commands = {
            h: node_command(
                spec,
                list(hosts),
                per_node,
                head.address,
                job_id,
                pythons[h],
                is_head=h == hosts[0],
                port=head.free_port,
                local_addr=addresses[h].address,
            )
            for h in hosts
        }
        return Launch("torchrun-nodes", tuple(hosts), tuple(range(per_node)), commands)
    chosen = choose_gpus(gpus.topology, gpus.indices, wanted or gpus.count)
    engine = "python" if len(chosen) == 1 else "torchrun"
    command = single_host_command(spec, chosen, pythons[hosts[0]])
    return Launch(engine, (hosts[0],), chosen, {hosts[0]: command})


@contextlib.asynccontextmanager
async def _shells_for(
    targets: Sequence[Target], settings: SshSettings | None
) -> AsyncIterator[dict[str, HostShell]]:
    """A shell per target, closed on the way out; `LaunchError` when one cannot be reached."""
    async with contextlib.AsyncExitStack() as stack:
        shells: dict[str, HostShell] = {}
        for target in targets:
            try:
                shells[target.name] = await stack.enter_async_context(
                    open_shell(target, ACTION, settings)
                )
            except ConnectFailure as failure:
                raise LaunchError(failure.reason) from None
        yield shells


async def launch(
    targets: Sequence[Target],
    spec: LaunchSpec,
    *,
    gpus: int | None = None,
    slurm_nodes: int | None = None,
    on_plan: Callable[[Launch, HostGpus], None] = lambda _l, _g: None,
    on_event: Callable[[Event], None] = lambda _event: None,
    on_line: Callable[[str], None] = lambda _line: None,
    settings: SshSettings | None = None,
) -> tuple[Launch, HostGpus, RunResult]:
    """Run ``spec`` on ``targets``; `LaunchError` when it cannot even start."""
    hosts = [t.name for t in targets]
    pythons = {t.name: (t.entry.python if t.entry else "python3") for t in targets}
    job_id = f"gpuconsole-{spec.recipe}-{int(time.time())}"
    async with _shells_for(targets, settings) as shells:
        first = shells[hosts[0]]
        found = HostGpus((), None, None, None) if slurm_nodes else await host_gpus(first)
        several = len(hosts) > 1 and slurm_nodes is None
        addresses = await node_addresses(shells, pythons) if several else None
        plan = plan_launch(spec, hosts, found, gpus, slurm_nodes, job_id, pythons, addresses)
        on_plan(plan, found)
        if len(plan.hosts) > 1:
            result = await run_on_nodes(shells, spec, plan.commands, on_event, on_line)
        else:
            command = plan.commands[hosts[0]]
            result = await run_recipe(first, spec, command, on_event, on_line)
    return plan, found, result
