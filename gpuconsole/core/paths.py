"""Where the console keeps its files: one place each, under the XDG base directories, and the
environment variable that moves it.

| file            | variable                 | default                                        |
|-----------------|--------------------------|------------------------------------------------|
| inventory       | `GPUCONSOLE_INVENTORY`   | `<XDG config dir>/gpuconsole/hosts.toml`       |
| alert rules     | `GPUCONSOLE_ALERTS`      | `<XDG config dir>/gpuconsole/alerts.toml`      |
| recording       | `GPUCONSOLE_RECORDING`   | `<XDG data dir>/gpuconsole/recording.sqlite`   |
| bundles (folder)| `GPUCONSOLE_BUNDLE_DIR`  | `<XDG data dir>/gpuconsole/bundles`            |
| screenshots (folder) | `GPUCONSOLE_SCREENSHOT_DIR` | `<XDG data dir>/gpuconsole/screenshots` |
| benchmark runs  | `GPUCONSOLE_BENCH_DB`    | `<XDG data dir>/gpuconsole/bench.sqlite`       |
| audit log       | `GPUCONSOLE_AUDIT_LOG`   | `<XDG state dir>/gpuconsole/audit.jsonl`       |
| ssh config      | `GPUCONSOLE_SSH_CONFIG`  | ssh's own (`~/.ssh/config`, `/etc/ssh/ssh_config`) |

A variable's value is a path as a shell user writes it: ``~`` is the home directory. Nothing is
created here; whoever writes a file makes its folder (see `gpuconsole.core.private_files`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "gpuconsole"


@dataclass(frozen=True, slots=True)
class Place:
    """One of the console's files: the variable that moves it, else its XDG default."""

    variable: str
    base: Callable[[str], str]
    """The platformdirs function of its XDG base directory."""
    name: str

    def path(self) -> Path:
        override = os.environ.get(self.variable)
        if override:
            return Path(override).expanduser()
        return self.default()

    def default(self) -> Path:
        """Where the file is when the variable is unset."""
        return Path(self.base(APP_NAME)) / self.name

    @property
    def explicit(self) -> bool:
        """The variable names the file (so a missing one is an error, not a default)."""
        return bool(os.environ.get(self.variable))


INVENTORY = Place("GPUCONSOLE_INVENTORY", platformdirs.user_config_dir, "hosts.toml")
ALERTS = Place("GPUCONSOLE_ALERTS", platformdirs.user_config_dir, "alerts.toml")
RECORDING = Place("GPUCONSOLE_RECORDING", platformdirs.user_data_dir, "recording.sqlite")
BUNDLES = Place("GPUCONSOLE_BUNDLE_DIR", platformdirs.user_data_dir, "bundles")
SCREENSHOTS = Place("GPUCONSOLE_SCREENSHOT_DIR", platformdirs.user_data_dir, "screenshots")
BENCH_DB = Place("GPUCONSOLE_BENCH_DB", platformdirs.user_data_dir, "bench.sqlite")
AUDIT_LOG = Place("GPUCONSOLE_AUDIT_LOG", platformdirs.user_state_dir, "audit.jsonl")


SSH_CONFIG_VARIABLE = "GPUCONSOLE_SSH_CONFIG"
"""Names the ssh config file the console hands to `ssh -F` (a fleet's own, say). Unset: ssh's
own files, `~/.ssh/config` then `/etc/ssh/ssh_config`, as a plain `ssh` reads them."""


def ssh_config_file() -> Path | None:
    """The file `ssh -F` is given, or None for ssh's own choice."""
    override = os.environ.get(SSH_CONFIG_VARIABLE)
    return Path(override).expanduser() if override else None
