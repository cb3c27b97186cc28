"""The subcommands of `gpuconsole`, one module each, and how they join the parser.

A command module has ``add(commands)``: it adds its parser (or its group: ``hosts check``) to
the top parser's subcommands and sets ``run`` on each parser that runs something
(``set_defaults(run=run)``). `gpuconsole.cli.main` builds the parser from the list of modules and
calls ``args.run(args)``, which returns the exit code or raises `exits.Refused`.

Every invocation builds the whole parser, ``--help`` too, so a module imports at its top only
what its options need; what its work needs (Textual, asyncssh, prometheus_client, torch, the
actions) it imports inside ``run``.
"""

from __future__ import annotations

import argparse
from typing import Protocol, TypeAlias

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The top parser's subcommands, as ``add_subparsers`` returns them."""


class Command(Protocol):
    """A command module."""

    def add(self, commands: Subcommands) -> None: ...
