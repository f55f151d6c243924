"""tiersim's version: the installed package's metadata, else ``pyproject.toml`` when run from a source tree.

Read when asked (never at import time) and remembered for the process: ``tiersim --version``, the
``tiersim_version`` key of every ``--json`` result (:mod:`planner.result_json`) and the sweep store's
record of which tiersim filled it (:mod:`planner.sweep.store`) all call :func:`tiersim_version`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import tomllib
from pathlib import Path

UNKNOWN = "0+unknown"


@functools.cache
def tiersim_version() -> str:
    """The installed package's version (``importlib.metadata``); not installed (a source tree on
    ``PYTHONPATH``): the ``pyproject.toml`` beside the packages; neither: ``0+unknown``."""
    try:
        return importlib.metadata.version("tiersim")
    except importlib.metadata.PackageNotFoundError:
        return _source_tree_version() or UNKNOWN


def _source_tree_version() -> str | None:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    project = data.get("project")
    if not isinstance(project, dict) or project.get("name") != "tiersim":
        return None
    version = project.get("version")
    return version if isinstance(version, str) else None
