"""HBM traffic and transient working memory of a layer: first-order estimates for a roofline.

These are not from a paper; they are our accounting, stated so a user can check it.

HBM traffic (bytes moved between HBM and the SMs):

* forward of a block: every weight read once (param bytes; MoE: all experts, since with b*s tokens
  every expert receives some) + every tensor the forward creates written once and read once by its
  consumer, i.e. ``2 * (activations without checkpointing + output)``; with FlashAttention the s x s
  scores never reach HBM, which the activation count already reflects;
* backward of a block: weights read once, the gradient buffer read and written (accumulation over
  micro-batches), saved activations read once and an activation gradient of the same size written and
  read (``3 x``), the incoming and outgoing layer gradients (``2 x output``), plus the recompute:
  ``full`` repeats the forward's weight reads and ``2 x`` the activations it rebuilds, ``selective``
  ``2 x`` the attention core it rebuilds;
* embedding: forward gathers s*b rows (+ s*b position rows when learned) and writes the output (and the
  dropout mask); backward reads the incoming gradient and writes the dense table gradient;
* head: the LM-head matrix is read (for tied embeddings it is the token-embedding table, owned by the
  embedding layer), the 16-bit logits written and read once more for the fp32 up-cast, activations as
  for a block; backward also reads and writes the matrix gradient.

Transient working memory (beyond the saved activations and the persistent parameter/gradient
buffers): during backward a block rebuilds what checkpointing dropped (``activations without
checkpointing - saved``) and holds the incoming and outgoing gradient of its largest tensor
(``2 x largest``: the MLP intermediate e*b*s*f (k of them for MoE), the QKV output, or without
FlashAttention the e*a*s^2*b scores). The head holds one 16-bit logits-sized tensor, ``e*b*s*V``: in
the forward the 16-bit logits while their fp32 copy (the saved softmax, counted in the activations) is
made, in the backward the 16-bit cast of the logit gradient. The fp32 gradient itself is written in
place into the saved softmax: Megatron's ``_VocabParallelCrossEntropy.backward`` (``grad_input =
softmax``, then in-place updates), the loss of ZeRO-Offload's GPT-2 runs (DeepSpeedExamples
Megatron-LM ``pretrain_gpt2.py``: ``vocab_parallel_cross_entropy(output.contiguous().float(), labels)``;
reference key ``ds_megatron_gpt2``). The embedding holds one e*b*s*h buffer.
"""

from __future__ import annotations

from workloads.model import ModelSpec

__all__ = ["block_largest_tensor", "block_traffic", "embedding_traffic", "head_traffic",
           "head_transient"]


def block_largest_tensor(model: ModelSpec, micro_batch: int, seq_len: int, dtype_bytes: int,
                         flash_attention: bool) -> int:
    sb = micro_batch * seq_len
    candidates = [
        dtype_bytes * sb * model.ffn * model.experts_per_token,
        dtype_bytes * sb * (model.hidden + 2 * model.kv_dim),
    ]
    if not flash_attention:
        candidates.append(dtype_bytes * model.n_heads * seq_len * seq_len * micro_batch)
    return max(candidates)


def block_traffic(param_bytes: int, grad_bytes: int, nockpt: int, saved: int, output: int,
                  checkpointing: str) -> tuple[int, int]:
    """(forward, backward) HBM bytes of one block (module docstring)."""
    fwd = param_bytes + 2 * (nockpt + output)
    if checkpointing == "full":
        recompute = param_bytes + 2 * (nockpt - saved)
    elif checkpointing == "selective":
        recompute = 2 * (nockpt - saved)
    else:
        recompute = 0
    bwd = param_bytes + 2 * grad_bytes + 3 * nockpt + 2 * output + recompute
    return fwd, bwd


def embedding_traffic(model: ModelSpec, micro_batch: int, seq_len: int, dtype_bytes: int,
                      grad_bytes: int, mask_bytes: int) -> tuple[int, int]:
    """(forward, backward) HBM bytes of the embedding lookup."""
    rows = dtype_bytes * micro_batch * seq_len * model.hidden
    fwd = rows * (2 + (1 if model.learned_pos else 0)) + mask_bytes
    bwd = rows + grad_bytes + mask_bytes
    return fwd, bwd


def head_traffic(model: ModelSpec, micro_batch: int, seq_len: int, dtype_bytes: int,
                 activations: int) -> tuple[int, int]:
    """(forward, backward) HBM bytes of final norm + LM head + loss."""
    weights = dtype_bytes * (model.norm_params() + model.vocab * model.hidden)
    logits16 = dtype_bytes * micro_batch * seq_len * model.vocab
    fwd = weights + 2 * activations + 2 * logits16
    bwd = 3 * weights + 3 * activations + 2 * logits16
    return fwd, bwd


def head_transient(model: ModelSpec, micro_batch: int, seq_len: int, dtype_bytes: int) -> int:
    """One 16-bit logits-sized tensor: the forward's 16-bit logits beside their fp32 copy, the backward's
    16-bit cast of the logit gradient (the fp32 gradient reuses the saved softmax in place; module docstring)."""
    return dtype_bytes * micro_batch * seq_len * model.vocab
