"""Read a Hugging Face ``config.json`` into :class:`~workloads.model.ModelSpec` keyword arguments.

Supported ``model_type`` values (or ``architectures`` entries):

* ``llama`` / ``mistral`` / ``mixtral`` (LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM):
  hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size,
  max_position_embeddings are required; num_key_value_heads defaults to num_attention_heads (plain
  multi-head attention, as ``transformers`` does); tie_word_embeddings defaults to false;
  attention_bias / mlp_bias default to false (either one true sets ``bias``); Mixtral also needs
  num_local_experts and num_experts_per_tok. A ``head_dim`` other than hidden/heads is refused.
  Dropout is on when attention_dropout > 0 (default 0).
* ``gpt2``: n_embd, n_layer, n_head, vocab_size, n_positions required; n_inner defaults to 4*n_embd
  (null counts as absent); tie_word_embeddings defaults to true; dropout when any *_pdrop > 0
  (defaults 0.1).
* ``opt``: hidden_size, num_hidden_layers, num_attention_heads, ffn_dim, vocab_size,
  max_position_embeddings required; enable_bias and tie_word_embeddings default to true; a
  word_embed_proj_dim other than hidden_size (OPT-350m's project_in/out) is refused; dropout when
  dropout/attention_dropout > 0 (default 0.1).

No network access: the file must be on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.checks import boolean, positive_int
from workloads.errors import WorkloadInputError
from workloads.files import read_json

__all__ = ["parse_hf_config", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "gpt2", "opt")
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "GPT2LMHeadModel": "gpt2",
    "OPTForCausalLM": "opt",
}


def _read_json(path: Path) -> dict[str, Any]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise WorkloadInputError(f"{path}: expected a JSON object of model settings")
    return data


class _Fields:
    """Typed access to one config's fields with one-line errors naming the file and field."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path, self.data = path, data

    def require(self, key: str, purpose: str) -> int:
        if self.data.get(key) is None:
            raise WorkloadInputError(f"{self.path}: missing field '{key}' (needed for {purpose})")
        return positive_int(self.data[key], key, str(self.path))

    def optional_int(self, key: str, default: int) -> int:
        value = self.data.get(key)
        return default if value is None else positive_int(value, key, str(self.path))

    def optional_bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        return default if value is None else boolean(value, key, str(self.path))

    def rate(self, key: str, default: float) -> float:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise WorkloadInputError(f"{self.path}: field '{key}' must be a number >= 0 (got {value!r})")
        return float(value)


def _model_type(path: Path, data: dict[str, Any]) -> str:
    model_type = data.get("model_type")
    if model_type is None:
        architectures = data.get("architectures") or []
        if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
            raise WorkloadInputError(f"{path}: field 'architectures' must be a list of class names like "
                                     f"[\"LlamaForCausalLM\"], got {str(architectures)[:60]}")
        for arch in architectures:
            if arch in _ARCHITECTURES:
                return _ARCHITECTURES[arch]
        raise WorkloadInputError(
            f"{path}: missing field 'model_type' (needed to know the architecture; one of "
            f"{', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise WorkloadInputError(
            f"{path}: unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)} "
            "(describe other models in a YAML of dimensions)"
        )
    return str(model_type)


def _name(path: Path, data: dict[str, Any]) -> str:
    name = data.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    return path.parent.name or path.stem


def _llama_like(f: _Fields, family: str) -> dict[str, object]:
    hidden = f.require("hidden_size", "the hidden size")
    heads = f.require("num_attention_heads", "the attention head count")
    head_dim = f.data.get("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise WorkloadInputError(
            f"{f.path}: field 'head_dim' ({head_dim}) differs from hidden_size/num_attention_heads "
            f"({hidden // heads}); such models are not supported, describe them in a YAML of dimensions"
        )
    moe = family == "mixtral"
    return {
        "family": family,
        "n_layers": f.require("num_hidden_layers", "the layer count"),
        "hidden": hidden,
        "n_heads": heads,
        "n_kv_heads": f.optional_int("num_key_value_heads", heads),
        "ffn": f.require("intermediate_size", "the MLP width"),
        "vocab": f.require("vocab_size", "the vocabulary size"),
        "max_pos": f.require("max_position_embeddings", "the context length"),
        "tied_embeddings": f.optional_bool("tie_word_embeddings", False),
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "bias": f.optional_bool("attention_bias", False) or f.optional_bool("mlp_bias", False),
        "learned_pos": False,
        "n_experts": f.require("num_local_experts", "the expert count") if moe else 1,
        "experts_per_token": f.require("num_experts_per_tok", "the experts per token") if moe else 1,
        "dropout": f.rate("attention_dropout", 0.0) > 0,
    }


def _gpt2(f: _Fields) -> dict[str, object]:
    hidden = f.require("n_embd", "the hidden size")
    return {
        "family": "gpt2",
        "n_layers": f.require("n_layer", "the layer count"),
        "hidden": hidden,
        "n_heads": f.require("n_head", "the attention head count"),
        "n_kv_heads": f.require("n_head", "the attention head count"),
        "ffn": f.optional_int("n_inner", 4 * hidden),
        "vocab": f.require("vocab_size", "the vocabulary size"),
        "max_pos": f.require("n_positions", "the position-embedding rows"),
        "tied_embeddings": f.optional_bool("tie_word_embeddings", True),
        "mlp": "gelu",
        "norm": "layernorm",
        "bias": True,
        "learned_pos": True,
        "dropout": max(f.rate(k, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")) > 0,
    }


def _opt(f: _Fields) -> dict[str, object]:
    hidden = f.require("hidden_size", "the hidden size")
    proj = f.data.get("word_embed_proj_dim")
    if proj is not None and proj != hidden:
        raise WorkloadInputError(
            f"{f.path}: field 'word_embed_proj_dim' ({proj}) differs from hidden_size ({hidden}); "
            "OPT's project_in/out layers are not supported, describe the model in a YAML of dimensions"
        )
    heads = f.require("num_attention_heads", "the attention head count")
    return {
        "family": "opt",
        "n_layers": f.require("num_hidden_layers", "the layer count"),
        "hidden": hidden,
        "n_heads": heads,
        "n_kv_heads": heads,
        "ffn": f.require("ffn_dim", "the MLP width"),
        "vocab": f.require("vocab_size", "the vocabulary size"),
        "max_pos": f.require("max_position_embeddings", "the position-embedding rows"),
        "tied_embeddings": f.optional_bool("tie_word_embeddings", True),
        "mlp": "gelu",
        "norm": "layernorm",
        "bias": f.optional_bool("enable_bias", True),
        "learned_pos": True,
        "dropout": max(f.rate("dropout", 0.1), f.rate("attention_dropout", 0.0)) > 0,
    }


def parse_hf_config(path: Path) -> dict[str, object]:
    """Return ModelSpec keyword arguments for the HF config at ``path``."""
    data = _read_json(path)
    fields = _Fields(path, data)
    model_type = _model_type(path, data)
    if model_type == "gpt2":
        spec = _gpt2(fields)
    elif model_type == "opt":
        spec = _opt(fields)
    else:
        spec = _llama_like(fields, model_type)
    return {"name": _name(path, data), **spec, "source": f"HF config.json: {path}"}
