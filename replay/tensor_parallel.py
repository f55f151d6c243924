"""Megatron-style tensor parallelism for the replay: one rank's shards of the model and the pieces of a
layer's forward and backward between the all-reduces of its tensor-parallel group.

A plan with ``tp > 1`` (``policies.kit.tp_steps``) gives each layer's use its compute parts and all-reduces in
Megatron-LM's order (Shoeybi et al. 2019, "Megatron-LM", §3; NVIDIA/Megatron-LM ``megatron/core/
tensor_parallel/``), tagged ``part``; the replay runs each piece where the plan puts it:

- a block: attention with the query/key/value projections split by heads (column-parallel: each rank
  ``n_heads / tp`` heads, ``n_kv_heads / tp`` key/value heads) and the output projection split by its
  input columns (row-parallel); the MLP with ``gate``/``up`` column-parallel and ``down`` row-parallel;
  norms and the row-parallel biases replicated. Forward: part 0 computes attention's partial output,
  collective 0 sums it, part 1 the MLP's, collective 1 sums it. Backward: part 0 the MLP's backward up to the
  partial gradient of its input (the second norm's output), collective 0 sums it, part 1 the second norm's
  and attention's backward up to the partial gradient of the first norm's output, collective 1 sums it and
  finishes the first norm: every rank then holds the full gradient of the replicated norms.
- the embedding: vocab-parallel (rank j looks up the tokens of its ``vocab / tp`` rows, zeros elsewhere;
  the forward's all-reduce sums them), positions replicated and added after the sum. Its backward is local.
- the head: the LM head column-parallel over the vocabulary (rank j holds ``vocab / tp`` rows of the head, or
  of the tied table it shares with the embedding) and Megatron's vocab-parallel cross-entropy
  (``cross_entropy.py``): collective 0 takes the max of the logits (``ReduceOp.MAX``), 1 sums the target
  logits, 2 the exp sums; the backward computes the softmax's gradient locally and collective 0 sums the
  gradient of the head's input (the final norm's output) before the replicated norm's backward.

A layer's gradients are handed to the plan's consumers (reduction, offload, optimizer) once its last backward
collective has completed them; the plan's consumers wait for that collective (docs/replay_tp.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from replay.errors import ReplayError
from replay.model import NORM_EPS, Dims, causal_attention
from replay.precision import linear

COLUMN = ("q.", "k.", "v.", "gate.", "up.")  # split by output rows (weight and bias)
ROW = ("o.weight", "down.weight")            # split by input columns


@dataclass(frozen=True)
class TpPlace:
    """Rank ``rank`` of a tensor-parallel group of ``world``; ``vocab_parallel``: the embedding and the head are
    split over the vocabulary (always with tp > 1; a field so that weights join back by it)."""

    rank: int
    world: int
    vocab_parallel: bool

    @property
    def active(self) -> bool:
        return self.world > 1


def check_dims(d: Dims, tp: int) -> None:
    """ReplayError unless the model splits evenly over ``tp`` ranks as Megatron splits it."""
    for what, n in (("attention heads", d.n_heads), ("key/value heads", d.n_kv_heads), ("ffn width", d.ffn)):
        if n % tp:
            raise ReplayError(f"tensor parallelism tp={tp}: the model's {n} {what} do not split over {tp} ranks; "
                              "replay a plan with a tp that divides them")
    if d.vocab % tp:
        raise ReplayError(f"tensor parallelism tp={tp}: the vocabulary of {d.vocab} does not split over {tp} ranks "
                          "(vocab-parallel embedding and head; Megatron pads it); replay a model whose vocab is a "
                          "multiple of tp")


def shard_dim(layer: int, n_layers: int, name: str, vocab_parallel: bool) -> int | None:
    """The dimension along which a parameter is split over the ranks (None: replicated)."""
    if layer == 0:
        return 0 if name == "wte" and vocab_parallel else None
    if layer == n_layers - 1:
        return 0 if name in ("lm", "wte") and vocab_parallel else None
    if name.startswith(COLUMN):
        return 0
    if name in ROW:
        return 1
    return None


def shard_layers(layers: list[nn.Module], d: Dims, place: TpPlace) -> None:
    """Replace, in place, every split parameter of ``layers`` by rank ``place.rank``'s contiguous shard."""
    if not place.active:
        return
    check_dims(d, place.world)
    for i, m in enumerate(layers):
        for name, p in list(m.named_parameters()):
            dim = shard_dim(i, len(layers), name, place.vocab_parallel)
            if dim is None:
                continue
            part = p.detach().chunk(place.world, dim=dim)[place.rank].clone()
            owner = m.get_submodule(name.rsplit(".", 1)[0]) if "." in name else m
            setattr(owner, name.rsplit(".", 1)[-1], nn.Parameter(part))


def unshard(layer: int, n_layers: int, shards: list[dict[str, Tensor]], vocab_parallel: bool) -> dict[str, Tensor]:
    """A layer's whole parameters from its ranks' shards (rank order)."""
    out = {}
    for name, t in shards[0].items():
        dim = shard_dim(layer, n_layers, name, vocab_parallel)
        out[name] = t if dim is None or len(shards) == 1 else torch.cat([s[name] for s in shards], dim=dim)
    return out


def local_dims(d: Dims, tp: int) -> Dims:
    return d.shard(tp)


def _norm(d: Dims, p: dict[str, Tensor], prefix: str, x: Tensor) -> Tensor:
    if d.norm == "rmsnorm":
        return F.rms_norm(x, (d.hidden,), p[prefix + "weight"], NORM_EPS)
    return F.layer_norm(x, (d.hidden,), p[prefix + "weight"], p.get(prefix + "bias"), NORM_EPS)


def _attention(d: Dims, p: dict[str, Tensor], h: Tensor) -> Tensor:
    """This rank's heads of attention and its part of the output projection (no bias: added after the sum)."""
    a = causal_attention(d, linear(h, p["q.weight"], p.get("q.bias")), linear(h, p["k.weight"], p.get("k.bias")),
                         linear(h, p["v.weight"], p.get("v.bias")))
    return linear(a, p["o.weight"])


def _mlp(d: Dims, p: dict[str, Tensor], h: Tensor) -> Tensor:
    up = linear(h, p["up.weight"], p.get("up.bias"))
    if d.mlp == "swiglu":
        m = F.silu(linear(h, p["gate.weight"], p.get("gate.bias"))) * up
    else:
        m = F.gelu(up, approximate="tanh")
    return linear(m, p["down.weight"])


@dataclass
class BlockGraph:
    """One rank's forward of a block as autograd pieces split at the sums (filled in part by part)."""

    x: Tensor                       # the input (a leaf)
    params: dict[str, Tensor]       # leaves
    grad: bool
    h1: Tensor                      # first norm's output (graph from x)
    h1_leaf: Tensor
    a_part: Tensor                  # this rank's attention output (graph from h1_leaf): collective 0 sums it
    a_leaf: Tensor | None = None    # the summed attention output
    x1: Tensor | None = None        # x + a + o.bias (graph from x, a_leaf)
    h2: Tensor | None = None        # second norm's output (graph from x1)
    h2_leaf: Tensor | None = None
    m_part: Tensor | None = None    # this rank's MLP output (graph from h2_leaf): collective 1 sums it


def block_attention(d: Dims, p: dict[str, Tensor], x: Tensor, grad: bool) -> BlockGraph:
    """Forward part 0: the first norm and this rank's heads of attention, up to the output projection's
    partial sum (no bias: added after the sum)."""
    with torch.set_grad_enabled(grad):
        x = x.detach().requires_grad_(grad)
        h1 = _norm(d, p, "ln1.", x)
        h1l = h1.detach().requires_grad_(grad)
        a_part = _attention(d, p, h1l)
    return BlockGraph(x, p, grad, h1, h1l, a_part)


def block_mlp(d: Dims, g: BlockGraph, a_sum: Tensor) -> None:
    """Forward part 1, from the summed attention output (collective 0): the residual, the second norm and this
    rank's columns of the MLP, up to the down projection's partial sum."""
    p = g.params
    with torch.set_grad_enabled(g.grad):
        al = a_sum.detach().requires_grad_(g.grad)
        x1 = g.x + al
        if "o.bias" in p:
            x1 = x1 + p["o.bias"]
        h2 = _norm(d, p, "ln2.", x1)
        h2l = h2.detach().requires_grad_(g.grad)
        g.a_leaf, g.x1, g.h2, g.h2_leaf, g.m_part = al, x1, h2, h2l, _mlp(d, p, h2l)


def block_output(g: BlockGraph, m_sum: Tensor) -> Tensor:
    """The block's output from the summed MLP output (collective 1): x1 + m + down.bias."""
    assert g.x1 is not None
    y = g.x1.detach() + m_sum
    if "down.bias" in g.params:
        y = y + g.params["down.bias"].detach()
    return y


@dataclass
class BlockBackward:
    """A block's backward between its collectives: the partial gradient being summed, the input's gradient
    through the residuals so far, and the parameters' gradients so far."""

    part: Tensor
    g_y: Tensor
    grads: dict[str, Tensor]
    g_x: Tensor | None = None


def block_backward_mlp(g: BlockGraph, g_y: Tensor) -> BlockBackward:
    """Backward part 0 from the output's gradient (replicated): the MLP's parameter gradients and the partial
    gradient of its input (the second norm's output), which collective 0 sums."""
    assert g.m_part is not None and g.h2_leaf is not None
    p = g.params
    mlp = [n for n in p if n.startswith(("gate.", "up.", "down.")) and n != "down.bias"]
    got = torch.autograd.grad(g.m_part, [g.h2_leaf, *(p[n] for n in mlp)], g_y.to(g.m_part.dtype))
    grads = dict(zip(mlp, got[1:], strict=True))
    if "down.bias" in p:
        grads["down.bias"] = g_y.sum(dim=(0, 1)).to(p["down.bias"].dtype)
    return BlockBackward(got[0], g_y, grads)


def block_backward_attention(g: BlockGraph, b: BlockBackward, g_h2: Tensor) -> None:
    """Backward part 1, from the summed gradient of the second norm's output (collective 0): the second norm,
    the residual and attention, up to the partial gradient of the first norm's output (collective 1 sums it)."""
    assert g.h2 is not None and g.x1 is not None and g.a_leaf is not None
    p = g.params
    mid = [n for n in p if n.startswith("ln2.") or n == "o.bias"]
    got = torch.autograd.grad([g.h2, g.x1], [g.x, g.a_leaf, *(p[n] for n in mid)],
                              [g_h2.to(g.h2.dtype), b.g_y.to(g.x1.dtype)])
    g_x, g_a = got[0], got[1]
    b.grads.update(zip(mid, got[2:], strict=True))
    attn = [n for n in p if n.startswith(("q.", "k.", "v.")) or n == "o.weight"]
    got = torch.autograd.grad(g.a_part, [g.h1_leaf, *(p[n] for n in attn)], g_a.to(g.a_part.dtype))
    b.grads.update(zip(attn, got[1:], strict=True))
    b.part, b.g_x = got[0], g_x


def block_backward_close(g: BlockGraph, b: BlockBackward, g_h1: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """After collective 1 (``g_h1``: the summed gradient of the first norm's output): the input's gradient
    and the layer's complete parameter gradients."""
    assert b.g_x is not None
    first = [n for n in g.params if n.startswith("ln1.")]
    got = torch.autograd.grad(g.h1, [g.x, *(g.params[n] for n in first)], g_h1.to(g.h1.dtype))
    grads = dict(b.grads)
    grads.update(zip(first, got[1:], strict=True))
    return b.g_x + got[0], {n: grads[n] for n in g.params}


@dataclass
class EmbedGraph:
    params: dict[str, Tensor]
    lookup: Tensor          # this rank's lookup (graph from wte)
    contrib: Tensor         # what this rank adds to the all-reduce
    pos: Tensor | None      # the position rows (graph from wpe)


def embed_forward(d: Dims, place: TpPlace, p: dict[str, Tensor], tokens: Tensor, grad: bool) -> EmbedGraph:
    """The vocab-parallel lookup of this rank's rows (module docstring), positions apart."""
    with torch.set_grad_enabled(grad):
        wte = p["wte"]
        rows = wte.shape[0]
        local = tokens - place.rank * rows
        keep = (local >= 0) & (local < rows)
        lookup = F.embedding(local.clamp(0, rows - 1), wte) * keep.unsqueeze(-1).to(wte.dtype)
        pos = None
        if "wpe" in p:
            idx = torch.arange(tokens.shape[1], device=tokens.device) + d.pos_offset
            pos = F.embedding(idx, p["wpe"]).expand_as(lookup)
    return EmbedGraph(p, lookup, lookup.detach(), pos)


def embed_output(g: EmbedGraph, summed: Tensor) -> Tensor:
    return summed if g.pos is None else summed + g.pos.detach()


def embed_backward(g: EmbedGraph, g_y: Tensor) -> dict[str, Tensor]:
    outs, names = [g.lookup], ["wte"]
    if g.pos is not None:
        outs.append(g.pos)
        names.append("wpe")
    got = torch.autograd.grad(outs, [g.params[n] for n in names], [g_y.to(o.dtype) for o in outs])
    return dict(zip(names, got, strict=True))


@dataclass
class HeadGraph:
    """The head on this rank's vocabulary rows: the final norm (replicated), its logits (graph from the norm's
    output and the weight shard) and the vocab-parallel cross-entropy's pieces, filled in by the collectives."""

    x: Tensor                 # the input (a leaf)
    params: dict[str, Tensor]  # leaves (the norm; the head's rows unless tied)
    weight: Tensor            # this rank's rows of the head (or of the tied table): a leaf
    hn: Tensor                # the final norm's output (graph from x)
    hn_leaf: Tensor
    logits: Tensor            # this rank's logits (graph from hn_leaf, weight)
    targets: Tensor
    first_row: int            # the vocabulary index of this rank's first row
    shifted: Tensor | None = None     # fp32 logits minus the global max
    predicted: Tensor | None = None   # this rank's target logit (0 where the target is another rank's)
    sum_exp: Tensor | None = None     # this rank's sum of exp(shifted)
    loss: Tensor | None = None


def head_forward(d: Dims, place: TpPlace, p: dict[str, Tensor], weight: Tensor, x: Tensor, targets: Tensor
                 ) -> tuple[HeadGraph, Tensor]:
    """The head's compute: the final norm and this rank's logits; returns the graph and the local max of the
    logits per token (collective 0 takes the group's max)."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        hn = _norm(d, p, "norm.", x)
        hnl = hn.detach().requires_grad_(True)
        logits = hnl @ weight.t()
    g = HeadGraph(x, p, weight, hn, hnl, logits, targets, place.rank * weight.shape[0])
    return g, logits.detach().float().amax(dim=-1)


def head_after_max(g: HeadGraph, logits_max: Tensor) -> Tensor:
    """After collective 0: the shifted logits, this rank's exp sums, and its target logits (collective 1)."""
    shifted = g.logits.detach().float() - logits_max.unsqueeze(-1)
    local = g.targets - g.first_row
    mine = (local >= 0) & (local < shifted.shape[-1])
    picked = shifted.gather(-1, local.clamp(0, shifted.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    g.shifted, g.sum_exp = shifted, shifted.exp().sum(dim=-1)
    g.predicted = torch.where(mine, picked, torch.zeros_like(picked))
    return g.predicted


def head_loss(g: HeadGraph, sum_exp: Tensor, predicted: Tensor) -> Tensor:
    """After collectives 1 and 2: the mean cross-entropy over the micro-batch's tokens."""
    g.sum_exp = sum_exp
    g.loss = (sum_exp.log() - predicted).mean()
    return g.loss


def head_backward(g: HeadGraph, scale: float) -> tuple[Tensor, Tensor]:
    """The head's backward compute (local, as Megatron's cross-entropy backward): the logits' gradient
    ``(softmax - one_hot) * scale / tokens`` on this rank's rows; returns the partial gradient of the final
    norm's output (collective 0 sums it) and the weight shard's gradient."""
    assert g.shifted is not None and g.sum_exp is not None
    soft = g.shifted.exp() / g.sum_exp.unsqueeze(-1)
    local = g.targets - g.first_row
    mine = (local >= 0) & (local < soft.shape[-1])
    onehot = torch.zeros_like(soft)
    onehot.scatter_(-1, local.clamp(0, soft.shape[-1] - 1).unsqueeze(-1), mine.unsqueeze(-1).to(soft.dtype))
    grad = (soft - onehot) * (scale / g.targets.numel())
    g_hn, g_w = torch.autograd.grad(g.logits, [g.hn_leaf, g.weight], grad.to(g.logits.dtype))
    return g_hn, g_w


def head_close(g: HeadGraph, g_hn: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """After the backward's collective: the input's gradient and the final norm's parameter gradients."""
    names = [n for n in g.params if n.startswith("norm.")]
    got = torch.autograd.grad(g.hn, [g.x, *(g.params[n] for n in names)], g_hn.to(g.hn.dtype))
    return got[0], dict(zip(names, got[1:], strict=True))


def is_tp_layer(i: int, n_layers: int) -> bool:
    """Layers a tensor-parallel plan splits: every one (embedding and head over the vocabulary, blocks by
    heads and MLP columns); their replicated tensors (norms, biases, positions) join back from rank 0."""
    return 0 <= i < n_layers
