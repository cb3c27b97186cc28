"""What the checks' judges share: reading outputs into lines and numbers, the verdict for a probe
that gave nothing to judge, and how well the driver runs a given CUDA version."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.verify import compat, probes
from gpuconsole.actions.verify.model import Evidence, Probe, Status, Verdict

# -- reading outputs -----------------------------------------------------------------------------


def lines_with(output: CommandOutput, *words: str) -> tuple[str, ...]:
    """The lines of stdout and stderr that contain any of ``words`` (case-insensitive)."""
    text = f"{output.stdout}\n{output.stderr}"
    wanted = [w.casefold() for w in words]
    return tuple(
        line.strip() for line in text.splitlines() if any(w in line.casefold() for w in wanted)
    )


def csv_cells(text: str) -> list[list[str]]:
    """The non-empty rows of CSV ``text``, each cell stripped."""
    return [
        [cell.strip() for cell in row]
        for row in csv.reader(text.splitlines(), skipinitialspace=True)
        if row
    ]


def smi_int(text: str | None) -> int | None:
    """A count or a number nvidia-smi printed; None for "[N/A]", "[Not Supported]" and the like."""
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def joined(items: Iterable[str]) -> str:
    return ", ".join(items)


# -- probes that gave nothing to judge -----------------------------------------------------------


def no_answer(probe: Probe, status: Status, remediation: str) -> Verdict:
    """A probe that timed out: the command is in the result already, there is no output."""
    return Verdict(
        status, f"{probe.name} probe gave no answer within {probe.timeout:g} s", (), remediation
    )


_HUNG_SMI = (
    "a hung nvidia-smi usually means a GPU stopped answering: look for XID 79 in `dmesg`, "
    "then drain and reboot the node"
)


def smi_unusable(output: CommandOutput, what: str) -> Verdict | None:
    """The verdict when nvidia-smi gave nothing to judge; None when it answered.

    A failing nvidia-smi is a skip here: the driver checks report why it fails.
    """
    if output.timed_out:
        return Verdict(
            Status.FAIL,
            f"nvidia-smi did not answer ({what}): {output.stderr.strip()}",
            (),
            _HUNG_SMI,
        )
    if output.missing:
        return Verdict(Status.SKIP, f"nvidia-smi is not installed: no {what} to check")
    if not output.ok:
        return Verdict(
            Status.SKIP,
            f"nvidia-smi failed (exit {output.exit_code}) on the {what}; the driver checks say why",
            output.lines(3),
        )
    return None


def script_unusable(output: CommandOutput, what: str) -> tuple[Verdict | None, dict[str, object]]:
    """A copy script's report, or the verdict when it gave none (no python3, a crash, a skip)."""
    if output.timed_out:
        verdict = Verdict(
            Status.WARN,
            f"the {what} did not finish: {output.stderr.strip()}",
            output.lines(),
            "run the probe command by hand on the host to see where it stalls "
            "(torch's first import can be slow on a network filesystem; a CUDA call that never "
            "returns points at the GPU: see xid-log)",
        )
        return verdict, {}
    if output.missing:
        return Verdict(Status.SKIP, f"python3 is not installed: no {what}"), {}
    report = probes.json_line(output)
    if report is None:
        verdict = Verdict(
            Status.WARN,
            f"the {what} failed (exit {output.exit_code}) without a result",
            tuple(output.stderr.strip().splitlines()[-4:]) or output.lines(),
            "run the probe command by hand on the host and read its traceback",
        )
        return verdict, {}
    if "skip" in report:
        return Verdict(Status.SKIP, f"no {what}: {report['skip']}"), {}
    return None, report


# -- the driver and a CUDA version ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CudaFit:
    """How well the driver runs a CUDA version: PASS fully, WARN only with minor-version
    compatibility, FAIL not at all, SKIP when the driver's version is unknown."""

    status: Status
    cuda: str
    driver: str | None
    driver_cuda: str | None
    min_driver: str | None
    floor: str | None

    def lines(self) -> tuple[str, ...]:
        need = f"CUDA {self.cuda} needs driver >= {self.min_driver or 'unknown'}"
        if self.floor:
            need += f" (>= {self.floor} with minor-version compatibility)"
        if self.driver is None:
            return ("driver version unknown", need)
        return (f"driver {self.driver} supports CUDA {self.driver_cuda or 'unknown'}", need)

    def remedy(self, instead: str) -> str:
        """Upgrading the driver, or ``instead`` (a build for the driver's CUDA)."""
        target = self.min_driver or f"a driver that supports CUDA {self.cuda}"
        return f"Upgrade the driver to {target} or newer, or {instead}."


def cuda_fit(evidence: Evidence, cuda: str) -> CudaFit:
    """Whether the driver runs ``cuda``: nvidia-smi's 'CUDA Version' decides when it is there
    (it is the driver's own word), else the minimum-driver table (shared/reference/gpu-facts.md,
    "Compatibility")."""
    driver, driver_cuda = probes.driver_version(evidence), probes.driver_cuda(evidence)
    support = compat.driver_runs_cuda(driver, cuda) if driver else None
    need = compat.min_driver_for_cuda(cuda)
    floor = compat.minor_compat_floor(cuda)
    if driver_cuda is not None:
        full = (compat.short(driver_cuda) or ()) >= (compat.short(cuda) or ())
    elif support is not None and need is not None:
        full = support.full
    else:
        return CudaFit(Status.SKIP, cuda, driver, driver_cuda, need, floor)
    if full:
        status = Status.PASS
    elif support is not None and support.minor_compatible:
        status = Status.WARN
    else:
        status = Status.FAIL
    return CudaFit(status, cuda, driver, driver_cuda, need, floor)
