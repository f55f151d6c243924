"""Per-layer compute tasks (forward, recomputation, backward), tensor-parallel syncs, saved activations
and the per-GPU workspace.

A compute task runs one layer's forward, recomputation or backward on one GPU's compute stream, priced by
the trace's FLOPs and HBM bytes divided by ``share`` (the tensor-parallel degree, or a chunk count);
``flops`` / ``hbm_bytes`` override the priced figures (a recomputation of the whole forward, a chunk's
bytes). Task ids default to ``fwd{i}.{g}``, ``rc{i}.{g}``, ``bwd{i}.{g}``.

With tp > 1 every block ends its forward, its recomputation and its backward with the two all-reduces of
Megatron's tensor parallelism (of the ``s*b*h`` layer output, merged into one collective task), which the
next layer waits for (``tp_sync``).

Activations with tensor parallelism (Korthikanti et al. 2022, arXiv 2205.05198, Table 2, no sequence
parallelism): of the ``34 sbh`` a GPT block saves, ``10 sbh`` (layer norms, dropout masks, inputs of the
column-parallel GEMMs) stay replicated and ``24 sbh`` are split; we apply that 10/34 : 24/34 ratio to
whatever the workload trace saves per block. Full checkpointing keeps only the (replicated) layer input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.base import Job
from policies.builder import PlanBuilder
from policies.kit.layout import Layout
from policies.kit.tags import tags
from simulator.phase import Phase
from workloads.trace import LayerTrace

REPLICATED_ACT_FRACTION = 10 / 34  # Korthikanti Table 2: 10sbh of 34sbh are not split by TP
TP_ALLREDUCES = {"block": 2, "embedding": 1, "head": 0}  # Megatron: attention + MLP per block
TP_PHASE = {"f": Phase.TP_FWD, "r": Phase.TP_RECOMPUTE, "b": Phase.TP_BWD}

Places = Sequence[tuple[str, str]]


def _compute(b: PlanBuilder, tid: str, stream: str, deps: Sequence[str], flops: float, hbm_bytes: float,
             phase: Phase, i: int, rank: int | None, allocs: Places, frees: Places,
             extra: Mapping[str, Any] | None) -> str:
    return b.task(tid, "compute", stream, deps, flops=flops, hbm_bytes=hbm_bytes, allocs=allocs, frees=frees,
                  tags=tags(phase, layer=i, rank=rank, extra=extra))


def forward(b: PlanBuilder, i: int, layer: LayerTrace, g: str, rank: int | None, deps: Sequence[str], *,
            share: float = 1, flops: float | None = None, hbm_bytes: float | None = None, tid: str | None = None,
            stream: str | None = None, allocs: Places = (), frees: Places = (),
            extra: Mapping[str, Any] | None = None) -> str:
    """Layer i's forward on GPU g (1/share of it); returns the task id."""
    return _compute(b, tid or f"fwd{i}.{g}", stream or f"{g}.compute", deps,
                    layer.fwd_flops / share if flops is None else flops,
                    layer.fwd_hbm_bytes / share if hbm_bytes is None else hbm_bytes,
                    Phase.FWD, i, rank, allocs, frees, extra)


def recompute(b: PlanBuilder, i: int, layer: LayerTrace, g: str, rank: int | None, deps: Sequence[str], *,
              share: float = 1, flops: float | None = None, hbm_bytes: float | None = None,
              tid: str | None = None, stream: str | None = None, allocs: Places = (), frees: Places = (),
              extra: Mapping[str, Any] | None = None) -> str:
    """Layer i's recomputation (the trace's ``recompute_flops`` unless ``flops``), reading as its forward."""
    return _compute(b, tid or f"rc{i}.{g}", stream or f"{g}.compute", deps,
                    layer.recompute_flops / share if flops is None else flops,
                    layer.fwd_hbm_bytes / share if hbm_bytes is None else hbm_bytes,
                    Phase.RECOMPUTE, i, rank, allocs, frees, extra)


def backward(b: PlanBuilder, i: int, layer: LayerTrace, g: str, rank: int | None, deps: Sequence[str], *,
             share: float = 1, flops: float | None = None, hbm_bytes: float | None = None, tid: str | None = None,
             stream: str | None = None, allocs: Places = (), frees: Places = (),
             extra: Mapping[str, Any] | None = None) -> str:
    """Layer i's backward on GPU g (1/share of it); returns the task id."""
    return _compute(b, tid or f"bwd{i}.{g}", stream or f"{g}.compute", deps,
                    layer.bwd_flops / share if flops is None else flops,
                    layer.bwd_hbm_bytes / share if hbm_bytes is None else hbm_bytes,
                    Phase.BWD, i, rank, allocs, frees, extra)


def tp_sync(b: PlanBuilder, lay: Layout, i: int, layer: LayerTrace, phase: str, prefix: str) -> dict[int, str]:
    """Tensor-parallel all-reduces closing layer i's ``phase`` (``f``, ``r`` or ``b``) in every TP group,
    after the tasks ``{prefix}{i}.{g}`` of its GPUs: group k -> task id (empty with tp = 1)."""
    n_ar = TP_ALLREDUCES[layer.kind]
    if lay.tp == 1 or n_ar == 0:
        return {}
    out = {}
    for k in range(lay.dp):
        grp = lay.tp_group(k)
        out[k] = b.task(f"tp{phase}{i}.k{k}", "collective", f"tp{k}", [f"{prefix}{i}.{g}" for g in grp],
                        coll="all_reduce", bytes=n_ar * layer.output_bytes, ranks=tuple(grp),
                        tags=tags(TP_PHASE[phase], layer=i))
    return out


def saved_activation_bytes(job: Job, layer_bytes: float, kind: str, tp: int) -> float:
    """Bytes a GPU keeps of a layer's saved activations with tensor parallelism ``tp`` (module docstring)."""
    if tp == 1 or kind != "block" or job.config.checkpointing == "full":
        return layer_bytes
    return layer_bytes * (REPLICATED_ACT_FRACTION + (1 - REPLICATED_ACT_FRACTION) / tp)


def workspace(b: PlanBuilder, job: Job, lay: Layout) -> None:
    """A persistent per-GPU buffer sized to the largest transient working set of any layer (split by TP).

    A caching allocator keeps such a block once it has served the largest layer, so it is modelled as
    resident for the whole run rather than allocated and freed per kernel.
    """
    ws = max(layer.peak_transient_bytes for layer in job.trace.layers) / lay.tp
    for g in lay.gpus():
        b.tensor(f"ws.{g}", ws, "buffer", home=g, persistent=True)
