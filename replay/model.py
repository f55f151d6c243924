"""The plan's decoder, built at the plan's dimensions with a fixed seed, as a list of per-layer modules.

Module ``i`` is the workload trace's layer ``i``: ``0`` the embedding, ``1..L`` the blocks, ``L+1`` the
head (final norm, LM head and the cross-entropy loss), so a plan task tagged ``{"layer": i}`` runs
module ``i``. Two styles, picked by the model's fields (``workloads.model.ModelSpec``):

- GPT-2 style (``norm: layernorm``, ``mlp: gelu``, ``learned_pos``, ``bias``): LayerNorm, tanh-GELU MLP,
  learned positions (OPT keeps 2 offset rows);
- LLaMA style (``norm: rmsnorm``, ``mlp: swiglu``, rotary positions, no bias): RMSNorm, SwiGLU, GQA.

Any mix of these fields is honoured; the parameter count equals ``ModelSpec.params()`` exactly.
With tied embeddings the head has no matrix of its own and takes the embedding's ``wte`` as an input.
Dropout is never applied (training must be deterministic to be compared with a reference); mixture of
experts is not supported yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from replay.errors import ReplayError
from replay.precision import linear
from workloads import ModelSpec

# the ModelSpec fields the runner builds (the original contract); any other field in to_dict() is refused
_BUILDABLE = frozenset(("name", "family", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "vocab", "max_pos",
                        "tied_embeddings", "mlp", "norm", "bias", "learned_pos", "n_experts", "experts_per_token",
                        "dropout", "source", "route", "notes"))
INIT_STD = 0.02  # GPT-2's initialiser range
NORM_EPS = 1e-5


@dataclass(frozen=True)
class Dims:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    vocab: int
    max_pos: int
    tied: bool
    mlp: str
    norm: str
    bias: bool
    learned_pos: bool
    pos_offset: int  # OPT: position rows start at 2
    head_width: int = 0  # one head's width when a shard holds fewer heads than hidden / head_dim (0: derived)

    @property
    def head_dim(self) -> int:
        return self.head_width or self.hidden // self.n_heads

    def shard(self, tp: int) -> Dims:
        """One tensor-parallel rank's dimensions: its share of the heads and of the MLP, the model's head width
        kept (``hidden`` stays the model's: the residual stream is whole on every rank)."""
        fields = {**self.__dict__, "n_heads": self.n_heads // tp, "n_kv_heads": self.n_kv_heads // tp,
                  "ffn": self.ffn // tp, "head_width": self.head_dim}
        return Dims(**fields)

    @classmethod
    def from_model(cls, spec: ModelSpec) -> Dims:
        if spec.n_experts > 1:
            raise ReplayError(f"model {spec.name!r}: mixture-of-experts models are not supported by replay yet")
        beyond = [k for k in spec.to_dict() if k not in _BUILDABLE]
        if beyond:
            raise ReplayError(f"model {spec.name!r}: replay builds GPT-2/OPT/LLaMA-style blocks only; it cannot build "
                              f"{', '.join(beyond)} (simulate this model, or replay one without these fields)")
        return cls(n_layers=spec.n_layers, hidden=spec.hidden, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
                   ffn=spec.ffn, vocab=spec.vocab, max_pos=spec.max_pos, tied=spec.tied_embeddings, mlp=spec.mlp,
                   norm=spec.norm, bias=spec.bias, learned_pos=spec.learned_pos,
                   pos_offset=2 if spec.family == "opt" else 0)


def _norm(d: Dims) -> nn.Module:
    if d.norm == "rmsnorm":
        return nn.RMSNorm(d.hidden, eps=NORM_EPS)
    return nn.LayerNorm(d.hidden, eps=NORM_EPS)


class Embedding(nn.Module):
    def __init__(self, d: Dims):
        super().__init__()
        self.d = d
        self.wte = nn.Parameter(torch.empty(d.vocab, d.hidden))
        rows = d.max_pos + d.pos_offset if d.learned_pos else 0
        self.wpe = nn.Parameter(torch.empty(rows, d.hidden)) if rows else None

    def forward(self, tokens: Tensor) -> Tensor:
        x = F.embedding(tokens, self.wte)
        if self.wpe is not None:
            pos = torch.arange(tokens.shape[1], device=tokens.device) + self.d.pos_offset
            x = x + F.embedding(pos, self.wpe)
        return x


def _rotary(x: Tensor) -> Tensor:
    """Rotary position embedding (half-split form, as HF LLaMA) of x: (batch, heads, seq, head_dim)."""
    s, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def causal_attention(d: Dims, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention of the projected queries, keys and values (batch, seq, heads x head width) of ``d``'s
    heads (rotary positions unless learned, key/value heads repeated for grouped queries), heads joined back:
    (batch, seq, n_heads x head width). A tensor-parallel rank passes its shard's ``Dims``."""
    b, s, _ = q.shape
    hd = d.head_dim
    q = q.view(b, s, d.n_heads, hd).transpose(1, 2)
    k = k.view(b, s, d.n_kv_heads, hd).transpose(1, 2)
    v = v.view(b, s, d.n_kv_heads, hd).transpose(1, 2)
    if not d.learned_pos:
        q, k = _rotary(q), _rotary(k)
    if d.n_kv_heads != d.n_heads:
        rep = d.n_heads // d.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return a.transpose(1, 2).reshape(b, s, d.n_heads * hd)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and names) computed by :func:`replay.precision.linear`: the plan's
    16-bit GEMM, native or emulated on fp32 GEMMs where the CPU has no native one."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


class Block(nn.Module):
    def __init__(self, d: Dims):
        super().__init__()
        self.d = d
        kv = d.n_kv_heads * d.head_dim
        self.ln1, self.ln2 = _norm(d), _norm(d)
        self.q = Linear(d.hidden, d.hidden, bias=d.bias)
        self.k = Linear(d.hidden, kv, bias=d.bias)
        self.v = Linear(d.hidden, kv, bias=d.bias)
        self.o = Linear(d.hidden, d.hidden, bias=d.bias)
        if d.mlp == "swiglu":
            self.gate = Linear(d.hidden, d.ffn, bias=d.bias)
        self.up = Linear(d.hidden, d.ffn, bias=d.bias)
        self.down = Linear(d.ffn, d.hidden, bias=d.bias)

    def forward(self, x: Tensor) -> Tensor:
        d = self.d
        b, s, _ = x.shape
        h = self.ln1(x)
        a = causal_attention(d, self.q(h), self.k(h), self.v(h))
        x = x + self.o(a)
        h = self.ln2(x)
        m = F.silu(self.gate(h)) * self.up(h) if d.mlp == "swiglu" else F.gelu(self.up(h), approximate="tanh")
        return x + self.down(m)


class Head(nn.Module):
    """Final norm, LM head and the mean cross-entropy; ``wte`` is the tied embedding matrix (or None)."""

    def __init__(self, d: Dims):
        super().__init__()
        self.norm = _norm(d)
        self.lm = None if d.tied else nn.Parameter(torch.empty(d.vocab, d.hidden))

    def forward(self, x: Tensor, targets: Tensor, wte: Tensor | None = None) -> Tensor:
        w = self.lm if self.lm is not None else wte
        if w is None:
            raise ReplayError("head: tied embeddings need the embedding matrix")
        logits = linear(self.norm(x), w)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_layers(d: Dims, seed: int) -> list[nn.Module]:
    """The model's layers (embedding, blocks, head), deterministically initialised from ``seed``."""
    layers: list[nn.Module] = [Embedding(d), *(Block(d) for _ in range(d.n_layers)), Head(d)]
    g = torch.Generator().manual_seed(seed)
    std_out = INIT_STD / math.sqrt(2 * d.n_layers)  # GPT-2's scaled init of residual projections
    with torch.no_grad():
        for layer in layers:
            for name, p in layer.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1:
                    p.fill_(1.0)  # norm weights
                else:
                    std = std_out if name.split(".")[0] in ("o", "down") else INIT_STD
                    p.normal_(0.0, std, generator=g)
    return layers


def param_count(layers: list[nn.Module]) -> int:
    return sum(p.numel() for layer in layers for p in layer.parameters())
