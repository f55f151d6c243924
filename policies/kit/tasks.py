"""One task of each kind a plan is made of: compute, parameter and gradient copies, collectives, frees,
optimizer steps, NVMe swaps, activation moves; plus the saved-activation split and the workspace.

A compute task runs one layer's forward, recomputation or backward on one GPU's compute stream, priced by
the trace's FLOPs and HBM bytes divided by ``share`` (the tensor-parallel degree, or a chunk count);
``flops`` / ``hbm_bytes`` override the priced figures. Task ids default to ``fwd{i}.{g}``, ``rc{i}.{g}``,
``bwd{i}.{g}``. With tp > 1 every block ends its forward, recomputation and backward with the two
all-reduces of Megatron's tensor parallelism (of the ``s*b*h`` layer output, merged into one collective
task), which the next layer waits for (``tp_sync``).

Activations with tensor parallelism (Korthikanti et al. 2022, arXiv 2205.05198, Table 2, no sequence
parallelism): of the ``34 sbh`` a GPT block saves, ``10 sbh`` (layer norms, dropout masks, inputs of the
column-parallel GEMMs) stay replicated and ``24 sbh`` are split; we apply that 10/34 : 24/34 ratio to
whatever the workload trace saves per block. Full checkpointing keeps only the (replicated) layer input.

The GPU optimizer step is bounded by HBM bandwidth (``gpu.optimizer_bytes_per_param``); CPU Adam
(DeepSpeed's vectorised kernel) runs per rank on ``cpu.adam{r}``, every rank sharing the ``cpu.adam`` rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.base import Job
from policies.builder import PlanBuilder
from policies.kit.layout import Layout, Places, tags
from simulator.phase import Phase
from workloads.trace import LayerTrace

REPLICATED_ACT_FRACTION = 10 / 34  # Korthikanti Table 2: 10sbh of 34sbh are not split by TP
TP_ALLREDUCES = {"block": 2, "embedding": 1, "head": 0}  # Megatron: attention + MLP per block
TP_PHASE = {"f": Phase.TP_FWD, "r": Phase.TP_RECOMPUTE, "b": Phase.TP_BWD}
Extra = Mapping[str, Any] | None


def upload(b: PlanBuilder, tid: str, g: str, nbytes: float, deps: Sequence[str], *, layer: int | None,
           rank: int | None, src: str = "cpu", use: str | None = None, stream: str | None = None,
           allocs: Places = (), frees: Places = (), reads: Places = (), phase: Phase = Phase.PARAM_UPLOAD,
           extra: Mapping[str, Any] | None = None) -> str:
    """A copy of ``nbytes`` of parameters from ``src`` to GPU g on its H2D stream."""
    return b.task(tid, "copy", stream or f"{g}.h2d", deps, src=src, dst=g, bytes=nbytes, allocs=allocs,
                  frees=frees, reads=reads, tags=tags(phase, layer=layer, rank=rank, use=use, extra=extra))


def all_gather(b: PlanBuilder, tid: str, stream: str, ranks: Sequence[str], nbytes: float, deps: Sequence[str], *,
               layer: int | None = None, use: str | None = None, allocs: Places = (), frees: Places = (),
               phase: Phase = Phase.PARAM_GATHER, extra: Mapping[str, Any] | None = None) -> str:
    """An all-gather of ``nbytes`` (the full tensor) over ``ranks`` on a communication stream."""
    return b.task(tid, "collective", stream, deps, coll="all_gather", bytes=nbytes, ranks=tuple(ranks),
                  allocs=allocs, frees=frees, tags=tags(phase, layer=layer, use=use, extra=extra))


def reduce(b: PlanBuilder, tid: str, stream: str, ranks: Sequence[str], nbytes: float, deps: Sequence[str], *,
           coll: str = "reduce_scatter", layer: int | None = None, allocs: Places = (), frees: Places = (),
           extra: Mapping[str, Any] | None = None) -> str:
    """A gradient reduction (``all_reduce`` or ``reduce_scatter``) of ``nbytes`` over ``ranks``."""
    return b.task(tid, "collective", stream, deps, coll=coll, bytes=nbytes, ranks=tuple(ranks), allocs=allocs,
                  frees=frees, tags=tags(Phase.GRAD_REDUCE, layer=layer, extra=extra))


def offload(b: PlanBuilder, tid: str, g: str, nbytes: float, deps: Sequence[str], *, layer: int | None,
            rank: int | None, dst: str = "cpu", stream: str | None = None, frees: Places = (),
            reads: Places = (), extra: Mapping[str, Any] | None = None) -> str:
    """A copy of ``nbytes`` of GPU g's gradients to ``dst`` on its D2H stream."""
    return b.task(tid, "copy", stream or f"{g}.d2h", deps, src=g, dst=dst, bytes=nbytes, frees=frees,
                  reads=reads, tags=tags(Phase.GRAD_OFFLOAD, layer=layer, rank=rank, extra=extra))


def release(b: PlanBuilder, tid: str, g: str, frees: Places, *, layer: int | None, rank: int | None,
            phase: Phase = Phase.GRAD_RELEASE, deps: Sequence[str] = (), stream: str | None = None,
            use: str | None = None, extra: Mapping[str, Any] | None = None) -> str:
    """A free, by default on GPU g's compute stream (``GRAD_RELEASE``, ``GRAD_ACCUMULATE`` for a bucket folded
    into a resident gradient buffer, or the phase of the staging buffer it frees)."""
    return b.task(tid, "free", stream or f"{g}.compute", deps, frees=frees,
                  tags=tags(phase, layer=layer, rank=rank, use=use, extra=extra))


def gpu_step(b: PlanBuilder, tid: str, stream: str, deps: Sequence[str], params: float, *, rank: int | None,
             layer: int | None = None, extra: Mapping[str, Any] | None = None) -> str:
    """An optimizer step over ``params`` parameters on a GPU's compute ``stream``."""
    return b.task(tid, "optimizer", stream, deps, params=params,
                  tags=tags(Phase.OPTIMIZER, layer=layer, rank=rank, extra=extra))


def cpu_adam(b: PlanBuilder, tid: str, r: int, deps: Sequence[str], params: float, *, layer: int | None = None,
             rank: int | None = None, extra: Mapping[str, Any] | None = None) -> str:
    """CPU Adam of rank r over ``params`` parameters on ``cpu.adam{r}`` (``rank`` tag defaults to r)."""
    return b.task(tid, "optimizer", f"cpu.adam{r}", deps, params=params,
                  tags=tags(Phase.OPTIMIZER, layer=layer, rank=r if rank is None else rank, extra=extra))


def swap(b: PlanBuilder, tid: str, stream: str, phase: Phase, src: str, dst: str, nbytes: float,
         deps: Sequence[str], *, layer: int | None = None, rank: int | None = None, use: str | None = None,
         allocs: Places = (), frees: Places = (), reads: Places = (),
         extra: Mapping[str, Any] | None = None) -> str:
    """A copy between CPU memory and NVMe (``OPTIMIZER_SWAP_IN`` / ``_OUT``, ``PARAM_SWAP_IN`` / ``_OUT``,
    ``GRAD_SWAP_OUT``) on an io stream."""
    return b.task(tid, "copy", stream, deps, src=src, dst=dst, bytes=nbytes, allocs=allocs, frees=frees,
                  reads=reads, tags=tags(phase, layer=layer, rank=rank, use=use, extra=extra))


def _compute(b: PlanBuilder, kind: str, phase: Phase, i: int, g: str, rank: int | None, deps: Sequence[str],
             flops: float, hbm_bytes: float, tid: str | None, stream: str | None, allocs: Places, frees: Places,
             extra: Extra) -> str:
    return b.task(tid or f"{kind}{i}.{g}", "compute", stream or f"{g}.compute", deps, flops=flops,
                  hbm_bytes=hbm_bytes, allocs=allocs, frees=frees, tags=tags(phase, layer=i, rank=rank, extra=extra))


def forward(b: PlanBuilder, i: int, layer: LayerTrace, g: str, rank: int | None, deps: Sequence[str], *,
            share: float = 1, flops: float | None = None, hbm_bytes: float | None = None, tid: str | None = None,
            stream: str | None = None, allocs: Places = (), frees: Places = (),
            extra: Mapping[str, Any] | None = None) -> str:
    """Layer i's forward on GPU g (1/share of it); returns the task id."""
    return _compute(b, "fwd", Phase.FWD, i, g, rank, deps, layer.fwd_flops / share if flops is None else flops,
                    layer.fwd_hbm_bytes / share if hbm_bytes is None else hbm_bytes, tid, stream, allocs, frees, extra)


def recompute(b: PlanBuilder, i: int, layer: LayerTrace, g: str, rank: int | None, deps: Sequence[str], *,
              share: float = 1, flops: float | None = None, hbm_bytes: float | None = None,
              tid: str | None = None, stream: str | None = None, allocs: Places = (), frees: Places = (),
              extra: Mapping[str, Any] | None = None) -> str:
    """Layer i's recomputation (the trace's ``recompute_flops`` unless ``flops``), reading as its forward."""
    return _compute(b, "rc", Phase.RECOMPUTE, i, g, rank, deps,
                    layer.recompute_flops / share if flops is None else flops,
                    layer.fwd_hbm_bytes / share if hbm_bytes is None else hbm_bytes, tid, stream, allocs, frees, extra)


def backward(b: PlanBuilder, i: int, layer: LayerTrace, g: str, rank: int | None, deps: Sequence[str], *,
             share: float = 1, flops: float | None = None, hbm_bytes: float | None = None, tid: str | None = None,
             stream: str | None = None, allocs: Places = (), frees: Places = (),
             extra: Mapping[str, Any] | None = None) -> str:
    """Layer i's backward on GPU g (1/share of it); returns the task id."""
    return _compute(b, "bwd", Phase.BWD, i, g, rank, deps, layer.bwd_flops / share if flops is None else flops,
                    layer.bwd_hbm_bytes / share if hbm_bytes is None else hbm_bytes, tid, stream, allocs, frees, extra)


def move_activation(b: PlanBuilder, tid: str, stream: str, tensor: str, src: str, dst: str, deps: Sequence[str],
                    *, phase: Phase, layer: int, rank: int | None = None,
                    extra: Mapping[str, Any] | None = None) -> str:
    """Move a layer's saved activations (``tensor``) between a GPU and CPU memory on a copy stream
    (``ACTIVATION_OFFLOAD`` / ``ACTIVATION_RELOAD``): the copy allocates the destination and frees the source."""
    return b.task(tid, "copy", stream, deps, tensor=tensor, src=src, dst=dst, alloc_dst=True, free_src=True,
                  tags=tags(phase, layer=layer, rank=rank, extra=extra))


def tp_sync(b: PlanBuilder, lay: Layout, i: int, layer: LayerTrace, phase: str, prefix: str) -> dict[int, str]:
    """Tensor-parallel all-reduces closing layer i's ``phase`` (``f``, ``r`` or ``b``) in every TP group,
    after the tasks ``{prefix}{i}.{g}`` of its GPUs: group k -> task id (empty with tp = 1)."""
    n_ar = TP_ALLREDUCES[layer.kind]
    if lay.tp == 1 or n_ar == 0:
        return {}
    return {k: b.task(f"tp{phase}{i}.k{k}", "collective", f"tp{k}", [f"{prefix}{i}.{g}" for g in lay.tp_group(k)],
                      coll="all_reduce", bytes=n_ar * layer.output_bytes, ranks=tuple(lay.tp_group(k)),
                      tags=tags(TP_PHASE[phase], layer=i)) for k in range(lay.dp)}


def saved_activation_bytes(job: Job, layer_bytes: float, kind: str, tp: int) -> float:
    """Bytes a GPU keeps of a layer's saved activations with tensor parallelism ``tp`` (module docstring)."""
    if tp == 1 or kind != "block" or job.config.checkpointing == "full":
        return layer_bytes
    return layer_bytes * (REPLICATED_ACT_FRACTION + (1 - REPLICATED_ACT_FRACTION) / tp)


def workspace(b: PlanBuilder, job: Job, lay: Layout) -> None:
    """A persistent per-GPU buffer sized to the largest transient working set of any layer (split by TP): a
    caching allocator keeps such a block once it has served the largest layer."""
    ws = max(layer.peak_transient_bytes for layer in job.trace.layers) / lay.tp
    for g in lay.gpus():
        b.tensor(f"ws.{g}", ws, "buffer", home=g, persistent=True)
