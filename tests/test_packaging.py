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
