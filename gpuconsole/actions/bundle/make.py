"""Making a bundle: collect on the host when it can be reached, then write the archive.

A host without a shell (a simulated one, a host replayed from a recording, one that cannot be
reached now) still gets a bundle of what the console knows; its summary says what is missing
and why.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gpuconsole.actions.bundle.archive import bundle_path, write_archive
from gpuconsole.actions.bundle.contents import BundleInputs, data_files, summary
from gpuconsole.actions.bundle.gather import (
    KERNEL_LOG_TIMEOUT_S,
    SMI_TIMEOUT_S,
    Gathered,
    gather,
)
from gpuconsole.actions.session import open_shell
from gpuconsole.actions.verify.model import Check
from gpuconsole.actions.verify.output import reports_text
from gpuconsole.core.untrusted import visible
from gpuconsole.fleet.record.when import file_stamp
from gpuconsole.hosts.ssh import ConnectFailure, SshSettings
from gpuconsole.hosts.targets import Context, Target

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class BundleResult:
    """The archive written, the files in it, and what could not be collected."""

    path: Path
    files: tuple[str, ...]
    notes: tuple[str, ...]


def bundle_name(host: str, at: float) -> str:
    return f"gpuconsole-bundle-{_UNSAFE.sub('_', host)}-{file_stamp(at)}"


async def make_bundle(
    inputs: BundleInputs,
    target: Target | None,
    output: Path | None = None,
    *,
    settings: SshSettings | None = None,
    checks: tuple[Check, ...] | None = None,
    smi_timeout: float = SMI_TIMEOUT_S,
    log_timeout: float = KERNEL_LOG_TIMEOUT_S,
) -> BundleResult:
    """Write the bundle of ``inputs``; ``target`` is how to reach the host's shell (None: it
    has none, and ``inputs.notes`` should say why). Raises `BundleError` when it cannot be
    written."""
    made = time.time()
    notes = list(inputs.notes)
    gathered: Gathered | None = None
    if target is not None:
        gpus = [g.index for g in inputs.readings[-1].gpus] if inputs.readings else []
        context = Context(inputs.host, target.context.expected_gpus)
        collect = partial(
            gather,
            context=context,
            gpus=gpus,
            checks=checks,
            smi_timeout=smi_timeout,
            log_timeout=log_timeout,
        )
        try:
            async with open_shell(target, "bundle", settings) as shell:
                gathered = await collect(shell)
        except ConnectFailure as failure:
            notes.append(
                f"nvidia-smi -q, kernel log, verification: {inputs.host} could not be "
                f"reached ({failure.reason})"
            )
    files = {"summary.md": "", **data_files(inputs)}
    verification = None
    if gathered is not None:
        files.update(gathered.files)
        verification = gathered.verification
        if verification is not None:
            files["verification.json"] = json.dumps(verification.as_dict(), indent=2) + "\n"
            files["verification.txt"] = reports_text([verification]) + "\n"
        notes += gathered.notes
    # A note quotes what the host said (a command's stderr): one visible line each, as the
    # summary lists it and `gpuconsole bundle` prints it.
    notes = [visible(note) for note in notes]
    files["summary.md"] = summary(inputs, list(files), verification, notes, made)
    name = bundle_name(inputs.host, inputs.at)
    path = bundle_path(output, name)
    write_archive(path, name, files, made)
    return BundleResult(path, tuple(files), tuple(notes))
