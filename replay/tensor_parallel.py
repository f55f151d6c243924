"""Megatron-style tensor parallelism for the replay: one rank's shards of the model and the pieces of a
layer's forward and backward between the all-reduces of its tensor-parallel group.

A plan with ``tp > 1`` (``policies.kit.tp_sync``) closes each layer's forward, recomputation and backward
with one collective over the layer's tensor-parallel group (phase ``tp-fwd`` / ``tp-recompute`` /
``tp-bwd``). The replay runs the layers as Megatron-LM does (Shoeybi et al. 2019, "Megatron-LM", §3):

- a block: attention with the query/key/value projections split by heads (column-parallel: each rank
  ``n_heads / tp`` heads, ``n_kv_heads / tp`` key/value heads) and the output projection split by its
  input columns (row-parallel); the MLP with ``gate``/``up`` column-parallel and ``down`` row-parallel;
  norms and the row-parallel biases replicated. Forward: attention's partial output is summed over the
  group (all-reduce 1), then the MLP's (all-reduce 2). Backward: the gradient of the MLP's input (the
  second norm's output) is summed (all-reduce 1), then that of attention's input (the first norm's
  output, all-reduce 2), each before the norm's backward, so every rank holds the full gradient of the
  replicated norms.
- the embedding: vocab-parallel (rank j looks up the tokens of its ``vocab / tp`` rows, zeros elsewhere;
  one all-reduce sums them), positions replicated and added after the sum. With tied embeddings the
  replicated head needs the whole table, so every rank holds it, looks every token up (its gradient is
  then the whole table's on each rank, as the reference's) and the all-reduce carries rank 0's lookup
  (the others contribute zeros: the sum is exact).
- the head: replicated. The plan gives it no tensor-parallel collective, and a vocab-parallel head needs
  them (Megatron's parallel cross-entropy: three all-reduces forward, one of the input gradient backward),
  so each rank computes the whole head.

Where the plan's tasks fall short (each layer's two all-reduces are one task after its compute; the
embedding's backward has an all-reduce Megatron does not; a gradient's consumers wait for the backward
only, not for the all-reduce that completes the norms' gradients), the runner follows ``Store``:
all-reduce 1 runs inside the compute task (on a process group of its own, ``inner_stream``), all-reduce 2
is the plan's task, the embedding's backward all-reduce sums a zero buffer of the plan's size, and a
layer's gradients are handed on only once its ``tp-bwd`` task has completed them. docs/replay_tp.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from replay.errors import ReplayError
from replay.model import NORM_EPS, Dims, causal_attention
from replay.precision import linear

INNER = "/inner"  # suffix of the process group of the all-reduces inside a compute task
COLUMN = ("q.", "k.", "v.", "gate.", "up.")  # split by output rows (weight and bias)
ROW = ("o.weight", "down.weight")            # split by input columns


def inner_stream(stream: str) -> str:
    """The process group name of the all-reduces a tensor-parallel stream's layers run inside compute tasks."""
    return stream + INNER


@dataclass(frozen=True)
class TpPlace:
    """Rank ``rank`` of a tensor-parallel group of ``world``; ``vocab_parallel``: the embedding is split."""

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
    if not d.tied and d.vocab % tp:
        raise ReplayError(f"tensor parallelism tp={tp}: the vocabulary of {d.vocab} does not split over {tp} ranks "
                          "(vocab-parallel embedding); replay a model whose vocab is a multiple of tp")


def shard_dim(layer: int, n_layers: int, name: str, vocab_parallel: bool) -> int | None:
    """The dimension along which a parameter is split over the ranks (None: replicated)."""
    if layer == 0:
        return 0 if name == "wte" and vocab_parallel else None
    if layer == n_layers - 1:
        return None
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


Reduce = Callable[[Tensor], Tensor]  # the sum over the group of a tensor (a real all-reduce)


@dataclass
class BlockGraph:
    """One rank's forward of a block up to its closing all-reduce, as autograd pieces split at the sums."""

    x: Tensor                  # the input (a leaf)
    params: dict[str, Tensor]  # leaves
    h1: Tensor                 # first norm's output (graph from x)
    h1_leaf: Tensor
    a_part: Tensor             # this rank's attention output (graph from h1_leaf)
    a_leaf: Tensor             # the summed attention output
    x1: Tensor                 # x + a + o.bias (graph from x, a_leaf)
    h2: Tensor                 # second norm's output (graph from x1)
    h2_leaf: Tensor
    m_part: Tensor             # this rank's MLP output (graph from h2_leaf): all-reduce 2 sums it


def block_forward(d: Dims, p: dict[str, Tensor], x: Tensor, reduce: Reduce, grad: bool) -> BlockGraph:
    """A block's forward on this rank's shards up to all-reduce 2 (all-reduce 1 runs here, by ``reduce``)."""
    with torch.set_grad_enabled(grad):
        x = x.detach().requires_grad_(grad)
        h1 = _norm(d, p, "ln1.", x)
        h1l = h1.detach().requires_grad_(grad)
        a_part = _attention(d, p, h1l)
        al = reduce(a_part.detach()).requires_grad_(grad)
        x1 = x + al
        if "o.bias" in p:
            x1 = x1 + p["o.bias"]
        h2 = _norm(d, p, "ln2.", x1)
        h2l = h2.detach().requires_grad_(grad)
        m_part = _mlp(d, p, h2l)
    return BlockGraph(x, p, h1, h1l, a_part, al, x1, h2, h2l, m_part)


def block_output(g: BlockGraph, m_sum: Tensor) -> Tensor:
    """The block's output from the summed MLP output (all-reduce 2): x1 + m + down.bias."""
    y = g.x1.detach() + m_sum
    if "down.bias" in g.params:
        y = y + g.params["down.bias"].detach()
    return y


@dataclass
class BlockBackward:
    """A block's backward up to all-reduce 2: the partial gradient of the first norm's output, the input's
    gradient through the residual and the second norm, and every parameter's gradient but the first norm's."""

    g_h1_part: Tensor
    g_x: Tensor
    grads: dict[str, Tensor]


def block_backward(g: BlockGraph, g_y: Tensor, reduce: Reduce) -> BlockBackward:
    """Backward from the output's gradient (replicated) down to all-reduce 2; all-reduce 1 runs here."""
    p = g.params
    grads: dict[str, Tensor] = {}
    mlp = [n for n in p if n.startswith(("gate.", "up.", "down.")) and n != "down.bias"]
    got = torch.autograd.grad(g.m_part, [g.h2_leaf, *(p[n] for n in mlp)], g_y.to(g.m_part.dtype))
    grads.update(zip(mlp, got[1:], strict=True))
    if "down.bias" in p:
        grads["down.bias"] = g_y.sum(dim=(0, 1)).to(p["down.bias"].dtype)
    g_h2 = reduce(got[0])
    mid = [n for n in p if n.startswith("ln2.") or n == "o.bias"]
    got = torch.autograd.grad([g.h2, g.x1], [g.x, g.a_leaf, *(p[n] for n in mid)],
                              [g_h2.to(g.h2.dtype), g_y.to(g.x1.dtype)])
    g_x, g_a = got[0], got[1]
    grads.update(zip(mid, got[2:], strict=True))
    attn = [n for n in p if n.startswith(("q.", "k.", "v.")) or n == "o.weight"]
    got = torch.autograd.grad(g.a_part, [g.h1_leaf, *(p[n] for n in attn)], g_a.to(g.a_part.dtype))
    grads.update(zip(attn, got[1:], strict=True))
    return BlockBackward(got[0], g_x, grads)


def block_backward_close(g: BlockGraph, b: BlockBackward, g_h1: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """After all-reduce 2 (``g_h1``: the summed gradient of the first norm's output): the input's gradient
    and the layer's complete parameter gradients."""
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
        if place.vocab_parallel:
            rows = wte.shape[0]
            local = tokens - place.rank * rows
            keep = (local >= 0) & (local < rows)
            lookup = F.embedding(local.clamp(0, rows - 1), wte) * keep.unsqueeze(-1).to(wte.dtype)
            contrib = lookup.detach()
        else:
            lookup = F.embedding(tokens, wte)
            contrib = lookup.detach() if place.rank == 0 else torch.zeros_like(lookup.detach())
        pos = None
        if "wpe" in p:
            idx = torch.arange(tokens.shape[1], device=tokens.device) + d.pos_offset
            pos = F.embedding(idx, p["wpe"]).expand_as(lookup)
    return EmbedGraph(p, lookup, contrib, pos)


def embed_output(g: EmbedGraph, summed: Tensor) -> Tensor:
    return summed if g.pos is None else summed + g.pos.detach()


def embed_backward(g: EmbedGraph, g_y: Tensor) -> dict[str, Tensor]:
    outs, names = [g.lookup], ["wte"]
    if g.pos is not None:
        outs.append(g.pos)
        names.append("wpe")
    got = torch.autograd.grad(outs, [g.params[n] for n in names], [g_y.to(o.dtype) for o in outs])
    return dict(zip(names, got, strict=True))


def is_tp_layer(i: int, n_layers: int) -> bool:
    """Layers a tensor-parallel plan splits: the embedding and the blocks (the head is replicated)."""
    return i < n_layers - 1

