"""The reference the presets cite: ``hardware_models/reference/hardware_specs.yaml``, shipped as package data.

Every preset's ``sources:`` entry is either a key of the reference's ``sources:`` table (a URL or a
repository file with a note) or says what it is (``derived: ...``, ``assumed: ...``, a named datasheet).
The reference also records the published figures (``gpus:``, ``systems:``, ``models:`` ...) the presets
and the model presets were written from; the tests check the presets against it.

Read at call time through :mod:`importlib.resources`; nothing is cached in module state.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from hardware_models.errors import HardwareInputError

__all__ = ["REFERENCE_RESOURCE", "reference_source_keys", "reference_specs"]

REFERENCE_RESOURCE = "reference/hardware_specs.yaml"


def reference_specs() -> dict[str, Any]:
    """The whole reference document (``sources``, ``gpus``, ``systems``, ``models``, ...) as parsed YAML."""
    text = resources.files("hardware_models").joinpath(REFERENCE_RESOURCE).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("sources"), dict):
        where = f"hardware_models/{REFERENCE_RESOURCE}"
        raise HardwareInputError("expected a mapping with a 'sources' table", file=where)
    return data


def reference_source_keys() -> frozenset[str]:
    """The citation keys a preset may use (the reference's ``sources:`` table)."""
    return frozenset(str(key) for key in reference_specs()["sources"])
