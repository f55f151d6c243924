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

and the LM head 2*b*s*h*V. The attention term is counted non-causally (full s x s), the Narayanan
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
    "block_forward_flops",
    "head_forward_flops",
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


def block_forward_flops(model: ModelSpec, micro_batch: int, seq_len: int,
                        causal_attention_factor: float = 1.0) -> BlockFlops:
    """Forward FLOPs of one block (see module docstring for the derivation)."""
    tokens = micro_batch * seq_len
    h, f = model.hidden, model.ffn
    q_width = model.n_heads * model.head_dim
    core = 4 * micro_batch * seq_len * seq_len * q_width
    return BlockFlops(
        qkv=2 * tokens * h * (q_width + 2 * model.kv_dim),
        attention_core=core * causal_attention_factor if causal_attention_factor != 1 else float(core),
        output_projection=2 * tokens * q_width * h,
        mlp=model.experts_per_token * model.mlp_matrices * 2 * tokens * h * f,
        router=2 * tokens * h * model.n_experts if model.is_moe else 0,
    )


def head_forward_flops(model: ModelSpec, micro_batch: int, seq_len: int) -> int:
    """LM head logits: 2*b*s*h*V (the final norm and the loss are element-wise, not counted)."""
    return 2 * micro_batch * seq_len * model.hidden * model.vocab
