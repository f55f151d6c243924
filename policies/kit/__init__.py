"""The policy kit: each mechanism a plan is made of, defined once, as calls on ``policies.builder.PlanBuilder``.

Every kit task is tagged with a ``simulator.phase.Phase`` member (``tags``). Functions take the task id (or build
the conventional one), the dependencies and the placements explicitly, so a policy (none, zero-offload,
zero-infinity, lazytrain, synergyscale, tinypipe) keeps its own names and schedule while the kit owns what a task of
each kind *is* (op, stream, pricing fields, tags). Below: layout and streams, one task of each kind, then the
mechanisms of many tasks and the dependency rules that schedule them.

- Layout: ``tp``-wide tensor-parallel groups of neighbouring GPUs (Megatron-LM, Shoeybi et al. 2019, arXiv
  1909.08053); GPUs at the same position of every group form a data-parallel group of ``dp = n / tp`` ranks. A
  collective is one task over its group on that group's stream: ``dp{j}.grad`` / ``dp{j}.param`` per data-parallel
  group j and ``tp{k}`` per tensor-parallel group k, or with ``flat_comm`` ``dp.grad`` / ``dp.param``.
- Compute: a layer's forward, recomputation or backward on one GPU's compute stream, priced by the trace's FLOPs
  and HBM bytes divided by ``share`` (TP degree or chunk count) unless ``flops`` / ``hbm_bytes`` are given; ids
  default to ``fwd{i}.{g}``, ``rc{i}.{g}``, ``bwd{i}.{g}``. With tp > 1 a layer's use is what Megatron-LM runs
  (``tp_steps``, ``tp_layer``): a block's forward is attention (``fwd{i}a``), the all-reduce of its output
  (``tpf{i}a``), the MLP (``fwd{i}``), the all-reduce of its output (``tpf{i}``); its backward the MLP's
  (``bwd{i}a``), the all-reduce of the MLP input's gradient (``tpb{i}a``), attention's (``bwd{i}``), the
  all-reduce of attention's input gradient (``tpb{i}``); the vocab-parallel embedding all-reduces its forward
  output only; the column-parallel head with the vocab-parallel cross-entropy all-reduces the logits' max, the
  target logits and the exp sums (``b*s`` fp32 each) in its forward and its input gradient in its backward.
- Activations under TP (Korthikanti et al. 2022, arXiv 2205.05198, Table 2, no sequence parallelism): of the
  ``34 sbh`` a GPT block saves, ``10 sbh`` (layer norms, dropout masks, inputs of the column-parallel GEMMs) stay
  replicated and ``24 sbh`` are split; we apply that ratio to whatever the trace saves per block. Full
  checkpointing keeps only the (replicated) layer input.
- Optimizer: the GPU step is bounded by HBM bandwidth (``gpu.optimizer_bytes_per_param``); CPU Adam (DeepSpeed's
  vectorised kernel) runs per rank on ``cpu.adam{r}``, all ranks sharing the ``cpu.adam`` rate. NVMe read-ahead:
  the read of unit k waits for the write ``window`` units back (at most ``window`` units' buffers live).
- Sliced fetch (ZeRO-3, ZeRO-Infinity's bandwidth-centric partitioning): every rank uploads its ``1/dp`` slice of a
  layer from its home (CPU, or NVMe through a pinned CPU buffer) on its H2D engine, then an all-gather over the
  data-parallel group assembles the layer on every GPU; ZeRO-3 without offload only gathers. Prefetch distance
  ``d``: the fetch for use ``u`` may start once use ``u - d`` has started, i.e. after the compute of use
  ``u - d - 1`` (``UseOrder``); d = 0 is fetch-on-demand.
- Gradients are reduced over the data-parallel group as soon as a layer's backward ends (with tp > 1, and its
  last tensor-parallel all-reduce, which completes the replicated norms' gradients), overlapping the next
  layer's backward (DeepSpeed ``overlap_comm``): all-reduce for ZeRO 0/1, reduce-scatter for ZeRO 2/3 and the
  offloading policies; with offload each rank then copies its partition to the CPU on its D2H engine. Bucket gate
  (B = ``buckets_in_flight``, each policy's own; DeepSpeed double-buffers its ipg bucket: B = 2): a layer's
  backward waits until the bucket B back (backward order, across micro-steps) has drained, so a slow link stalls
  the backward instead of piling gradients up.
- Peaks that do not depend on timing: a copy on another stream allocates or frees GPU memory when it runs, so
  the GPU's peak would depend on how fast copies are against compute (the simulator with fast copies and the
  torch runner with slow ones see different peaks for one plan). Where a policy asks for it, the GPU buffers of
  copies are allocated and freed by tasks on the GPU's compute stream instead: a prefetched layer's buffer is
  allocated (``reserve``) at the point of the compute order where its prefetch may start (what the framework
  does: the compute thread allocates the buffer when it issues the prefetch), and a gradient bucket is released
  (``release``) just before the backward B buckets later, after its copy has drained (DeepSpeed's gradient
  buffers are reused, not freed: the ``bucket_gate`` bound, held); the last B buckets of a micro-step are
  released after its last backward (``bucket_release``). The GPU pool then changes only in the compute
  order, which the plan fixes: every timing gives one peak.
- Data/tensor-parallel micro-step (``emit_microstep``: none, zero-offload): per GPU the forward of every layer on a
  1/tp slice (saving its activations, or only its input under full checkpointing), then in reverse recomputation
  and backward, each ended by its TP sync; ZeRO-3 all-gathers each layer before its forward and again before its
  backward and frees it after use, one layer ahead (layer i while layer i-1 computes: at most two gathered layers
  live, as DeepSpeed's prefetch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from hardware_models.allocator import allocator_overhead
from policies.base import Job, KnobError, gpu_pool
from policies.builder import PlanBuilder
from simulator.phase import Phase
from simulator.rank_template import RankTemplate
from workloads.flops import block_forward_flops
from workloads.trace import LayerTrace

Places = Sequence[tuple[str, str]]
REPLICATED_ACT_FRACTION = 10 / 34  # Korthikanti Table 2: 10sbh of 34sbh are not split by TP
TP_PHASE = {"f": Phase.TP_FWD, "r": Phase.TP_RECOMPUTE, "b": Phase.TP_BWD}
Extra = Mapping[str, Any] | None
ParamReady = Mapping[int, Sequence[str]]


def tags(phase: Phase, *, layer: int | None = None, rank: int | None = None, use: str | None = None,
         extra: Extra = None) -> dict[str, Any]:
    """A kit task's tags: ``phase``, then layer / rank / use (``"fwd"`` or ``"bwd"``) where given, then ``extra``."""
    out: dict[str, Any] = {"phase": phase}
    for key, v in (("layer", layer), ("rank", rank), ("use", use)):
        if v is not None:
            out[key] = v
    out.update(extra or {})
    return out


def use_of(phase: str) -> str:
    """``"fwd"`` for the forward use of a layer (``"f"``), ``"bwd"`` otherwise."""
    return "fwd" if phase == "f" else "bwd"


def gpu(r: int) -> str:
    return f"gpu{r}"


def dtype_bytes(job: Job) -> int:
    """Bytes per element of the training precision (the 16-bit parameters and gradients)."""
    return {"bf16": 2, "fp16": 2, "fp32": 4}[job.config.precision]


@dataclass(frozen=True)
class Layout:
    """n GPUs as dp x tp groups; ``flat_comm`` (tp = 1): no group index in names (``dp.grad``, ``red{i}``).

    ``template`` (n > 1): a rank template (``simulator.rank_template``): the per-rank and per-group loops
    (``gpus``, ``ranks``, ``mine``, ``dp_groups``, ``tp_groups``) see rank 0 and its groups only, sizes and the
    collectives' groups stay those of all n ranks; a barrier over ``gpus()`` is then rank 0's own task, which is
    what the symmetric simulation makes of it (every rank's copy ends at the same instant)."""

    n: int
    tp: int = 1
    flat_comm: bool = False
    template: bool = False

    def __post_init__(self) -> None:
        if self.template and self.n < 2:
            raise ValueError("a rank template is a plan of two or more ranks")

    @property
    def dp(self) -> int:
        return self.n // self.tp

    @property
    def rank_template(self) -> RankTemplate | None:
        """What the plan's builder records of a template (``PlanBuilder(template=...)``)."""
        return RankTemplate(self.n, self.tp) if self.template else None

    def gpus(self) -> list[str]:
        """Every rank's GPU (a template: rank 0's), in rank order."""
        return [gpu(r) for r in self.ranks()]

    def ranks(self) -> range:
        """The ranks whose tasks the plan holds: all, or rank 0 in a template."""
        return range(1 if self.template else self.n)

    def mine(self, group: Sequence[str]) -> list[str]:
        """The GPUs of ``group`` whose tasks the plan holds."""
        return [g for g in group if g == gpu(0)] if self.template else list(group)

    def dp_groups(self) -> range:
        """The data-parallel groups whose collectives the plan holds (a template: rank 0's)."""
        return range(1 if self.template else self.tp)

    def tp_groups(self) -> range:
        """The tensor-parallel groups whose collectives the plan holds (a template: rank 0's)."""
        return range(1 if self.template else self.dp)

    def tp_group(self, k: int) -> list[str]:
        return [gpu(k * self.tp + j) for j in range(self.tp)]

    def dp_group(self, j: int) -> list[str]:
        return [gpu(k * self.tp + j) for k in range(self.dp)]

    def tp_index(self, r: int) -> tuple[int, int]:
        """(tensor-parallel group k, position j) of GPU r."""
        return r // self.tp, r % self.tp

    def dp_stream(self, j: int, what: str) -> str:
        """The communication stream of data-parallel group j for ``what`` (``grad`` or ``param``)."""
        return f"dp.{what}" if self.flat_comm else f"dp{j}.{what}"

    def dp_suffix(self, j: int) -> str:
        """The suffix of a data-parallel collective's task id for group j (``.d{j}``, or none when flat)."""
        return "" if self.flat_comm else f".d{j}"


def templated(job: Job) -> bool:
    """Does the job ask for a rank template (``Job.rank_template``) that a layout can give (two or more ranks)?"""
    return job.rank_template and job.n_gpus > 1


def tp_splits_model(job: Job, tp: int) -> bool:
    """Does ``tp`` split the model's attention heads, key/value heads and MLP width evenly (``check_tp``)?"""
    m = job.model
    return not (m.n_heads % tp or m.n_kv_heads % tp or m.ffn and m.ffn % tp)


def check_tp(job: Job, tp: int, policy: str) -> None:
    """KnobError unless ``tp`` divides the GPU count and splits the model as Megatron-LM splits it: attention
    heads, key/value heads (query groups) and the MLP width divisible by ``tp``.

    Megatron accepts a query-group count that is a multiple *or a divisor* of tp (``megatron/core/transformer/
    transformer_config.py``, the ``num_query_groups`` check); with fewer groups than ranks
    (``megatron/core/transformer/attention.py``, ``num_query_groups < world_size``) every block all-gathers its
    QKV projection over the group and each rank keeps one replicated key/value head. Those all-gathers and the
    replicated heads are not in our plans (nor in the replay's shards), so tp > key/value heads is refused."""
    if tp < 1 or job.n_gpus % tp:
        raise KnobError(f"{policy}: knob 'tp' must divide the GPU count {job.n_gpus}, got {tp}")
    m = job.model
    if m.n_heads % tp:
        raise KnobError(f"{policy}: knob 'tp' = {tp} does not divide the model's {m.n_heads} attention heads")
    if m.n_kv_heads % tp:
        raise KnobError(f"{policy}: knob 'tp' = {tp} does not divide the model's {m.n_kv_heads} key/value heads "
                        f"(Megatron then all-gathers every block's QKV, which is not modelled); use a tp that divides "
                        f"{m.n_kv_heads}")
    if m.ffn and m.ffn % tp:
        raise KnobError(f"{policy}: knob 'tp' = {tp} does not divide the model's MLP width {m.ffn} "
                        "(column-parallel layers split it evenly); use a tp that divides it")


def gpu_streams(b: PlanBuilder, gpus: Iterable[str], extra: Sequence[tuple[str, str]] = ()) -> None:
    """Per GPU: ``{g}.compute``, ``{g}.h2d``, ``{g}.d2h`` and each ``(name, kind)`` of ``extra``."""
    for g in gpus:
        for name, kind in (("compute", "compute"), ("h2d", "h2d"), ("d2h", "d2h"), *extra):
            b.stream(f"{g}.{name}", g, kind)


def cpu_streams(b: PlanBuilder, ranks: Iterable[int], per_rank: Sequence[tuple[str, str]], device: str = "cpu") -> None:
    """Per rank r: ``{device}.{name}{r}`` of each ``(name, kind)``, e.g. ``("adam", "optim")``."""
    for r in ranks:
        for name, kind in per_rank:
            b.stream(f"{device}.{name}{r}", device, kind)


def comm_streams(b: PlanBuilder, lay: Layout, order: Sequence[str] = ("grad", "param")) -> None:
    """The data-parallel streams (``order``: which of grad / param first), then the tensor-parallel ones."""
    for j in lay.dp_groups() if lay.dp > 1 else ():
        for what in order:
            b.stream(lay.dp_stream(j, what), lay.dp_group(j)[0], "comm")
    for k in lay.tp_groups() if lay.tp > 1 else ():
        b.stream(f"tp{k}", lay.tp_group(k)[0], "comm")


def declare_streams(b: PlanBuilder, lay: Layout, *, cpu_adam: bool = False,
                    cpu_per_rank: Sequence[tuple[str, str]] = (), shared: Sequence[tuple[str, str, str]] = (),
                    comm_order: Sequence[str] = ("grad", "param")) -> None:
    """Per rank GPU streams, ``cpu.adam{r}`` and ``cpu_per_rank``; then ``shared`` (id, device, kind); then comm."""
    per_rank = ((("adam", "optim"),) if cpu_adam else ()) + tuple(cpu_per_rank)
    for r in lay.ranks():
        gpu_streams(b, [gpu(r)])
        cpu_streams(b, [r], per_rank)
    for sid, device, kind in shared:
        b.stream(sid, device, kind)
    comm_streams(b, lay, comm_order)


# -- one task of each kind ---------------------------------------------------------------------------------------------
def upload(b: PlanBuilder, tid: str, g: str, nbytes: float, deps: Sequence[str], *, layer: int | None, rank: int | None,
           src: str = "cpu", use: str | None = None, stream: str | None = None, allocs: Places = (), frees: Places = (),
           reads: Places = (), phase: Phase = Phase.PARAM_UPLOAD, extra: Extra = None) -> str:
    """A copy of ``nbytes`` of parameters from ``src`` to GPU g on its H2D stream."""
    return b.task(tid, "copy", stream or f"{g}.h2d", deps, src=src, dst=g, bytes=nbytes, allocs=allocs,
                  frees=frees, reads=reads, tags=tags(phase, layer=layer, rank=rank, use=use, extra=extra))


def all_gather(b: PlanBuilder, tid: str, stream: str, ranks: Sequence[str], nbytes: float, deps: Sequence[str], *,
               layer: int | None = None, use: str | None = None, allocs: Places = (), frees: Places = (),
               phase: Phase = Phase.PARAM_GATHER, extra: Extra = None) -> str:
    """An all-gather of ``nbytes`` (the full tensor) over ``ranks`` on a communication stream."""
    return b.task(tid, "collective", stream, deps, coll="all_gather", bytes=nbytes, ranks=tuple(ranks),
                  allocs=allocs, frees=frees, tags=tags(phase, layer=layer, use=use, extra=extra))


def reduce(b: PlanBuilder, tid: str, stream: str, ranks: Sequence[str], nbytes: float, deps: Sequence[str], *,
           coll: str = "reduce_scatter", layer: int | None = None, allocs: Places = (), frees: Places = (),
           extra: Extra = None) -> str:
    """A gradient reduction (``all_reduce`` or ``reduce_scatter``) of ``nbytes`` over ``ranks``."""
    return b.task(tid, "collective", stream, deps, coll=coll, bytes=nbytes, ranks=tuple(ranks), allocs=allocs,
                  frees=frees, tags=tags(Phase.GRAD_REDUCE, layer=layer, extra=extra))


def offload(b: PlanBuilder, tid: str, g: str, nbytes: float, deps: Sequence[str], *, layer: int | None,
            rank: int | None, dst: str = "cpu", stream: str | None = None, frees: Places = (), reads: Places = (),
            allocs: Places = (), extra: Extra = None) -> str:
    """A copy of ``nbytes`` of GPU g's gradients to ``dst`` on its D2H stream (``allocs``: a staging buffer the
    copy lands in)."""
    return b.task(tid, "copy", stream or f"{g}.d2h", deps, src=g, dst=dst, bytes=nbytes, frees=frees,
                  reads=reads, allocs=allocs, tags=tags(Phase.GRAD_OFFLOAD, layer=layer, rank=rank, extra=extra))


def release(b: PlanBuilder, tid: str, g: str, frees: Places, *, layer: int | None, rank: int | None,
            phase: Phase = Phase.GRAD_RELEASE, deps: Sequence[str] = (), stream: str | None = None,
            use: str | None = None, extra: Extra = None) -> str:
    """A free on GPU g's compute stream (``GRAD_RELEASE``, ``GRAD_ACCUMULATE``, or a staging buffer's phase)."""
    return b.task(tid, "free", stream or f"{g}.compute", deps, frees=frees,
                  tags=tags(phase, layer=layer, rank=rank, use=use, extra=extra))


def reserve(b: PlanBuilder, tid: str, g: str, allocs: Places, deps: Sequence[str] = (), *, layer: int | None,
            rank: int | None, use: str | None = None, stream: str | None = None, extra: Extra = None) -> str:
    """An alloc on GPU g's compute stream of buffers that a copy on another stream will fill (module docstring:
    peaks that do not depend on timing)."""
    return b.task(tid, "alloc", stream or f"{g}.compute", deps, allocs=allocs,
                  tags=tags(Phase.BUFFER_RESERVE, layer=layer, rank=rank, use=use, extra=extra))


def gpu_step(b: PlanBuilder, tid: str, stream: str, deps: Sequence[str], params: float, *, rank: int | None,
             layer: int | None = None, extra: Extra = None) -> str:
    """An optimizer step over ``params`` parameters on a GPU's compute ``stream``."""
    return b.task(tid, "optimizer", stream, deps, params=params,
                  tags=tags(Phase.OPTIMIZER, layer=layer, rank=rank, extra=extra))


def cpu_adam(b: PlanBuilder, tid: str, r: int, deps: Sequence[str], params: float, *, layer: int | None = None,
             rank: int | None = None, extra: Extra = None) -> str:
    """CPU Adam of rank r over ``params`` parameters on ``cpu.adam{r}`` (``rank`` tag defaults to r)."""
    return b.task(tid, "optimizer", f"cpu.adam{r}", deps, params=params,
                  tags=tags(Phase.OPTIMIZER, layer=layer, rank=r if rank is None else rank, extra=extra))


def swap(b: PlanBuilder, tid: str, stream: str, phase: Phase, src: str, dst: str, nbytes: float, deps: Sequence[str], *,
         layer: int | None = None, rank: int | None = None, use: str | None = None, allocs: Places = (),
         frees: Places = (), reads: Places = (), extra: Extra = None) -> str:
    """A copy between CPU memory and NVMe on an io stream (optimizer, parameter or gradient swap)."""
    return b.task(tid, "copy", stream, deps, src=src, dst=dst, bytes=nbytes, allocs=allocs, frees=frees,
                  reads=reads, tags=tags(phase, layer=layer, rank=rank, use=use, extra=extra))


def _compute(b: PlanBuilder, kind: str, phase: Phase, i: int, g: str, rank: int | None, deps: Sequence[str],
             flops: float, hbm_bytes: float, tid: str | None, stream: str | None, allocs: Places, frees: Places,
             extra: Extra) -> str:
    return b.task(tid or f"{kind}{i}.{g}", "compute", stream or f"{g}.compute", deps, flops=flops,
                  hbm_bytes=hbm_bytes, allocs=allocs, frees=frees, tags=tags(phase, layer=i, rank=rank, extra=extra))


def forward(b: PlanBuilder, i: int, layer: LayerTrace, g: str, rank: int | None, deps: Sequence[str], *,
            share: float = 1, flops: float | None = None, hbm_bytes: float | None = None, tid: str | None = None,
            stream: str | None = None, allocs: Places = (), frees: Places = (), extra: Extra = None) -> str:
    """Layer i's forward on GPU g (1/share of it); returns the task id."""
    return _compute(b, "fwd", Phase.FWD, i, g, rank, deps, layer.fwd_flops / share if flops is None else flops,
                    layer.fwd_hbm_bytes / share if hbm_bytes is None else hbm_bytes, tid, stream, allocs, frees, extra)


def recompute(b: PlanBuilder, i: int, layer: LayerTrace, g: str, rank: int | None, deps: Sequence[str], *,
              share: float = 1, flops: float | None = None, hbm_bytes: float | None = None, tid: str | None = None,
              stream: str | None = None, allocs: Places = (), frees: Places = (), extra: Extra = None) -> str:
    """Layer i's recomputation (the trace's ``recompute_flops`` unless ``flops``), reading as its forward."""
    return _compute(b, "rc", Phase.RECOMPUTE, i, g, rank, deps,
                    layer.recompute_flops / share if flops is None else flops,
                    layer.fwd_hbm_bytes / share if hbm_bytes is None else hbm_bytes, tid, stream, allocs, frees, extra)


def backward(b: PlanBuilder, i: int, layer: LayerTrace, g: str, rank: int | None, deps: Sequence[str], *,
             share: float = 1, flops: float | None = None, hbm_bytes: float | None = None, tid: str | None = None,
             stream: str | None = None, allocs: Places = (), frees: Places = (), extra: Extra = None) -> str:
    """Layer i's backward on GPU g (1/share of it); returns the task id."""
    return _compute(b, "bwd", Phase.BWD, i, g, rank, deps, layer.bwd_flops / share if flops is None else flops,
                    layer.bwd_hbm_bytes / share if hbm_bytes is None else hbm_bytes, tid, stream, allocs, frees, extra)


def move_activation(b: PlanBuilder, tid: str, stream: str, tensor: str, src: str, dst: str, deps: Sequence[str], *,
                    phase: Phase, layer: int, rank: int | None = None, extra: Extra = None) -> str:
    """Saved activations (``tensor``) between a GPU and CPU memory; allocates the destination, frees the source."""
    return b.task(tid, "copy", stream, deps, tensor=tensor, src=src, dst=dst, alloc_dst=True, free_src=True,
                  tags=tags(phase, layer=layer, rank=rank, extra=extra))


TpStep = tuple[str, float]  # ("compute", fraction of the layer's FLOPs) or ("sum" | "max", all-reduce bytes)
PARTS = "abcdefgh"  # id suffixes of a layer use's compute parts and collectives before its last


def _block_attention_fraction(job: Job, i: int) -> float:
    """The share of block ``i``'s (trace index) matmul FLOPs before its first all-reduce: Q/K/V, the attention
    core and the output projection (the rest: the MLP and a router)."""
    c = job.config
    bf = block_forward_flops(job.model, c.micro_batch, c.seq_len, c.causal_attention_factor, i - 1)
    attention = bf.qkv + bf.attention_core + bf.output_projection
    total = attention + bf.mlp + bf.router
    return attention / total if total > 0 else 0.5


def tp_steps(job: Job, i: int, phase: str) -> list[TpStep]:
    """Layer i's use ``phase`` (f / r / b) with tensor parallelism, in Megatron-LM's order (module docstring).

    Sources (NVIDIA/Megatron-LM, ``megatron/core/tensor_parallel/``): ``layers.py`` VocabParallelEmbedding
    reduces its output with ``reduce_from_tensor_model_parallel_region``, whose backward (``mappings.py``,
    ``_ReduceFromModelParallelRegion``) passes the gradient through: no backward collective. RowParallelLinear
    (attention's output projection, the MLP's down projection) ends with the same reduction; ColumnParallelLinear
    all-reduces its input gradient in the backward (``allreduce_dgrad``). ``cross_entropy.py``
    ``_VocabParallelCrossEntropy.forward`` all-reduces the logits' max (``ReduceOp.MAX``), the target logits and
    the exp sums, one float per token each; its backward is local. Selective recomputation reruns the attention
    core alone (no collective); full recomputation reruns the forward with its all-reduces."""
    layer = job.trace.layers[i]
    if layer.kind == "embedding":
        return [("compute", 1.0)] + ([("sum", float(layer.output_bytes))] if phase in "fr" else [])
    if layer.kind == "head":
        if phase == "f":
            per_token = 4.0 * job.config.micro_batch * job.config.seq_len  # fp32, Megatron's cross-entropy
            return [("compute", 1.0), ("max", per_token), ("sum", per_token), ("sum", per_token)]
        return [("compute", 1.0), ("sum", float(job.trace.layers[i - 1].output_bytes))]
    if phase == "r" and job.config.checkpointing != "full":
        return [("compute", 1.0)]
    attn = _block_attention_fraction(job, i)
    first, second = (attn, 1.0 - attn) if phase in "fr" else (1.0 - attn, attn)
    out = float(layer.output_bytes)
    return [("compute", first), ("sum", out), ("compute", second), ("sum", out)]


ComputePart = Callable[[str, float, str, int, list[str], int, bool, bool], str]


def tp_layer(b: PlanBuilder, job: Job, lay: Layout, i: int, phase: str, compute: ComputePart,
             deps_of: Callable[[int, str], list[str]]) -> dict[int, str]:
    """Layer i's use ``phase`` on every GPU with tp > 1, as ``tp_steps`` lists it: each compute part on every
    GPU (``compute(suffix, fraction, g, r, deps, part, first, last)``; the first part after ``deps_of(r, g)``,
    a later one after the collective before it), each collective one task per tensor-parallel group on its
    stream ``tp{k}`` (ids ``tp{phase}{i}{suffix}.k{k}``, the last without suffix), tagged ``part`` (its index)
    and ``reduce_op``. Returns group k -> the use's last collective (empty when it has none)."""
    steps = tp_steps(job, i, phase)
    n_compute = sum(kind == "compute" for kind, _ in steps)
    n_coll = len(steps) - n_compute
    ci = ai = 0
    sync: dict[int, str] = {}
    last_compute: dict[str, str] = {}
    for kind, x in steps:
        if kind == "compute":
            last = ci == n_compute - 1
            for r, g in enumerate(lay.gpus()):
                k = lay.tp_index(r)[0]
                deps = [sync[k]] if sync else deps_of(r, g)
                last_compute[g] = compute("" if last else PARTS[ci], x, g, r, deps, ci, ci == 0, last)
            ci += 1
            continue
        sfx = "" if ai == n_coll - 1 else PARTS[ai]
        sync = {k: b.task(f"tp{phase}{i}{sfx}.k{k}", "collective", f"tp{k}",  # (a template: rank 0's compute)
                          [last_compute[g] for g in lay.tp_group(k) if g in last_compute]
                          + ([sync[k]] if k in sync else []),
                          coll="all_reduce", bytes=x, ranks=tuple(lay.tp_group(k)),
                          tags=tags(TP_PHASE[phase], layer=i, extra={"part": ai, "reduce_op": kind}))
                for k in lay.tp_groups()}
        ai += 1
    return sync


def layer_use(b: PlanBuilder, job: Job, lay: Layout, i: int, phase: str, deps_of: Callable[[int, str], list[str]],
              *, allocs_of: Callable[[str], Places] = lambda g: (),
              frees_of: Callable[[str], Places] = lambda g: ()) -> dict[int, str]:
    """Layer i's forward (``f``), recomputation (``r``) or backward (``b``) on every GPU: one compute task per GPU
    (tp = 1), or Megatron's parts and collectives (``tp_layer``). ``allocs_of(g)`` go on the use's first compute
    task, ``frees_of(g)`` on its last. Returns group k -> the collective that completes the use (tp > 1)."""
    layer = job.trace.layers[i]
    emit = {"f": forward, "r": recompute, "b": backward}[phase]
    if lay.tp == 1:
        for r, g in enumerate(lay.gpus()):
            emit(b, i, layer, g, r, deps_of(r, g), share=1, allocs=allocs_of(g), frees=frees_of(g))
        return {}
    flops = {"f": layer.fwd_flops, "r": layer.recompute_flops, "b": layer.bwd_flops}[phase]
    hbm = layer.bwd_hbm_bytes if phase == "b" else layer.fwd_hbm_bytes
    prefix = {"f": "fwd", "r": "rc", "b": "bwd"}[phase]
    split = sum(kind == "compute" for kind, _ in tp_steps(job, i, phase)) > 1

    def part(sfx: str, frac: float, g: str, r: int, deps: list[str], ci: int, first: bool, last: bool) -> str:
        return emit(b, i, layer, g, r, deps, flops=flops * frac / lay.tp, hbm_bytes=hbm * frac / lay.tp,
                    tid=f"{prefix}{i}{sfx}.{g}", allocs=allocs_of(g) if first else (),
                    frees=frees_of(g) if last else (), extra={"part": ci, "layer_share": frac} if split else None)

    return tp_layer(b, job, lay, i, phase, part, deps_of)


def saved_activation_bytes(job: Job, layer_bytes: float, kind: str, tp: int) -> float:
    """Bytes a GPU keeps of a layer's saved activations with tensor parallelism ``tp`` (module docstring)."""
    if tp == 1 or kind != "block" or job.config.checkpointing == "full":
        return layer_bytes
    return layer_bytes * (REPLICATED_ACT_FRACTION + (1 - REPLICATED_ACT_FRACTION) / tp)


def workspace(b: PlanBuilder, job: Job, lay: Layout) -> None:
    """Per GPU the largest transient working set of any layer (split by TP), kept by the caching allocator."""
    ws = max(layer.peak_transient_bytes for layer in job.trace.layers) / lay.tp
    for g in lay.gpus():
        b.tensor(f"ws.{g}", ws, "buffer", home=g, persistent=True)


# -- mechanisms of many tasks, dependency rules ------------------------------------------------------------------------
def sliced_fetch(b: PlanBuilder, gpus: Sequence[str], i: int, ph: str, slice_bytes: float, full_bytes: float,
                 deps_of: Callable[[int, str], list[str]], *, sfx: str = "", src: str = "cpu",
                 gather_deps: Sequence[str] = (), stream: str = "dp.param", gather_use: bool = True,
                 frees_of: Callable[[int], Places] | None = None,
                 reads_of: Callable[[int], Places] | None = None, reserved: bool = False,
                 mine: Sequence[str] | None = None) -> dict[str, str]:
    """Layer i's parameters to every GPU for use ``ph`` (``f`` / ``b``): each rank r uploads its slice
    (``up{ph}{i}{sfx}.{g}``, ``slice_bytes`` from ``src``, after ``deps_of(r, g)``) into ``ps{ph}{i}.{g}``;
    with more than one rank an all-gather (``ag{ph}{i}{sfx}``, ``full_bytes``, after the uploads and
    ``gather_deps``) assembles ``pg{ph}{i}.{g}`` and frees the slices; one rank uploads straight into
    ``pg{ph}{i}.{g}`` (``fetch_buffer``). ``reserved``: the caller allocated the uploads' buffers
    (``reserve``, one of ``deps_of``); ``mine``: the GPUs whose uploads the plan holds (``Layout.mine``; all by
    default). Returns GPU -> the task its use waits for."""
    n = len(gpus)
    full = f"pg{ph}{i}"
    ready = {g: upload(b, f"up{ph}{i}{sfx}.{g}", g, slice_bytes, deps_of(r, g), layer=i, rank=r, src=src,
                       use=use_of(ph), allocs=[] if reserved else [(fetch_buffer(i, ph, g, n), g)],
                       frees=frees_of(r) if frees_of else (), reads=reads_of(r) if reads_of else ())
             for r, g in enumerate(gpus) if mine is None or g in mine}
    if n > 1:  # (a template: its placements on the GPUs whose tasks it holds)
        held = gpus if mine is None else mine
        t = all_gather(b, f"ag{ph}{i}{sfx}", stream, gpus, full_bytes, [*ready.values(), *gather_deps], layer=i,
                       use=use_of(ph) if gather_use else None, allocs=[(f"{full}.{g}", g) for g in held],
                       frees=[(fetch_buffer(i, ph, g, n), g) for g in held])
        ready = dict.fromkeys(gpus, t)
    return ready


def fetch_buffer(i: int, ph: str, g: str, n: int) -> str:
    """The GPU buffer a ``sliced_fetch`` upload fills on GPU g: the slice ``ps{ph}{i}.{g}`` (n > 1 ranks), else
    the whole layer ``pg{ph}{i}.{g}``."""
    return f"ps{ph}{i}.{g}" if n > 1 else f"pg{ph}{i}.{g}"


def gather_layer(b: PlanBuilder, lay: Layout, i: int, phase: str, nbytes: float,
                 deps_of: Mapping[int, Sequence[str]]) -> dict[int, str]:
    """ZeRO-3: all-gather layer i (``nbytes`` per GPU) in every data-parallel group j into a transient
    ``pg{i}.{g}`` before its use ``phase`` (``f`` / ``b``), after ``deps_of[j]``. Returns j -> task id."""
    return {j: all_gather(b, f"ag{phase}{i}{lay.dp_suffix(j)}", lay.dp_stream(j, "param"), lay.dp_group(j), nbytes,
                          deps_of.get(j, []), layer=i, use=use_of(phase),
                          allocs=[(f"pg{i}.{g}", g) for g in lay.mine(lay.dp_group(j))]) for j in lay.dp_groups()}


@dataclass(frozen=True)
class UseOrder:
    """The order in which a micro-step uses its layers: forward 0..L-1, then backward L-1..0. A use ends
    with its compute task (``fwd{i}`` / ``bwd{i}``); ``sfx`` is appended to ids of this micro-step, and
    ``prev(id)`` names a task of the previous micro-step (None when this step has none)."""

    n_layers: int
    sfx: str = ""
    prev: Callable[[str], str | None] = lambda x: f"{x}@1"

    @cached_property
    def uses(self) -> list[tuple[int, str]]:
        """Every use in order (worked out once: ``end_id`` reads it for every fetch window of every GPU)."""
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
        """What a fetch for use u waits for with prefetch ``distance``: the end of use ``u - distance - 1``."""
        return [d for g in gpus for d in self.ended(u - distance - 1, g)]


def bucket_gate(order: Sequence[int], i: int, buckets_in_flight: int, drained: Callable[[int], str],
                previous: Callable[[int], str | None] | None = None) -> list[str]:
    """What holds layer i's backward until the bucket ``buckets_in_flight`` back has drained. ``order``: the
    layers that fill a bucket, in backward order; ``drained(o)``: the task freeing layer o's bucket. Before
    the first B buckets of a micro-step the gate is on the previous micro-step's (``previous(o)``, by default
    ``drained(o)`` of ``@1``; None: no previous micro-step); none with < B."""
    j, B = list(order).index(i), buckets_in_flight
    if j >= B:
        return [drained(order[j - B])]
    q = len(order) - B + j
    before = (previous or (lambda o: drained(o) + "@1"))(order[q]) if q >= 0 else None
    return [before] if before else []


def bucket_release(order: Sequence[int], i: int | None, buckets_in_flight: int) -> list[int]:
    """The layers whose gradient buckets are released on the compute stream just before layer i's backward (the
    one ``buckets_in_flight`` back in ``order``, backward order), or with i = None after the micro-step's last
    backward (the last ``buckets_in_flight``). Each release waits for its bucket's copy: the gate of
    ``bucket_gate``, with the bucket held until then (module docstring)."""
    B = max(buckets_in_flight, 1)
    if i is None:
        return list(order[max(len(order) - B, 0):])
    j = list(order).index(i)
    return [order[j - B]] if j >= B else []


def read_ahead(k: int, window: int, written: str) -> list[str]:
    """The read of unit k waits for the write of unit ``k - window`` (``written``: its id, ``{}`` for the unit)."""
    return [written.format(k - window)] if k >= window else []


@dataclass(frozen=True)
class Grads:
    """How a layer's gradients leave the backward in the data/tensor-parallel micro-step."""

    reduce: str          # "all_reduce" | "reduce_scatter"
    bucket: bool         # gradients land in a transient per-layer bucket (else in a persistent buffer)
    offload: bool        # the rank's partition is copied to the CPU (ZeRO-Offload)
    offload_bytes_per_param: float = 2.0
    buckets_in_flight: int = 0  # offloaded buckets in flight per GPU before the backward waits (0: no gate)


def reduce_and_offload(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, i: int,
                       tp_done: Mapping[int, str] | None = None) -> None:
    """Reduce layer i's gradients across each data-parallel group, then (offload) copy them down; a bucket
    that is neither reduced nor offloaded is folded into the resident buffer (``acc{i}.{g}``). ``tp_done``:
    tensor-parallel group k -> the collective that completes the layer's gradients (the replicated norms'
    need the summed input gradient), which every consumer waits for besides the backward."""
    layer = job.trace.layers[i]
    done = tp_done or {}

    def ready(g: str) -> list[str]:
        k = lay.tp_index(int(g[3:]))[0]
        return [f"bwd{i}.{g}"] + ([done[k]] if k in done else [])

    for j in lay.dp_groups():
        grp = lay.dp_group(j)
        red = None
        if lay.dp > 1:
            red = reduce(b, f"red{i}{lay.dp_suffix(j)}", lay.dp_stream(j, "grad"), grp,
                         layer.params / lay.tp * dtype_bytes(job), [d for g in lay.mine(grp) for d in ready(g)],
                         coll=grads.reduce, layer=i,
                         frees=[(f"gb{i}.{g}", g) for g in lay.mine(grp)] if grads.bucket and not grads.offload else [])
        for g in lay.mine(grp):
            r = int(g[3:])
            if grads.offload:  # a gated bucket is released on the compute stream (release_buckets), else here
                offload(b, f"d2h{i}.{g}", g, layer.params / lay.n * grads.offload_bytes_per_param,
                        [red] if red else ready(g), layer=i, rank=r,
                        frees=[] if grads.buckets_in_flight else [(f"gb{i}.{g}", g)])
            elif grads.bucket and red is None:
                release(b, f"acc{i}.{g}", g, [(f"gb{i}.{g}", g)], layer=i, rank=r, phase=Phase.GRAD_ACCUMULATE,
                        deps=ready(g)[1:])


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


def _on_gpu(names: Sequence[str], i: int) -> Callable[[str], Places]:
    """GPU g -> the placements ``({name}{i}.{g}, g)`` of ``names`` (a use's allocations or frees)."""
    return lambda g: [(f"{n}{i}.{g}", g) for n in names]


def _forward_pass(b: PlanBuilder, job: Job, lay: Layout, *, gather_params: bool, param_ready: ParamReady) -> dict[int,
                  str]:
    """The forward of every layer on every GPU; returns the last layer's TP syncs (group -> task)."""
    prev_sync: dict[int, str] = {}
    for i, layer in enumerate(job.trace.layers):
        pre: dict[int, str] = {}
        if gather_params:
            bound = {j: [f"fwd{i - 2}.{g}" for g in lay.mine(lay.dp_group(j))] if i >= 2 else []
                     for j in lay.dp_groups()}
            pre = gather_layer(b, lay, i, "f", layer.params / lay.tp * dtype_bytes(job),
                               {j: list(param_ready.get(i, [])) + bound[j] for j in lay.dp_groups()})

        def deps(r: int, g: str, i: int = i, pre: dict[int, str] = pre, prev: dict[int, str] = prev_sync) -> list[str]:
            k, j = lay.tp_index(r)
            return ([pre[j]] if pre else list(param_ready.get(i, []))) + ([prev[k]] if k in prev else [])

        prev_sync = layer_use(b, job, lay, i, "f", deps, allocs_of=_on_gpu(["act"], i),
                              frees_of=_on_gpu(["pg"] if gather_params else [], i))
    return prev_sync


def _backward_pass(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, *, gather_params: bool,
                   prev_sync: dict[int, str]) -> None:
    """Recomputation and backward of every layer, last first, each followed by its gradient reduction."""
    layers = job.trace.layers
    L = len(layers)
    order = list(reversed(range(L)))
    for i in order:
        layer = layers[i]
        release_buckets(b, lay, grads, order, i)
        pre: dict[int, str] = {}
        if gather_params:
            after = f"fwd{L - 1}" if i >= L - 2 else f"bwd{i + 2}"  # backward prefetch: also one layer ahead
            pre = gather_layer(b, lay, i, "b", layer.params / lay.tp * dtype_bytes(job),
                               {j: [f"{after}.{g}" for g in lay.mine(lay.dp_group(j))] for j in lay.dp_groups()})
        rc_sync: dict[int, str] = {}
        recomputed = layer.recompute_flops > 0
        if recomputed:
            def rc_deps(r: int, g: str, pre: dict[int, str] = pre, prev: dict[int, str] = prev_sync) -> list[str]:
                k, j = lay.tp_index(r)
                return ([pre[j]] if pre else []) + ([prev[k]] if k in prev else [])

            rc_sync = layer_use(b, job, lay, i, "r", rc_deps)

        def deps(r: int, g: str, i: int = i, pre: dict[int, str] = pre, rc: dict[int, str] = rc_sync,
                 prev: dict[int, str] = prev_sync, recomputed: bool = recomputed) -> list[str]:
            k, j = lay.tp_index(r)
            out = [] if recomputed else ([pre[j]] if pre else [])
            out += [s[k] for s in (rc, prev) if k in s][:1]
            if grads.offload and grads.buckets_in_flight:
                out += bucket_gate(order, i, grads.buckets_in_flight, f"d2h{{}}.{g}".format)
            return out

        prev_sync = layer_use(b, job, lay, i, "b", deps,
                              allocs_of=_on_gpu(["gb"] if grads.bucket else [], i),
                              frees_of=_on_gpu(["act", *(["pg"] if gather_params else [])], i))
        reduce_and_offload(b, job, lay, grads, i, prev_sync)  # the embedding's gradient is local: no sync
    release_buckets(b, lay, grads, order, None)


def release_buckets(b: PlanBuilder, lay: Layout, grads: Grads, order: Sequence[int], i: int | None) -> None:
    """With offloaded, gated buckets: on every GPU's compute stream, the buckets ``bucket_release`` releases
    before layer i's recomputation and backward (None: after the micro-step's last backward), each once its copy
    has ended, so the GPU's peak is the compute order's at every timing (module docstring). The last ones hold
    the next micro-step's forward until the copies end, as DeepSpeed does: with ``overlap_comm`` (on with
    offload) ``DeepSpeedZeroOptimizer.independent_gradient_partition_epilogue`` synchronises the device after
    each backward (deepspeed/runtime/zero/stage_1_and_2.py, 0.19.8, lines 1016-1028). Before, the copy freed
    its bucket on the D2H stream: a replay whose copies ran slower than priced held the 53.6 MB tied-table
    bucket of gpt-h512-zoff-bf16 into the next forward (gpu0 peak +27%, docs/calib.md)."""
    if not (grads.offload and grads.buckets_in_flight):
        return
    for o in bucket_release(order, i, grads.buckets_in_flight):
        for r, g in enumerate(lay.gpus()):
            release(b, f"gfree{o}.{g}", g, [(f"gb{o}.{g}", g)], layer=o, rank=r, deps=[f"d2h{o}.{g}"])


def cpu_update_by_layer(b: PlanBuilder, job: Job, lay: Layout, *, upload_bytes_per_param: float, staged: bool,
                        first_deps: Mapping[int, Sequence[str]]) -> None:
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
        for j in lay.dp_groups() if lay.dp > 1 else ():
            grp = lay.dp_group(j)
            all_gather(b, f"ag{i}{lay.dp_suffix(j)}", lay.dp_stream(j, "param"), grp,
                       layer.params / lay.tp * dtype_bytes(job), [f"up{i}.{g}" for g in lay.mine(grp)], layer=i,
                       frees=[(f"stage32_{i}.{g}", g) for g in lay.mine(grp)] if staged else [])


def gpu_held_bytes(job: Job, sizes: Iterable[float]) -> float:
    """Bytes that GPU tensors of ``sizes`` hold together in GPU 0's pool as the simulator charges them: each
    rounded by the hardware's allocator (``gpu.allocator``, PyTorch's caching allocator: ``hardware_models.
    allocator``) in an HBM pool, the bytes alone in a unified one. A policy's estimate of what fits a GPU
    sums these, not the raw sizes, or it passes plans the simulation finds over by the rounding."""
    hbm = gpu_pool(job).kind == "hbm"
    return float(sum(n + (allocator_overhead(n, job.hw.gpu.allocator) if hbm else 0.0) for n in sizes))
