"""Which CUDA version does the driver support (nvidia-smi's header)? The toolkit and the
frameworks' builds are judged against it (shared/reference/gpu-facts.md, "Compatibility")."""

from __future__ import annotations

from gpuconsole.actions.verify import probes
from gpuconsole.actions.verify.judging import lines_with
from gpuconsole.actions.verify.model import Check, Evidence, Status, Verdict
from gpuconsole.hosts.targets import Context


def _judge_cuda_driver(evidence: Evidence, context: Context) -> Verdict:
    smi = evidence[probes.SMI.name]
    if not smi.ok:
        return Verdict(Status.SKIP, "nvidia-smi did not run (see the nvidia-smi check)")
    cuda, header = probes.driver_cuda(evidence), lines_with(smi, "CUDA Version")
    if cuda is None:
        return Verdict(
            Status.WARN,
            "nvidia-smi's header names no CUDA version",
            header or smi.lines(3),
            "Drivers older than 410 do not print it: upgrade the driver "
            "(`ubuntu-drivers list --gpgpu` names the server packages on Ubuntu).",
        )
    driver = probes.smi_header_driver(smi)
    return Verdict(Status.PASS, f"driver {driver} supports CUDA up to {cuda}", header)


CHECKS: tuple[Check, ...] = (
    Check("cuda-driver", "CUDA version of the driver", (probes.SMI,), _judge_cuda_driver),
)
