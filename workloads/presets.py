"""Read the packaged model presets (``workloads/presets/models.yaml``) at call time.

Nothing is cached in module state: each call re-reads the small YAML file through
:mod:`importlib.resources`, so the package does no I/O at import and holds no mutable globals.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from workloads.errors import WorkloadInputError

__all__ = ["preset_table", "shorthands", "published_params"]

_RESOURCE = "presets/models.yaml"
_PUBLISHED_KEYS = ("published_params", "published_active_params")


def _document() -> dict[str, Any]:
    text = resources.files("workloads").joinpath(_RESOURCE).read_text(encoding="utf-8")
    try:
        # libyaml's parser where PyYAML has it (the same safe constructor and resolver, so the same data): the
        # pure-Python one took half of every make_job
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:  # a packaging bug, but still report it with the line
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise WorkloadInputError(f"workloads/{_RESOURCE}{line}: malformed YAML ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise WorkloadInputError(f"workloads/{_RESOURCE}: expected a mapping with a 'models' section")
    if not isinstance(data.get("shorthands", {}), dict):
        raise WorkloadInputError(f"workloads/{_RESOURCE}: 'shorthands' must be a mapping")
    return data


def preset_table() -> dict[str, dict[str, object]]:
    """Preset name -> ModelSpec keyword arguments (without ``name`` and the published totals)."""
    models: dict[str, Any] = _document()["models"]
    return {
        str(name): {k: v for k, v in entry.items() if k not in _PUBLISHED_KEYS}
        for name, entry in models.items()
    }


def shorthands() -> dict[str, str]:
    """CLI shorthand -> preset name (7b -> llama2-7b, ...)."""
    table: dict[str, Any] = _document().get("shorthands") or {}
    return {str(k): str(v) for k, v in table.items()}


def published_params() -> dict[str, tuple[int, int | None]]:
    """Preset name -> (published total, published active or None), as recorded in the preset file."""
    models: dict[str, Any] = _document()["models"]
    return {
        str(name): (int(entry["published_params"]), entry.get("published_active_params"))
        for name, entry in models.items()
    }
