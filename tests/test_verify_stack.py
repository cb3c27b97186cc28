"""The driver and software stack checks, judged on recorded outputs: the real ones captured on an
NVIDIA H200 host (tests/fixtures/h200, tests/fixtures/nvidia-smi) and failing ones written from
the tools' documented formats (each marked where it is built). One test runs the probes for real
on this machine, which has no GPU and no driver."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.shell import LocalShell
from gpuconsole.actions.verify import probes, runner
from gpuconsole.actions.verify.checks import STACK, checks_of
from gpuconsole.actions.verify.checks.cuda_toolkit import NVCC
from gpuconsole.actions.verify.checks.cudnn import CUDNN_HEADER
from gpuconsole.actions.verify.checks.dkms import DKMS, KERNEL_TREE
from gpuconsole.actions.verify.checks.profiler import PROFILERS
from gpuconsole.actions.verify.checks.secure_boot import MODULE_SIGNER, SECURE_BOOT
from gpuconsole.actions.verify.checks.tensorflow import TENSORFLOW
from gpuconsole.actions.verify.checks.tensorrt import TENSORRT
from gpuconsole.actions.verify.model import Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

FIXTURES = Path(__file__).parent / "fixtures"
STACK_CHECKS = checks_of(STACK)
CHECKS = {check.id: check for check in STACK_CHECKS}


def transcript() -> dict[str, str]:
    """tests/fixtures/h200/environment.txt (a `set -x` transcript) as {command: what it printed}."""
    commands: dict[str, str] = {}
    current = None
    for line in (FIXTURES / "h200" / "environment.txt").read_text().splitlines():
        if line.startswith("+"):
            current = line.lstrip("+ ")
            commands[current] = ""
        elif current is not None:
            commands[current] += line + "\n"
    return commands


def out(probe: Probe, stdout: str = "", code: int | None = 0, stderr: str = "") -> CommandOutput:
    return CommandOutput(probe.command, code, stdout, stderr)


def not_installed(probe: Probe) -> CommandOutput:
    return out(probe, code=127, stderr="/bin/sh: 1: tool: not found")


def python_json(**fields: object) -> str:
    return json.dumps({"python": "/opt/torch/.venv/bin/python3", **fields}) + "\n"


def smi_query_csv(*rows: Mapping[str, str]) -> str:
    header = ", ".join(probes.SMI_FIELDS)
    lines = [", ".join(row.get(field, "[N/A]") for field in probes.SMI_FIELDS) for row in rows]
    return "\n".join([header, *lines]) + "\n"


def h200_query_row() -> dict[str, str]:
    """The H200's row for SMI_QUERY's fields, taken from the real query CSV and `-q -x` output
    (persistence and ECC mode); compute_cap 9.0 is the H200's published capability (NVIDIA's
    CUDA GPUs list): the captured CSV predates that field."""
    lines = (FIXTURES / "nvidia-smi" / "h200-query-gpu.csv").read_text().splitlines()
    header = [cell.strip().split(" [")[0] for cell in lines[0].split(",")]
    row = dict(zip(header, (cell.strip() for cell in lines[1].split(",")), strict=True))
    return {
        **row,
        "compute_cap": "9.0",
        "persistence_mode": "Enabled",
        "ecc.mode.current": "Enabled",
    }


def h200() -> dict[str, CommandOutput]:
    """Every stack probe's output on the H200 host, from the captured transcript.

    Not captured there, written from the formats: /proc/modules (lsmod was missing; the line
    format is the kernel's, "name size refcount deps state address"), `modinfo` (the VM has no
    /lib/modules, so modinfo cannot find the module: kmod's error line), TensorRT and
    TensorFlow (not installed on that host: the probes' not-found answers)."""
    said = transcript()
    kernel = said["uname -a"].split()[2]
    version, cuda, cudnn, available = said[
        "python3 -c 'import torch;print(torch.__version__, torch.version.cuda, "
        "torch.backends.cudnn.version(), torch.cuda.is_available())'"
    ].split()
    tools = [f"{path.rsplit('/', 1)[1]} {path}" for path in said["command -v ncu nvprof"].split()]
    return {
        probes.DRIVER_VERSION.name: out(
            probes.DRIVER_VERSION, said["cat /proc/driver/nvidia/version"]
        ),
        probes.SMI.name: out(
            probes.SMI, (FIXTURES / "nvidia-smi" / "h200-default.txt").read_text()
        ),
        probes.SMI_QUERY.name: out(probes.SMI_QUERY, smi_query_csv(h200_query_row())),
        probes.KERNEL_MODULES.name: out(
            probes.KERNEL_MODULES,
            "nvidia_uvm 2076672 0 - Live 0x0000000000000000 (O)\n"
            "nvidia 14381056 2 nvidia_uvm, Live 0x0000000000000000 (O)\n",
        ),
        probes.UNAME.name: out(probes.UNAME, kernel + "\n"),
        NVCC.name: out(NVCC, said["nvcc --version"]),
        CUDNN_HEADER.name: out(CUDNN_HEADER, code=1),
        TENSORRT.name: out(TENSORRT, code=127),
        probes.TORCH.name: out(
            probes.TORCH,
            python_json(
                torch=version,
                cuda=cuda,
                cudnn=int(cudnn),
                available=available == "True",
                devices=1,
                name="NVIDIA H200",
                capability="9.0",
            ),
        ),
        TENSORFLOW.name: out(
            TENSORFLOW,
            python_json(missing=True, error="ModuleNotFoundError: No module named 'tensorflow'"),
        ),
        KERNEL_TREE.name: out(KERNEL_TREE, f"absent /lib/modules/{kernel}\n"),
        DKMS.name: not_installed(DKMS),
        SECURE_BOOT.name: not_installed(SECURE_BOOT),
        MODULE_SIGNER.name: out(
            MODULE_SIGNER, code=1, stderr="modinfo: ERROR: Module nvidia not found.\n"
        ),
        PROFILERS.name: out(PROFILERS, "\n".join(tools) + "\n"),
    }


def judge(check_id: str, changes: Mapping[Probe, CommandOutput] = {}, **context: object) -> Verdict:
    """One check's verdict on the H200 outputs with ``changes`` in place of some of them."""
    evidence = h200() | {probe.name: output for probe, output in changes.items()}
    return CHECKS[check_id].judge(evidence, Context("h200", **context))  # type: ignore[arg-type]


def assert_remedied(verdict: Verdict, *words: str) -> None:
    assert verdict.status in (Status.WARN, Status.FAIL)
    assert verdict.remediation is not None
    for word in words:
        assert word in verdict.remediation, (word, verdict.remediation)


# -- the real H200 -------------------------------------------------------------------------


def test_healthy_h200_passes_or_skips_with_reasons() -> None:
    results = runner.judge_all(STACK_CHECKS, h200(), Context("h200", expected_gpus=1))
    statuses = {r.id: r.status for r in results}
    assert statuses == {
        "driver-loaded": Status.PASS,
        "nvidia-smi": Status.PASS,
        "nvml-driver-match": Status.PASS,
        "gpu-count": Status.PASS,
        "cuda-driver": Status.PASS,
        "cuda-toolkit": Status.PASS,
        "cudnn": Status.PASS,
        "tensorrt": Status.SKIP,
        "pytorch": Status.PASS,
        "tensorflow": Status.SKIP,
        "nouveau": Status.PASS,
        "kernel-headers": Status.SKIP,
        "dkms": Status.SKIP,
        "secure-boot": Status.SKIP,
        "profiler": Status.PASS,
    }
    for result in results:
        assert result.summary
        assert result.remediation is None, result.id


def test_h200_summaries_name_the_values() -> None:
    results = {r.id: r for r in runner.judge_all(STACK_CHECKS, h200(), Context("h200"))}
    assert "580.159.04" in results["driver-loaded"].summary
    assert "open" in results["driver-loaded"].summary
    assert results["nvidia-smi"].summary == "nvidia-smi answers: driver 580.159.04, CUDA 13.0"
    assert "580.159.04" in results["nvml-driver-match"].summary
    assert "13.0" in results["cuda-driver"].summary
    assert "13.0.88" in results["cuda-toolkit"].summary
    assert "cuDNN 9.19.0" in results["cudnn"].summary
    assert results["pytorch"].summary == "torch 2.11.0+cu130, CUDA 13.0, cuDNN 9.19.0, 1 GPU"
    assert "/usr/local/cuda/bin/ncu" in results["profiler"].summary
    assert "no /lib/modules/6.18.44-fc-v973-gpu and no DKMS" in results["kernel-headers"].summary
    assert "1 GPU(s) visible; no expected count" in results["gpu-count"].summary
    assert results["gpu-count"].status is Status.SKIP


# -- driver-loaded, nvidia-smi, nvml-driver-match ------------------------------------------


def test_driver_not_loaded_fails_with_the_causes() -> None:
    # coreutils' message for a missing file
    missing = out(
        probes.DRIVER_VERSION,
        code=1,
        stderr="cat: /proc/driver/nvidia/version: No such file or directory\n",
    )
    verdict = judge("driver-loaded", {probes.DRIVER_VERSION: missing})
    assert verdict.status is Status.FAIL
    assert verdict.evidence == ("cat: /proc/driver/nvidia/version: No such file or directory",)
    assert_remedied(verdict, "modprobe nvidia", "Secure Boot", "headers", "DKMS", "nouveau")


def test_proprietary_module_named() -> None:
    # the proprietary module's first line, per the NVIDIA driver README
    line = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023"
    )
    verdict = judge("driver-loaded", {probes.DRIVER_VERSION: out(probes.DRIVER_VERSION, line)})
    assert verdict.status is Status.PASS
    assert verdict.summary == "NVIDIA kernel module 535.129.03 (proprietary) is loaded"


SMI_NO_DRIVER = (  # nvidia-smi's message when the driver is not loaded (exit 9), as documented
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running.\n"
)


def nvidia_gpus_in_sysfs() -> int | None:
    """This machine's NVIDIA display controllers as Python reads sysfs; None without it."""
    devices = Path("/sys/bus/pci/devices")
    if not devices.is_dir():
        return None
    return sum(
        1
        for device in devices.iterdir()
        if (device / "vendor").read_text().strip() == "0x10de"
        and (device / "class").read_text().startswith("0x03")
    )


def driver_module_missing() -> CommandOutput:
    return out(probes.DRIVER_VERSION, code=1, stderr="cat: /proc/driver/nvidia/version: No such")


@pytest.mark.parametrize(
    "classes",
    ["", "0x040300\n", "0x068000\n0x068000\n"],
    ids=["nothing of NVIDIA", "an audio function", "NVSwitches"],
)
def test_no_nvidia_gpu_on_the_bus_says_so_and_not_modprobe(classes: str) -> None:
    bus = out(probes.NVIDIA_PCI, classes)
    verdict = judge(
        "driver-loaded", {probes.DRIVER_VERSION: driver_module_missing(), probes.NVIDIA_PCI: bus}
    )
    assert verdict.status is Status.FAIL
    assert verdict.summary.startswith("no NVIDIA GPU on this machine")
    assert_remedied(verdict, "lspci -d 10de:", "passed through")
    assert verdict.remediation is not None and "modprobe" not in verdict.remediation


@pytest.mark.parametrize(
    ("bus", "gpus"),
    [
        (out(probes.NVIDIA_PCI, "0x030200\n0x040300\n"), 1),  # a 3D controller and its audio
        (out(probes.NVIDIA_PCI, "0x030000\n"), 1),  # a VGA controller
        (out(probes.NVIDIA_PCI, code=2, stderr="sh: cd: can't cd to /sys/bus/pci/devices"), None),
        (out(probes.NVIDIA_PCI, code=None), None),  # timed out
    ],
)
def test_a_gpu_on_the_bus_or_a_bus_unknown_gets_the_causes_of_a_module_not_loaded(
    bus: CommandOutput, gpus: int | None
) -> None:
    evidence = {probes.NVIDIA_PCI.name: bus}
    assert probes.nvidia_gpus_on_bus(evidence) == gpus
    verdict = judge(
        "driver-loaded", {probes.DRIVER_VERSION: driver_module_missing(), probes.NVIDIA_PCI: bus}
    )
    assert verdict.status is Status.FAIL
    assert_remedied(verdict, "modprobe nvidia", "Secure Boot")


def test_the_bus_probe_counts_what_sysfs_shows() -> None:
    """The probe's shell command, run here, against this machine's sysfs as Python reads it."""
    probe = probes.NVIDIA_PCI
    output = asyncio.run(LocalShell().run(probe.command, probe.timeout))
    assert probes.nvidia_gpus_on_bus({probe.name: output}) == nvidia_gpus_in_sysfs()


def test_smi_exit_9_names_code_and_meaning() -> None:
    verdict = judge("nvidia-smi", {probes.SMI: out(probes.SMI, SMI_NO_DRIVER, code=9)})
    assert verdict.status is Status.FAIL
    assert verdict.summary == "nvidia-smi exited with 9 (NVIDIA driver not loaded)"
    assert verdict.evidence[0].startswith("NVIDIA-SMI has failed")
    assert_remedied(verdict, "driver-loaded")


def test_smi_fell_off_the_bus_and_timeout() -> None:
    fell = judge("nvidia-smi", {probes.SMI: out(probes.SMI, "Unable to determine ...", 15)})
    assert fell.summary == "nvidia-smi exited with 15 (a GPU fell off the bus)"
    assert_remedied(fell, "XID 79", "reboot")
    hung = judge("nvidia-smi", {probes.SMI: out(probes.SMI, code=None, stderr="no answer")})
    assert hung.status is Status.FAIL
    assert "no answer within 15 s" in hung.summary
    assert_remedied(hung, "XID 79")


def test_smi_not_installed() -> None:
    verdict = judge("nvidia-smi", {probes.SMI: not_installed(probes.SMI)})
    assert verdict.summary == "nvidia-smi is not installed"
    assert_remedied(verdict, "nvidia-utils")


# Written from a public CI log (mozilla/translations#1167): nvidia-smi exits 18 and prints this.
NVML_MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.144\n"
)
MODULE_550_127 = (  # /proc/driver/nvidia/version of the older module still loaded
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024\n"
)


def test_nvml_mismatch_message_fails_with_reload_and_hold() -> None:
    changes = {
        probes.SMI: out(probes.SMI, NVML_MISMATCH, code=18),
        probes.SMI_QUERY: out(probes.SMI_QUERY, NVML_MISMATCH, code=18),
        probes.DRIVER_VERSION: out(probes.DRIVER_VERSION, MODULE_550_127),
    }
    verdict = judge("nvml-driver-match", changes)
    assert verdict.status is Status.FAIL
    assert verdict.summary == (
        "driver/library version mismatch: NVML 550.144, kernel module 550.127.05"
    )
    assert "Failed to initialize NVML: Driver/library version mismatch" in verdict.evidence
    assert_remedied(verdict, "Reboot", "rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia", "hold")
    smi = judge("nvidia-smi", changes)
    assert smi.summary == "nvidia-smi exited with 18: NVML driver/library version mismatch"
    assert_remedied(smi, "nvml-driver-match")


def test_nvml_versions_differ() -> None:
    verdict = judge(
        "nvml-driver-match", {probes.DRIVER_VERSION: out(probes.DRIVER_VERSION, MODULE_550_127)}
    )
    assert verdict.status is Status.FAIL
    assert verdict.summary == (
        "nvidia-smi reports driver 580.159.04, the loaded kernel module is 550.127.05"
    )


def test_nvml_nothing_to_compare_without_driver() -> None:
    verdict = judge(
        "nvml-driver-match",
        {
            probes.SMI: not_installed(probes.SMI),
            probes.SMI_QUERY: not_installed(probes.SMI_QUERY),
        },
    )
    assert verdict.status is Status.SKIP


# -- gpu-count, cuda-driver ----------------------------------------------------------------


def test_fewer_gpus_than_expected_fails_with_lost_gpu_hints() -> None:
    verdict = judge("gpu-count", expected_gpus=8)
    assert verdict.status is Status.FAIL
    assert verdict.summary == "1 of 8 expected GPUs visible"
    assert verdict.evidence == ("GPU 0: NVIDIA H200 (00000000:00:06.0)",)
    assert_remedied(verdict, "XID 79", "nvidia-smi -q", "reseat")


def test_more_gpus_than_expected_warns() -> None:
    row = h200_query_row()
    second = out(probes.SMI_QUERY, smi_query_csv(row, {**row, "index": "1"}))
    verdict = judge("gpu-count", {probes.SMI_QUERY: second}, expected_gpus=1)
    assert verdict.status is Status.WARN


def test_gpu_count_from_the_table_when_the_query_fails() -> None:
    # an older nvidia-smi rejects an unknown field, in its documented words
    rejected = out(probes.SMI_QUERY, 'Field "compute_cap" is not a valid field to query.', 2)
    verdict = judge("gpu-count", {probes.SMI_QUERY: rejected}, expected_gpus=1)
    assert verdict.status is Status.PASS
    assert verdict.evidence == ("GPU 0: NVIDIA H200 (00000000:00:06.0)",)
    nothing = judge(
        "gpu-count",
        {probes.SMI_QUERY: rejected, probes.SMI: out(probes.SMI, SMI_NO_DRIVER, 9)},
        expected_gpus=1,
    )
    assert nothing.status is Status.FAIL
    assert nothing.summary == "0 of 1 expected GPUs visible"


def test_cuda_driver_skips_without_nvidia_smi() -> None:
    verdict = judge("cuda-driver", {probes.SMI: out(probes.SMI, SMI_NO_DRIVER, 9)})
    assert verdict.status is Status.SKIP
    assert judge("cuda-driver").summary == "driver 580.159.04 supports CUDA up to 13.0"


# -- cuda-toolkit --------------------------------------------------------------------------


def driver_at(version: str, cuda: str) -> dict[Probe, CommandOutput]:
    """A host with this driver and CUDA: the H200's outputs with the versions replaced."""
    header = (FIXTURES / "nvidia-smi" / "h200-default.txt").read_text()
    header = header.replace("580.159.04", version).replace(
        "CUDA Version: 13.0", f"CUDA Version: {cuda}"
    )
    row = {**h200_query_row(), "driver_version": version}
    # the proprietary module's line, per the NVIDIA driver README
    module = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Oct 19 2023\n"
    return {
        probes.SMI: out(probes.SMI, header),
        probes.SMI_QUERY: out(probes.SMI_QUERY, smi_query_csv(row)),
        probes.DRIVER_VERSION: out(probes.DRIVER_VERSION, module),
    }


def driver_535() -> dict[Probe, CommandOutput]:
    return driver_at("535.129.03", "12.2")


def nvcc(release: str, build: str) -> CommandOutput:
    # `nvcc --version`'s layout, as in the captured transcript
    return out(
        NVCC,
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        f"Cuda compilation tools, release {release}, V{build}\n",
    )


def test_toolkit_newer_minor_on_driver_535_warns() -> None:
    verdict = judge("cuda-toolkit", {**driver_535(), NVCC: nvcc("12.8", "12.8.61")})
    assert verdict.status is Status.WARN
    assert "12.8.61" in verdict.summary
    assert "driver 535.129.03 supports CUDA 12.2" in verdict.evidence
    assert any("570.26" in line for line in verdict.evidence)
    assert_remedied(verdict, "570.26", "cuda-toolkit-12-2", "minor-version")


def test_toolkit_of_a_newer_major_fails() -> None:
    verdict = judge("cuda-toolkit", {**driver_535(), NVCC: nvcc("13.0", "13.0.88")})
    assert verdict.status is Status.FAIL
    assert verdict.summary == "CUDA toolkit 13.0.88 cannot run on driver 535.129.03"
    assert_remedied(verdict, "580.65.06")


def test_toolkit_absent_skips_and_no_driver_skips() -> None:
    assert judge("cuda-toolkit", {NVCC: not_installed(NVCC)}).status is Status.SKIP
    no_driver = {
        probes.SMI: not_installed(probes.SMI),
        probes.SMI_QUERY: not_installed(probes.SMI_QUERY),
        probes.DRIVER_VERSION: out(probes.DRIVER_VERSION, code=1),
    }
    verdict = judge("cuda-toolkit", no_driver)
    assert verdict.status is Status.SKIP
    assert "no driver version" in verdict.summary


# -- cudnn, tensorrt -----------------------------------------------------------------------


def test_cudnn_from_the_header() -> None:
    # cudnn_version.h's defines (cuDNN's installation guide greps the same lines)
    header = (
        "/usr/include/x86_64-linux-gnu/cudnn_version.h\n"
        "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n"
    )
    verdict = judge("cudnn", {CUDNN_HEADER: out(CUDNN_HEADER, header)})
    assert verdict.status is Status.PASS
    assert verdict.summary.startswith(
        "cuDNN 9.1.0 (/usr/include/x86_64-linux-gnu/cudnn_version.h); cuDNN 9.19.0 in torch"
    )


def test_cudnn_8_number_and_none() -> None:
    torch = out(probes.TORCH, python_json(torch="2.1.0+cu121", cuda="12.1", cudnn=8902))
    assert "cuDNN 8.9.2" in judge("cudnn", {probes.TORCH: torch}).summary
    gone = out(probes.TORCH, python_json(missing=True, error="No module named 'torch'"))
    assert judge("cudnn", {probes.TORCH: gone}).status is Status.SKIP


def test_tensorrt_versions() -> None:
    python = out(TENSORRT, "python tensorrt 10.3.0\n")
    assert judge("tensorrt", {TENSORRT: python}).summary == "TensorRT 10.3.0 (python)"
    # dpkg-query's answer for NVIDIA's libnvinfer packages, formatted by the probe
    debs = out(
        TENSORRT,
        "dpkg libnvinfer-dev 10.3.0.26-1+cuda12.5\ndpkg libnvinfer10 10.3.0.26-1+cuda12.5\n",
    )
    verdict = judge("tensorrt", {TENSORRT: debs})
    assert verdict.status is Status.PASS
    assert verdict.summary == "TensorRT 10.3.0.26 (dpkg)"
    library = out(TENSORRT, "library /usr/lib/x86_64-linux-gnu/libnvinfer.so.8.6.1\n")
    assert judge("tensorrt", {TENSORRT: library}).summary == "TensorRT 8.6.1 (library)"


# -- pytorch -------------------------------------------------------------------------------


def torch_on(**fields: object) -> CommandOutput:
    return out(probes.TORCH, python_json(**fields))


def test_torch_cu124_on_cuda_12_2_driver_warns_minor_compat() -> None:
    torch = torch_on(torch="2.4.0+cu124", cuda="12.4", cudnn=90100, available=True, devices=1)
    verdict = judge("pytorch", {**driver_535(), probes.TORCH: torch})
    assert verdict.status is Status.WARN
    assert "12.4" in verdict.summary and "12.2" in verdict.summary
    assert_remedied(verdict, "550.54.14", "https://download.pytorch.org/whl/cu121")


def test_torch_cu124_unavailable_on_old_driver_fails() -> None:
    # torch's documented warning when the driver is too old for its CUDA
    torch = out(
        probes.TORCH,
        python_json(torch="2.4.0+cu124", cuda="12.4", cudnn=90100, available=False, devices=0),
        stderr="UserWarning: CUDA initialization: The NVIDIA driver on your system is too old "
        "(found version 12020).\n",
    )
    verdict = judge("pytorch", {**driver_535(), probes.TORCH: torch})
    assert verdict.status is Status.FAIL
    assert "is_available() is False" in verdict.summary
    assert any("too old" in line for line in verdict.evidence)
    assert_remedied(verdict, "cu121")


def test_torch_unavailable_with_a_fitting_build_points_at_the_devices() -> None:
    torch = torch_on(torch="2.11.0+cu130", cuda="13.0", cudnn=91900, available=False, devices=0)
    verdict = judge("pytorch", {probes.TORCH: torch})
    assert verdict.status is Status.FAIL
    assert_remedied(verdict, "CUDA_VISIBLE_DEVICES", "/dev/nvidia")


def test_cpu_only_torch_on_a_gpu_host_fails_with_the_index_url() -> None:
    torch = torch_on(torch="2.4.0+cpu", cuda=None, cudnn=None, available=False, devices=0)
    verdict = judge("pytorch", {**driver_535(), probes.TORCH: torch})
    assert verdict.status is Status.FAIL
    assert verdict.summary == "torch 2.4.0+cpu is a CPU-only build on a GPU host"
    assert_remedied(verdict, "torch==2.4.0 --index-url https://download.pytorch.org/whl/cu121")


def test_torch_experimental_build_of_the_guide_passes_and_says_so() -> None:
    # the guide's torch 1.12 + CUDA 11.6 on a driver of CUDA 11.7
    torch = torch_on(torch="1.12.1+cu116", cuda="11.6", cudnn=8302, available=True, devices=8)
    verdict = judge("pytorch", {**driver_at("515.65.01", "11.7"), probes.TORCH: torch})
    assert verdict.status is Status.PASS
    assert verdict.summary == (
        "torch 1.12.1+cu116, CUDA 11.6, cuDNN 8.3.2, 8 GPUs "
        "(CUDA 11.6 is an experimental build of torch 1.12)"
    )


def test_torch_cuda_not_built_for_that_release_warns() -> None:
    torch = torch_on(torch="2.4.0", cuda="12.2", cudnn=90100, available=True, devices=1)
    verdict = judge("pytorch", {**driver_535(), probes.TORCH: torch})
    assert verdict.status is Status.WARN
    assert "no official CUDA 12.2 build" in verdict.summary
    assert_remedied(verdict, "whl/cu121")


def test_torch_newer_major_than_the_driver_fails() -> None:
    torch = torch_on(torch="2.11.0+cu130", cuda="13.0", cudnn=91900, available=True, devices=1)
    verdict = judge("pytorch", {**driver_535(), probes.TORCH: torch})
    assert verdict.status is Status.FAIL
    assert_remedied(verdict, "580.65.06", "whl/cu")


def test_torch_absent_broken_and_slow() -> None:
    assert judge("pytorch", {probes.TORCH: not_installed(probes.TORCH)}).status is Status.SKIP
    absent = torch_on(missing=True, error="ModuleNotFoundError: No module named 'torch'")
    assert judge("pytorch", {probes.TORCH: absent}).status is Status.SKIP
    broken = torch_on(error="ImportError: libcudnn.so.9: cannot open shared object file")
    verdict = judge("pytorch", {probes.TORCH: broken})
    assert verdict.summary == (
        "torch does not import: ImportError: libcudnn.so.9: cannot open shared object file"
    )
    assert_remedied(verdict, "--force-reinstall")
    slow = judge("pytorch", {probes.TORCH: out(probes.TORCH, code=None, stderr="no answer")})
    assert slow.status is Status.WARN
    assert "60 s" in slow.summary


def test_torch_probe_runs_and_prints_one_json_line(tmp_path: Path, monkeypatch) -> None:
    """The probe's script for real, against a stand-in `torch` package (written for this test)."""
    package = tmp_path / "torch"
    (package / "backends").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from torch import backends, cuda, version\n__version__ = '9.9.0+cu999'\n"
    )
    (package / "version.py").write_text("cuda = '99.9'\n")
    (package / "backends" / "__init__.py").write_text("from torch.backends import cudnn\n")
    (package / "backends" / "cudnn.py").write_text("def version():\n    return 91900\n")
    (package / "cuda.py").write_text(
        "def is_available():\n    return True\n"
        "def device_count():\n    return 2\n"
        "def get_device_name(i):\n    return 'Stand-in GPU'\n"
        "def get_device_capability(i):\n    return (9, 0)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    output = asyncio.run(LocalShell().run(probes.TORCH.command, probes.TORCH.timeout))
    assert json.loads(output.stdout) | {"python": None} == {
        "python": None,
        "torch": "9.9.0+cu999",
        "cuda": "99.9",
        "cudnn": 91900,
        "available": True,
        "devices": 2,
        "name": "Stand-in GPU",
        "capability": "9.0",
    }


# -- tensorflow ----------------------------------------------------------------------------


def tf_on(**fields: object) -> dict[Probe, CommandOutput]:
    return {TENSORFLOW: out(TENSORFLOW, python_json(**fields))}


def test_tensorflow_without_gpu_on_a_gpu_host_fails() -> None:
    verdict = judge("tensorflow", tf_on(tensorflow="2.17.0", built_with_cuda=False, gpus=[]))
    assert verdict.status is Status.FAIL
    assert_remedied(verdict, "tensorflow[and-cuda]")


def test_tensorflow_gpu_and_mixed_precision() -> None:
    gpu = ["/physical_device:GPU:0"]
    fine = judge(
        "tensorflow", tf_on(tensorflow="2.17.0", built_with_cuda=True, gpus=gpu, mixed_float16=True)
    )
    assert fine.status is Status.PASS
    assert fine.summary == "TensorFlow 2.17.0 sees 1 GPU(s); mixed_float16 can be set"
    policy = judge(
        "tensorflow",
        tf_on(tensorflow="2.17.0", built_with_cuda=True, gpus=gpu, error="ValueError: no keras"),
    )
    assert policy.status is Status.WARN
    assert "ValueError: no keras" in policy.evidence
    assert_remedied(policy, "mixed_float16")


# -- nouveau, kernel-headers, dkms ---------------------------------------------------------


def test_nouveau_loaded_fails_with_blacklist() -> None:
    # /proc/modules lines in the kernel's format
    modules = (
        "nouveau 2433024 3 - Live 0x0000000000000000\n"
        "drm_ttm_helper 16384 1 nouveau, Live 0x0000000000000000\n"
    )
    verdict = judge("nouveau", {probes.KERNEL_MODULES: out(probes.KERNEL_MODULES, modules)})
    assert verdict.status is Status.FAIL
    assert verdict.evidence == ("nouveau 2433024 3 - Live 0x0000000000000000",)
    assert_remedied(verdict, "blacklist nouveau", "modeset=0", "update-initramfs -u", "dracut")


def test_nouveau_absent_passes() -> None:
    verdict = judge("nouveau")
    assert verdict.status is Status.PASS
    assert verdict.evidence == ("nvidia 14381056 2 nvidia_uvm, Live 0x0000000000000000 (O)",)


def test_missing_headers_warn() -> None:
    tree = out(KERNEL_TREE, "missing /lib/modules/6.5.0-14-generic/build\n")
    verdict = judge("kernel-headers", {KERNEL_TREE: tree})
    assert verdict.status is Status.WARN
    assert verdict.summary.startswith("no kernel headers for 6.5.0-14-generic")
    assert_remedied(verdict, "linux-headers-$(uname -r)", "kernel-devel-$(uname -r)")


def test_headers_present_and_absent_tree_with_dkms() -> None:
    there = out(KERNEL_TREE, "present /lib/modules/6.5.0-14-generic/build\n")
    assert judge("kernel-headers", {KERNEL_TREE: there}).status is Status.PASS
    dkms = out(DKMS, "nvidia/535.129.03: added\n")
    assert judge("kernel-headers", {DKMS: dkms}).status is Status.WARN


# `dkms status` lines as dkms 3 prints them (and dkms 2, comma-separated), per its man page.
UNAME_6_5 = {probes.UNAME: out(probes.UNAME, "6.5.0-14-generic\n")}


def test_dkms_added_only_fails_with_build_and_make_log() -> None:
    dkms = out(DKMS, "nvidia/535.129.03: added\n")
    verdict = judge("dkms", {**UNAME_6_5, DKMS: dkms})
    assert verdict.status is Status.FAIL
    assert "6.5.0-14-generic" in verdict.summary
    assert_remedied(
        verdict,
        "dkms build -m nvidia -v 535.129.03",
        "dkms install -m nvidia -v 535.129.03 -k $(uname -r)",
        "/var/lib/dkms/nvidia/535.129.03/build/make.log",
    )


def test_dkms_built_for_another_kernel_fails() -> None:
    dkms = out(DKMS, "nvidia/535.129.03, 6.2.0-39-generic, x86_64: installed\n")
    assert judge("dkms", {**UNAME_6_5, DKMS: dkms}).status is Status.FAIL


def test_dkms_installed_for_the_running_kernel_passes() -> None:
    dkms = out(
        DKMS,
        "nvidia/535.129.03, 6.2.0-39-generic, x86_64: installed\n"
        "nvidia/535.129.03, 6.5.0-14-generic, x86_64: installed\n",
    )
    verdict = judge("dkms", {**UNAME_6_5, DKMS: dkms})
    assert verdict.status is Status.PASS
    old = out(DKMS, "nvidia, 470.82.00, 6.5.0-14-generic, x86_64: installed\n")
    assert judge("dkms", {**UNAME_6_5, DKMS: old}).status is Status.PASS


def test_dkms_without_nvidia_skips() -> None:
    dkms = out(DKMS, "virtualbox/7.0.10, 6.5.0-14-generic, x86_64: installed\n")
    assert judge("dkms", {**UNAME_6_5, DKMS: dkms}).status is Status.SKIP


# -- secure-boot, profiler -----------------------------------------------------------------

SB_ON = {SECURE_BOOT: out(SECURE_BOOT, "SecureBoot enabled\n")}  # mokutil's words


def test_secure_boot_unsigned_module_fails() -> None:
    unsigned = out(MODULE_SIGNER, "\n")  # modinfo -F prints an empty field
    verdict = judge("secure-boot", {**SB_ON, MODULE_SIGNER: unsigned})
    assert verdict.status is Status.FAIL
    assert_remedied(verdict, "mokutil --import", "Key was rejected by service", "disable")


def test_secure_boot_signed_or_off_passes() -> None:
    signed = out(MODULE_SIGNER, "DKMS module signing key\n")
    verdict = judge("secure-boot", {**SB_ON, MODULE_SIGNER: signed})
    assert verdict.status is Status.PASS
    assert "DKMS module signing key" in verdict.summary
    off = out(SECURE_BOOT, "SecureBoot disabled\n")
    assert judge("secure-boot", {SECURE_BOOT: off}).status is Status.PASS


def test_secure_boot_no_module_to_check() -> None:
    no_module = {
        **SB_ON,
        probes.DRIVER_VERSION: out(probes.DRIVER_VERSION, code=1),
    }
    verdict = judge("secure-boot", no_module)
    assert verdict.status is Status.WARN
    assert judge("secure-boot", SB_ON).status is Status.PASS  # loaded, so the kernel accepted it


def test_nvprof_only_on_hopper_warns() -> None:
    nvprof = out(PROFILERS, "nvprof /usr/local/cuda/bin/nvprof\n")
    verdict = judge("profiler", {PROFILERS: nvprof})
    assert verdict.status is Status.WARN
    assert "9.0" in verdict.summary
    assert_remedied(verdict, "ncu", "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct")


def test_nvprof_on_volta_passes_and_none_skips() -> None:
    row = {**h200_query_row(), "compute_cap": "7.0"}
    volta = {
        PROFILERS: out(PROFILERS, "nvprof /usr/local/cuda/bin/nvprof\n"),
        probes.SMI_QUERY: out(probes.SMI_QUERY, smi_query_csv(row)),
    }
    assert judge("profiler", volta).status is Status.PASS
    assert judge("profiler", {PROFILERS: out(PROFILERS)}).status is Status.SKIP


# -- for real, on this machine (no GPU, no driver) -----------------------------------------


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="has an NVIDIA driver")
def test_probes_run_for_real_without_a_driver() -> None:
    began = time.monotonic()
    report = asyncio.run(runner.verify_with(LocalShell(), STACK_CHECKS, Context("localhost")))
    assert time.monotonic() - began < 60
    results = {r.id: r for r in report.checks}
    assert list(results) == [c.id for c in STACK_CHECKS]
    for result in results.values():
        assert result.status in set(Status)
        assert not result.summary.startswith("the check itself failed"), result
        if result.status in (Status.WARN, Status.FAIL):
            assert result.remediation, result.id
    loaded = results["driver-loaded"]
    assert loaded.status is Status.FAIL
    no_gpu = nvidia_gpus_in_sysfs() == 0
    assert loaded.remediation is not None
    assert ("lspci -d 10de:" if no_gpu else "modprobe nvidia") in loaded.remediation
    assert results["cuda-driver"].status is Status.SKIP
    assert results["pytorch"].status is Status.SKIP
