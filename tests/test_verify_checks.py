"""The checks' registration: every check module in `verify.checks` is in the order the package
states (`FAMILIES`), every check and judge it defines is in its own `CHECKS`, and reports list the
checks in exactly this order (the verify command, the verify screen and bundles all read
`checks.CHECKS`)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from gpuconsole.actions.verify import checks
from gpuconsole.actions.verify.model import Check


def unregistered(package: ModuleType, families: Sequence[ModuleType]) -> list[str]:
    """What in ``package`` the order ``families`` does not hold: a module left out of it, a
    `Check` or a judge (a function of ``evidence, context``) outside its module's `CHECKS`, a
    check registered in one module and judged in another, an id listed twice."""
    problems = []
    listed = {family.__name__ for family in families}
    for found in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(found.name)
        if found.name not in listed:
            problems.append(f"{found.name} is not in the stated order")
        registered: tuple[Check, ...] = getattr(module, "CHECKS", ())
        judges = {check.judge for check in registered}
        for name, value in vars(module).items():
            if isinstance(value, Check) and value not in registered:
                problems.append(f"{found.name}.{name} is a check outside CHECKS")
            if (
                inspect.isfunction(value)
                and value.__module__ == found.name
                and list(inspect.signature(value).parameters) == ["evidence", "context"]
                and value not in judges
            ):
                problems.append(f"{found.name}.{name} judges no check in CHECKS")
        problems += [
            f"{check.id} is in {found.name}'s CHECKS, judged in {check.judge.__module__}"
            for check in registered
            if check.judge.__module__ != found.name
        ]
    ids = [check.id for family in families for check in family.CHECKS]
    problems += [f"{i} is listed twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    return problems


def test_every_check_module_is_in_the_stated_order() -> None:
    assert unregistered(checks, checks.FAMILIES) == []


def test_reports_list_the_checks_in_this_order() -> None:
    assert [c.id for c in checks.CHECKS] == [
        # the driver and the software stack
        "driver-loaded",
        "nvidia-smi",
        "nvml-driver-match",
        "gpu-count",
        "cuda-driver",
        "cuda-toolkit",
        "cudnn",
        "tensorrt",
        "pytorch",
        "tensorflow",
        "nouveau",
        "kernel-headers",
        "dkms",
        "secure-boot",
        "profiler",
        # the hardware and the system around it
        "persistence-mode",
        "ecc",
        "row-remap",
        "pcie-link",
        "host-device-bandwidth",
        "nvlink",
        "p2p-bandwidth",
        "fabric-manager",
        "xid-log",
        "nvme",
        "disk-free",
        "disk-read",
    ]


_HEADER = """
from gpuconsole.actions.verify.model import Check, Status, Verdict


def _judge_ok(evidence, context):
    return Verdict(Status.PASS, "ok")
"""
_FAKE_MODULES = {
    "listed": _HEADER + 'CHECKS = (Check("listed", "Listed", (), _judge_ok),)\n',
    "forgotten": _HEADER + 'CHECKS = (Check("forgotten", "Not in the order", (), _judge_ok),)\n',
    "stray": _HEADER
    + "\n\ndef _judge_unused(evidence, context):\n    return Verdict(Status.PASS, 'ok')\n\n\n"
    + 'EXTRA = Check("extra", "Outside CHECKS", (), _judge_ok)\n'
    + 'CHECKS = (Check("stray", "Stray", (), _judge_ok),)\n',
    "borrowed": "from fakechecks.listed import Check, _judge_ok\n"
    'CHECKS = (Check("listed", "Judged in listed", (), _judge_ok),)\n',
}


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """A package `fakechecks` laid out like `verify.checks`, with one of each mistake."""
    package = tmp_path / "fakechecks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in _FAKE_MODULES.items():
        (package / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("fakechecks")
    for name in [n for n in sys.modules if n == "fakechecks" or n.startswith("fakechecks.")]:
        del sys.modules[name]


def test_a_mistake_in_the_registration_is_reported(fake_package: ModuleType) -> None:
    family = {
        name: importlib.import_module(f"fakechecks.{name}")
        for name in ("listed", "stray", "borrowed")
    }
    assert unregistered(fake_package, list(family.values())) == [
        "listed is in fakechecks.borrowed's CHECKS, judged in fakechecks.listed",
        "fakechecks.forgotten is not in the stated order",
        "fakechecks.stray._judge_unused judges no check in CHECKS",
        "fakechecks.stray.EXTRA is a check outside CHECKS",
        "listed is listed twice",
    ]


def test_a_module_left_out_of_the_order_is_reported() -> None:
    assert unregistered(checks, checks.FAMILIES[:-1]) == [
        "gpuconsole.actions.verify.checks.disk_read is not in the stated order"
    ]
