"""Snapshot tests of every screen on the simulated rack (fixed seed, fixed clock, fixed size).

Accept a deliberate change with `pytest --snapshot-update` after looking at snapshot_report.html.
"""

from __future__ import annotations


def test_fleet_120x40(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40))


def test_fleet_80x24(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24))


def test_fleet_expanded_160x48(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(160, 48), press=["space"])


def test_host_120x40(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), press=["enter"])


def test_host_80x24(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24), press=["enter"])


def test_topology_a100_120x40(snap_compare, make_app) -> None:
    # The second host, worst first, is the A100 PCIe host with its thermal fault.
    assert snap_compare(make_app(), terminal_size=(120, 40), press=["down", "t"])


def test_help_120x40(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), press=["question_mark"])


def test_light_theme_host_120x40(snap_compare, make_app) -> None:
    assert snap_compare(
        make_app(theme="gpuconsole-light"), terminal_size=(120, 40), press=["enter"]
    )


def test_triage_120x40(snap_compare, make_app) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), press=["T"])
