"""The :class:`~workloads.model.ModelSpec` that describes an inventoried model (route "model definition").

Every dimension is read from the tensors of the built model, not from the config's field names: head
widths from the Q/K/V/O shapes, kv heads from K (or from a fused QKV's width), expert and shared-expert
widths from their down projections, the dense-first layers from which layers hold experts, MLA ranks
from the latent projections, norms and biases from the tensors present, windows from each layer's
attention. The spec's own parameter counts are then checked against the inventory's: a difference
(a tensor the dimensions cannot express) is named in a note with its size, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from workloads.errors import WorkloadInputError
from workloads.hf_inventory.inventory import LayerInventory, ModelInventory

if TYPE_CHECKING:
    from workloads.model import ModelSpec

__all__ = ["spec_fields", "spec_from_inventory"]

_DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout",
                 "hidden_dropout_prob", "attention_probs_dropout_prob", "residual_dropout", "embedding_dropout")
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "seq_length", "max_seq_len", "max_sequence_length",
                 "n_ctx")
_DEFAULT_CONTEXT = 2048
_PARALLEL_KEYS = ("parallel_attn", "use_parallel_residual", "parallel_residual")


def _tensors(layer: LayerInventory, kind: str) -> list[tuple[int, ...]]:
    return [t.shape for t in layer.tensors if t.kind == kind]


def _has_bias(layer: LayerInventory, *kinds: str) -> bool:
    return any(t.kind in kinds and t.name.endswith("bias") for t in layer.tensors)


def _attention_fields(inv: ModelInventory, notes: list[str]) -> dict[str, Any]:
    shapes = {la.attention for la in inv.layers if la.attention is not None}
    if not shapes:
        raise WorkloadInputError(
            f"{inv.architecture}: no attention with recognised q/k/v/o projections in the decoder layers (kinds "
            f"found: {', '.join(sorted(inv.kinds()))}); tiersim describes attention transformers"
        )
    windows = {(s.n_heads, s.n_kv_heads, s.qk_head_dim, s.v_head_dim, s.q_lora_rank, s.kv_lora_rank)
               for s in shapes}
    if len(windows) > 1:
        notes.append(f"{inv.architecture}: attention shapes differ between layers; described by layer 0's")
    missing = [la.index for la in inv.layers if la.attention is None]
    if missing:
        notes.append(f"{inv.architecture}: layers {missing} have no attention with q/k/v/o projections (another "
                     "token mixer); described as attention layers")
    first = next(la.attention for la in inv.layers if la.attention is not None)
    assert first is not None
    sliding = [la.index for la in inv.layers if la.attention is not None and la.attention.sliding_window]
    sizes = {la.attention.sliding_window for la in inv.layers if la.attention is not None
             and la.attention.sliding_window}
    if len(sizes) > 1:
        notes.append(f"{inv.architecture}: layers use windows of {sorted(sizes)} tokens; described by the largest")
    out: dict[str, Any] = {
        "n_heads": first.n_heads, "n_kv_heads": first.n_kv_heads,
        "head_dim": first.qk_head_dim, "v_head_dim": first.v_head_dim,
        "sliding_window": max(sizes) if sizes else 0, "sliding_layers": tuple(sliding),
    }
    if first.kv_lora_rank:
        layer = inv.layers[0]
        kv_down = _tensors(layer, "attn.kv_down")
        out.update(q_lora_rank=first.q_lora_rank or 0, kv_lora_rank=first.kv_lora_rank,
                   qk_rope_head_dim=(kv_down[0][0] - first.kv_lora_rank) if kv_down else 0)
    return out


def _norm_fields(inv: ModelInventory) -> dict[str, Any]:
    layer = inv.layers[0]
    hidden_norms = [t for t in layer.tensors if t.kind == "norm" and t.shape == (inv.hidden,)
                    and not t.name.endswith("bias")]
    attn_norms = [t.shape[0] for t in layer.tensors if t.kind == "attn.norm" and not t.name.endswith("bias")]
    att = layer.attention
    qk_norm = "none"
    if att is not None and not att.kv_lora_rank and attn_norms:
        qk_norm = "head" if all(w == att.qk_head_dim for w in attn_norms) else "full"
    layernorm = any(t.kind in ("norm", "embedding.norm") and t.name.endswith("bias")
                    for t in [*layer.tensors, *inv.head, *inv.embedding])
    return {"norm": "layernorm" if layernorm else "rmsnorm", "block_norms": len(hidden_norms), "qk_norm": qk_norm}


def _unused_dense_width(config: Mapping[str, Any], expert_ffn: int) -> int:
    """``ffn`` of an MoE model without dense layers (unused by every count): the config's dense width, as the
    formula route reads it, else the expert width."""
    value = config.get("intermediate_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else expert_ffn


def _mlp_fields(inv: ModelInventory, config: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    moe_layers = [la for la in inv.layers if la.moe is not None]
    dense_layers = [la for la in inv.layers if la.moe is None]
    matrices = max(la.mlp_matrices for la in inv.layers)
    if not moe_layers and not any(la.ffn for la in dense_layers):
        raise WorkloadInputError(
            f"{inv.architecture}: no MLP recognised in the decoder layers (kinds found: "
            f"{', '.join(sorted(inv.kinds()))}); describe the model in a YAML of dimensions"
        )
    out: dict[str, Any] = {"mlp": "swiglu" if matrices == 3 else "gelu"}
    if not moe_layers:
        out["ffn"] = dense_layers[0].ffn
        return out
    moe = moe_layers[0].moe
    assert moe is not None
    first_dense = len(inv.layers) - len(moe_layers)
    if any(la.moe is None for la in inv.layers[first_dense:]):
        notes.append(f"{inv.architecture}: dense layers {[la.index for la in dense_layers]} are not the first "
                     f"{first_dense}; described as the first {first_dense} (same parameter count)")
    out.update(
        ffn=dense_layers[0].ffn if dense_layers else _unused_dense_width(config, moe.expert_ffn),
        n_experts=moe.n_experts, experts_per_token=moe.top_k, expert_ffn=moe.expert_ffn,
        shared_experts=moe.n_shared, shared_expert_ffn=(moe.shared_ffn // moe.n_shared) if moe.n_shared else 0,
        first_dense_layers=first_dense,
    )
    return out


def _bias_fields(inv: ModelInventory) -> dict[str, Any]:
    layer = inv.layers[0]
    qkv = _has_bias(layer, "attn.q", "attn.k", "attn.v", "attn.qkv")
    o = _has_bias(layer, "attn.o")
    mlp = _has_bias(layer, "mlp.up", "mlp.down", "mlp.gate", "mlp.gate_up", "expert.up", "expert.down",
                    "expert.gate_up", "expert.gate")
    every = qkv and o and mlp
    return {"bias": every, "qkv_bias": qkv and not every, "o_bias": o and not every, "mlp_bias": mlp and not every}


def _flag(cfg: Any, keys: tuple[str, ...]) -> bool | None:
    for key in keys:
        value = getattr(cfg, key, None)
        if isinstance(value, bool):
            return value
    return None


def _dropout(cfg: Any) -> bool:
    rates = [getattr(cfg, key, 0) for key in _DROPOUT_KEYS]
    return any(isinstance(r, int | float) and not isinstance(r, bool) and r > 0 for r in rates)


def _family(model_type: str) -> str:
    """The formula family name where one matches (``gemma3_text`` is the formulas' ``gemma3``)."""
    from workloads.model import FAMILIES

    text = model_type.removesuffix("_text")
    return text if model_type not in FAMILIES and text in FAMILIES else model_type


def _context(config: Mapping[str, Any], cfg: Any, notes: list[str]) -> int:
    """Trained context length (ALiBi and rotary models have no position table to read it from)."""
    for key in _CONTEXT_KEYS:
        value = config.get(key, getattr(cfg, key, None))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    notes.append(f"no context length in the config ({', '.join(_CONTEXT_KEYS)}); {_DEFAULT_CONTEXT} assumed, "
                 "give --seq-len for another")
    return _DEFAULT_CONTEXT


def spec_fields(inv: ModelInventory, cfg: Any, config: Mapping[str, Any], *, name: str, source: str
                ) -> tuple[dict[str, Any], list[str]]:
    """ModelSpec keyword arguments describing ``inv`` (built from ``cfg``), and the notes."""
    notes = list(inv.notes)
    positions = [t for t in inv.embedding if t.kind == "position"]
    family = _family(inv.model_type)
    if positions:
        rows = positions[0].shape[0]
        max_pos = rows - 2 if family == "opt" else rows
    else:
        max_pos = _context(config, cfg, notes)
    parallel = _flag(cfg, _PARALLEL_KEYS)
    if getattr(cfg, "new_decoder_architecture", False):
        parallel = True
    fields: dict[str, Any] = {
        "name": name, "family": family, "n_layers": inv.n_layers, "hidden": inv.hidden, "vocab": inv.vocab,
        "max_pos": max_pos,
        "tied_embeddings": inv.tied_embeddings, "learned_pos": bool(positions),
        "alibi": not positions and not inv.rotary,
        "embedding_norm": any(t.kind == "embedding.norm" for t in inv.embedding),
        "parallel_blocks": bool(parallel) if parallel is not None else False,
        "dropout": _dropout(cfg), "route": "model definition", "source": source,
        **_attention_fields(inv, notes), **_norm_fields(inv), **_mlp_fields(inv, config, notes), **_bias_fields(inv),
    }
    return fields, notes


def _difference(label: str, spec_count: int, inv_count: int) -> str:
    diff = inv_count - spec_count
    return (f"{label}: the model definition has {inv_count:,} parameters, the dimensions describe "
            f"{spec_count:,} ({diff:+,}, {100 * diff / inv_count:+.3f}%)")


def spec_from_inventory(inv: ModelInventory, cfg: Any, config: Mapping[str, Any], *, name: str, source: str,
                        extra_notes: tuple[str, ...] = ()) -> tuple[ModelSpec, tuple[str, ...]]:
    """The ModelSpec and its notes; any parameter-count difference with the inventory is a note."""
    from workloads.model import ModelSpec

    fields, notes = spec_fields(inv, cfg, config, name=name, source=source)
    notes.extend(n for n in extra_notes if n not in notes)
    spec = ModelSpec(**fields)
    if spec.params() != inv.params():
        notes.append(_difference("total", spec.params(), inv.params()))
    if spec.active_params() != inv.active_params():
        notes.append(_difference("active", spec.active_params(), inv.active_params()))
    final = ModelSpec(**{**fields, "notes": tuple(notes)})
    return final, tuple(notes)
