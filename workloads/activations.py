"""Bytes of activations saved for the backward pass, per layer and micro-batch.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198, Sec. 4 and Table 2: a GPT block (LayerNorm, MHA, 4h GeLU MLP, dropout) in 16-bit
saves ``s*b*h*(34 + 5*a*s/h)`` bytes; selective recomputation (attention core recomputed) saves
``34*s*b*h``; full recomputation saves only the block input ``2*s*b*h``. We rebuild that count tensor
by tensor so that the same code also covers SwiGLU, GQA, RMSNorm, no dropout, MoE, FlashAttention and
fp32. Notation: s sequence, b micro-batch, h hidden, a heads, d_kv = n_kv_heads*h/a, f ffn,
e bytes per activation element (2 for bf16/fp16, 4 for fp32), dropout masks 1 byte per element (stay
1 byte in fp32), FlashAttention's logsumexp and the loss logits fp32 (4 bytes) in every precision.

Per block, what each op keeps for its backward (Korthikanti's accounting; Korthikanti's numbers for
e = 2 in brackets)::

  norms      each of the 2 norms keeps its input: 2 * e*sbh                              [4sbh]
             (LayerNorm or RMSNorm alike; the per-row statistics, O(sb) fp32, are ignored
             as in Korthikanti)
  attention  QKV projection input (norm output)          e*sbh                          [2sbh]
             Q and K for Q.K^T                          e*sbh + e*sb*k_w                [4sbh]
             V for P.V                                  e*sb*k_w                         [2sbh]
             output-projection input (context)          e*sbh                           [2sbh]
             dropout mask after the output projection   sbh          (dropout only)     [1sbh]
             k_w = h without FlashAttention (GQA's K/V are expanded to all a heads before
             the matmuls, as Megatron's and HF's eager attention do, so the saved tensors
             are full width), k_w = d_kv with FlashAttention (native GQA, unexpanded K/V).
             Rotary embeddings are a fixed rotation: their backward needs no saved input.
  core       without FlashAttention: softmax output     e*a*s^2*b                       [2as^2b]
             + dropout mask on the probabilities        a*s^2*b      (dropout only)     [1as^2b]
             + dropout output (the P of P.V)            e*a*s^2*b    (dropout only)     [2as^2b]
             without dropout the softmax output itself is P and is stored once.
             with FlashAttention: only the logsumexp, 4*a*s*b (fp32); dropout inside the kernel
             is regenerated from the RNG state, so no mask is kept.
  mlp gelu   first-linear input e*sbh, GeLU input e*sbf, GeLU output (second-linear input)
             e*sbf, dropout mask sbh (dropout only)                   [f = 4h: 2+8+8+1 = 19sbh]
  mlp swiglu down(silu(gate(x)) * up(x)): input x e*sbh; gate(x) e*sbf (for silu's backward);
             up(x) e*sbf and silu(gate(x)) e*sbf (the product's two operands); the product
             e*sbf (down's input); dropout mask sbh (dropout only). Total e*sb*(h + 4f) (+sbh).
             This is the unfused autograd graph (HF, plain PyTorch); a fused SwiGLU that keeps
             only [gate, up] and recomputes silu would save e*sb*(h + 3f).
  moe        router input (norm output) e*sbh + router probabilities 4*sb*E (fp32 softmax) +
             for each of the k experts a token copies: the gathered input e*sbh, the expert's
             internals as above without its input (e*sb*4f for swiglu, e*sb*2f for gelu) and its
             output e*sbh, kept by the multiplication with the routing weight (+ sbh mask).

Totals: GPT block (gelu, f = 4h, MHA, dropout, e = 2): 4 + 11 + 19 = 34 sbh plus 5as^2b, exactly
Korthikanti's ``sbh(34 + 5as/h)``. LLaMA block (swiglu, rmsnorm, no dropout, e = 2):
``sbh*(16 + 8f/h) + 2as^2b`` without FlashAttention; with FlashAttention
``sb*(12h + 4*d_kv + 8f) + 4asb``; for Llama-2-7B (f = 2.6875h, MHA) 37.5 sbh + 4asb.

Today's architectures (ModelSpec fields) generalise the widths above: Q is a*d wide (d = head_dim), K
g*d and V g*d_v (unexpanded with FlashAttention, a*d and a*d_v expanded without it), the context a*d_v;
qk-norms keep their inputs (the projected Q and K); latent attention keeps its down-projections and
their norms' outputs (2*r_q + 2*r_kv + d_rope per token) and K, V expanded to every head; ``block_norms``
norms keep an input each; an MoE block adds its shared experts (input shared, internals + output each);
dense first layers keep a dense MLP; a parallel block with one norm stores that norm's output once for
attention and MLP. The embedding norm (BLOOM) keeps its input e*sbh. Blocks are computed one by one.

Checkpointing modes: ``none`` keeps everything above; ``selective`` keeps everything except the
attention core (recomputed in backward from the stored Q, K, V), i.e. 34sbh for GPT; ``full`` keeps
only the block input e*sbh. The embedding keeps its dropout mask sbh (dropout only; Korthikanti
Sec. 4.3; the int64 token ids, 8sb, are input data and not counted). The head keeps the final-norm
input e*sbh, the LM-head input e*sbh and the fp32 logits for the cross-entropy, 4*s*b*V (Korthikanti:
"4sbh + 4sbv"); embedding and head are never checkpointed.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.model import ModelSpec

__all__ = [
    "MASK_BYTES",
    "FP32_BYTES",
    "BlockActivations",
    "block_activations",
    "saved_block_bytes",
    "embedding_activation_bytes",
    "head_activation_bytes",
]

MASK_BYTES = 1
FP32_BYTES = 4


@dataclass(frozen=True)
class BlockActivations:
    """Bytes one block saves for backward without checkpointing, by component (module docstring)."""

    norms: int
    attention: int        # projections' inputs, Q, K, V, output-dropout mask
    attention_core: int   # s^2 tensors (or FlashAttention's logsumexp): what selective drops
    mlp: int
    layer_input: int      # e*sbh, what full checkpointing keeps (also part of ``norms``)

    @property
    def total(self) -> int:
        return self.norms + self.attention + self.attention_core + self.mlp


def _expert_internal_elements(model: ModelSpec, width: int | None = None) -> int:
    """Elements (per token) one MLP of ``width`` keeps besides its input: 4f for swiglu, 2f for gelu."""
    return (4 if model.mlp == "swiglu" else 2) * (model.ffn if width is None else width)


def _attention_bytes(model: ModelSpec, sb: int, e: int, flash_attention: bool, mask: int) -> int:
    """Projection inputs, Q, K, V, the context and the qk-norm / latent-norm inputs (module docstring)."""
    h = model.hidden
    expanded = not flash_attention or model.is_mla  # MLA materialises K and V at every head
    k_width = model.q_dim if expanded else model.kv_dim
    v_width = model.context_dim if expanded else model.v_dim
    saved = e * sb * (h + model.q_dim + k_width + v_width + model.context_dim) + mask
    if model.qk_norm != "none":  # each norm keeps its input: the projected Q and K
        saved += e * sb * (model.q_dim + model.kv_dim)
    if model.is_mla:  # q_a output + its norm's output, kv_a output + the latent norm's output
        saved += e * sb * (2 * model.q_lora_rank + 2 * model.kv_lora_rank + model.qk_rope_head_dim)
    return saved


def _mlp_bytes(model: ModelSpec, sb: int, e: int, layer: int, mask: int) -> int:
    """The MLP's input, its internals (every routed copy and shared expert) and the router's output."""
    h = model.hidden
    shared_input = 0 if model.parallel_blocks and model.block_norms == 1 else e * sb * h  # one norm feeds both
    if not model.is_moe_layer(layer):
        return shared_input + e * sb * _expert_internal_elements(model) + mask
    k = model.experts_per_token
    routed = k * (2 * e * sb * h + e * sb * _expert_internal_elements(model, model.expert_ffn))
    shared = model.shared_experts * (e * sb * h + e * sb * _expert_internal_elements(model, model.shared_expert_ffn))
    return shared_input + FP32_BYTES * sb * model.n_experts + routed + shared + mask


def block_activations(model: ModelSpec, micro_batch: int, seq_len: int, dtype_bytes: int,
                      flash_attention: bool, layer: int | None = None) -> BlockActivations:
    """Saved bytes of block ``layer`` (0-based; default the last), no checkpointing (module docstring)."""
    layer = model.default_layer() if layer is None else layer
    e, sb, h, a = dtype_bytes, seq_len * micro_batch, model.hidden, model.n_heads
    mask = MASK_BYTES * sb * h if model.dropout else 0
    if flash_attention:
        core = FP32_BYTES * a * sb
    else:
        scores = a * seq_len * seq_len * micro_batch
        core = e * scores + ((MASK_BYTES + e) * scores if model.dropout else 0)
    return BlockActivations(norms=model.block_norms * e * sb * h,
                            attention=_attention_bytes(model, sb, e, flash_attention, mask),
                            attention_core=core, mlp=_mlp_bytes(model, sb, e, layer, mask), layer_input=e * sb * h)


def saved_block_bytes(acts: BlockActivations, checkpointing: str) -> int:
    """What a block keeps under ``checkpointing`` ("none" | "selective" | "full")."""
    if checkpointing == "full":
        return acts.layer_input
    if checkpointing == "selective":
        return acts.total - acts.attention_core
    return acts.total


def embedding_activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int, dtype_bytes: int = 2) -> int:
    """Embedding-dropout mask (1 byte per element) when the model uses dropout, else 0; plus the
    embedding norm's input (e*sbh, BLOOM)."""
    sbh = micro_batch * seq_len * model.hidden
    return (MASK_BYTES * sbh if model.dropout else 0) + (dtype_bytes * sbh if model.embedding_norm else 0)


def head_activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int, dtype_bytes: int) -> int:
    """Final-norm input + LM-head input (e*sbh each) + fp32 logits for the loss (4*s*b*V)."""
    sb = micro_batch * seq_len
    return 2 * dtype_bytes * sb * model.hidden + FP32_BYTES * sb * model.vocab
