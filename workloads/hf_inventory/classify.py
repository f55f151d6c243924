"""Name one parameter tensor of a decoder layer from where it sits in the module tree (no torch).

The walk hands over the tensor's path inside its layer (``self_attn.q_proj``), the class names of the
modules on that path, the parameter's own name (``weight``, ``bias``, ``gate_up_proj``) and its shape.
Names follow the conventions of the ``transformers`` model definitions (Llama/Qwen/Gemma ``q_proj``,
GPT-2 ``c_attn``/``c_fc``, GPT-NeoX/BLOOM/Falcon ``query_key_value``/``dense_h_to_4h``, OPT ``fc1``,
Phi-3 ``qkv_proj``/``gate_up_proj``, DeepSeek MLA ``q_a_proj``/``kv_b_proj``, fused 3-D expert tensors
``experts.gate_up_proj``). A tensor matching none is kind ``other`` and is reported, never dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Placement", "classify"]

_ATTENTION_MODULES = frozenset({"self_attn", "attn", "attention", "self_attention", "mixer", "attn_layer"})
_MLP_MODULES = frozenset({"mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "ff"})
_ATTENTION_LEAVES = {
    "q_proj": "attn.q", "query": "attn.q", "q": "attn.q", "wq": "attn.q",
    "k_proj": "attn.k", "key": "attn.k", "k": "attn.k", "wk": "attn.k",
    "v_proj": "attn.v", "value": "attn.v", "v": "attn.v", "wv": "attn.v",
    "o_proj": "attn.o", "out_proj": "attn.o", "dense": "attn.o", "c_proj": "attn.o", "wo": "attn.o",
    "o": "attn.o", "out": "attn.o",
    "query_key_value": "attn.qkv", "qkv_proj": "attn.qkv", "c_attn": "attn.qkv", "Wqkv": "attn.qkv",
    "qkv": "attn.qkv", "W_pack": "attn.qkv", "wqkv": "attn.qkv",
    "q_a_proj": "attn.q_down", "q_b_proj": "attn.q_up",
    "kv_a_proj_with_mqa": "attn.kv_down", "kv_a_proj": "attn.kv_down", "kv_b_proj": "attn.kv_up",
}
_MLP_LEAVES = {
    "gate_proj": "gate", "w1": "gate", "wi_0": "gate", "gate": "gate",
    "up_proj": "up", "w3": "up", "wi_1": "up", "c_fc": "up", "dense_h_to_4h": "up", "fc1": "up",
    "fc_in": "up", "wi": "up", "up": "up",
    "gate_up_proj": "gate_up", "w13": "gate_up",
    "down_proj": "down", "w2": "down", "c_proj": "down", "dense_4h_to_h": "down", "fc2": "down",
    "fc_out": "down", "wo": "down", "down": "down",
}
_BIAS_SUFFIX = "_bias"


@dataclass(frozen=True)
class Placement:
    kind: str
    matrix: bool
    routed_experts: int = 0     # leading expert dimension of a fused routed-expert tensor (0: none)


def _is_norm(parts: Sequence[str], classes: Sequence[str]) -> bool:
    leaf = parts[-1] if parts else ""
    cls = classes[-1] if classes else ""
    return ("norm" in cls.lower() or "norm" in leaf.lower() or leaf.startswith("ln")
            or leaf in ("layernorm", "layer_norm"))


def _mlp_role(leaf: str) -> str:
    return _MLP_LEAVES.get(leaf, "other")


def classify(parts: Sequence[str], classes: Sequence[str], param: str, shape: Sequence[int],
             beside_experts: bool = False) -> Placement:
    """Kind of the parameter ``param`` of the module at ``parts`` (path inside the layer).

    ``classes`` are the class names of the modules along ``parts``; ``beside_experts`` says that the
    module's parent also holds an ``experts`` child (so a ``gate``/``router`` there is the MoE router).
    """
    is_bias = param == "bias" or param.endswith(_BIAS_SUFFIX)
    # A fused tensor names its role itself (experts.gate_up_proj); a Linear's is "weight"/"bias".
    leaf = param.removesuffix(_BIAS_SUFFIX) if param not in ("weight", "bias") else (parts[-1] if parts else "")
    lowered = [p.lower() for p in parts]
    in_shared = any(p.startswith("shared_expert") or p.startswith("shared_mlp") for p in lowered)
    in_experts = not in_shared and any(p == "experts" for p in lowered)
    in_attention = any(p in _ATTENTION_MODULES for p in parts) or any("attention" in c.lower() for c in classes)
    in_mlp = any(p in _MLP_MODULES for p in parts) or in_experts or in_shared
    matrix = not is_bias and len(shape) >= 2
    if param not in ("weight", "bias") and not is_bias and (in_experts or in_shared):
        matrix = len(shape) >= (3 if in_experts else 2)
    if _is_norm(parts, classes) and not matrix and not in_experts:
        return Placement("attn.norm" if in_attention else "norm", False)
    if in_shared:
        if leaf.startswith("shared_expert_gate") or (parts and parts[-1].startswith("shared_expert_gate")):
            return Placement("shared.router", matrix)
        return Placement(f"shared.{_mlp_role(leaf)}", matrix)
    if in_experts:
        lead = shape[0] if len(shape) >= 3 or (is_bias and len(shape) == 2) else 0
        return Placement(f"expert.{_mlp_role(leaf)}", matrix, lead)
    owner = classes[-1].lower() if classes else ""
    if (beside_experts and leaf in ("gate", "router", "gating")) or "router" in owner:
        return Placement("router", matrix)
    if in_attention:
        return Placement(_ATTENTION_LEAVES.get(leaf, "attn.other"), matrix)
    if in_mlp or leaf in ("fc1", "fc2"):
        return Placement(f"mlp.{_mlp_role(leaf)}", matrix)
    return Placement("other", matrix)
