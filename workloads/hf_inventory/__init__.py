"""The model-definition route: a model inventory from ``transformers``' own definition of a config.json.

For any ``config.json`` whose ``model_type`` ``transformers`` (>= 5, the optional ``hf`` extra:
``pip install 'tiersim[hf]'``) defines, the model is instantiated on the meta device (shapes, no
weights, no network, never remote code) and its module tree walked: every parameter tensor of every
decoder layer with its kind (attention q/k/v/o or fused qkv, latent-attention down/up projections,
MLP gate/up/down, routed experts -- fused 3-D tensors or a list --, shared experts, router, norms),
the embeddings, position tables and the LM head, tied or not (:mod:`.inventory`, :mod:`.walk`).
From it: total and active parameters, per-layer matmul FLOPs, and the :class:`~workloads.model.ModelSpec`
that describes the model with route "model definition" (:mod:`.spec`).

``torch`` and ``transformers`` are imported only inside functions; without them
:func:`spec_from_hf_config` fails with one line naming the extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.hf_inventory.inventory import (
    AttentionShape,
    LayerInventory,
    ModelInventory,
    MoeShape,
    ParamTensor,
)
from workloads.hf_inventory.spec import spec_from_inventory
from workloads.hf_inventory.walk import (
    HF_EXTRA_HINT,
    inventory_and_config,
    inventory_from_config,
    transformers_available,
)

if TYPE_CHECKING:
    from workloads.model import ModelSpec

__all__ = [
    "HF_EXTRA_HINT",
    "AttentionShape",
    "LayerInventory",
    "ModelInventory",
    "MoeShape",
    "ParamTensor",
    "inventory_from_config",
    "spec_from_hf_config",
    "transformers_available",
]


def _name(config: Mapping[str, Any], path: Path | None) -> str:
    name = config.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    if path is not None:
        return path.parent.name or path.stem
    return str(config.get("model_type", "model"))


def spec_from_hf_config(config: Mapping[str, Any], *, path: Path | str | None = None,
                        notes: tuple[str, ...] = ()) -> tuple[ModelSpec, tuple[str, ...]]:
    """Describe a config.json's model from its ``transformers`` definition (route "model definition").

    ``config`` is the file's JSON object, ``path`` where it came from (names the model and the errors);
    ``notes`` are lines to carry (e.g. keys that change cost and are not modelled). Returns the spec and
    its notes (also in ``spec.notes``). Raises :class:`~workloads.errors.WorkloadInputError` (one line)
    when transformers is missing, does not define the ``model_type``, or cannot build the model.
    """
    where = str(path) if path is not None else "config.json"
    inv, cfg = inventory_and_config(config, where=where)
    import transformers

    source = f"HF config.json: {where} (model definition: transformers {transformers.__version__} {inv.architecture})"
    return spec_from_inventory(inv, cfg, config, name=_name(config, Path(path) if path is not None else None),
                               source=source, extra_notes=notes)
