"""The verification screen: the check × host matrix, the detail of a check, and how it is opened."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuconsole.actions.verify.model import (
    Check,
    CheckResult,
    Evidence,
    HostReport,
    Probe,
    Status,
    Verdict,
)
from gpuconsole.hosts.targets import Context, Target
from gpuconsole.ui.screens.verify import VerifyScreen

PROBE = Probe("p", "true")


def fixed(check_id: str) -> Check:
    return Check(
        check_id, f"the {check_id} check", (PROBE,), lambda _e, _c: Verdict(Status.PASS, "")
    )


CHECKS = [fixed("driver-loaded"), fixed("pcie-link"), fixed("disk-free")]
TARGETS = [Target("gpu-a", None, Context("gpu-a")), Target("gpu-b", None, Context("gpu-b"))]
REPORTS = [
    HostReport(
        "gpu-a",
        (
            CheckResult("driver-loaded", "", Status.PASS, "NVIDIA driver 580.159.04 loaded"),
            CheckResult(
                "pcie-link",
                "",
                Status.FAIL,
                "GPU 3 at x8 of x16",
                ("nvidia-smi --query-gpu=pcie.link.width.current --format=csv",),
                ("3, 8, 16",),
                "reseat GPU 3 or check its riser",
            ),
            CheckResult("disk-free", "", Status.WARN, "/tmp 95 % full", (), (), "free /tmp"),
        ),
        seconds=2.5,
    ),
    HostReport("gpu-b", error="gpu-b: connection refused (gpu-b:22)"),
]


def canned(reports: Sequence[HostReport]) -> Callable[..., object]:
    async def run(
        _targets: Sequence[Target], _checks: Sequence[Check], on_report: Callable[..., None]
    ) -> object:
        for report in reports:
            on_report(report)
        return list(reports)

    return run


async def test_the_matrix_shows_each_hosts_verdicts_and_the_detail_its_fix(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = VerifyScreen(TARGETS, CHECKS, canned(REPORTS))
        app.push_screen(screen)
        await pilot.pause(0.3)
        assert set(screen.reports) == {"gpu-a", "gpu-b"}
        matrix = screen.query_one("#verify-matrix")
        assert [str(c) for c in matrix.get_row("pcie-link")] == ["pcie-link", "fail", "down"]
        await pilot.press("down")
        detail = str(screen.query_one("#verify-detail").render())
        assert "GPU 3 at x8 of x16" in detail
        assert "fix: reseat GPU 3 or check its riser" in detail
        assert "not reached: gpu-b: connection refused" in detail
        status = str(screen.query_one("#verify-status").render())
        assert "1 host(s) not reached, 1 fail, 1 warn, 1 pass" in status


async def test_the_checks_really_run_on_this_machine_off_the_ui_thread(make_app) -> None:
    def judge(evidence: Evidence, _context: Context) -> Verdict:
        return Verdict(Status.PASS, evidence["who"].stdout.strip())

    check = Check("whoami", "who runs the checks", (Probe("who", "id -un"),), judge)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = VerifyScreen([Target("here", None, Context("here"))], [check])
        app.push_screen(screen)
        for _ in range(50):
            await pilot.pause(0.1)
            if "here" in screen.reports:
                break
        (result,) = screen.reports["here"].checks
        assert result.status is Status.PASS and result.summary


async def test_simulated_hosts_cannot_be_verified(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("v")
        await pilot.pause()
        assert not isinstance(app.screen, VerifyScreen)


def test_verify_screen_120x40(snap_compare, make_app) -> None:
    async def open_screen(pilot) -> None:  # type: ignore[no-untyped-def]
        pilot.app.push_screen(VerifyScreen(TARGETS, CHECKS, canned(REPORTS)))
        await pilot.pause(0.3)
        await pilot.press("down")

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=open_screen)
