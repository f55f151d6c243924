"""Gradients leaving the backward: reduction across data-parallel ranks, offload to the CPU, and the
bucket gate that bounds how many gradient buckets are in flight.

Each layer's gradients are reduced across the data-parallel group as soon as that layer's backward ends,
overlapping the next layer's backward (DeepSpeed ``overlap_comm``): an all-reduce for ZeRO 0/1, a
reduce-scatter for ZeRO 2/3 and the offloading policies. With offload each rank then copies its
partition to the CPU on its D2H engine.

The bucket gate (``buckets_in_flight`` = B): a layer's backward does not produce its gradients before the
bucket B buckets back (in backward order, across micro-steps) has drained, so a slow link stalls the
backward instead of piling gradients up on the GPU. DeepSpeed double-buffers its ipg bucket (B = 2);
each policy passes its own B.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.base import Job
from policies.builder import PlanBuilder
from policies.kit.layout import Layout, dtype_bytes
from policies.kit.tags import tags
from simulator.phase import Phase

Places = Sequence[tuple[str, str]]


def bucket_gate(order: Sequence[int], i: int, buckets_in_flight: int, drained: Callable[[int], str]) -> list[str]:
    """The dependency that holds layer i's backward until the bucket ``buckets_in_flight`` back has drained.

    ``order``: the layers that fill a bucket, in backward order (last layer first); ``drained(o)``: the
    id of the task that frees layer o's bucket. Before the first B buckets of a micro-step the gate is
    on the previous micro-step's (``@1``); with fewer than B buckets in all there is none.
    """
    j = list(order).index(i)
    B = buckets_in_flight
    q, suffix = (j - B, "") if j >= B else (len(order) - B + j, "@1")
    if q < 0:
        return []
    return [drained(order[q]) + suffix]


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
    """A free task, by default on GPU g's compute stream (``GRAD_RELEASE``, ``GRAD_ACCUMULATE`` for a bucket
    folded into a resident gradient buffer, or the phase of whatever staging buffer it frees)."""
    return b.task(tid, "free", stream or f"{g}.compute", deps, frees=frees,
                  tags=tags(phase, layer=layer, rank=rank, use=use, extra=extra))


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
