"""Is cuDNN installed: a system cudnn_version.h, or the cuDNN a torch build carries?"""

from __future__ import annotations

import re

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.verify import probes
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

CUDNN_HEADER = Probe(
    "cudnn-header",
    "for header in /usr/include/cudnn_version.h /usr/include/x86_64-linux-gnu/cudnn_version.h "
    '/usr/local/cuda/include/cudnn_version.h; do if [ -r "$header" ]; then echo "$header"; '
    "grep -E '^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)[[:space:]]' \"$header\"; exit 0; fi; done; "
    "exit 1",
)
"""The first cudnn_version.h found, then its three version #defines."""


def _cudnn_from_header(output: CommandOutput) -> tuple[str, str] | None:
    """(header path, version) from the cudnn-header probe; None if no header was found."""
    if not output.ok:
        return None
    defines = dict(re.findall(r"#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", output.stdout))
    if "MAJOR" not in defines:
        return None
    path = output.stdout.splitlines()[0].strip()
    parts = (defines["MAJOR"], defines.get("MINOR", "0"), defines.get("PATCHLEVEL", "0"))
    return path, ".".join(parts)


def _judge_cudnn(evidence: Evidence, context: Context) -> Verdict:
    header = _cudnn_from_header(evidence[CUDNN_HEADER.name])
    torch = probes.torch_info(evidence) or {}
    bundled = probes.cudnn_from_number(torch.get("cudnn"))
    found = []
    if header is not None:
        found.append(f"cuDNN {header[1]} ({header[0]})")
    if bundled is not None:
        found.append(f"cuDNN {bundled} in torch {torch.get('torch')}")
    if not found:
        return Verdict(
            Status.SKIP,
            "no cuDNN: no cudnn_version.h in /usr/include, /usr/include/x86_64-linux-gnu or "
            "/usr/local/cuda/include, and no torch build with cuDNN",
        )
    return Verdict(Status.PASS, "; ".join(found), tuple(found))


CHECKS: tuple[Check, ...] = (
    Check("cudnn", "cuDNN installed", (CUDNN_HEADER, probes.TORCH), _judge_cudnn),
)
