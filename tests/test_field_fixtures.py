"""Every public nvidia-smi dump under fixtures/nvidia-smi read by the parser, checked against the
values read by hand from the file (``manifest.json``): its GPU count, driver and GPU 0's readings.

A dump cut off mid-GPU is listed as ``"refused": true`` and must be refused as incomplete. The
folder may hold no dump the manifest does not list, so no fixture comes without its expectations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.telemetry.smi import SmiParseError, parse_dump
from gpuconsole.telemetry.smi.dump import read_dump

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
MANIFEST = FIXTURES / "manifest.json"
NOT_LISTED = {"README.md", "manifest.json"}
"""Files of the folder that are no dump of the manifest (beside the H200's own, ``h200-*``)."""
MIN_PUBLIC = 40
FORMATS = {"xml", "text", "csv"}


def manifest() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(MANIFEST.read_text(encoding="utf-8"))
    return entries


def expected_first_line(entry: dict[str, Any], text: str) -> None:
    """The entry's format agrees with how the dump starts."""
    head = text.lstrip("\ufeff \t\r\n")
    if entry["format"] == "xml":
        assert head.startswith("<")
    elif entry["format"] == "text":
        assert "NVSMI LOG" in head.partition("\n")[0]
    else:
        assert "," in head.partition("\n")[0]


@pytest.mark.parametrize("entry", manifest(), ids=lambda entry: entry["file"])
def test_fixture_reads_as_read_by_hand(entry: dict[str, Any]) -> None:
    assert entry["format"] in FORMATS
    text = read_dump(FIXTURES / entry["file"])
    expected_first_line(entry, text)
    if entry.get("refused"):
        assert "expect" not in entry
        with pytest.raises(SmiParseError) as refused:
            parse_dump(text, host="h", time=0.0)
        assert str(refused.value).startswith("incomplete"), str(refused.value)
        return
    snapshot = parse_dump(text, host="h", time=0.0)
    assert len(snapshot.gpus) == entry["gpus"]
    assert snapshot.driver_version == entry["driver"]
    gpu = snapshot.gpus[0]
    assert gpu.index == 0
    assert "name" in entry["expect"]
    for key, value in entry["expect"].items():
        assert getattr(gpu, key) == value, f"GPU 0 {key}"


def test_manifest_lists_every_fixture() -> None:
    listed = [entry["file"] for entry in manifest()]
    assert len(listed) == len(set(listed)), "a file listed twice"
    present = {
        path.name
        for path in FIXTURES.iterdir()
        if path.is_file() and not path.name.startswith("h200-") and path.name not in NOT_LISTED
    }
    assert present == set(listed)
    assert not any(name.startswith("h200-") for name in listed)
    assert len(listed) >= MIN_PUBLIC
