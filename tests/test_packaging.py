"""Every package of the source tree is shipped by a (non-editable) install: pyproject's find patterns cover it."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_in_the_distribution() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = set(find_packages(str(ROOT), include=conf["include"]))
    tops = {p.split(".")[0] for p in shipped}
    every = {p for p in find_packages(str(ROOT), exclude=["tests*", "build*"]) if p.split(".")[0] in tops}
    assert every <= shipped
    # and the top-level packages of design.md's picture are all there, with their sub-packages
    for top in ("hardware_models", "workloads", "costs", "policies", "simulator", "planner", "reports", "replay",
                "tiersim"):
        assert top in shipped
    assert {"tiersim.commands", "planner.sweep", "reports.figures"} <= shipped
    assert not [p for p in shipped if fnmatch.fnmatch(p, "tests*")]


def test_every_data_file_of_a_package_is_package_data() -> None:
    # Presets and the hardware reference are read through importlib.resources: a (non-editable) install
    # must carry them, so each non-Python file inside a shipped package matches its package-data patterns.
    setuptools_conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = setuptools_conf["package-data"]
    shipped = set(find_packages(str(ROOT), include=setuptools_conf["packages"]["find"]["include"]))
    tops = sorted({p.split(".")[0] for p in shipped})
    uncovered = []
    for top in tops:
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT / top).as_posix()
            if not any(fnmatch.fnmatch(rel, pattern) for pattern in data.get(top, [])):
                uncovered.append(f"{top}/{rel}")
    assert uncovered == []
    assert "reference/*.yaml" in data["hardware_models"]
    assert (ROOT / "hardware_models" / "reference" / "hardware_specs.yaml").is_file()
