"""Reading JSON and YAML files with one-line errors that name the file and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from workloads.errors import WorkloadInputError

__all__ = ["read_json", "read_yaml"]


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadInputError(f"{path}: cannot read ({exc.strerror}); check the path") from exc


def read_json(path: Path) -> Any:
    """Parse JSON; a syntax error is reported as ``path:line:col: malformed JSON (...)``."""
    try:
        return json.loads(_text(path))
    except json.JSONDecodeError as exc:
        raise WorkloadInputError(
            f"{path}:{exc.lineno}:{exc.colno}: malformed JSON ({exc.msg}); fix the syntax at that line"
        ) from exc


def read_yaml(path: Path) -> Any:
    """Parse YAML (safe loader); a syntax error is reported as ``path:line: malformed YAML (...)``."""
    try:
        return yaml.safe_load(_text(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or "syntax error"
        raise WorkloadInputError(f"{where}: malformed YAML ({problem}); fix the syntax at that line") from exc
