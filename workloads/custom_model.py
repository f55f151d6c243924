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

Today's architectures (every key optional; the meaning of each is that of the ModelSpec field of the same
name, see ``workloads/model.py``)::

    head_dim: 256            # query/key head width when it is not hidden/heads (Gemma-2, Mistral-Nemo, Qwen3)
    v_head_dim: 128          # value head width (latent attention)
    expert_ffn: 768          # routed expert width (default ffn); ffn stays the dense MLP width
    shared_experts: 1        # experts every token passes through (DeepSeek)
    shared_expert_ffn: 2048  # width of each shared expert (default expert_ffn)
    first_dense_layers: 3    # the first blocks of an MoE model are dense (width ffn)
    q_lora_rank: 1536        # latent attention (MLA): Q rank (0: no Q compression)
    kv_lora_rank: 512        # latent attention: KV rank (> 0 switches MLA on)
    qk_rope_head_dim: 64     # latent attention: rotary part of head_dim
    sliding_window: 4096     # attention window in tokens, on every block unless one of:
    sliding_layers: [0, 2]   #   the 0-based blocks that use it (or "all"), or
    global_every: 6          #   every 6th block attends globally, the others use the window (Gemma-3: 6)
    qk_norm: head            # none | head (Qwen3, Gemma-3) | full (OLMo-2)
    block_norms: 4           # hidden-wide norms per block (default 2)
    parallel_blocks: true    # attention and MLP read the same input (Falcon, GPT-NeoX)
    qkv_bias: true           # q/k/v biases only (Qwen2); also o_bias, mlp_bias
    alibi: true              # ALiBi positions: no position parameters (BLOOM)
    embedding_norm: true     # a norm after the token embedding (BLOOM)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.checks import boolean, choice, non_negative_int, positive_int, reject_unknown_keys
from workloads.errors import WorkloadInputError
from workloads.files import read_yaml

__all__ = ["parse_custom_yaml", "CUSTOM_KEYS", "llama_ffn"]

CUSTOM_KEYS = (
    "name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_pos", "mlp", "norm", "bias",
    "tied_embeddings", "learned_pos", "dropout", "experts", "experts_per_token", "source",
    "head_dim", "v_head_dim", "expert_ffn", "shared_experts", "shared_expert_ffn", "first_dense_layers",
    "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "sliding_window", "sliding_layers", "global_every",
    "qk_norm", "block_norms", "parallel_blocks", "qkv_bias", "o_bias", "mlp_bias", "alibi", "embedding_norm",
)
_COUNTS = ("head_dim", "v_head_dim", "expert_ffn", "shared_experts", "shared_expert_ffn", "first_dense_layers",
           "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "sliding_window")
_FLAGS = ("parallel_blocks", "qkv_bias", "o_bias", "mlp_bias", "alibi", "embedding_norm")
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


def _sliding_layers(data: dict[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """The blocks that use ``sliding_window``: ``sliding_layers`` (a list or "all"), ``global_every`` N
    (every N-th block global), or every block."""
    if not data.get("sliding_window"):
        for key in ("sliding_layers", "global_every"):
            if data.get(key) is not None:
                raise WorkloadInputError(f"{where}: field '{key}' needs 'sliding_window' (the window in tokens)")
        return ()
    given, every = data.get("sliding_layers"), data.get("global_every")
    if given is not None and every is not None:
        raise WorkloadInputError(f"{where}: give 'sliding_layers' or 'global_every', not both")
    if every is not None:
        n = positive_int(every, "global_every", where)
        return tuple(i for i in range(layers) if (i + 1) % n)
    if given is None or given == "all":
        return tuple(range(layers))
    if not isinstance(given, list):
        raise WorkloadInputError(f"{where}: field 'sliding_layers' must be a list of block indices or \"all\" "
                                 f"(got {given!r})")
    return tuple(non_negative_int(v, f"sliding_layers[{i}]", where) for i, v in enumerate(given))


def _architecture(data: dict[str, Any], layers: int, where: str) -> dict[str, object]:
    """The optional keys of today's architectures, checked (absent keys keep ModelSpec's defaults)."""
    out: dict[str, object] = {k: non_negative_int(data[k], k, where) for k in _COUNTS if data.get(k) is not None}
    out.update({k: boolean(data[k], k, where) for k in _FLAGS if data.get(k) is not None})
    if data.get("qk_norm") is not None:
        out["qk_norm"] = choice(data["qk_norm"], "qk_norm", ("none", "head", "full"), where)
    if data.get("block_norms") is not None:
        out["block_norms"] = non_negative_int(data["block_norms"], "block_norms", where)
    if (data.get("experts") or 1) == 1:
        for key in ("expert_ffn", "shared_experts", "shared_expert_ffn", "first_dense_layers"):
            if data.get(key) is not None:
                raise WorkloadInputError(f"{where}: field '{key}' needs 'experts' > 1 (a mixture of experts)")
    sliding = _sliding_layers(data, layers, where)
    if sliding:
        out["sliding_layers"] = sliding
    return out


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
    layers = positive_int(data["layers"], "layers", where)
    return {
        "name": name,
        "family": "custom",
        "n_layers": layers,
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
        **_architecture(data, layers, where),
    }
