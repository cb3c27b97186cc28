"""Does the installed CUDA toolkit (nvcc) run on the driver, fully or only with minor-version
compatibility? The minimum drivers and the compatibility floors are shared/reference/gpu-facts.md's
("Compatibility", from the CUDA release notes)."""

from __future__ import annotations

import re

from gpuconsole.actions.verify import compat, probes
from gpuconsole.actions.verify.judging import cuda_fit, lines_with, no_answer
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

NVCC = Probe(
    "nvcc",
    "if command -v nvcc >/dev/null 2>&1; then nvcc --version; "
    "elif [ -x /usr/local/cuda/bin/nvcc ]; then /usr/local/cuda/bin/nvcc --version; "
    "else exit 127; fi",
)

_NVCC_RELEASE = re.compile(r"release (\d+\.\d+)(?:, V(\d+(?:\.\d+)+))?")


def _judge_cuda_toolkit(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[NVCC.name]
    if output.missing:
        return Verdict(
            Status.SKIP, "no CUDA toolkit: nvcc is neither on PATH nor in /usr/local/cuda/bin"
        )
    if output.timed_out:
        return no_answer(NVCC, Status.WARN, "Run `nvcc --version` by hand to see why it hangs.")
    match = _NVCC_RELEASE.search(output.stdout)
    if match is None:
        return Verdict(
            Status.WARN,
            "nvcc printed no release version",
            output.lines(),
            "Run `nvcc --version`; reinstall the CUDA toolkit if it fails.",
        )
    toolkit = match.group(2) or match.group(1)
    fit = cuda_fit(evidence, match.group(1))
    lines = (*lines_with(output, "release"), *fit.lines())
    if fit.status is Status.SKIP:
        return Verdict(
            Status.SKIP, f"CUDA toolkit {toolkit}; no driver version to compare with", lines
        )
    if fit.status is Status.PASS:
        return Verdict(
            Status.PASS,
            f"CUDA toolkit {toolkit} runs on driver {fit.driver} (CUDA {fit.driver_cuda})",
            lines,
        )
    older = compat.short(fit.driver_cuda)
    remedy = fit.remedy(
        f"install the toolkit of the driver's CUDA (cuda-toolkit-{older[0]}-{older[1]} from "
        "NVIDIA's repository)"
        if older and len(older) == 2
        else "install an older toolkit"
    )
    if fit.status is Status.WARN:
        return Verdict(
            Status.WARN,
            f"CUDA toolkit {toolkit} is newer than driver {fit.driver} supports; it runs only "
            "with minor-version compatibility",
            lines,
            f"{remedy} Under minor-version compatibility the newer toolkit's features may be "
            "missing and the PTX it builds cannot be JIT-compiled by the older driver.",
        )
    return Verdict(
        Status.FAIL, f"CUDA toolkit {toolkit} cannot run on driver {fit.driver}", lines, remedy
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "cuda-toolkit",
        "CUDA toolkit fits the driver",
        (NVCC, probes.SMI, probes.SMI_QUERY, probes.DRIVER_VERSION),
        _judge_cuda_toolkit,
    ),
)
