"""One parser per Hugging Face ``model_type``: the keys each family reads and its defaults.

Defaults for absent keys are those of the family's ``transformers`` configuration class (5.x), as
``transformers`` itself applies them (e.g. Qwen3's head_dim 128, Gemma's tied embeddings, Falcon's
ffn_hidden_size 4*hidden). Shapes follow the ``transformers`` modelling code:

* ``llama``, ``mistral``, ``mixtral``, ``qwen2``, ``qwen3``, ``qwen3_moe``, ``phi3``, ``olmo2``: SwiGLU, RMSNorm,
  rotary, GQA with ``head_dim`` (default hidden/heads; Qwen3 128). attention_bias sets the q/k/v/o biases
  (Qwen2: q/k/v always, o never), mlp_bias the MLP's. Qwen3 adds per-head q/k norms, OLMo-2 norms over
  the whole Q and K (and its two norms are post-norms: same count). MoE: Mixtral num_local_experts of
  width intermediate_size; Qwen3-MoE num_experts of width moe_intermediate_size (mlp_only_layers /
  decoder_sparse_step must leave the dense blocks first). Sliding window: Mistral, Mixtral and Phi-3 on
  every block when ``sliding_window`` is set; Qwen2/3 only with use_sliding_window, from block
  max_window_layers on.
* ``gemma2``, ``gemma3`` (its ``text_config``), ``gemma3_text``: gated GELU (3 matrices), RMSNorm, 4 norms per
  block, head_dim 256, tied; sliding window on ``layer_types`` (Gemma-2: every other block from block 0;
  Gemma-3: five of every six, ``sliding_window_pattern``); Gemma-3 adds per-head q/k norms.
* ``falcon``: GELU MLP of ffn_hidden_size, LayerNorm, fused QKV with multi_query (1 KV head) or
  num_kv_heads (new_decoder_architecture), parallel attention/MLP with one norm (two with the new
  architecture), ``bias`` for every linear, ``alibi`` or rotary, tied.
* ``gpt_neox``: GELU MLP, LayerNorm (2 per block, parallel residual), biases, rotary, untied.
* ``bloom``: GELU MLP of 4*hidden, LayerNorm, biases, ALiBi, a norm after the embedding, tied.
* ``deepseek_v3``: latent attention (q_lora_rank, kv_lora_rank, qk_nope/rope_head_dim, v_head_dim),
  first_k_dense_replace dense blocks of intermediate_size, then n_routed_experts of moe_intermediate_size
  (num_experts_per_tok per token) + n_shared_experts.
* ``gpt2``: n_embd, n_layer, n_head, vocab_size, n_positions required; n_inner defaults to 4*n_embd;
  tied; dropout when any *_pdrop > 0 (defaults 0.1).
* ``opt``: hidden_size, num_hidden_layers, num_attention_heads, ffn_dim, vocab_size,
  max_position_embeddings required; enable_bias and tie_word_embeddings default to true; a
  word_embed_proj_dim other than hidden_size (OPT-350m's project_in/out) is refused; dropout when
  dropout/attention_dropout > 0 (default 0.1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from workloads.errors import WorkloadInputError

if TYPE_CHECKING:
    from workloads.hf_config import Fields

__all__ = ["PARSERS", "common_notes"]

_LAYERS = ("num_hidden_layers", "n_layer")
_HEADS = ("num_attention_heads", "n_head")
_HIDDEN = ("hidden_size", "n_embed")


def _sliding(f: Fields, n_layers: int, window: int, rule: Callable[[int], bool]) -> dict[str, object]:
    """sliding_window / sliding_layers from ``layer_types`` when given, else from the family's rule."""
    types = f.string_list("layer_types")
    if types is not None:
        if len(types) != n_layers:
            raise WorkloadInputError(f"{f.where}: field 'layer_types' has {len(types)} entries for {n_layers} layers")
        unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
        if unknown:
            raise WorkloadInputError(f"{f.where}: field 'layer_types' holds {unknown[0]!r}; "
                                     "known: sliding_attention, full_attention")
        layers = [i for i, t in enumerate(types) if t == "sliding_attention"]
    else:
        layers = [i for i in range(n_layers) if rule(i)]
    if not window or not layers:
        return {}
    return {"sliding_window": window, "sliding_layers": tuple(layers)}


def _gqa_decoder(f: Fields, family: str, *, head_dim: int = 0, tied: bool = False) -> dict[str, Any]:
    """The keys shared by LLaMA-style decoders (SwiGLU, RMSNorm, rotary, GQA)."""
    heads = f.require(_HEADS, "the attention head count")
    attention_bias = f.optional_bool("attention_bias", False)
    return {
        "family": family,
        "n_layers": f.require(_LAYERS, "the layer count"),
        "hidden": f.require(_HIDDEN, "the hidden size"),
        "n_heads": heads,
        "n_kv_heads": f.optional_int("num_key_value_heads", heads),
        "head_dim": f.optional_int("head_dim", head_dim),
        "ffn": f.require("intermediate_size", "the MLP width"),
        "vocab": f.require("vocab_size", "the vocabulary size"),
        "max_pos": f.require("max_position_embeddings", "the context length"),
        "tied_embeddings": f.optional_bool("tie_word_embeddings", tied),
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "bias": False,
        "learned_pos": False,
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "mlp_bias": f.optional_bool("mlp_bias", False),
        "dropout": f.rate("attention_dropout", 0.0) > 0,
    }


def _unless_null(f: Fields, key: str, default: int) -> int:
    """``key``'s count; ``default`` when the key is absent (as the transformers config class fills it), but
    0 when it is written as null (transformers keeps the null: no window, no low-rank projection)."""
    return f.count(key, default) if key not in f.data else f.count(key)


def _every_layer_window(f: Fields, spec: dict[str, Any], default: int = 0) -> dict[str, object]:
    return _sliding(f, spec["n_layers"], _unless_null(f, "sliding_window", default), lambda i: True)


def _qwen_window(f: Fields, spec: dict[str, Any]) -> dict[str, object]:
    if not f.optional_bool("use_sliding_window", False):
        return {}
    start = f.count("max_window_layers", 28)
    return _sliding(f, spec["n_layers"], f.count("sliding_window"), lambda i: i >= start)


def _llama(f: Fields) -> dict[str, object]:
    return _gqa_decoder(f, "llama")


def _mistral(f: Fields) -> dict[str, object]:
    spec = _gqa_decoder(f, "mistral")
    return {**spec, **_every_layer_window(f, spec, default=4096)}  # MistralConfig's default window


def _mixtral(f: Fields) -> dict[str, object]:
    spec = _gqa_decoder(f, "mixtral")
    return {**spec, **_every_layer_window(f, spec),
            "n_experts": f.require(("num_local_experts", "num_experts"), "the expert count"),
            "experts_per_token": f.require("num_experts_per_tok", "the experts per token")}


def _qwen2(f: Fields) -> dict[str, object]:
    spec = _gqa_decoder(f, "qwen2")
    return {**spec, **_qwen_window(f, spec), "qkv_bias": True, "o_bias": False}


def _qwen3(f: Fields) -> dict[str, Any]:
    spec = _gqa_decoder(f, "qwen3", head_dim=128)
    return {**spec, **_qwen_window(f, spec), "qk_norm": "head"}


def _first_dense(f: Fields, n_layers: int) -> int:
    """Qwen3-MoE's dense blocks (mlp_only_layers, decoder_sparse_step) as a count of first blocks."""
    only = set(f.int_list("mlp_only_layers"))
    step = f.optional_int("decoder_sparse_step", 1)
    dense = sorted(i for i in range(n_layers) if i in only or (i + 1) % step != 0)
    if dense != list(range(len(dense))):
        raise WorkloadInputError(
            f"{f.where}: fields 'mlp_only_layers'/'decoder_sparse_step' make blocks {dense[:6]} dense; only "
            "dense blocks before every MoE block are modelled (describe the model in a YAML of dimensions "
            "with first_dense_layers)"
        )
    return len(dense)


def _qwen3_moe(f: Fields) -> dict[str, object]:
    spec = _qwen3(f)
    experts = f.require(("num_experts", "num_local_experts"), "the expert count")
    return {**spec, "family": "qwen3_moe", "n_experts": experts,
            "experts_per_token": f.require("num_experts_per_tok", "the experts per token"),
            "expert_ffn": f.require("moe_intermediate_size", "the expert width"),
            "first_dense_layers": _first_dense(f, int(spec["n_layers"])) if experts > 1 else 0}


def _phi3(f: Fields) -> dict[str, object]:
    spec = _gqa_decoder(f, "phi3")
    dropout = max(f.rate(k, 0.0) for k in ("attention_dropout", "resid_pdrop", "embd_pdrop")) > 0
    return {**spec, **_every_layer_window(f, spec), "dropout": dropout}


def _olmo2(f: Fields) -> dict[str, object]:
    return {**_gqa_decoder(f, "olmo2"), "qk_norm": "full"}


def _gemma2(f: Fields) -> dict[str, object]:
    spec = _gqa_decoder(f, "gemma2", head_dim=256, tied=True)
    window = _unless_null(f, "sliding_window", 4096)
    return {**spec, **_sliding(f, int(spec["n_layers"]), window, lambda i: i % 2 == 0), "block_norms": 4}


_GEMMA3_TEXT_DEFAULTS = {  # transformers Gemma3TextConfig defaults, for keys a Gemma-3 text_config leaves out
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
    "sliding_window": 4096,
}


def _gemma3_text(f: Fields) -> dict[str, object]:
    spec = _gqa_decoder(f, "gemma3", head_dim=256, tied=True)
    pattern = f.optional_int("sliding_window_pattern", 6)
    window = f.count("sliding_window", 4096)
    return {**spec, **_sliding(f, int(spec["n_layers"]), window, lambda i: (i + 1) % pattern != 0),
            "block_norms": 4, "qk_norm": "head"}


def _gemma3(f: Fields) -> dict[str, object]:
    """Gemma-3 (Gemma3ForConditionalGeneration): the text decoder of ``text_config``."""
    inner = f.nested("text_config", _GEMMA3_TEXT_DEFAULTS)
    spec = _gemma3_text(inner)
    common_notes(inner)
    f.notes.extend(inner.notes)
    return spec


def _falcon(f: Fields) -> dict[str, object]:
    hidden = f.require(_HIDDEN, "the hidden size")
    heads = f.require(_HEADS, "the attention head count")
    new_arch = f.optional_bool("new_decoder_architecture", False)
    multi_query = f.optional_bool("multi_query", True)
    kv = f.optional_int(("num_kv_heads", "n_head_kv"), heads) if new_arch or not multi_query else 1
    parallel = f.optional_bool("parallel_attn", True)
    norms = 2 if not parallel or f.optional_int("num_ln_in_parallel_attn", 2 if new_arch else 1) == 2 else 1
    alibi = f.optional_bool("alibi", False)
    dropout = max(f.rate(k, 0.0) for k in ("attention_dropout", "hidden_dropout")) > 0
    return {"family": "falcon", "n_layers": f.require(_LAYERS, "the layer count"), "hidden": hidden,
            "n_heads": heads, "n_kv_heads": kv, "ffn": f.optional_int("ffn_hidden_size", 4 * hidden),
            "vocab": f.require("vocab_size", "the vocabulary size"),
            "max_pos": f.optional_int("max_position_embeddings", 2048),
            "tied_embeddings": f.optional_bool("tie_word_embeddings", True), "mlp": "gelu", "norm": "layernorm",
            "bias": f.optional_bool("bias", False), "learned_pos": False, "alibi": alibi,
            "parallel_blocks": parallel, "block_norms": norms, "dropout": dropout}


def _gpt_neox(f: Fields) -> dict[str, object]:
    dropout = max(f.rate(k, 0.0) for k in ("attention_dropout", "hidden_dropout")) > 0
    return {"family": "gpt_neox", "n_layers": f.require(_LAYERS, "the layer count"),
            "hidden": f.require(_HIDDEN, "the hidden size"), "n_heads": f.require(_HEADS, "the attention head count"),
            "n_kv_heads": f.require(_HEADS, "the attention head count"),
            "ffn": f.require("intermediate_size", "the MLP width"),
            "vocab": f.require("vocab_size", "the vocabulary size"),
            "max_pos": f.optional_int("max_position_embeddings", 2048),
            "tied_embeddings": f.optional_bool("tie_word_embeddings", False), "mlp": "gelu", "norm": "layernorm",
            "bias": f.optional_bool("attention_bias", True), "learned_pos": False,
            "parallel_blocks": f.optional_bool("use_parallel_residual", True), "dropout": dropout}


def _bloom(f: Fields) -> dict[str, object]:
    hidden = f.require(_HIDDEN, "the hidden size")
    dropout = max(f.rate(k, 0.0) for k in ("attention_dropout", "hidden_dropout")) > 0
    return {"family": "bloom", "n_layers": f.require(_LAYERS, "the layer count"), "hidden": hidden,
            "n_heads": f.require(_HEADS, "the attention head count"),
            "n_kv_heads": f.require(_HEADS, "the attention head count"), "ffn": 4 * hidden,
            "vocab": f.require("vocab_size", "the vocabulary size"),
            "max_pos": f.optional_int(("seq_length", "max_position_embeddings"), 2048),
            "tied_embeddings": f.optional_bool("tie_word_embeddings", True), "mlp": "gelu", "norm": "layernorm",
            "bias": True, "learned_pos": False, "alibi": True, "embedding_norm": True, "dropout": dropout}


def _deepseek_v3(f: Fields) -> dict[str, object]:
    heads = f.require(_HEADS, "the attention head count")
    layers = f.require(_LAYERS, "the layer count")
    if f.optional_int("moe_layer_freq", 1) != 1:
        raise WorkloadInputError(f"{f.where}: field 'moe_layer_freq' other than 1 is not modelled; describe the "
                                 "model in a YAML of dimensions")
    rope = f.require("qk_rope_head_dim", "the rotary part of a query/key head")
    experts = f.require(("n_routed_experts", "num_local_experts"), "the routed expert count")
    return {"family": "deepseek_v3", "n_layers": layers, "hidden": f.require(_HIDDEN, "the hidden size"),
            "n_heads": heads, "n_kv_heads": heads,
            "head_dim": f.require("qk_nope_head_dim", "the non-rotary part of a query/key head") + rope,
            "v_head_dim": f.require("v_head_dim", "the value head width"), "qk_rope_head_dim": rope,
            "q_lora_rank": _unless_null(f, "q_lora_rank", 1536),
            "kv_lora_rank": f.require("kv_lora_rank", "the latent KV rank"),
            "ffn": f.require("intermediate_size", "the dense MLP width"),
            "expert_ffn": f.require("moe_intermediate_size", "the expert width"), "n_experts": experts,
            "experts_per_token": f.require("num_experts_per_tok", "the experts per token"),
            "shared_experts": f.count("n_shared_experts") if experts > 1 else 0,
            "first_dense_layers": min(f.count("first_k_dense_replace", 3), layers) if experts > 1 else 0,
            "vocab": f.require("vocab_size", "the vocabulary size"),
            "max_pos": f.require("max_position_embeddings", "the context length"),
            "tied_embeddings": f.optional_bool("tie_word_embeddings", False), "mlp": "swiglu", "norm": "rmsnorm",
            "bias": False, "learned_pos": False, "dropout": f.rate("attention_dropout", 0.0) > 0}


def _gpt2(f: Fields) -> dict[str, object]:
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


def _opt(f: Fields) -> dict[str, object]:
    hidden = f.require("hidden_size", "the hidden size")
    proj = f.data.get("word_embed_proj_dim")
    if proj is not None and proj != hidden:
        raise WorkloadInputError(
            f"{f.where}: field 'word_embed_proj_dim' ({proj}) differs from hidden_size ({hidden}); "
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


PARSERS: dict[str, Callable[[Fields], dict[str, object]]] = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "gpt2": _gpt2, "opt": _opt, "qwen2": _qwen2,
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "phi3": _phi3, "gemma2": _gemma2, "gemma3": _gemma3,
    "gemma3_text": _gemma3_text, "olmo2": _olmo2, "falcon": _falcon, "gpt_neox": _gpt_neox, "bloom": _bloom,
    "deepseek_v3": _deepseek_v3,
}


def _rope_note(f: Fields) -> None:
    rope = f.data.get("rope_scaling")
    if rope is None:
        return
    if not isinstance(rope, dict):
        raise WorkloadInputError(f"{f.where}: field 'rope_scaling' must be an object or null (got {rope!r})")
    kind = rope.get("rope_type", rope.get("type", "?"))
    f.note(f"rope_scaling ({kind}, factor {rope.get('factor', '?')}): the stretched context is not modelled; "
           "cost follows the sequence length given")


def common_notes(f: Fields) -> None:
    """Name, once each, the keys that change cost but that the formulas do not model."""
    _rope_note(f)
    for key, what in (("attn_logit_softcapping", "tanh soft-capping of the attention scores"),
                      ("final_logit_softcapping", "tanh soft-capping of the logits")):
        if f.data.get(key) is not None:
            f.rate(key, 0.0)
            f.note(f"{key} ({f.data[key]}): {what} is not modelled (element-wise cost; no fused attention "
                   "kernel in transformers with it)")
    if f.data.get("vision_config") is not None:
        f.note("vision_config: the vision tower and its projector are not modelled (text decoder only)")
    if f.count("num_nextn_predict_layers"):
        f.note(f"num_nextn_predict_layers ({f.data['num_nextn_predict_layers']}): the multi-token-prediction "
               "layers are not modelled (main model only)")
    if f.data.get("quantization_config") is not None:
        f.note("quantization_config: quantised weights are not modelled (training precision is --precision)")
