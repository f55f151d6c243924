"""Which route describes a ``config.json``: the family formulas or the model's own definition.

* ``route=None`` (automatic): the formulas (:mod:`workloads.hf_config`) for a ``model_type`` they know --
  fast, no extra needed --, otherwise the model definition (:func:`workloads.hf_inventory.spec_from_hf_config`)
  when ``transformers`` is importable, otherwise one line naming both remedies.
* ``route="formula"`` or ``route="definition"`` forces one (``"model definition"`` is accepted too), e.g.
  to cross-check the two on a family both know.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads import hf_config, hf_families
from workloads.errors import WorkloadInputError
from workloads.files import read_json
from workloads.hf_inventory.walk import HF_EXTRA_HINT, transformers_available

if TYPE_CHECKING:
    from workloads.model import ModelSpec

__all__ = ["MODEL_ROUTES", "formula_knows", "load_hf_model"]

MODEL_ROUTES = ("formula", "definition")
_ALIASES = {"formula": "formula", "definition": "definition", "model definition": "definition",
            "model-definition": "definition", "auto": None}


def _route(route: str | None) -> str | None:
    if route is None:
        return None
    key = route.strip().lower()
    if key not in _ALIASES:
        raise WorkloadInputError(f"model route {route!r} is not one of auto, {', '.join(MODEL_ROUTES)}")
    return _ALIASES[key]


def formula_knows(config: Mapping[str, Any]) -> bool:
    """True when the family formulas describe this config's ``model_type`` (or, lacking one, leave the
    decision to them: they resolve ``architectures`` and name the missing field)."""
    model_type = config.get("model_type")
    return not isinstance(model_type, str) or not model_type or model_type in hf_config.SUPPORTED_MODEL_TYPES


def _unmodelled_notes(config: dict[str, Any], where: str) -> tuple[str, ...]:
    """The keys that change cost and are not modelled, named as the formula route names them."""
    fields = hf_config.Fields(where, config)
    hf_families.common_notes(fields)
    return tuple(fields.notes)


def load_hf_model(path: Path, route: str | None = None) -> ModelSpec:
    """The ModelSpec of the config.json at ``path`` by the chosen (or automatic) route."""
    from workloads.hf_inventory import spec_from_hf_config
    from workloads.model import ModelSpec

    chosen = _route(route)
    data = read_json(path)
    if not isinstance(data, dict):
        raise WorkloadInputError(f"{path}: expected a JSON object of model settings")
    if chosen == "formula" or (chosen is None and formula_knows(data)):
        return ModelSpec(**hf_config.parse_hf_config(path))  # type: ignore[arg-type]
    if chosen is None and not transformers_available():
        raise WorkloadInputError(
            f"{path}: model_type {data.get('model_type')!r} is not one the formulas know "
            f"({', '.join(hf_config.SUPPORTED_MODEL_TYPES)}); describe it from its model definition "
            f"with transformers ({HF_EXTRA_HINT}) or in a YAML of dimensions"
        )
    if chosen == "definition":
        return spec_from_hf_config(data, path=path, notes=_unmodelled_notes(data, str(path)))[0]
    try:
        return spec_from_hf_config(data, path=path, notes=_unmodelled_notes(data, str(path)))[0]
    except WorkloadInputError as definition_error:
        # Neither route describes it: the formulas' refusal, then why the model definition could not help.
        why = str(definition_error).removeprefix(f"{path}: ")
        try:
            hf_config.parse_hf_config(path)
        except WorkloadInputError as formula_error:
            raise WorkloadInputError(f"{formula_error}; its transformers model definition could not be "
                                     f"described either: {why}") from None
        raise
