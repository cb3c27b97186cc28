"""Does PyTorch use the GPU: is it a CUDA build the driver runs, does it see the GPUs, and was its
release ever built for that CUDA (pytorch/pytorch RELEASE.md, as shared/reference/gpu-facts.md's
"Compatibility" keeps it)?"""

from __future__ import annotations

from typing import Any

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.verify import compat, probes
from gpuconsole.actions.verify.judging import cuda_fit, no_answer
from gpuconsole.actions.verify.model import Check, Evidence, Status, Verdict
from gpuconsole.hosts.targets import Context


def _torch_index_url(release: str, driver_cuda: str | None) -> str:
    """The PyTorch wheel index of the newest CUDA build of ``release`` the driver runs."""
    builds = compat.torch_builds(release)
    known = (*builds.stable, *builds.experimental) if builds else ()
    limit = compat.short(driver_cuda)
    fitting = [cuda for cuda in known if limit and (compat.short(cuda) or ()) <= limit]
    if fitting:
        tag = "cu" + max(fitting, key=lambda c: compat.short(c) or ()).replace(".", "")
    elif driver_cuda:
        tag = f"cu{''.join(map(str, compat.short(driver_cuda) or ()))}"
    else:
        tag = "cu<XY>"
    return f"https://download.pytorch.org/whl/{tag}"


def _reinstall_torch(release: str, driver_cuda: str | None) -> str:
    return (
        f"install a build for the driver's CUDA {driver_cuda or '(see cuda-driver)'}: "
        f"`pip install --force-reinstall torch=={release} --index-url "
        f"{_torch_index_url(release, driver_cuda)}`"
    )


def _torch_summary(info: dict[str, Any]) -> str:
    parts = [f"torch {info.get('torch')}", f"CUDA {info.get('cuda')}"]
    cudnn = probes.cudnn_from_number(info.get("cudnn"))
    if cudnn:
        parts.append(f"cuDNN {cudnn}")
    devices = info.get("devices") or 0
    parts.append(f"{devices} GPU" + ("" if devices == 1 else "s"))
    return ", ".join(parts)


def _torch_lines(info: dict[str, Any], output: CommandOutput) -> tuple[str, ...]:
    described = [f"{k}: {info[k]}" for k in ("python", "torch", "cuda", "available") if k in info]
    if "name" in info:
        described.append(f"device 0: {info['name']} (compute capability {info.get('capability')})")
    warnings = [line for line in output.stderr.splitlines() if "warning" in line.casefold()]
    return (*described, *warnings[:3])


def _judge_pytorch(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[probes.TORCH.name]
    info = probes.torch_info(evidence)
    if info is None:
        if output.missing:
            return Verdict(Status.SKIP, "python3 is not installed")
        if output.timed_out:
            return no_answer(
                probes.TORCH,
                Status.WARN,
                "Run `python3 -c 'import torch'` by hand to see what hangs.",
            )
        return Verdict(
            Status.FAIL,
            f"the torch probe crashed (exit {output.exit_code})",
            output.lines(),
            "Run `python3 -c 'import torch; print(torch.cuda.is_available())'` to see the error.",
        )
    if info.get("missing"):
        return Verdict(Status.SKIP, f"torch is not installed for {info.get('python')}")
    if "torch" not in info or "error" in info:
        return Verdict(
            Status.FAIL,
            f"torch {info['torch']} fails: {info.get('error')}"
            if "torch" in info
            else f"torch does not import: {info.get('error')}",
            _torch_lines(info, output),
            "Reinstall torch into this environment (`pip install --force-reinstall torch`); "
            "`python3 -c 'import torch'` shows the whole traceback.",
        )
    return _judge_torch_build(evidence, info, output)


def _judge_torch_build(evidence: Evidence, info: dict[str, Any], output: CommandOutput) -> Verdict:
    version, cuda = str(info["torch"]), info.get("cuda")
    release, lines = version.split("+")[0], _torch_lines(info, output)
    driver_cuda = probes.driver_cuda(evidence)
    if not probes.driver_answers(evidence):
        return Verdict(
            Status.SKIP,
            f"torch {version} (CUDA {cuda}); no NVIDIA driver answers here (see driver-loaded)",
            lines,
        )
    if cuda is None:
        return Verdict(
            Status.FAIL,
            f"torch {version} is a CPU-only build on a GPU host",
            lines,
            f"A CPU-only build never uses the GPU: {_reinstall_torch(release, driver_cuda)}.",
        )
    fit = cuda_fit(evidence, str(cuda))
    lines = (*lines, *fit.lines())
    fix_build = fit.remedy(_reinstall_torch(release, driver_cuda))
    if not info.get("available"):
        too_new = fit.status in (Status.FAIL, Status.WARN)
        return Verdict(
            Status.FAIL,
            f"torch {version} cannot use the GPU: torch.cuda.is_available() is False"
            + (f" (built for CUDA {cuda}, the driver supports {driver_cuda})" if too_new else ""),
            lines,
            fix_build
            if too_new
            else "Read torch's warning above; check CUDA_VISIBLE_DEVICES, that /dev/nvidia* "
            "exist and are readable, and in a container that it runs with the GPUs "
            "(`--gpus all` with the NVIDIA Container Toolkit).",
        )
    if fit.status is Status.FAIL:
        return Verdict(
            Status.FAIL,
            f"torch {version} is built for CUDA {cuda}; driver {fit.driver} cannot run it",
            lines,
            fix_build,
        )
    if fit.status is Status.WARN:
        return Verdict(
            Status.WARN,
            f"torch {version} is built for CUDA {cuda}, newer than the driver's "
            f"{driver_cuda}: it runs on minor-version compatibility",
            lines,
            fix_build,
        )
    return _judge_torch_release(info, release, str(cuda), lines)


def _judge_torch_release(
    info: dict[str, Any], release: str, cuda: str, lines: tuple[str, ...]
) -> Verdict:
    """Whether the release was ever built for this CUDA (pytorch/pytorch RELEASE.md)."""
    summary = _torch_summary(info)
    builds = compat.torch_builds(release)
    if builds is None:
        return Verdict(Status.PASS, summary, lines)
    wanted, series = compat.short(cuda), ".".join(map(str, compat.short(release) or ()))
    if wanted in map(compat.short, builds.experimental):
        return Verdict(
            Status.PASS,
            f"{summary} (CUDA {cuda} is an experimental build of torch {series})",
            lines,
        )
    if wanted in map(compat.short, builds.stable):
        return Verdict(Status.PASS, summary, lines)
    known = ", ".join((*builds.stable, *builds.experimental))
    return Verdict(
        Status.WARN,
        f"{summary}: torch {series} has no official CUDA {cuda} build (known: {known})",
        lines,
        f"Install an official build: pip install --force-reinstall torch=={release} "
        f"--index-url https://download.pytorch.org/whl/cu{builds.stable[-1].replace('.', '')}",
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "pytorch",
        "PyTorch uses the GPU",
        (probes.TORCH, probes.SMI, probes.SMI_QUERY, probes.DRIVER_VERSION),
        _judge_pytorch,
    ),
)
