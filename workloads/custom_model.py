"""Read a YAML file of model dimensions into :class:`~workloads.model.ModelSpec` keyword arguments.

Example::

    name: my-3b
    layers: 26
    hidden: 3200
    heads: 32
    kv_heads: 8          # optional, default = heads
    ffn: 8640            # optional, see below
    vocab: 32000
    mlp: swiglu          # swiglu | gelu (required)

Optional keys and their defaults, chosen by ``mlp`` so that a LLaMA-like (swiglu) or a GPT-like
(gelu) block comes out without further keys:

================ ============================================ ===============
key              swiglu (LLaMA-like)                          gelu (GPT-like)
================ ============================================ ===============
ffn              256*ceil(int(8*hidden/3)/256) (LLaMA rule)   4*hidden
norm             rmsnorm                                      layernorm
bias             false                                        true
tied_embeddings  false                                        true
learned_pos      false (rotary)                               true
dropout          false                                        true
================ ============================================ ===============

``max_pos`` defaults to 2048, ``experts``/``experts_per_token`` to 1, ``source`` to the file path.
Unknown keys are errors (with the closest known key suggested).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.checks import boolean, choice, positive_int, reject_unknown_keys
from workloads.errors import WorkloadInputError
from workloads.files import read_yaml

__all__ = ["parse_custom_yaml", "CUSTOM_KEYS", "llama_ffn"]

CUSTOM_KEYS = (
    "name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_pos", "mlp", "norm", "bias",
    "tied_embeddings", "learned_pos", "dropout", "experts", "experts_per_token", "source",
)
_REQUIRED = {"name": "the model name", "layers": "the layer count", "hidden": "the hidden size",
             "heads": "the attention head count", "vocab": "the vocabulary size",
             "mlp": "the MLP kind (swiglu or gelu)"}


def llama_ffn(hidden: int, multiple_of: int = 256) -> int:
    """LLaMA's SwiGLU width: 2/3 of 4*hidden, rounded up to ``multiple_of`` (11008 for hidden 4096)."""
    raw = int(2 * 4 * hidden / 3)
    return multiple_of * ((raw + multiple_of - 1) // multiple_of)


def _read_yaml(path: Path) -> dict[str, Any]:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise WorkloadInputError(f"{path}: expected a YAML mapping of model dimensions (name, layers, ...)")
    return data


def parse_custom_yaml(path: Path) -> dict[str, object]:
    """Return ModelSpec keyword arguments for the YAML file at ``path``."""
    data = _read_yaml(path)
    where = str(path)
    reject_unknown_keys(data, CUSTOM_KEYS, where)
    for key, purpose in _REQUIRED.items():
        if data.get(key) is None:
            raise WorkloadInputError(f"{where}: missing field '{key}' (needed for {purpose})")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise WorkloadInputError(f"{where}: field 'name' must be a non-empty string (got {name!r})")
    mlp = choice(data["mlp"], "mlp", ("swiglu", "gelu"), where)
    gpt_like = mlp == "gelu"
    hidden = positive_int(data["hidden"], "hidden", where)
    heads = positive_int(data["heads"], "heads", where)

    def opt_int(key: str, default: int) -> int:
        return default if data.get(key) is None else positive_int(data[key], key, where)

    def opt_bool(key: str, default: bool) -> bool:
        return default if data.get(key) is None else boolean(data[key], key, where)

    norm = data.get("norm", "layernorm" if gpt_like else "rmsnorm")
    return {
        "name": name,
        "family": "custom",
        "n_layers": positive_int(data["layers"], "layers", where),
        "hidden": hidden,
        "n_heads": heads,
        "n_kv_heads": opt_int("kv_heads", heads),
        "ffn": opt_int("ffn", 4 * hidden if gpt_like else llama_ffn(hidden)),
        "vocab": positive_int(data["vocab"], "vocab", where),
        "max_pos": opt_int("max_pos", 2048),
        "tied_embeddings": opt_bool("tied_embeddings", gpt_like),
        "mlp": mlp,
        "norm": choice(norm, "norm", ("layernorm", "rmsnorm"), where),
        "bias": opt_bool("bias", gpt_like),
        "learned_pos": opt_bool("learned_pos", gpt_like),
        "n_experts": opt_int("experts", 1),
        "experts_per_token": opt_int("experts_per_token", 1),
        "dropout": opt_bool("dropout", gpt_like),
        "source": str(data.get("source") or f"YAML: {path}"),
    }
