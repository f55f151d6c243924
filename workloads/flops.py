"""Matmul FLOPs of one micro-batch, layer by layer.

Convention (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", arXiv 2104.04473, Sec. 5.1 / eq. 3): a matmul of an (m x k) by a (k x n) matrix
costs 2*m*n*k FLOPs; only matmuls are counted. Norms, softmax, activation functions, rotary
embeddings, residual adds, bias adds, dropout and the loss are O(b*s*h) or O(b*s*V) element-wise work,
below 1% of the matmuls for every preset, and are left out (as Narayanan does).

Per block, forward, with b = micro-batch, s = sequence, h = hidden, a = heads, d = h/a,
d_kv = n_kv_heads*d (grouped-query attention), f = ffn, E = experts, k = experts per token::

    Q, K, V projections   2*b*s*h*(h + 2*d_kv)        (MHA: 6*b*s*h^2, Narayanan's "3 x 2bsh^2")
    scores Q.K^T          2*b*s^2*(a*d) = 2*b*s^2*h    (every query head; GQA shares K/V only)
    context P.V           2*b*s^2*h
    output projection     2*b*s*h^2
    MLP, gelu             2 * 2*b*s*h*f                (f = 4h: 16*b*s*h^2, as Narayanan)
    MLP, swiglu           3 * 2*b*s*h*f                (gate, up, down)
    MoE                   k * (one expert's MLP) + router 2*b*s*h*E

and the LM head 2*b*s*h*V. For the architectures beyond that (fields of ``ModelSpec``): Q is a*d wide
with d = ``head_dim`` (not necessarily h/a), K g*d, V g*d_v, the output projection maps a*d_v back to h,
so the projections cost 2*b*s*h*(a*d + g*d + g*d_v) + 2*b*s*(a*d_v)*h and the core 2*b*s^2*a*(d + d_v);
latent attention (MLA) replaces the projections by its low-rank down/up products (q: h*r_q + r_q*a*d,
kv: h*(r_kv + d_rope) + r_kv*a*(d_nope + d_v)) and computes the core at the materialised head widths;
a block with a sliding window w < s computes s*w query-key pairs per head instead of s^2
(:func:`attention_pairs`); an MoE block adds its shared experts to the k routed ones, and DeepSeek's
first dense blocks run one MLP of width ``ffn``. Blocks are priced one by one (``layer``).

The attention term is counted non-causally (full s x s), the Narayanan
convention used for MFU; a causal kernel (e.g. FlashAttention with causal=True) executes about half
of it (:data:`CAUSAL_ATTENTION_FACTOR`), selectable per workload through
``WorkloadConfig.causal_attention_factor``. FlashAttention's backward also recomputes Q.K^T inside the
kernel; that is the kernel's own work and, as in Narayanan, not counted.

Backward = 2 x forward for every matmul (one product for the input gradient, one for the weight
gradient; for the two attention products, one for each operand's gradient). The embedding lookup is
a gather (forward) and a scatter-add (backward): no matmul, so 0 FLOPs both ways (our choice; its
O(b*s*h) adds are negligible).

For a GPT-3-shaped model (gelu, f = 4h, MHA) forward + backward + one full recompute of every block
gives exactly Narayanan eq. 3, ``96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))`` (the LM head is not
recomputed); tests/test_workload_flops.py checks the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.model import ModelSpec

__all__ = [
    "BACKWARD_FACTOR",
    "CAUSAL_ATTENTION_FACTOR",
    "BlockFlops",
    "attention_pairs",
    "block_forward_flops",
    "early_stop_skipped_flops",
    "head_forward_flops",
    "mlp_forward_flops",
]

BACKWARD_FACTOR = 2
"""Backward matmul FLOPs per forward matmul FLOP (activation gradient + weight gradient)."""

CAUSAL_ATTENTION_FACTOR = 0.5
"""Fraction of the s^2 attention FLOPs a causal kernel executes (note only; the default counts 1.0)."""


@dataclass(frozen=True)
class BlockFlops:
    """Forward matmul FLOPs of one transformer block for one micro-batch, by component."""

    qkv: int
    attention_core: float   # scores + context, scaled by the causal attention factor
    output_projection: int
    mlp: int                # active experts only
    router: int

    @property
    def total(self) -> float:
        return self.qkv + self.attention_core + self.output_projection + self.mlp + self.router


def attention_pairs(seq_len: int, window: int, causal_attention_factor: float = 1.0) -> float:
    """Query-key pairs of one sequence and head that the attention core computes.

    Full attention: s^2 (x the causal factor). A sliding window w < s: each query sees at most w keys,
    ``s*w - (1 - c)*w^2`` for causal factor c -- s*w in the non-causal convention (c = 1) and, for
    c = 1/2, the causal count ``s*w - w^2/2`` (the first w queries see fewer keys); both meet the full
    count at w = s.
    """
    if not window or window >= seq_len:
        return float(seq_len * seq_len) * causal_attention_factor
    return float(seq_len * window) - (1.0 - causal_attention_factor) * window * window


def _projection_flops(model: ModelSpec, tokens: int) -> int:
    """Q, K, V projections (latent attention: the down- and up-projections of Q and of K/V)."""
    h = model.hidden
    if not model.is_mla:
        return 2 * tokens * h * (model.q_dim + model.kv_dim + model.v_dim)
    r_q, r_kv, heads = model.q_lora_rank, model.kv_lora_rank, model.n_heads
    q = 2 * tokens * (h * r_q + r_q * model.q_dim) if r_q else 2 * tokens * h * model.q_dim
    kv = 2 * tokens * (h * (r_kv + model.qk_rope_head_dim) + r_kv * heads * (model.qk_nope_head_dim + model.v_head_dim))
    return q + kv


def mlp_forward_flops(model: ModelSpec, tokens: int, layer: int) -> int:
    """MLP of block ``layer``: the dense MLP, or k routed + the shared experts (router not included)."""
    per_width = model.mlp_matrices * 2 * tokens * model.hidden
    if not model.is_moe_layer(layer):
        return per_width * model.ffn
    return (model.experts_per_token * per_width * model.expert_ffn
            + model.shared_experts * per_width * model.shared_expert_ffn)


def block_forward_flops(model: ModelSpec, micro_batch: int, seq_len: int,
                        causal_attention_factor: float = 1.0, layer: int | None = None) -> BlockFlops:
    """Forward FLOPs of block ``layer`` (0-based; default the last) (see module docstring)."""
    layer = model.default_layer() if layer is None else layer
    tokens = micro_batch * seq_len
    h = model.hidden
    window = model.window(layer)
    widths = model.q_dim + model.context_dim  # Q.K^T over head_dim, P.V over v_head_dim, every query head
    if not window or window >= seq_len:
        core = 2 * micro_batch * seq_len * seq_len * widths
        attention = core * causal_attention_factor if causal_attention_factor != 1 else float(core)
    else:
        attention = 2.0 * micro_batch * attention_pairs(seq_len, window, causal_attention_factor) * widths
    return BlockFlops(
        qkv=_projection_flops(model, tokens),
        attention_core=attention,
        output_projection=2 * tokens * model.context_dim * h,
        mlp=mlp_forward_flops(model, tokens, layer),
        router=2 * tokens * h * model.n_experts if model.is_moe_layer(layer) else 0,
    )


def early_stop_skipped_flops(model: ModelSpec, micro_batch: int, seq_len: int, layer: int | None = None) -> int:
    """Forward matmul FLOPs of block ``layer`` that a recomputation with early stop does not rerun
    (``WorkloadConfig.checkpoint_early_stop``).

    PyTorch's non-reentrant checkpoint (``torch.utils.checkpoint``, early stop on by default since torch 2.1)
    stops recomputing as soon as every tensor the block saved for its backward has been rebuilt. An operator
    records what it saves before it computes, so the last one that saves anything does not run again: in a
    dense block without dropout or a norm after the MLP that is the MLP's down projection, which saves its
    input (a parallel block runs its MLP after its attention, as GPT-NeoX, GPT-J and Falcon do, so the same
    holds): its ``2*tokens*ffn*h`` FLOPs are skipped. Where something after it saves a tensor (a dropout's
    mask; Gemma-2's post-MLP norm, ``block_norms`` 4; an MoE block's weighted combine of its experts'
    outputs) the projection runs and only the residual add after it is skipped: 0 FLOPs. Checked against
    torch by ``tests/test_replay_ops.py``.
    """
    layer = model.default_layer() if layer is None else layer
    if model.dropout or model.block_norms > 2 or model.is_moe_layer(layer):
        return 0
    return 2 * micro_batch * seq_len * model.ffn * model.hidden


def head_forward_flops(model: ModelSpec, micro_batch: int, seq_len: int) -> int:
    """LM head logits: 2*b*s*h*V (the final norm and the loss are element-wise, not counted)."""
    return 2 * micro_batch * seq_len * model.hidden * model.vocab
