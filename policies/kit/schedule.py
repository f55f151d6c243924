"""Mechanisms of many tasks and the dependency rules that schedule them.

- Sliced fetch (ZeRO-3, ZeRO-Infinity's bandwidth-centric partitioning): every rank uploads only its
  ``1/dp`` slice of a layer from its home (CPU, or NVMe through a pinned CPU buffer) on its H2D engine,
  then an all-gather over the data-parallel group assembles the full layer on every GPU; ZeRO-3 without
  offload only gathers. A prefetch distance ``d`` bounds how far ahead a fetch runs: the fetch for use
  ``u`` may start once use ``u - d`` has started, i.e. after the compute of use ``u - d - 1``
  (``UseOrder``); d = 0 is fetch-on-demand.
- Gradients are reduced across the data-parallel group as soon as a layer's backward ends, overlapping
  the next layer's backward (DeepSpeed ``overlap_comm``): all-reduce for ZeRO 0/1, reduce-scatter for
  ZeRO 2/3 and the offloading policies; with offload each rank then copies its partition to the CPU on
  its D2H engine. The bucket gate (``buckets_in_flight`` = B): a layer's backward does not produce its
  gradients before the bucket B buckets back (backward order, across micro-steps) has drained, so a slow
  link stalls the backward instead of piling gradients up (DeepSpeed double-buffers its ipg bucket: B = 2).
- The micro-step of data/tensor parallelism (``none``, ``zero-offload``): per GPU the forward of every
  layer on a 1/tp slice (saving its activations, or only its input under full checkpointing), then in
  reverse the recomputation and backward, each ended by its tensor-parallel sync; ZeRO-3 all-gathers each
  layer before its forward and again before its backward and frees it after use, one layer ahead (layer
  i is gathered while layer i-1 computes: at most two gathered layers live, DeepSpeed's prefetch).
- NVMe read-ahead: the read of unit k waits for the write ``window`` units back, so at most ``window``
  units' buffers are live.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from policies.base import Job
from policies.builder import PlanBuilder
from policies.kit.layout import Layout, Places, dtype_bytes, use_of
from policies.kit.tasks import (
    all_gather,
    backward,
    cpu_adam,
    forward,
    offload,
    recompute,
    reduce,
    release,
    saved_activation_bytes,
    tp_sync,
    upload,
)
from simulator.phase import Phase

ParamReady = Mapping[int, Sequence[str]]


def sliced_fetch(b: PlanBuilder, gpus: Sequence[str], i: int, ph: str, slice_bytes: float, full_bytes: float,
                 deps_of: Callable[[int, str], list[str]], *, sfx: str = "", src: str = "cpu",
                 gather_deps: Sequence[str] = (), stream: str = "dp.param", gather_use: bool = True,
                 frees_of: Callable[[int], Places] | None = None,
                 reads_of: Callable[[int], Places] | None = None) -> dict[str, str]:
    """Layer i's parameters to every GPU for use ``ph`` (``f`` / ``b``): each rank r uploads its slice
    (``up{ph}{i}{sfx}.{g}``, ``slice_bytes`` from ``src``, after ``deps_of(r, g)``) into ``ps{ph}{i}.{g}``;
    with more than one rank an all-gather (``ag{ph}{i}{sfx}``, ``full_bytes``, after the uploads and
    ``gather_deps``) assembles ``pg{ph}{i}.{g}`` and frees the slices; one rank uploads straight into
    ``pg{ph}{i}.{g}``. Returns GPU -> the task its use waits for."""
    n = len(gpus)
    full, part = f"pg{ph}{i}", f"ps{ph}{i}"
    ready = {g: upload(b, f"up{ph}{i}{sfx}.{g}", g, slice_bytes, deps_of(r, g), layer=i, rank=r, src=src,
                       use=use_of(ph), allocs=[(f"{part if n > 1 else full}.{g}", g)],
                       frees=frees_of(r) if frees_of else (), reads=reads_of(r) if reads_of else ())
             for r, g in enumerate(gpus)}
    if n > 1:
        t = all_gather(b, f"ag{ph}{i}{sfx}", stream, gpus, full_bytes, [*ready.values(), *gather_deps], layer=i,
                       use=use_of(ph) if gather_use else None, allocs=[(f"{full}.{g}", g) for g in gpus],
                       frees=[(f"{part}.{g}", g) for g in gpus])
        ready = dict.fromkeys(gpus, t)
    return ready


def gather_layer(b: PlanBuilder, lay: Layout, i: int, phase: str, nbytes: float,
                 deps_of: Mapping[int, Sequence[str]]) -> dict[int, str]:
    """ZeRO-3: all-gather layer i (``nbytes`` per GPU) in every data-parallel group j into a transient
    ``pg{i}.{g}`` before its use ``phase`` (``f`` / ``b``), after ``deps_of[j]``. Returns j -> task id."""
    return {j: all_gather(b, f"ag{phase}{i}{lay.dp_suffix(j)}", lay.dp_stream(j, "param"), lay.dp_group(j), nbytes,
                          deps_of.get(j, []), layer=i, use=use_of(phase),
                          allocs=[(f"pg{i}.{g}", g) for g in lay.dp_group(j)]) for j in range(lay.tp)}


@dataclass(frozen=True)
class UseOrder:
    """The order in which a micro-step uses its layers: forward 0..L-1, then backward L-1..0. A use ends
    with its compute task (``fwd{i}`` / ``bwd{i}``); ``sfx`` is appended to ids of this micro-step, and
    ``prev(id)`` names a task of the previous micro-step (None when this step has none)."""

    n_layers: int
    sfx: str = ""
    prev: Callable[[str], str | None] = lambda x: f"{x}@1"

    @property
    def uses(self) -> list[tuple[int, str]]:
        L = self.n_layers
        return [(i, "f") for i in range(L)] + [(i, "b") for i in reversed(range(L))]

    def end_id(self, u: int) -> str:
        i, ph = self.uses[u]
        return f"fwd{i}" if ph == "f" else f"bwd{i}"

    def ended(self, u: int, g: str) -> list[str]:
        """The end of use u on GPU g (u < 0: a use of the previous micro-step)."""
        if u >= 0:
            return [f"{self.end_id(u)}{self.sfx}.{g}"]
        ref = self.prev(f"{self.end_id(max(u + 2 * self.n_layers, 0))}.{g}")  # previous step: no suffix
        return [ref] if ref else []

    def window(self, u: int, distance: int, gpus: Sequence[str]) -> list[str]:
        """What a fetch for use u waits for with prefetch ``distance``: the end of use ``u - distance - 1``
        on each of ``gpus``."""
        return [d for g in gpus for d in self.ended(u - distance - 1, g)]


def bucket_gate(order: Sequence[int], i: int, buckets_in_flight: int, drained: Callable[[int], str]) -> list[str]:
    """What holds layer i's backward until the bucket ``buckets_in_flight`` back has drained. ``order``: the
    layers that fill a bucket, in backward order; ``drained(o)``: the task freeing layer o's bucket. Before
    the first B buckets of a micro-step the gate is on the previous micro-step's (``@1``); none with < B."""
    j = list(order).index(i)
    B = buckets_in_flight
    q, suffix = (j - B, "") if j >= B else (len(order) - B + j, "@1")
    return [drained(order[q]) + suffix] if q >= 0 else []


def read_ahead(k: int, window: int, written: str) -> list[str]:
    """What the read of unit k waits for with a read-ahead ``window``: the write of unit ``k - window``
    (``written``: its id with ``{}`` for the unit), none for the first units."""
    return [written.format(k - window)] if k >= window else []


@dataclass(frozen=True)
class Grads:
    """How a layer's gradients leave the backward in the data/tensor-parallel micro-step."""

    reduce: str          # "all_reduce" | "reduce_scatter"
    bucket: bool         # gradients land in a transient per-layer bucket (else in a persistent buffer)
    offload: bool        # the rank's partition is copied to the CPU (ZeRO-Offload)
    offload_bytes_per_param: float = 2.0
    buckets_in_flight: int = 0  # offloaded buckets in flight per GPU before the backward waits (0: no gate)


def reduce_and_offload(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, i: int) -> None:
    """Reduce layer i's gradients across each data-parallel group, then (offload) copy them down; a bucket
    that is neither reduced nor offloaded is folded into the resident buffer (``acc{i}.{g}``)."""
    layer = job.trace.layers[i]
    for j in range(lay.tp):
        grp = lay.dp_group(j)
        red = None
        if lay.dp > 1:
            red = reduce(b, f"red{i}{lay.dp_suffix(j)}", lay.dp_stream(j, "grad"), grp,
                         layer.params / lay.tp * dtype_bytes(job), [f"bwd{i}.{g}" for g in grp], coll=grads.reduce,
                         layer=i, frees=[(f"gb{i}.{g}", g) for g in grp] if grads.bucket and not grads.offload else [])
        for g in grp:
            r = int(g[3:])
            if grads.offload:
                offload(b, f"d2h{i}.{g}", g, layer.params / lay.n * grads.offload_bytes_per_param,
                        [red or f"bwd{i}.{g}"], layer=i, rank=r, frees=[(f"gb{i}.{g}", g)])
            elif grads.bucket and red is None:
                release(b, f"acc{i}.{g}", g, [(f"gb{i}.{g}", g)], layer=i, rank=r, phase=Phase.GRAD_ACCUMULATE)


def emit_microstep(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, *, gather_params: bool,
                   param_ready: ParamReady) -> None:
    """One micro-step for all GPUs in the current segment: per GPU and layer its tensors (saved activations,
    the gradient bucket, ZeRO-3's gathered parameters), the forward pass and the backward pass.
    ``param_ready[i]``: what makes layer i's parameters usable (the previous step's all-gather or upload)."""
    if gather_params and lay.dp == 1:
        raise ValueError("gathering parameters needs more than one data-parallel rank")
    db = dtype_bytes(job)
    for g in lay.gpus():
        for i, layer in enumerate(job.trace.layers):
            b.tensor(f"act{i}.{g}", saved_activation_bytes(job, layer.activation_bytes, layer.kind, lay.tp),
                     "activation", scope="iteration", layer=i)
            if grads.bucket:
                b.tensor(f"gb{i}.{g}", layer.params / lay.tp * db, "grad", scope="iteration", layer=i)
            if gather_params:
                b.tensor(f"pg{i}.{g}", layer.params / lay.tp * db, "param16", scope="iteration", layer=i)
    prev_sync = _forward_pass(b, job, lay, gather_params=gather_params, param_ready=param_ready)
    _backward_pass(b, job, lay, grads, gather_params=gather_params, prev_sync=prev_sync)


def _forward_pass(b: PlanBuilder, job: Job, lay: Layout, *, gather_params: bool,
                  param_ready: ParamReady) -> dict[int, str]:
    """The forward of every layer on every GPU; returns the last layer's TP syncs (group -> task)."""
    prev_sync: dict[int, str] = {}
    for i, layer in enumerate(job.trace.layers):
        pre: dict[int, str] = {}
        if gather_params:
            bound = {j: [f"fwd{i - 2}.{g}" for g in lay.dp_group(j)] if i >= 2 else [] for j in range(lay.tp)}
            pre = gather_layer(b, lay, i, "f", layer.params / lay.tp * dtype_bytes(job),
                               {j: list(param_ready.get(i, [])) + bound[j] for j in range(lay.tp)})
        for r, g in enumerate(lay.gpus()):
            k, j = lay.tp_index(r)
            deps = ([pre[j]] if pre else list(param_ready.get(i, []))) + ([prev_sync[k]] if k in prev_sync else [])
            forward(b, i, layer, g, r, deps, share=lay.tp, allocs=[(f"act{i}.{g}", g)],
                    frees=[(f"pg{i}.{g}", g)] if gather_params else [])
        prev_sync = tp_sync(b, lay, i, layer, "f", "fwd")
    return prev_sync


def _backward_pass(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, *, gather_params: bool,
                   prev_sync: dict[int, str]) -> None:
    """Recomputation and backward of every layer, last first, each followed by its gradient reduction."""
    layers = job.trace.layers
    L = len(layers)
    order = list(reversed(range(L)))
    for i in order:
        layer = layers[i]
        pre: dict[int, str] = {}
        if gather_params:
            after = f"fwd{L - 1}" if i >= L - 2 else f"bwd{i + 2}"  # backward prefetch: also one layer ahead
            pre = gather_layer(b, lay, i, "b", layer.params / lay.tp * dtype_bytes(job),
                               {j: [f"{after}.{g}" for g in lay.dp_group(j)] for j in range(lay.tp)})
        rc_sync: dict[int, str] = {}
        if layer.recompute_flops > 0:
            for r, g in enumerate(lay.gpus()):
                k, j = lay.tp_index(r)
                recompute(b, i, layer, g, r, ([pre[j]] if pre else []) + ([prev_sync[k]] if k in prev_sync else []),
                          share=lay.tp)
            rc_sync = tp_sync(b, lay, i, layer, "r", "rc")
        for r, g in enumerate(lay.gpus()):
            k, j = lay.tp_index(r)
            deps = [] if layer.recompute_flops > 0 else ([pre[j]] if pre else [])
            deps += [s[k] for s in (rc_sync, prev_sync) if k in s][:1]
            if grads.offload and grads.buckets_in_flight:
                deps += bucket_gate(order, i, grads.buckets_in_flight, f"d2h{{}}.{g}".format)
            backward(b, i, layer, g, r, deps, share=lay.tp, allocs=[(f"gb{i}.{g}", g)] if grads.bucket else [],
                     frees=[(f"act{i}.{g}", g)] + ([(f"pg{i}.{g}", g)] if gather_params else []))
        prev_sync = tp_sync(b, lay, i, layer, "b", "bwd")
        reduce_and_offload(b, job, lay, grads, i)


def cpu_update_by_layer(b: PlanBuilder, job: Job, lay: Layout, *, upload_bytes_per_param: float,
                        staged: bool, first_deps: Mapping[int, Sequence[str]]) -> None:
    """ZeRO-Offload's step: per layer in order, every rank's CPU Adam of its ``1/n`` partition
    (``adam{i}.r{r}``; layer 0's waits for ``first_deps[r]``), the upload of the updated partition
    (``up{i}.{g}``, through an fp32 staging buffer ``stage32_{i}.{g}`` when ``staged``) and, with more
    than one data-parallel rank, the all-gather of the layer in every group (``ag{i}.d{j}``)."""
    n = lay.n
    for i, layer in enumerate(job.trace.layers):
        for r, g in enumerate(lay.gpus()):
            cpu_adam(b, f"adam{i}.r{r}", r, list(first_deps.get(r, [])) if i == 0 else [], layer.params / n, layer=i)
            upload(b, f"up{i}.{g}", g, layer.params / n * upload_bytes_per_param, [f"adam{i}.r{r}"], layer=i,
                   rank=r, allocs=[(f"stage32_{i}.{g}", g)] if staged else [],
                   frees=[(f"stage32_{i}.{g}", g)] if staged and lay.dp == 1 else [])
        for j in range(lay.tp if lay.dp > 1 else 0):
            grp = lay.dp_group(j)
            all_gather(b, f"ag{i}{lay.dp_suffix(j)}", lay.dp_stream(j, "param"), grp,
                       layer.params / lay.tp * dtype_bytes(job), [f"up{i}.{g}" for g in grp], layer=i,
                       frees=[(f"stage32_{i}.{g}", g) for g in grp] if staged else [])
