"""The real training state a replay mutates, and the operations a plan's tasks map to.

A layer-by-layer forward and backward over ``replay.model``'s module list with explicit saved inputs:
the forward stores each layer's input (and keeps its autograd graph only where the plan has no
recomputation for the layer); a recomputation rebuilds the graph from the saved input; the backward
uses that graph (or rebuilds it) and calls autograd with the upstream gradient. Parameters are explicit
tensors passed through ``torch.func.functional_call``:

- every layer has *versions* of its parameters on the compute device (version k = after k optimizer
  steps); a forward uses the version its plan dependencies name (an upload or an on-device optimizer
  step), and the layer's recomputation and backward of that micro-step use the same version, so a
  delayed update computes exactly what its plan says even while the next version is being uploaded;
- the *master* parameters and one ``torch.optim.Adam`` per layer live where the plan's optimizer tasks
  for that layer run (``cpu`` for ZeRO-Offload, the GPU for ``none``);
- gradients are held per (location, layer, step, micro-step) and move only with the plan's copies; an
  optimizer step sums a step's micro-steps in order (what ``.grad`` accumulation does), and where the
  optimizer runs in host memory each micro-step's copy is added to the earlier ones' as it arrives (the same
  sum, in the same order: ``Store._fold_target``).

Every method raises ReplayError naming the task when the data it needs is not where the plan put it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from replay.data import batch
from replay.errors import ReplayError
from replay.model import Dims
from replay.nvme_files import NvmeFile
from replay.pools import Held, Pools
from replay.precision import Precision
from replay.tensor_parallel import (
    BlockGraph,
    EmbedGraph,
    HeadGraph,
    TpPlace,
    block_attention,
    block_backward_attention,
    block_backward_close,
    block_backward_mlp,
    block_mlp,
    block_output,
    embed_backward,
    embed_forward,
    embed_output,
    head_after_max,
    head_backward,
    head_close,
    head_forward,
    head_loss,
    local_dims,
)

LR = 1e-3
KEEP_VERSIONS = 3  # parameter versions kept per layer besides those in use (a delayed update lags by 2)
# fused: one kernel per step over all of a layer's tensors (what DeepSpeed's CPU Adam and `tiersim calibrate`
# measure); the reference (replay.reference) uses the same, so a replay and its reference compute alike
ADAM = {"lr": LR, "betas": (0.9, 0.999), "eps": 1e-8, "fused": True}


def _host_copy(t: Tensor, dev: torch.device, pin: bool) -> Tensor:
    """A copy of ``t`` on ``dev``, page-locked when ``pin`` (a host master of a CUDA replay)."""
    out = t.to(dev, copy=True)
    return out.pin_memory() if pin else out


@dataclass
class Graph:
    x: Tensor | None            # the layer input as an autograd leaf (None for the embedding)
    params: dict[str, Tensor]   # parameter leaves
    wte: Tensor | None          # the tied embedding matrix as a leaf (head with tied embeddings)
    out: Tensor


@dataclass
class Saved:
    x: Tensor                   # layer input (token ids for the embedding)
    version: int                # parameter version the forward used
    wte_version: int | None     # head with tied embeddings: the embedding's version
    graph: Graph | None = None
    tp: BlockGraph | EmbedGraph | HeadGraph | None = None  # a tensor-parallel layer's pieces (replay.tensor_parallel)
    a_sum: Tensor | None = None  # a tp block's summed attention output (recomputed without collectives)


@dataclass(frozen=True)
class Batching:
    seed: int
    micro_batch: int
    seq_len: int
    precision: str = "fp32"  # the plan's; layers compute in it (replay.precision)


@dataclass(frozen=True)
class Sharding:
    """This rank's place among the ranks of a multi-rank replay, and the layers whose gradients, master
    parameters and optimizer states are partitioned (ZeRO: the layers the plan reduce-scatters)."""

    rank: int = 0
    world: int = 1
    layers: frozenset[int] = frozenset()


class Store:
    def __init__(self, dims: Dims, layers: list[nn.Module], compute_loc: str, master_loc: list[str],
                 pools: Pools, batching: Batching, sharding: Sharding | None = None, tp: TpPlace | None = None):
        self.dims = dims
        self.sharding = sharding or Sharding()
        self.tp = tp or TpPlace(0, 1, False)
        self.tp_dims = local_dims(dims, self.tp.world)
        self.tp_comm: tuple[Any, str] | None = None  # comm, the group's stream (tp_link)
        # a tensor-parallel layer's pieces between its parts and collectives, by (kind, step, micro-step, layer)
        self.tp_pending: dict[tuple[str, int, int, int], Any] = {}
        self.tp_head_grad: dict[tuple[int, int, int], Tensor] = {}
        self.tp_done: dict[tuple[int, int, int], threading.Event] = {}
        self.tp_rc_layers: frozenset[int] = frozenset()  # layers whose recomputation has collectives
        self.abort: threading.Event | None = None
        self.names = [[n for n, _ in m.named_parameters()] for m in layers]
        self.shapes = [{n: p.shape for n, p in m.named_parameters()} for m in layers]
        self.numel = [sum(p.numel() for p in m.parameters()) for m in layers]
        self.pending: dict[int, list[tuple[int, dict[str, Tensor]]]] = {}  # uploaded shards awaiting a gather
        self.reduced: set[tuple[str, int, int, int]] = set()
        self.layers = [m.to(pools.device) for m in layers]
        self.compute_loc = compute_loc
        self.master_loc = master_loc
        self.pools = pools
        self.batching = batching
        self.precision = Precision(batching.precision, pools.device.type)
        self.lock = threading.Lock()
        self.versions: list[dict[int, dict[str, Tensor]]] = []
        self.latest: list[int] = []
        self.master: list[dict[str, nn.Parameter]] = []
        self.optim: list[torch.optim.Adam | None] = []
        self.master_version: list[int] = []
        for i, m in enumerate(self.layers):
            params = {n: p.detach().clone() for n, p in m.named_parameters()}
            if i in self.sharding.layers:  # a partitioned layer's versions are gathered in 16 bits (gather_params)
                params = {n: self.precision.working_params(p) for n, p in params.items()}
            self.versions.append({0: params})
            self.latest.append(0)
            dev = pools.torch_device(master_loc[i])
            if master_loc[i] == "nvme":
                raise ReplayError(f"layer {i}: optimizer on nvme is not supported by replay yet")
            # host masters of a CUDA replay in page-locked memory, as DeepSpeed's CPU optimizer keeps them: a copy
            # from pageable memory goes through a staging buffer at a fraction of the link's rate
            pin = pools.pin and dev.type == "cpu"
            if i in self.sharding.layers:  # this rank's contiguous shard of the layer's flat parameters
                lo, hi = self.shard_range(i)
                flat = self.flat(i, {n: p.detach() for n, p in m.named_parameters()})
                mp = {"flat": nn.Parameter(_host_copy(flat[lo:hi], dev, pin))}
            else:
                mp = {n: nn.Parameter(_host_copy(p.detach(), dev, pin)) for n, p in m.named_parameters()}
            self.master.append(mp)
            self.optim.append(torch.optim.Adam(list(mp.values()), **ADAM) if mp else None)  # type: ignore[arg-type]
            self.master_version.append(0)
        self.outputs: dict[tuple[int, int, int], Tensor] = {}
        self.saved: dict[tuple[int, int, int], Saved] = {}
        self.upstream: dict[tuple[int, int, int], Tensor] = {}
        self.tied_grad: dict[tuple[int, int], Tensor] = {}
        self.grads: dict[tuple[str, int, int, int], Held] = {}
        # an entry of ``grads`` -> the last micro-step summed into it (absent: its own; ``_fold_target``)
        self.grad_upto: dict[tuple[str, int, int, int], int] = {}
        self.losses: dict[tuple[int, int], float] = {}
        self.produced: dict[str, dict[int, int]] = {}
        self.buffers: dict[tuple[str, str], Held] = {}

    @property
    def own_table(self) -> bool:
        """Does the head hold its own copy of the tied table (its pipeline stage is not the embedding's)?"""
        return self.dims.tied and "wte" in self.names[self.head]

    @property
    def head(self) -> int:
        return len(self.layers) - 1

    def global_micro(self, m: int) -> int:
        """The data batch of this rank's micro-step m: micro-step m of every rank is one wave of ``world``
        consecutive batches (rank r takes batch ``m * world + r``; the reference trains on the same)."""
        return m * self.sharding.world + self.sharding.rank

    # -- flat buffers (collectives and partitions) -----------------------------------------------------
    def flat(self, i: int, params: dict[str, Tensor]) -> Tensor:
        """Layer i's tensors as one flat buffer in parameter order, padded to a multiple of the ranks."""
        world = self.sharding.world
        pad = -(-self.numel[i] // world) * world - self.numel[i]
        parts = [params[n].reshape(-1) for n in self.names[i]]
        if pad:
            parts.append(torch.zeros(pad, dtype=parts[0].dtype, device=parts[0].device))
        return torch.cat(parts)

    def unflat(self, i: int, flat: Tensor) -> dict[str, Tensor]:
        out, k = {}, 0
        for n in self.names[i]:
            size = self.shapes[i][n].numel()
            out[n] = flat[k:k + size].view(self.shapes[i][n])
            k += size
        return out

    def shard_range(self, i: int) -> tuple[int, int]:
        size = -(-self.numel[i] // self.sharding.world)
        return self.sharding.rank * size, (self.sharding.rank + 1) * size

    # -- compute ---------------------------------------------------------------------------------------
    def _call(self, i: int, params: dict[str, Tensor], x: Tensor, key: tuple[int, int, int],
              wte: Tensor | None) -> Tensor:
        if i == self.head:
            s, m, _ = key
            _, targets = batch(self.batching.seed, s, self.global_micro(m), self.batching.micro_batch,
                               self.batching.seq_len, self.dims.vocab)
            with self.precision.autocast():
                if wte is None and self.own_table:  # the head's own copy of the tied table (another stage)
                    wte = params["wte"]
                return functional_call(self.layers[i], params, (x, targets.to(x.device), wte))
        with self.precision.autocast():
            return functional_call(self.layers[i], params, (x,))

    def _graph(self, i: int, saved: Saved, key: tuple[int, int, int]) -> Graph:
        params = {n: p.detach().requires_grad_(True) for n, p in self.versions[i][saved.version].items()}
        x = saved.x.detach().requires_grad_(True) if i > 0 else None
        wte = None
        if i == self.head and self.dims.tied and not self.own_table:
            assert saved.wte_version is not None
            wte = self.versions[0][saved.wte_version]["wte"].detach().requires_grad_(True)
        with torch.enable_grad():
            out = self._call(i, params, x if x is not None else saved.x, key, wte)
        return Graph(x, params, wte, out)

    def _layer_input(self, uid: str, key: tuple[int, int, int], missing: str) -> Tensor:
        """Layer i's input: the micro-batch's tokens for the embedding, else layer i - 1's output (taken)."""
        s, m, i = key
        if i == 0:
            tokens, _ = batch(self.batching.seed, s, self.global_micro(m), self.batching.micro_batch,
                              self.batching.seq_len, self.dims.vocab)
            return tokens.to(self.pools.device)
        with self.lock:
            got = self.outputs.pop((s, m, i - 1), None)
        if got is None:
            raise ReplayError(f"task {uid!r}: the input of layer {i} (output of layer {i - 1}, step {s}, "
                              f"micro-step {m}) is not there: {missing}")
        return got

    def _forward_input(self, uid: str, key: tuple[int, int, int], version: int, missing: str) -> Saved:
        """What a layer's forward starts from (the whole layer's and a tp shard's): its input, the parameter
        version it uses (still held) and, for a tied head on the embedding's stage, the embedding's version."""
        s, m, i = key
        x = self._layer_input(uid, key, missing)
        if version not in self.versions[i]:
            raise ReplayError(f"task {uid!r}: uses version {version} of layer {i}'s parameters, which is no longer "
                              f"held (the runner keeps the last {KEEP_VERSIONS})")
        wte_version = None
        if i == self.head and self.dims.tied and not self.own_table:
            emb = self.saved.get((s, m, 0))
            if emb is None:
                raise ReplayError(f"task {uid!r}: the tied head needs the embedding of step {s}, micro-step {m}")
            wte_version = emb.version
        return Saved(x, version, wte_version)

    def forward(self, uid: str, key: tuple[int, int, int], version: int, keep_graph: bool, part: int = 0) -> None:
        s, m, i = key
        if self.tp.active:
            self._tp_forward(uid, key, version, keep_graph, part)
            return
        saved = self._forward_input(uid, key, version, "that layer's forward has not run")
        if keep_graph:
            saved.graph = self._graph(i, saved, key)
            out = saved.graph.out
        else:
            wv = saved.wte_version
            wte = self.versions[0][wv]["wte"] if wv is not None else None
            with torch.no_grad():
                out = self._call(i, self.versions[i][version], saved.x, key, wte)
        with self.lock:
            self.saved[key] = saved
            if i == self.head:
                self.losses[(s, self.global_micro(m))] = float(out.detach())
            else:
                self.outputs[key] = out.detach()

    def _saved(self, uid: str, key: tuple[int, int, int], pop: bool) -> Saved:
        with self.lock:
            saved = self.saved.pop(key, None) if pop else self.saved.get(key)
        if saved is None:
            s, m, i = key
            raise ReplayError(f"task {uid!r}: the saved activations of layer {i} (step {s}, micro-step {m}) "
                              "are not there: its forward has not run or they were already freed")
        return saved

    def recompute(self, uid: str, key: tuple[int, int, int], part: int = 0) -> None:
        saved = self._saved(uid, key, pop=False)
        if self.tp.active:
            self._tp_recompute(uid, key, saved, part)
            return
        saved.graph = self._graph(key[2], saved, key)

    def backward(self, uid: str, key: tuple[int, int, int], accum: int, loc: str, part: int = 0) -> None:
        s, m, i = key
        if self.tp.active:
            self._tp_backward(uid, key, accum, loc, part)
            return
        saved = self._saved(uid, key, pop=True)
        g = saved.graph if saved.graph is not None else self._graph(i, saved, key)
        if i == self.head:
            # what (loss * scale / accum).backward() feeds in (scale: replay.precision, fp16 only)
            grad_out = torch.full_like(g.out, self.precision.loss_scale / accum)
        else:
            with self.lock:
                got = self.upstream.pop(key, None)
            if got is None:
                raise ReplayError(f"task {uid!r}: the gradient of layer {i}'s output (step {s}, micro-step {m}) "
                                  f"is not there: the backward of layer {i + 1} has not run")
            grad_out = got
        names = list(g.params)
        inputs = ([g.x] if g.x is not None else []) + [g.params[n] for n in names] + ([g.wte] if g.wte is not None
                                                                                      else [])
        grads = torch.autograd.grad(g.out, inputs, grad_out, allow_unused=True)
        k = 0
        if g.x is not None:
            with self.lock:
                self.upstream[(s, m, i - 1)] = grads[0]
            k = 1
        pg = {n: (gr if gr is not None else torch.zeros_like(g.params[n])) for n, gr in zip(names, grads[k:],
                                                                                           strict=False)}
        with self.lock:
            if g.wte is not None:
                self.tied_grad[(s, m)] = grads[-1]
            if i == 0 and self.dims.tied:
                extra = self.tied_grad.pop((s, m), None)
                if extra is not None:
                    pg["wte"].add_(extra)  # as autograd's AccumulateGrad sums the two contributions: in place
            self.grads[(loc, i, s, m)] = pg

    # -- tensor parallelism (replay.tensor_parallel) ------------------------------------------------------
    def tp_link(self, comm: Any, stream: str) -> None:
        """The tensor-parallel group this rank belongs to: the communicator and the group's plan stream."""
        self.tp_comm = (comm, stream)

    def _all_reduce(self, t: Tensor, op: str = "sum") -> Tensor:
        """The group's sum (or max) of ``t`` (a real all-reduce, in fp32), in ``t``'s dtype."""
        if self.tp_comm is None:
            raise ReplayError("a tensor-parallel layer without its group (replay.runner links it)")
        comm, stream = self.tp_comm
        flat = t.detach().to(torch.float32).contiguous().clone()
        comm.all_reduce(flat, stream, op)
        return flat.to(t.dtype)

    def _tp_state(self, uid: str, kind: str, key: tuple[int, int, int], pop: bool = False) -> Any:
        with self.lock:
            got = self.tp_pending.pop((kind, *key), None) if pop else self.tp_pending.get((kind, *key))
        if got is None:
            s, m, i = key
            what = {"f": "forward", "r": "recomputation", "b": "backward", "max": "logits' max"}.get(kind, kind)
            raise ReplayError(f"task {uid!r}: the tensor-parallel state of layer {i} (step {s}, micro-step {m}, "
                              f"{what}) is not there: the plan runs its parts out of Megatron's order")
        return got

    def _tp_params(self, i: int, version: int, grad: bool) -> dict[str, Tensor]:
        return {n: p.detach().requires_grad_(grad) for n, p in self.versions[i][version].items()}

    def _tp_start(self, uid: str, key: tuple[int, int, int], saved: Saved, grad: bool) -> Any:
        """A tensor-parallel layer's first forward part (compute): the embedding's lookup, a block's attention,
        the head's logits (with their local max, which the first collective reduces)."""
        i = key[2]
        params = self._tp_params(i, saved.version, grad or i == self.head)
        with self.precision.autocast():
            if i == 0:
                return embed_forward(self.dims, self.tp, params, saved.x, grad)
            if i < self.head:
                return block_attention(self.tp_dims, params, saved.x, grad)
            s, m, _ = key
            if self.own_table:
                weight = params["wte"]
            elif self.dims.tied:
                assert saved.wte_version is not None
                weight = self.versions[0][saved.wte_version]["wte"].detach().requires_grad_(True)
            else:
                weight = params["lm"]
            _, targets = batch(self.batching.seed, s, self.global_micro(m), self.batching.micro_batch,
                               self.batching.seq_len, self.dims.vocab)
            return head_forward(self.dims, self.tp, params, weight, saved.x, targets.to(saved.x.device))

    def _tp_forward(self, uid: str, key: tuple[int, int, int], version: int, keep_graph: bool, part: int) -> None:
        """A tensor-parallel layer's forward compute part (module docstring of replay.tensor_parallel)."""
        s, m, i = key
        if part == 1:  # a block's MLP, after collective 0
            g = self._tp_state(uid, "f", key)
            with self.precision.autocast():
                block_mlp(self.tp_dims, g, g.a_leaf)
            return
        saved = self._forward_input(uid, key, version, "that layer's forward (and its tp-fwd) has not run")
        got = self._tp_start(uid, key, saved, grad=keep_graph)
        g, local_max = got if i == self.head else (got, None)
        if keep_graph or i == self.head:
            saved.tp = g
        with self.lock:
            self.saved[key] = saved
            self.tp_pending[("f", *key)] = g
            if local_max is not None:
                self.tp_pending[("max", *key)] = local_max

    def _tp_recompute(self, uid: str, key: tuple[int, int, int], saved: Saved, part: int) -> None:
        if part == 1:
            g = self._tp_state(uid, "r", key)
            with self.precision.autocast():
                block_mlp(self.tp_dims, g, g.a_leaf)
            return
        g = self._tp_start(uid, key, saved, grad=True)
        saved.tp = g
        if isinstance(g, BlockGraph) and key[2] not in self.tp_rc_layers:
            # selective recomputation reruns no collective: the forward's summed attention output is reused
            if saved.a_sum is None:
                raise ReplayError(f"task {uid!r}: recomputes block {key[2]} without its all-reduces, but its "
                                  "forward kept no summed attention output")
            with self.precision.autocast():
                block_mlp(self.tp_dims, g, saved.a_sum)
            return
        with self.lock:
            self.tp_pending[("r", *key)] = g

    def _tp_backward(self, uid: str, key: tuple[int, int, int], accum: int, loc: str, part: int) -> None:
        s, m, i = key
        if part == 1:  # a block's attention backward, after collective 0
            g, bb, _ = self._tp_state(uid, "b", key)
            with self.precision.autocast():
                block_backward_attention(g, bb, bb.part)
            return
        saved = self._saved(uid, key, pop=True)
        g = saved.tp
        if g is None:
            raise ReplayError(f"task {uid!r}: the backward of tensor-parallel layer {i} (step {s}, micro-step {m}) "
                              "has no graph: the plan neither keeps its activations nor recomputes it")
        if isinstance(g, HeadGraph):
            g_hn, g_w = head_backward(g, self.precision.loss_scale / accum)
            with self.lock:
                self.tp_pending[("b", *key)] = (g, g_hn, loc)
                if self.dims.tied and not self.own_table:
                    self.tied_grad[(s, m)] = g_w
                else:
                    self.tp_head_grad[key] = g_w
                self.tp_done[(i, s, m)] = threading.Event()
            return
        with self.lock:
            got = self.upstream.pop(key, None)
        if got is None:
            raise ReplayError(f"task {uid!r}: the gradient of layer {i}'s output (step {s}, micro-step {m}) "
                              f"is not there: the backward of layer {i + 1} has not run")
        if isinstance(g, EmbedGraph):  # local (Megatron's vocab-parallel embedding has no backward collective)
            pg = embed_backward(g, got)
            with self.lock:
                extra = self.tied_grad.pop((s, m), None) if self.dims.tied else None
                if extra is not None:
                    pg["wte"] = extra + pg["wte"]
                self.grads[(loc, i, s, m)] = pg
            return
        bb = block_backward_mlp(g, got)
        with self.lock:
            self.tp_done[(i, s, m)] = threading.Event()
            self.tp_pending[("b", *key)] = (g, bb, loc)

    def tp_close(self, uid: str, phase: str, key: tuple[int, int, int], part: int) -> int:
        """A tensor-parallel collective of the plan (``part``: its index in the layer's use; module docstring of
        replay.tensor_parallel); returns the real bytes it reduced."""
        s, m, i = key
        if phase == "b":
            return self._tp_close_backward(uid, key, part)
        g = self._tp_state(uid, phase, key)
        if isinstance(g, HeadGraph):
            return self._tp_close_head(uid, key, g, part)
        last = isinstance(g, EmbedGraph) or part == 1
        if not last:  # a block's attention output
            g.a_leaf = self._all_reduce(g.a_part)
            if phase == "f" and i not in self.tp_rc_layers:
                self._saved(uid, key, pop=False).a_sum = g.a_leaf.detach()
            return g.a_leaf.numel() * 4
        self._tp_state(uid, phase, key, pop=True)
        part_sum = g.contrib if isinstance(g, EmbedGraph) else g.m_part
        summed = self._all_reduce(part_sum)
        if phase == "f":
            out = embed_output(g, summed) if isinstance(g, EmbedGraph) else block_output(g, summed)
            with self.lock:
                self.outputs[key] = out.detach()
        return summed.numel() * 4

    def _tp_close_head(self, uid: str, key: tuple[int, int, int], g: HeadGraph, part: int) -> int:
        s, m, _ = key
        if part == 0:
            got = self._all_reduce(self._tp_state(uid, "max", key, pop=True), "max")
            head_after_max(g, got)
            return got.numel() * 4
        if part == 1:
            assert g.predicted is not None
            g.predicted = self._all_reduce(g.predicted)
            return g.predicted.numel() * 4
        assert g.sum_exp is not None and g.predicted is not None
        loss = head_loss(g, self._all_reduce(g.sum_exp), g.predicted)
        self._tp_state(uid, "f", key, pop=True)
        with self.lock:
            self.losses[(s, self.global_micro(m))] = float(loss)
        return g.sum_exp.numel() * 4

    def _tp_close_backward(self, uid: str, key: tuple[int, int, int], part: int) -> int:
        s, m, i = key
        state = self._tp_state(uid, "b", key)
        if isinstance(state[0], HeadGraph):
            g, g_hn, loc = state
            summed = self._all_reduce(g_hn)
            g_x, pg = head_close(g, summed)
            with self.lock:
                w = self.tp_head_grad.pop(key, None)
            if w is not None:
                pg["wte" if self.own_table else "lm"] = w
            pg = {n: pg[n] for n in g.params}
            self._tp_finish(uid, key, g_x, pg, loc)
            return summed.numel() * 4
        g, bb, loc = state
        summed = self._all_reduce(bb.part)
        if part == 0:  # the gradient of the MLP's input
            bb.part = summed
            return summed.numel() * 4
        g_x, pg = block_backward_close(g, bb, summed)
        self._tp_finish(uid, key, g_x, pg, loc)
        return summed.numel() * 4

    def _tp_finish(self, uid: str, key: tuple[int, int, int], g_x: Tensor, pg: dict[str, Tensor], loc: str) -> None:
        """A layer's backward completed by its last collective: the input's gradient and the layer's gradients."""
        s, m, i = key
        self._tp_state(uid, "b", key, pop=True)
        with self.lock:
            self.upstream[(s, m, i - 1)] = g_x
            self.grads[(loc, i, s, m)] = pg
            self.tp_done[(i, s, m)].set()
            for old in [k for k in self.tp_done if k[1] < s - 1]:  # two steps back: every consumer has run
                del self.tp_done[old]

    def _tp_wait(self, uid: str, i: int, step: int, micro: int | None) -> None:
        """Wait until the tp-bwd tasks of layer i (step, micro-step or all of the step's) completed its
        gradients: the plan's consumers of a gradient wait for the backward only (replay.tensor_parallel)."""
        if not self.tp.active:
            return
        with self.lock:
            evs = [e for (j, s, m), e in self.tp_done.items() if j == i and s == step and micro in (None, m)]
        for ev in evs:
            while not ev.wait(0.2):
                if self.abort is not None and self.abort.is_set():
                    raise ReplayError(f"task {uid!r}: stopped while waiting for layer {i}'s tensor-parallel "
                                      "gradients")

    # -- optimizer -------------------------------------------------------------------------------------
    def optimizer(self, uid: str, loc: str, layers: list[int], step: int, n_micro: int) -> None:
        made: dict[int, int] = {}
        for i in layers:
            if self.master_loc[i] != loc:
                raise ReplayError(f"task {uid!r}: updates layer {i} on {loc!r}, but its master parameters and "
                                  f"optimizer states are on {self.master_loc[i]!r}")
            total: dict[str, Tensor] | None = None
            self._tp_wait(uid, i, step, None)
            m = 0
            while m < n_micro:
                with self.lock:
                    held = self.grads.pop((loc, i, step, m), None)
                    upto = self.grad_upto.pop((loc, i, step, m), m)
                if held is None:
                    raise ReplayError(f"task {uid!r}: the gradients of layer {i} (step {step}, micro-step {m}) "
                                      f"are not on {loc!r} where this optimizer step runs")
                g = self.pools.get(held, loc)
                self.pools.drop(held)
                if total is None:
                    total = dict(g)  # popped above: this step's gradients belong to this optimizer task
                else:  # what .grad accumulation does, in place
                    for n in total:
                        total[n].add_(g[n])
                    self.pools.recycle(g)
                m = upto + 1
            opt = self.optim[i]
            if opt is None:
                continue
            if total is not None:
                self.precision.unscale(total, f"task {uid!r}: layer {i}, step {step}")
            sharded = i in self.sharding.layers
            if loc == self.compute_loc and not sharded:
                self._release_alias(i)
            for n, p in self.master[i].items():
                p.grad = total[n] if total is not None else torch.zeros_like(p)
            opt.step()
            for p in self.master[i].values():
                p.grad = None
            self.pools.recycle(total)
            with self.lock:
                self.master_version[i] += 1
                v = self.master_version[i]
                if not sharded:  # a shard is no version: the parameter gather makes it (gather_params)
                    made[i] = v
                if loc == self.compute_loc and not sharded:  # the new version IS the master until the next step
                    self._store_version(i, v, {n: p.detach() for n, p in self.master[i].items()})
        with self.lock:
            self.produced[uid] = made

    def _release_alias(self, i: int) -> None:
        """Before layer i's master is updated in place on the compute device: its current version (which
        aliases the master) keeps its values -- the master moves to a copy if saved activations still use
        that version (their graphs hold its storage), else the version is dropped (nothing uses it)."""
        with self.lock:
            cur = self.master_version[i]
            held = self.versions[i].get(cur)
            first = next(iter(self.master[i].values()), None)
            if held is None or first is None or next(iter(held.values())).data_ptr() != first.data_ptr():
                return  # that version is a copy (an upload, or made before the run): nothing aliases the master
            used = {sv.version for (_, _, j), sv in self.saved.items() if j == i}
            if i == 0:
                used |= {sv.wte_version for sv in self.saved.values() if sv.wte_version is not None}
            if cur in used:
                for p in self.master[i].values():
                    p.data = p.data.clone()
            else:
                del self.versions[i][cur]

    def _store_version(self, i: int, v: int, params: dict[str, Tensor]) -> None:
        """Under the lock: keep version v of layer i, dropping versions no saved activation uses any more."""
        master = {p.data_ptr() for p in self.master[i].values()}

        def retire(dropped: dict[str, Tensor] | None) -> None:
            # an upload's buffers (not the master's own): back to the pools once nothing uses them, so the next
            # upload writes into mapped memory (a fresh buffer of a 50k-token table faulted in for 2-3 s, 2 at once)
            if dropped is not None and dropped is not params and not any(t.data_ptr() in master
                                                                         for t in dropped.values()):
                self.pools.retire(dropped)

        retire(self.versions[i].get(v))  # the same version uploaded again (tinypipe: for each micro-step)
        self.versions[i][v] = params
        self.latest[i] = max(self.latest[i], v)
        used = {sv.version for (_, _, j), sv in self.saved.items() if j == i}
        if i == 0:
            used |= {sv.wte_version for sv in self.saved.values() if sv.wte_version is not None}
        for old in [k for k in self.versions[i] if k not in used and k < self.latest[i] - KEEP_VERSIONS + 1]:
            retire(self.versions[i].pop(old))

    # -- copies ----------------------------------------------------------------------------------------
    def upload(self, uid: str, layer: int, src: str, dst: str) -> int:
        if self.master_loc[layer] != src:
            raise ReplayError(f"task {uid!r}: copies layer {layer}'s parameters from {src!r}, but they are "
                              f"updated on {self.master_loc[layer]!r}")
        if dst != self.compute_loc:
            raise ReplayError(f"task {uid!r}: uploads layer {layer}'s parameters to {dst!r}, which is not the "
                              f"GPU that computes ({self.compute_loc!r})")
        with self.lock:
            v = self.master_version[layer]
            params = {n: p.detach() for n, p in self.master[layer].items()}
        moved = self.pools.put(dst, params, f"param{layer}.v{v}")
        assert isinstance(moved, dict)
        with self.lock:
            if layer in self.sharding.layers:  # a shard: the parameter gather that follows makes the version
                self.pending.setdefault(layer, []).append((v, moved))
                return Pools.nbytes(moved)
            self._store_version(layer, v, moved)
            self.produced.setdefault(uid, {})[layer] = v  # a pack's upload makes a version of each layer
        return Pools.nbytes(moved)

    def move_grads(self, uid: str, layer: int, step: int, micro: int | None, src: str, dst: str) -> int:
        """Move one micro-step's gradients of ``layer``; ``micro`` None: every micro-step's held on ``src``
        (a copy after the step's last backward, of gradients accumulated where they were made)."""
        self._tp_wait(uid, layer, step, micro)
        if micro is None:
            with self.lock:
                held_micro = sorted(m for (loc, i, s, m) in self.grads if (loc, i, s) == (src, layer, step))
            if not held_micro:
                raise ReplayError(f"task {uid!r}: copies the gradients of layer {layer} (step {step}) from "
                                  f"{src!r}, but none are there")
            return sum(self.move_grads(uid, layer, step, m, src, dst) for m in held_micro)
        with self.lock:
            held = self.grads.pop((src, layer, step, micro), None)
        if held is None:
            raise ReplayError(f"task {uid!r}: copies the gradients of layer {layer} (step {step}, micro-step "
                              f"{micro}) from {src!r}, but they are not there")
        tensors = self.pools.get(held, src)  # in memory: the held tensors themselves
        moved = self.pools.put(dst, tensors, f"grad{layer}.s{step}.m{micro}")
        self.pools.recycle(held)
        if isinstance(held, NvmeFile):
            self.pools.recycle(tensors)  # read from the file for this copy only
        with self.lock:
            upto = self.grad_upto.pop((src, layer, step, micro), micro)
            into = self._fold_target(dst, layer, step, micro)
            if into is None:
                self.grads[(dst, layer, step, micro)] = moved
                self.grad_upto[(dst, layer, step, micro)] = upto
        if into is not None:  # accumulated as it arrives, in micro-step order (the optimizer's sum, bit for bit)
            acc = self.grads[into]
            assert isinstance(acc, dict) and isinstance(moved, dict)
            for n in acc:
                acc[n].add_(moved[n])
            self.pools.recycle(moved)
            with self.lock:
                self.grad_upto[into] = upto
        return Pools.nbytes(tensors)

    def _fold_target(self, dst: str, layer: int, step: int, micro: int) -> tuple[str, int, int, int] | None:
        """Under the lock: the entry on ``dst`` that micro-step ``micro``'s gradients of ``layer`` are added to as
        they arrive, or None. Only where the layer's optimizer runs (nothing but its step reads them there), in
        host memory, and only onto the sum of every earlier micro-step (0 .. micro - 1, ``grad_upto``): the
        optimizer's in-order sum then finds one entry, holds one buffer as the plan's gradient buffer (not one
        per micro-step) and does not sum the step's micro-steps on its critical path (zero-offload on one
        H200: 568 ms of host adds in the optimizer tasks against 26.6 priced, docs/calib.md)."""
        if micro == 0 or dst == "nvme" or dst.startswith("gpu") or self.master_loc[layer] != dst:
            return None
        for m0 in range(micro - 1, -1, -1):
            key = (dst, layer, step, m0)
            if key in self.grads:
                return key if self.grad_upto.get(key, m0) == micro - 1 else None
        return None

    def copy_buffer(self, inst: str | None, src: str, dst: str, nbytes: int, free_src: bool) -> int:
        """A copy the store knows no meaning of: moves real bytes (a buffer of the plan's size)."""
        key = inst if inst is not None else f"scratch{nbytes}"
        with self.lock:
            held = self.buffers.get((key, src))
        if held is None:
            held = self.pools.put(src, {"b": torch.zeros(nbytes, dtype=torch.uint8)}, key)
            with self.lock:
                self.buffers[(key, src)] = held
        data = self.pools.get(held, src)  # in memory: the held tensors themselves
        moved = self.pools.put(dst, data, key)
        if isinstance(held, NvmeFile):
            self.pools.recycle(data)  # read from the file for this copy only
        with self.lock:
            if inst is not None:
                old = self.buffers.get((key, dst))
                self.buffers[(key, dst)] = moved
                self.pools.recycle(old)
                if free_src:
                    self.pools.recycle(self.buffers.pop((key, src), None))
            else:
                self.pools.recycle(moved)
        return nbytes

    def drop_buffer(self, inst: str, loc: str) -> None:
        with self.lock:
            self.pools.recycle(self.buffers.pop((inst, loc), None))

    # -- collectives (multi-rank replays; ``comm`` is a replay.dist_comm.Comm) ----------------------------
    def reduce_grads(self, uid: str, comm: Any, stream: str, coll: str, layers: list[int], step: int,
                     micros: list[int] | None, loc: str) -> int:
        """Sum layer gradients over the ranks (mean: divided by their number), in place of this rank's:
        ``all_reduce`` keeps the whole layer, ``reduce_scatter`` this rank's shard (a ZeRO partition).
        ``micros``: the micro-steps whose gradients are reduced (None: every one held of that step)."""
        moved = 0
        n = self.sharding.world
        for i in layers:
            self._tp_wait(uid, i, step, None if micros is None else micros[0])
            with self.lock:
                keys = sorted(k for k in self.grads if k[0] == loc and k[1] == i and k[2] == step
                              and (micros is None or k[3] in micros) and k not in self.reduced)
            if not keys:
                raise ReplayError(f"task {uid!r}: reduces the gradients of layer {i} (step {step}), but none "
                                  f"are on {loc!r}: the backward has not run or they already moved")
            for k in keys:
                held = self.grads[k]
                if isinstance(held, NvmeFile):
                    raise ReplayError(f"task {uid!r}: reduces gradients held on nvme; reduce them on the GPU")
                flat = self.flat(i, held) if "flat" not in held else held["flat"]
                if coll not in ("all_reduce", "reduce_scatter"):
                    raise ReplayError(f"task {uid!r}: a gradient reduction by {coll!r} is not supported")
                wire = self.precision.wire_gradients(flat, n)
                if coll == "reduce_scatter" and i in self.sharding.layers:
                    out = {"flat": self.precision.mean_from_wire(comm.reduce_scatter(wire, stream, n), n)}
                else:
                    comm.all_reduce(wire, stream)
                    self.precision.mean_into(flat, wire, n)
                    out = self.unflat(i, flat)
                moved += wire.numel() * wire.element_size()
                with self.lock:
                    self.grads[k] = out
                    self.reduced.add(k)
        return moved

    def sync_tied(self, uid: str, comm: Any, stream: str, step: int, loc: str) -> int:
        """The tied table's two gradients summed (Megatron's embedding all-reduce between the first and the
        last pipeline stage, once per step, as the plan prices it): this rank's (the embedding's ``wte``, or
        the head's copy), summed over the step's micro-steps in their order, with the other's, in the plan's
        gradient dtype (``Precision.wire_gradients``); the sum takes the first micro-step's place and the
        others' become zeros, so each stage's optimizer, which adds the micro-steps, updates its copy with the
        same sum. ``replay.reference.tied_sync_split`` trains the reference in that order."""
        i = self.head if self.own_table else 0
        with self.lock:
            keys = sorted(k for k in self.grads if k[0] == loc and k[1] == i and k[2] == step)
        if not keys:
            raise ReplayError(f"task {uid!r}: sums the tied table's gradients of step {step}, but layer {i}'s are "
                              f"not on {loc!r}: its backward has not run or they already moved")
        parts = []
        for k in keys:
            held = self.grads[k]
            if isinstance(held, NvmeFile):
                raise ReplayError(f"task {uid!r}: sums tied gradients held on nvme; sum them on the GPU")
            parts.append(held["wte"])
        total = parts[0].detach().to(torch.float32).contiguous().clone()
        for g in parts[1:]:
            total.add_(g)
        wire = self.precision.wire_gradients(total, 1)
        comm.all_reduce(wire, stream)
        parts[0].copy_(wire.view_as(parts[0]))
        for g in parts[1:]:
            g.zero_()
        return wire.numel() * wire.element_size()

    def send_boundary(self, uid: str, comm: Any, stream: str, peer: int, step: int, m: int, grad: bool) -> int:
        """Send this stage's boundary tensor of (step, micro-step m) to the peer rank: the output of its last
        layer (forward), or the gradient of its first layer's input (backward), with that layer's index."""
        held = self.upstream if grad else self.outputs
        with self.lock:
            keys = [k for k in held if k[0] == step and k[1] == m]
            if len(keys) != 1:
                what = "input gradient" if grad else "output activation"
                raise ReplayError(f"task {uid!r}: sends the stage's {what} of step {step}, micro-step {m}, but "
                                  f"{len(keys)} such tensors are held here (its layer has not run)")
            key = keys[0]
            data = held.pop(key)
        comm.send(key[2], data, stream, peer)
        return data.numel() * data.element_size()

    def recv_boundary(self, comm: Any, stream: str, peer: int, step: int, m: int, grad: bool,
                      shape: tuple[int, ...]) -> None:
        layer, data = comm.recv(shape, stream, peer)
        with self.lock:
            (self.upstream if grad else self.outputs)[(step, m, layer)] = data

    def gather_params(self, uid: str, comm: Any, stream: str, layers: list[int]) -> int:
        """All-gather layer shards into a full version on the compute device: the shard an upload just
        brought (ZeRO-Offload/Infinity), else the master shard itself when it lives on the GPU; sent in the
        plan's 16-bit dtype in mixed precision (``Precision.wire_params``: the bytes the plan prices; the fp32
        shard took 2.4-3.2x its price for a vocab-50257 x 512 table here, 2026-12-05)."""
        moved = 0
        n = self.sharding.world
        for i in layers:
            if i not in self.sharding.layers:
                raise ReplayError(f"task {uid!r}: gathers layer {i}'s parameters, which the plan never partitions "
                                  "(no reduce-scatter of its gradients)")
            with self.lock:
                queue = self.pending.get(i)
                if queue:
                    v, shard = queue.pop(0)
                    part = shard["flat"]
                elif self.master_loc[i] == self.compute_loc:
                    v = self.master_version[i]
                    part = self.master[i]["flat"].detach()
                else:
                    raise ReplayError(f"task {uid!r}: gathers layer {i}'s parameters, but no shard of them was "
                                      f"uploaded to {self.compute_loc!r}")
            full = comm.all_gather(self.precision.wire_params(part.to(self.pools.device)), stream, n)
            moved += full.numel() * full.element_size()  # the collective's size: the gathered tensor
            full = self.precision.working_params(full)
            with self.lock:
                self._store_version(i, v, self.unflat(i, full))
                self.produced.setdefault(uid, {})[i] = v
        return moved

    # -- results ---------------------------------------------------------------------------------------
    def final_weights(self) -> list[dict[str, Tensor]]:
        return [{n: p.detach().cpu().clone() for n, p in mp.items()} for mp in self.master]

    def close(self) -> None:
        """Remove the nvme files this replay still holds."""
        with self.lock:
            for held in [*self.grads.values(), *self.buffers.values()]:
                self.pools.drop(held)
            self.grads.clear()
            self.grad_upto.clear()
            self.buffers.clear()
