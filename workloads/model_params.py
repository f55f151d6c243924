"""Parameter counts of a :class:`~workloads.model.ModelSpec`, weight tensor by weight tensor.

Each count is the sum of the weight (and bias) tensors of the reference implementation of the family
(HF ``transformers``: ``modeling_llama``, ``_qwen2``, ``_qwen3``, ``_qwen3_moe``, ``_phi3``, ``_gemma2``,
``_gemma3``, ``_olmo2``, ``_falcon``, ``_gpt_neox``, ``_bloom``, ``_deepseek_v3``, ``_gpt2``, ``_opt``).
With h = hidden, a = n_heads, d = head_dim, d_v = v_head_dim, g = n_kv_heads::

    attention (GQA)   q h*(a*d), k h*(g*d), v h*(g*d_v), o (a*d_v)*h; fused QKV (Phi-3, Falcon, GPT-NeoX,
                      BLOOM) has the same count. Biases: q/k/v a*d + g*d + g*d_v (``qkv_bias``: Qwen2),
                      o h (``o_bias``); ``bias`` means all of them (GPT-2, OPT, GPT-NeoX, BLOOM).
                      qk-norm: "head" 2 norms of d (Qwen3, Gemma-3), "full" norms of a*d and g*d (OLMo-2).
    attention (MLA)   q: h*r_q + norm(r_q) + r_q*(a*d) (or h*(a*d) when q_lora_rank r_q is 0);
                      kv: h*(r_kv + d_rope) + norm(r_kv) + r_kv*a*(d_nope + d_v); o (a*d_v)*h.
                      (DeepSeek-V3: d = d_nope + d_rope = 128 + 64, d_v = 128, r_q 1536, r_kv 512.)
    mlp (width w)     gelu 2*h*w, swiglu 3*h*w (gate/up fused or not), + (w or 2w) + h biases (``mlp_bias``).
    MoE block         E routed experts of width ``expert_ffn`` (k of them active), ``shared_experts`` of
                      width ``shared_expert_ffn`` (always active), router h*E (no bias); the first
                      ``first_dense_layers`` blocks have one dense MLP of width ``ffn`` instead.
    norms             ``block_norms`` hidden-wide norms per block (layernorm 2h weight+bias, rmsnorm h):
                      2 pre-norms; Gemma-2/3 4 (pre and post around both sublayers); Falcon-7B 1 (one norm
                      feeds the parallel attention and MLP).
    embedding         V*h + learned position rows * h (+ a norm: BLOOM's word_embeddings_layernorm);
                      ALiBi and rotary positions have no parameters.
    head              final norm + V*h unless tied to the embedding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workloads.model import ModelSpec

__all__ = ["attention", "block", "embedding", "mlp", "norm"]


def norm(m: ModelSpec, width: int) -> int:
    """One norm over ``width`` features: layernorm weight + bias, rmsnorm weight."""
    return 2 * width if m.norm == "layernorm" else width


def embedding(m: ModelSpec) -> int:
    table = m.vocab * m.hidden + m.position_rows * m.hidden
    return table + (norm(m, m.hidden) if m.embedding_norm else 0)


def _latent_attention(m: ModelSpec) -> int:
    h, r_q, r_kv = m.hidden, m.q_lora_rank, m.kv_lora_rank
    q = h * r_q + norm(m, r_q) + r_q * m.q_dim if r_q else h * m.q_dim
    kv = h * (r_kv + m.qk_rope_head_dim) + norm(m, r_kv) + r_kv * m.n_heads * (m.qk_nope_head_dim + m.v_head_dim)
    return q + kv + m.context_dim * h


def attention(m: ModelSpec) -> int:
    """Attention projections, their biases and the qk-norms of one block."""
    if m.is_mla:
        return _latent_attention(m)
    h = m.hidden
    weights = h * m.q_dim + h * m.kv_dim + h * m.v_dim + m.context_dim * h
    biases = (m.q_dim + m.kv_dim + m.v_dim if m.has_qkv_bias else 0) + (h if m.has_o_bias else 0)
    if m.qk_norm == "head":
        qk = 2 * norm(m, m.head_dim)
    elif m.qk_norm == "full":
        qk = norm(m, m.q_dim) + norm(m, m.kv_dim)
    else:
        qk = 0
    return weights + biases + qk


def mlp(m: ModelSpec, width: int) -> int:
    """One MLP (one expert) of ``width``: 2 or 3 matrices h<->width plus biases where present."""
    h = m.hidden
    biases = ((m.mlp_matrices - 1) * width + h) if m.has_mlp_bias else 0
    return m.mlp_matrices * h * width + biases


def block(m: ModelSpec, layer: int, active: bool) -> int:
    """Block ``layer`` (0-based): attention + norms + its MLP (dense, or routed + shared experts + router)."""
    fixed = attention(m) + m.block_norms * norm(m, m.hidden)
    if not m.is_moe_layer(layer):
        return fixed + mlp(m, m.ffn)
    routed = m.experts_per_token if active else m.n_experts
    return (fixed + routed * mlp(m, m.expert_ffn) + m.shared_experts * mlp(m, m.shared_expert_ffn)
            + m.router_params())
