"""`rules export -o` and `grafana export -o` never write through a symbolic link planted at the
path (as one can be in /tmp, onto another of the user's files): a link there is refused in one
line naming it, and nothing the user had is lost or changed; a file there is replaced whole."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from cli_runner import gpuconsole

EXPORTS = (("rules", "export"), ("grafana", "export"))
IDS = ("rules", "grafana")


def export(command: tuple[str, ...], output: Path) -> subprocess.CompletedProcess[str]:
    return gpuconsole(*command, "-o", str(output))


@pytest.mark.parametrize("command", EXPORTS, ids=IDS)
def test_a_planted_link_onto_a_file_is_refused_and_the_file_kept(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    victim = tmp_path / "home" / ".bashrc"
    victim.parent.mkdir()
    victim.write_text("the user's own file\n")
    planted = tmp_path / "tmp" / "gpu-rules.yml"
    planted.parent.mkdir()
    planted.symlink_to(victim)
    result = export(command, planted)
    assert result.returncode != 0
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"gpuconsole: {planted}: "), result.stderr
    assert "link" in result.stderr
    assert victim.read_text() == "the user's own file\n"
    assert planted.is_symlink() and planted.readlink() == victim
    assert sorted(p.name for p in planted.parent.iterdir()) == ["gpu-rules.yml"]


@pytest.mark.parametrize("command", EXPORTS, ids=IDS)
def test_a_dangling_link_does_not_make_the_file_it_points_at(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    aimed = tmp_path / "elsewhere" / "authorized_keys"
    aimed.parent.mkdir()
    planted = tmp_path / "out.json"
    planted.symlink_to(aimed)
    result = export(command, planted)
    assert result.returncode != 0
    assert result.stderr.startswith(f"gpuconsole: {planted}: "), result.stderr
    assert not aimed.exists()
    assert planted.is_symlink()


@pytest.mark.parametrize("command", EXPORTS, ids=IDS)
def test_a_file_at_the_path_is_replaced_whole_keeping_its_mode(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    output = tmp_path / "exported"
    output.write_text("an older export, longer than any new one\n" * 10_000)
    output.chmod(0o640)
    other = tmp_path / "hard-link"
    os.link(output, other)  # another name of the old file keeps the old text
    result = export(command, output)
    assert result.returncode == 0, result.stderr
    fresh = gpuconsole(*command)
    assert output.read_text() == fresh.stdout
    assert stat.S_IMODE(output.stat().st_mode) == 0o640
    assert other.read_text().startswith("an older export")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "hard-link"]
