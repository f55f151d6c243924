"""The model inventory: every parameter tensor of a model, by layer and kind, and what follows from it.

Pure data (no torch): :mod:`workloads.hf_inventory.walk` fills it from a model instantiated on the meta
device. From the tensors alone this module derives

* total parameters: the sum over unique tensors (a tied LM head is the token embedding, counted once);
* active parameters per token: the same with each MoE layer's routed experts scaled by top-k / experts
  (the router and any shared experts are always active);
* forward matmul FLOPs of one micro-batch of ``b`` sequences of ``s`` tokens, per layer, in the
  convention of :mod:`workloads.flops` (Narayanan et al. 2021, arXiv 2104.04473): every weight matrix a
  token passes through costs 2 FLOPs per element per token (routed experts: top-k of them), so the
  projections cost ``2*b*s*active_matmul_params``; the attention scores and context cost
  ``2*b*s*span*heads*(qk_head_dim + v_head_dim)`` with ``span`` the keys each query sees: ``s`` (the
  non-causal convention of :mod:`workloads.flops`, full attention) or ``min(s, window)`` for a layer
  with a sliding window. Latent attention (MLA) is priced as its down/up projections (they are
  matrices of the inventory) plus the score/context term on the decompressed heads
  (qk = nope + rope head dim, v = v_head_dim), as ``transformers`` computes it in training.
  The LM head is ``2*b*s*hidden*vocab`` (tied or not). Biases, norms, embeddings lookups and
  element-wise work are not counted (as :mod:`workloads.flops`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "ATTENTION_KINDS",
    "KINDS",
    "AttentionShape",
    "LayerInventory",
    "ModelInventory",
    "MoeShape",
    "ParamTensor",
]

ATTENTION_KINDS = ("attn.q", "attn.k", "attn.v", "attn.qkv", "attn.o",
                   "attn.q_down", "attn.q_up", "attn.kv_down", "attn.kv_up", "attn.norm", "attn.other")
_MLP_ROLES = ("gate", "up", "gate_up", "down", "other")
KINDS = (
    *ATTENTION_KINDS,
    *(f"mlp.{r}" for r in _MLP_ROLES),
    *(f"expert.{r}" for r in _MLP_ROLES),
    *(f"shared.{r}" for r in _MLP_ROLES), "shared.router",
    "router", "norm", "embedding", "embedding.norm", "position", "lm_head", "other",
)
"""Every tensor kind. ``attn.q_down``/``attn.q_up``/``attn.kv_down``/``attn.kv_up`` are latent attention
(MLA) projections; ``expert.*`` routed experts, ``shared.*`` shared experts; ``other`` is a tensor the
walk could not name (listed in the notes, counted in the parameters, and as a dense matmul when 2-D)."""


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor (or one bias) of the model."""

    name: str                 # dotted name in the module tree, e.g. "model.layers.0.self_attn.q_proj.weight"
    kind: str                 # one of KINDS
    shape: tuple[int, ...]
    matrix: bool              # a matmul weight (FLOPs); False for biases, norms, embedding tables

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def routed(self) -> bool:
        return self.kind.startswith("expert.")


@dataclass(frozen=True)
class AttentionShape:
    """What the attention of one layer computes beyond its projections."""

    n_heads: int
    n_kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    sliding_window: int | None = None     # keys each query sees at most; None = full attention
    q_lora_rank: int | None = None        # MLA: rank of the query compression (None: no compression)
    kv_lora_rank: int | None = None       # MLA: rank of the key/value compression

    def span(self, seq_len: int) -> int:
        """Keys each query attends to, in the non-causal convention of :mod:`workloads.flops`."""
        return seq_len if self.sliding_window is None else min(seq_len, self.sliding_window)

    def core_flops_per_key(self) -> int:
        """Scores (qk) + context (v) FLOPs for one query token and one key, all heads."""
        return 2 * self.n_heads * (self.qk_head_dim + self.v_head_dim)


@dataclass(frozen=True)
class MoeShape:
    n_experts: int            # routed experts
    top_k: int                # routed experts per token
    n_shared: int = 0         # shared experts (always active), counted in units of the routed width
    expert_ffn: int = 0       # width of one routed expert
    shared_ffn: int = 0       # total width of the shared expert(s)


@dataclass(frozen=True)
class LayerInventory:
    """One decoder layer."""

    index: int
    tensors: tuple[ParamTensor, ...]
    attention: AttentionShape | None
    moe: MoeShape | None = None
    ffn: int = 0              # dense MLP width (0 when the layer's MLP is MoE only)
    mlp_matrices: int = 0     # 3 for a gated MLP (gate, up, down), 2 for an ungated one

    def _sum(self, *, active: bool, matrices: bool, kinds: Iterable[str] | None = None) -> int:
        wanted = None if kinds is None else set(kinds)
        total = 0
        routed = 0
        for t in self.tensors:
            if (matrices and not t.matrix) or (wanted is not None and t.kind not in wanted):
                continue
            if t.routed:
                routed += t.numel
            else:
                total += t.numel
        if active and self.moe is not None and routed:
            routed = routed * self.moe.top_k // self.moe.n_experts
        return total + routed

    def params(self, kinds: Iterable[str] | None = None) -> int:
        return self._sum(active=False, matrices=False, kinds=kinds)

    def active_params(self) -> int:
        """Parameters a token touches: routed experts scaled by top_k / n_experts."""
        return self._sum(active=True, matrices=False)

    def matmul_params(self, active: bool = True) -> int:
        """Weight-matrix elements a token multiplies (biases, norms excluded)."""
        return self._sum(active=active, matrices=True)

    def attention_params(self) -> int:
        return self.params(ATTENTION_KINDS)

    def forward_flops(self, micro_batch: int, seq_len: int) -> tuple[int, int]:
        """(projection FLOPs, attention score+context FLOPs) of one forward pass of the micro-batch."""
        tokens = micro_batch * seq_len
        proj = 2 * tokens * self.matmul_params(active=True)
        if self.attention is None:
            return proj, 0
        return proj, tokens * self.attention.span(seq_len) * self.attention.core_flops_per_key()


@dataclass(frozen=True)
class ModelInventory:
    """Every parameter tensor of a model built from its definition."""

    model_type: str
    architecture: str                         # the transformers class, e.g. "Qwen3MoeForCausalLM"
    hidden: int
    vocab: int
    layers: tuple[LayerInventory, ...]
    embedding: tuple[ParamTensor, ...]        # token embedding, position table, embedding norm
    head: tuple[ParamTensor, ...]             # final norm, LM head (absent when tied)
    other: tuple[ParamTensor, ...] = ()       # tensors outside the layers the walk could not name
    tied_embeddings: bool = False
    rotary: bool = False                      # rotary position embeddings (a module of the definition)
    notes: tuple[str, ...] = field(default=())

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def embedding_params(self) -> int:
        return sum(t.numel for t in self.embedding)

    def position_params(self) -> int:
        return sum(t.numel for t in self.embedding if t.kind == "position")

    def head_params(self) -> int:
        return sum(t.numel for t in self.head)

    def params(self) -> int:
        """Total parameters (all experts; a tied head counted once, with the embedding)."""
        return (self.embedding_params() + sum(layer.params() for layer in self.layers) + self.head_params()
                + sum(t.numel for t in self.other))

    def active_params(self) -> int:
        """Parameters touched per token (MoE: top-k routed experts + router + shared experts)."""
        return (self.embedding_params() + sum(layer.active_params() for layer in self.layers)
                + self.head_params() + sum(t.numel for t in self.other))

    def head_forward_flops(self, micro_batch: int, seq_len: int) -> int:
        """LM head logits: 2*b*s*hidden*vocab (tied or not)."""
        return 2 * micro_batch * seq_len * self.hidden * self.vocab

    def forward_flops(self, micro_batch: int, seq_len: int) -> int:
        """Matmul FLOPs of one forward pass of the micro-batch: every layer plus the LM head."""
        layers = sum(sum(layer.forward_flops(micro_batch, seq_len)) for layer in self.layers)
        other = 2 * micro_batch * seq_len * sum(t.numel for t in self.other if t.matrix)
        return layers + other + self.head_forward_flops(micro_batch, seq_len)

    def kinds(self) -> dict[str, int]:
        """Parameters by kind over the whole model."""
        out: dict[str, int] = {}
        tensors = [*self.embedding, *self.head, *self.other, *(t for la in self.layers for t in la.tensors)]
        for t in tensors:
            out[t.kind] = out.get(t.kind, 0) + t.numel
        return out
