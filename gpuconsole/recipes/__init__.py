"""Training recipes the console ships to hosts and runs there with python3 or torchrun.

Each recipe is a script that imports only the standard library, torch and its harness
(`_recipe_harness.py`, shared by all recipes), so a host needs nothing from gpuconsole: the two
files are written side by side there. This package only finds them. It never imports torch: the
console does not need it.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

HARNESS = _HERE / "_recipe_harness.py"
RECIPES: dict[str, Path] = {
    "resnet50": _HERE / "resnet50.py",
    "bert": _HERE / "bert.py",
    "detection": _HERE / "detection.py",
}


def recipe_files(name: str) -> dict[str, str]:
    """The files a host needs to run recipe ``name``, {file name: text}: the recipe and the
    harness it imports."""
    try:
        path = RECIPES[name]
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}") from None
    return {path.name: path.read_text(encoding="utf-8"), HARNESS.name: HARNESS.read_text("utf-8")}
