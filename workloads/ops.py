"""The operations one layer task executes: its matmuls, its element-wise bytes and its operator count.

A layer's FLOPs (:mod:`workloads.flops`) say how much arithmetic it does, not how it is executed. A
LLaMA block's forward is not one matmul of the block's total FLOPs but ~60 operators: 7 matmuls of a
seventh of the size each (every one at its own efficiency), the attention kernel, and element-wise or
reduction operators (norms, rotary embedding, SwiGLU, residual adds) whose time is the bytes they read
and write over the memory bandwidth, each operator with a fixed dispatch cost. :func:`layer_ops` lists
that inventory for one layer task (``phase`` fwd, bwd or recompute) so that the simulator can price it
with measured per-operator figures (``gpu.op_overhead``, ``gpu.elementwise_bw``).

Convention: *eager PyTorch*, one operator per ATen call that does work (views, reshapes and transposes
are free and not counted), as the replay's modules (``replay/model.py``) execute them. The coefficients
below were counted with a ``TorchDispatchMode`` over those modules (forward, and autograd's backward)
and are re-counted by ``tests/test_replay_ops.py`` at several sizes; a fused implementation (Megatron,
FlashAttention-2 with fused norms) runs fewer operators and moves fewer bytes. Units: ``T_h`` is one
activation of the hidden width, ``b*s*h*e`` bytes (e = bytes of the training dtype), ``T_kv`` of the
key/value width, ``T_f`` of the FFN width; logits and the loss are fp32 (``T_V = 4*b*s*V``).

Per block, forward (backward), bytes read + written by the non-matmul operators and their count:

    norm x2           rmsnorm 7 T_h, 6 ops (24 T_h, 14 ops)   layernorm 2 T_h, 1 op (3 T_h, 1 op)
    residual adds     6 T_h, 2 ops                           (branch-gradient adds: 12 T_h, 4 ops)
    rotary (q and k)  13 T_h + 4 T_kv, 36 ops                (20 T_h + 9.5 T_kv, 15 ops)
    GQA k/v repeat    2 T_h + 2 T_kv, 2 ops                  (4 T_h, 4 ops)
    MLP activation    swiglu 5 T_f, 2 ops (9 T_f, 3 ops)     gelu 2 T_f, 1 op (3 T_f, 1 op)
    bias gradients    -                                      (one reduction per linear, its output bytes)

For today's architectures the T_h of the rotary and GQA terms is the Q width (a*head_dim), the qk-norms
add one norm over Q and one over K, ``block_norms`` norms run per block, bias gradients follow each
projection's own bias, and ALiBi/learned positions run no rotary operators. Matmuls (latent attention:
q_a, q_b, kv_a, kv_b in place of Q, K, V; MoE: the shared experts on every token besides the routed ones;
dense first layers: one MLP) are priced block by block.

Matmuls: Q, K, V, O and the MLP's matrices (MoE: every expert's, at its share of the tokens, and the
router), each its own kernel; the attention core (Q.K^T and P.V) is one kernel (fused SDPA) with flash
attention, and two batched GEMMs without it (see below); backward
runs two matmuls of the same FLOPs per forward matmul and one attention-backward kernel of twice the
core (``kinds`` marks each kernel ``gemm`` or ``attention``, so that a calibrated spec prices the attention
kernel and a backward's products at the rates measured for them). Head: final norm + LM-head matmul +
cross-entropy (forward 3 T_V, 2 ops; backward 5 T_V, 2 ops).
Recompute (``checkpointing`` full): the forward's operators again; with ``checkpoint_early_stop`` (PyTorch's
non-reentrant checkpoint) without the block's last residual add and, where nothing after it saves a tensor,
its MLP down projection (:func:`workloads.flops.early_stop_skipped_flops`); its weight cast still runs.
Embedding: a gather (2 T_h, 1 op; learned positions + 2 T_h + 3 T_s, +4 ops, T_s = s*h*e one sequence's
rows); its backward zeroes the table's gradient and scatter-adds into it (table bytes + T_h, 1 op; learned
positions + their table + T_h + 2 T_s, +2 ops). The tables are fp32 weights whatever the training dtype (mixed
precision keeps fp32 weights, below), so their gradients are 4 bytes per element; with tied embeddings the
head's gradient of the table is summed into the lookup's in place (AccumulateGrad: two tables read, one
written, 3 x V*h*4 bytes, 1 op).

Attention without FlashAttention (``WorkloadConfig.flash_attention`` False): the a*s^2*b scores are
materialised in HBM, as Megatron-LM's ``ParallelAttention`` (``megatron/model/transformer.py``) runs them:
Q.K^T is a batched GEMM (``torch.baddbmm``, the 1/sqrt(d) scale folded into its ``alpha``) that writes
the scores; ``FusedScaleMaskSoftmax`` (``megatron/model/fused_softmax.py``,
``ScaledUpperTriangMaskedSoftmax``: scale, causal mask and softmax in one kernel) reads them once and
writes the probabilities once, which it keeps for its backward; attention dropout (``torch.nn.Dropout``,
when the model trains with dropout) reads the probabilities and writes its output and a one-byte mask;
P.V (``torch.bmm``) reads them. Backward: the dropout's backward reads the incoming gradient and the mask
and writes the gradient; the softmax's backward (``scaled_upper_triang_masked_softmax_backward``) reads
the gradient and the saved probabilities and writes the scores' gradient. These are the tensors that
Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4 counts as the 5as^2b bytes of attention activations
(:mod:`workloads.activations`). Per block, S = a*s^2*b elements of e bytes (the full s x s: the kernels
compute every pair and mask the upper triangle), the non-matmul operators move::

    forward (and a full recomputation)   softmax 2e*S, 1 op;  dropout (2e + 1)*S, 1 op
    backward                             softmax 3e*S, 1 op;  dropout (2e + 1)*S, 1 op

(``LayerOps.score_bytes``, included in ``elementwise_bytes``; selective recomputation, which recomputes
exactly the attention core, repeats the forward's). The two score matmuls are kernels of their own,
``gemm`` kind, each with its batched shape (M = b*a*s rows, Q.K^T: N = s, K = d; P.V: N = d_v, K = s),
so that where the pricing holds a kernel to its operands' HBM traffic the s x s scores it writes or
reads count; backward runs each twice (dQ and dK, dP and dV), as the linears.

Mixed precision (bf16 / fp16, as the runner computes it: fp32 weights under autocast, ``replay.precision``):
every linear's forward (and recomputation) casts its fp32 weight to 16 bits (reads 4 + writes 2 bytes per
weight, one operator) and its backward casts the 16-bit weight gradient back to fp32 (2 + 4 bytes, one
operator). fp32 runs no casts.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads import flops as wflops
from workloads.config import WorkloadConfig
from workloads.model import ModelSpec

__all__ = ["PHASES", "LayerOps", "layer_ops"]

PHASES = ("fwd", "bwd", "recompute")
LOGIT_BYTES = 4  # fp32 logits and loss
WEIGHT_BYTES = 4  # the weights (and so their gradients) are fp32, in mixed precision too (replay.precision)
CAST_BYTES = 6  # per weight element: fp32 read (4) + 16-bit written (2), or the reverse for its gradient
GEMM, ATTENTION = "gemm", "attention"  # LayerOps.kinds
MASK_BYTES = 1  # a dropout mask element (torch.bool)

# (forward T_h, forward ops, backward T_h, backward ops) per norm
_NORM = {"rmsnorm": (7.0, 6, 24.0, 14), "layernorm": (2.0, 1, 3.0, 1)}
# (forward T_f, forward ops, backward T_f, backward ops) of the MLP's activation
_ACT = {"swiglu": (5.0, 2, 9.0, 3), "gelu": (2.0, 1, 3.0, 1)}


@dataclass(frozen=True)
class LayerOps:
    """What one layer task executes: one entry per matmul kernel (its FLOPs), the bytes read + written by
    the other operators, and how many operators run in all (matmuls included).

    ``matmul_shapes``, where known, gives each kernel's GEMM shape (M, N, K) in the order of
    ``matmul_flops`` (M the token rows, K the reduction; a backward kernel carries its forward matmul's
    triple, whose operand sizes MK + KN + MN it shares); (0, 0, 0) marks a kernel without one (the
    attention core). Empty where not known. ``kinds``, where known, says what each kernel is: ``gemm`` (a
    linear layer's product, or a score matmul without flash attention) or ``attention`` (the fused attention
    kernel). ``score_bytes``: the part of ``elementwise_bytes`` that the non-matmul operators on materialised
    attention scores move (softmax, dropout and their backwards; 0 with flash attention): the kernel-level
    pricing, whose curve folds in the other element-wise work, prices these apart."""

    matmul_flops: tuple[float, ...]
    elementwise_bytes: float
    n_ops: int
    matmul_shapes: tuple[tuple[float, float, float], ...] = ()
    kinds: tuple[str, ...] = ()
    score_bytes: float = 0.0

    @property
    def flops(self) -> float:
        return float(sum(self.matmul_flops))

    def scaled(self, k: float) -> LayerOps:
        """The same operators on ``k`` times the data (a tensor-parallel shard, a chunk of the tokens); a
        kernel's shape scales its rows M."""
        return LayerOps(tuple(f * k for f in self.matmul_flops), self.elementwise_bytes * k, self.n_ops,
                        tuple((mm * k, n, kk) for mm, n, kk in self.matmul_shapes), self.kinds, self.score_bytes * k)


EMPTY = LayerOps((), 0.0, 0)
NO_SHAPE = (0.0, 0.0, 0.0)  # a kernel priced by its FLOPs alone (the attention core)


def _attention_shapes(m: ModelSpec, t: float) -> list[tuple[float, float, float]]:
    """(M, N, K) of the Q, K, V and O projections (latent attention: q_a, q_b, kv_a, kv_b and O)."""
    h = m.hidden
    if not m.is_mla:
        return [(t, m.q_dim, h), (t, m.kv_dim, h), (t, m.v_dim, h), (t, h, m.context_dim)]
    r_q, r_kv = m.q_lora_rank, m.kv_lora_rank
    q = [(t, r_q, h), (t, m.q_dim, r_q)] if r_q else [(t, m.q_dim, h)]
    kv = [(t, r_kv + m.qk_rope_head_dim, h), (t, m.n_heads * (m.qk_nope_head_dim + m.v_head_dim), r_kv)]
    return [*q, *kv, (t, h, m.context_dim)]


def _block_shapes(m: ModelSpec, tokens: int, bf: wflops.BlockFlops, layer: int) -> list[tuple[float, float, float]]:
    """(M, N, K) of each linear of block ``layer``, one kernel each, in :func:`_block_matmuls` order."""
    h, t = m.hidden, float(tokens)
    shapes = _attention_shapes(m, t)
    if m.is_moe_layer(layer):
        per_expert_tokens = t * m.experts_per_token / m.n_experts
        shapes += [(per_expert_tokens, m.expert_ffn, h)] * (m.mlp_matrices * m.n_experts)
        shapes += [(t, m.shared_expert_ffn, h)] * (m.mlp_matrices * m.shared_experts)
    else:
        shapes += [(t, m.ffn, h)] * m.mlp_matrices
    if bf.router:
        shapes.append((t, m.n_experts, h))
    return [(float(a), float(b), float(c)) for a, b, c in shapes]


def _block_matmuls(shapes: list[tuple[float, float, float]]) -> list[float]:
    return [2.0 * mm * n * k for mm, n, k in shapes]


def _mlp_width(m: ModelSpec, layer: int) -> int:
    """Intermediate elements per token of block ``layer``'s MLPs (every routed copy and shared expert)."""
    if not m.is_moe_layer(layer):
        return m.ffn
    return m.experts_per_token * m.expert_ffn + m.shared_experts * m.shared_expert_ffn


def _casts(c: WorkloadConfig, shapes: list[tuple[float, float, float]]) -> tuple[float, int]:
    """Mixed precision: (bytes, operators) of casting each linear's weight (N x K) once (module docstring)."""
    if c.precision == "fp32":
        return 0.0, 0
    return CAST_BYTES * sum(n * k for _, n, k in shapes), len(shapes)


def _bias_grads(m: ModelSpec, t_h: float, t_q: float, t_kv: float, t_v: float, t_f: float) -> tuple[float, int]:
    """Backward bias-gradient reductions: (bytes written, operators)."""
    qkv, o, mlp = m.has_qkv_bias, m.has_o_bias, m.has_mlp_bias
    ew = ((t_q + t_kv + t_v) if qkv else 0.0) + (t_h if o else 0.0)
    ew += ((m.mlp_matrices - 1) * t_f + t_h) if mlp else 0.0
    n = (3 if qkv else 0) + (1 if o else 0) + (m.mlp_matrices if mlp else 0)
    return ew, n


@dataclass(frozen=True)
class _Core:
    """The attention core of one block in one phase: its kernels (FLOPs, shapes, kinds) and, without flash
    attention, the score operators' bytes and count (module docstring)."""

    flops: tuple[float, ...]
    shapes: tuple[tuple[float, float, float], ...]
    kinds: tuple[str, ...]
    score_bytes: float = 0.0
    n_score_ops: int = 0


def _core(m: ModelSpec, c: WorkloadConfig, core_flops: float, phase: str) -> _Core:
    """The attention core's kernels in ``phase`` (a recomputation runs the forward's): one fused kernel with
    flash attention, else Q.K^T and P.V as batched GEMMs plus the score operators (module docstring)."""
    bwd = phase == "bwd"
    if c.flash_attention:
        return _Core(((2.0 if bwd else 1.0) * core_flops,), (NO_SHAPE,), (ATTENTION,))
    b, s, e, a = c.micro_batch, c.seq_len, c.dtype_bytes, m.n_heads
    scores = float(a * s * s * b)
    rows = float(b * a * s)
    f_qk = core_flops * m.q_dim / (m.q_dim + m.context_dim)
    qk, pv = (rows, float(s), m.q_dim / a), (rows, m.context_dim / a, float(s))
    dropout = (2 * e + MASK_BYTES) * scores if m.dropout else 0.0
    n_drop = 1 if m.dropout else 0
    if bwd:
        return _Core((f_qk, f_qk, core_flops - f_qk, core_flops - f_qk), (qk, qk, pv, pv), (GEMM,) * 4,
                     3 * e * scores + dropout, 1 + n_drop)
    return _Core((f_qk, core_flops - f_qk), (qk, pv), (GEMM,) * 2, 2 * e * scores + dropout, 1 + n_drop)


def _block(m: ModelSpec, c: WorkloadConfig, phase: str, layer: int) -> LayerOps:
    b, s, e = c.micro_batch, c.seq_len, c.dtype_bytes
    tokens = b * s
    t_h, t_kv, t_f = tokens * m.hidden * e, tokens * m.kv_dim * e, tokens * _mlp_width(m, layer) * e
    t_q, t_v = tokens * m.q_dim * e, tokens * m.v_dim * e
    bf = wflops.block_forward_flops(m, b, s, c.causal_attention_factor, layer)
    shapes = _block_shapes(m, tokens, bf, layer)
    mats = _block_matmuls(shapes)
    nf, no, nb, nob = _NORM[m.norm]
    af, ao, ab, aob = _ACT[m.mlp]
    rotary, gqa, norms = m.rotary, m.n_kv_heads != m.n_heads, m.block_norms
    qk = (t_q + t_kv) if m.qk_norm != "none" else 0.0  # qk-norms: one norm over Q and one over K
    n_qk = 2 if m.qk_norm != "none" else 0
    cast, n_cast = _casts(c, shapes)
    if phase == "recompute" and c.checkpointing == "none":
        return EMPTY
    core = _core(m, c, float(bf.attention_core), phase)
    n_core = len(core.flops) + core.n_score_ops
    if phase == "bwd":
        linears = len(mats)
        bias, n_bias = _bias_grads(m, t_h, t_q, t_kv, t_v, t_f)
        ew = (norms * nb * t_h + nb * qk + 12 * t_h + ab * t_f + bias
              + (20 * t_q + 9.5 * t_kv if rotary else 0.0) + (4 * t_q if gqa else 0.0))
        n = (2 * linears + n_core + norms * nob + n_qk * nob + 4 + aob + n_bias + (15 if rotary else 0)
             + (4 if gqa else 0))
        return LayerOps((*[f for f in mats for _ in (0, 1)], *core.flops), ew + cast + core.score_bytes,
                        n + n_cast, (*[s for s in shapes for _ in (0, 1)], *core.shapes),
                        (GEMM,) * (2 * linears) + core.kinds, core.score_bytes)
    if phase == "recompute" and c.checkpointing == "selective":
        return LayerOps(core.flops, core.score_bytes, n_core, core.shapes, core.kinds, core.score_bytes)
    ew = (norms * nf * t_h + nf * qk + 6 * t_h + af * t_f + (13 * t_q + 4 * t_kv if rotary else 0.0)
          + (2 * t_q + 2 * t_kv if gqa else 0.0))
    n = len(mats) + n_core + norms * no + n_qk * no + 2 + ao + (36 if rotary else 0) + (2 if gqa else 0)
    if phase == "recompute" and c.checkpoint_early_stop:
        # torch's early stop: the last residual add (3 T_h, 1 op) is not rerun, nor the down projection
        # where nothing after it saves a tensor (wflops.early_stop_skipped_flops)
        ew, n = ew - 3 * t_h, n - 1
        if wflops.early_stop_skipped_flops(m, b, s, layer):
            down = len(_attention_shapes(m, float(tokens))) + m.mlp_matrices - 1
            mats, shapes, n = mats[:down] + mats[down + 1:], shapes[:down] + shapes[down + 1:], n - 1
    return LayerOps((*mats, *core.flops), ew + cast + core.score_bytes, n + n_cast, (*shapes, *core.shapes),
                    (GEMM,) * len(mats) + core.kinds, core.score_bytes)


def _head(m: ModelSpec, c: WorkloadConfig, phase: str) -> LayerOps:
    tokens = c.micro_batch * c.seq_len
    t_h, t_v = tokens * m.hidden * c.dtype_bytes, tokens * m.vocab * LOGIT_BYTES
    gemm = float(wflops.head_forward_flops(m, c.micro_batch, c.seq_len))
    shape = (float(tokens), float(m.vocab), float(m.hidden))
    nf, no, nb, nob = _NORM[m.norm]
    cast, n_cast = _casts(c, [shape])  # a tied head casts the embedding table as its weight
    if phase == "bwd":
        return LayerOps((gemm, gemm), nb * t_h + 5 * t_v + cast, nob + 2 + 2 + n_cast, (shape, shape), (GEMM, GEMM))
    if phase == "recompute":
        return EMPTY  # the head is never recomputed (its recompute FLOPs are 0)
    return LayerOps((gemm,), nf * t_h + 3 * t_v + cast, no + 1 + 2 + n_cast, (shape,), (GEMM,))


def _embedding(m: ModelSpec, c: WorkloadConfig, phase: str) -> LayerOps:
    e = c.dtype_bytes
    t_h = c.micro_batch * c.seq_len * m.hidden * e
    t_pos = c.seq_len * m.hidden * e if m.learned_pos else 0  # one sequence's position rows
    if phase == "bwd":  # zero + scatter-add into each table; positions: sum over the batch first
        # the tables are fp32 weights (mixed precision too): their gradients are written in fp32
        table = (m.vocab + (m.max_pos if m.learned_pos else 0)) * m.hidden * WEIGHT_BYTES
        ew = table + t_h + (t_h + 2 * t_pos if m.learned_pos else 0)
        n = 1 + (2 if m.learned_pos else 0)
        if m.tied_embeddings:  # autograd sums the head's gradient of the table into the lookup's, in place
            ew, n = ew + 3 * m.vocab * m.hidden * WEIGHT_BYTES, n + 1
        return _with_embedding_norm(m, LayerOps((), ew, n), t_h, phase)
    if phase == "recompute":
        return EMPTY
    # gather of the tokens' rows; positions: gather of s rows, broadcast add
    fwd = LayerOps((), 2 * t_h + (2 * t_h + 3 * t_pos if m.learned_pos else 0), 1 + (4 if m.learned_pos else 0))
    return _with_embedding_norm(m, fwd, t_h, phase)


def _with_embedding_norm(m: ModelSpec, ops: LayerOps, t_h: float, phase: str) -> LayerOps:
    """BLOOM's word_embeddings_layernorm after the gather (its forward or backward operators)."""
    if not m.embedding_norm:
        return ops
    nf, no, nb, nob = _NORM[m.norm]
    byts, n = (nb, nob) if phase == "bwd" else (nf, no)
    return LayerOps(ops.matmul_flops, ops.elementwise_bytes + byts * t_h, ops.n_ops + n)


def layer_ops(model: ModelSpec, config: WorkloadConfig, layer: int, phase: str) -> LayerOps:
    """The operators of trace layer ``layer`` (0 embedding, 1..L blocks, L+1 head) in ``phase``."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {', '.join(PHASES)}")
    if not 0 <= layer <= model.n_layers + 1:
        raise ValueError(f"layer {layer} is not a layer of {model.name!r} (0..{model.n_layers + 1})")
    if layer == 0:
        return _embedding(model, config, phase)
    if layer == model.n_layers + 1:
        return _head(model, config, phase)
    return _block(model, config, phase, layer - 1)
