"""Where the nodes of a multi-node run meet: each node's address as the others reach it, and a
free rendezvous port on the head.

An inventory name is often an SSH alias (`Host gpu-a` in ~/.ssh/config) that only the console
can resolve, and torchrun resolves the rendezvous endpoint on every node. So each node is asked
for the address its SSH server was reached on (the server half of `$SSH_CONNECTION`), else its
FQDN, and whether the rendezvous port is free there (another job's store may hold it).
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from gpuconsole.actions.launch.commands import RDZV_PORT, LaunchError
from gpuconsole.actions.shell import Shell

_PROBE = """
import os, socket
def free(port):
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return 0
        return probe.getsockname()[1]
reached = os.environ.get("SSH_CONNECTION", "").split()
print(reached[2] if len(reached) == 4 else socket.getfqdn(), free({port}) or free(0))
"""
PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """A node as the other nodes reach it, and a TCP port that was free on it."""

    address: str
    free_port: int


def probe_command(python: str, port: int = RDZV_PORT) -> str:
    return f"{python} -c {shlex.quote(_PROBE.format(port=port))}"


def parse_probe(host: str, text: str) -> NodeAddress:
    """The probe's one line `ADDRESS PORT`; `LaunchError` naming ``host`` otherwise."""
    words = text.split()
    if len(words) != 2 or not words[1].isdigit() or not 0 < int(words[1]) < 65536:
        shown = text.strip()[:120] or "nothing"
        raise LaunchError(f"{host}: cannot tell its address (the probe printed {shown!r})")
    return NodeAddress(words[0], int(words[1]))


async def node_addresses(
    shells: Mapping[str, Shell], pythons: Mapping[str, str]
) -> dict[str, NodeAddress]:
    """Every node's address and free port, asked of all of them at once."""

    async def ask(host: str) -> NodeAddress:
        output = await shells[host].run(probe_command(pythons[host]), PROBE_TIMEOUT_S)
        if not output.ok:
            cause = (output.stderr or output.stdout).strip().splitlines() or ["no output"]
            raise LaunchError(f"{host}: {pythons[host]} does not run: {cause[-1][:160]}")
        return parse_probe(host, output.stdout)

    found = await asyncio.gather(*(ask(host) for host in shells))
    return dict(zip(shells, found, strict=True))
