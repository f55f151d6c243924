"""Data-parallel forward/backward emission shared by ``none`` (ZeRO 0-3 on the GPUs) and ``zero-offload``.

Every GPU is one data-parallel rank running the same layer sequence on its own micro-batches. Per rank
and micro-step: the forward of every layer (saving its activations, or only its input under full
checkpointing), then in reverse the recomputation (when checkpointing) and the backward of every layer,
whose gradients are reduced across ranks per layer (all-reduce for ZeRO 0/1, reduce-scatter for ZeRO 2/3
and ZeRO-Offload) as soon as that layer's backward ends, overlapping the next layer's backward (DeepSpeed's
``overlap_comm``). ZeRO-3 all-gathers each layer's parameters before its forward and again before its
backward, and frees them after use. Collectives are single tasks over all ranks on a communication
stream; with one GPU they are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import Job
from policies.builder import PlanBuilder


@dataclass(frozen=True)
class Grads:
    """How a layer's gradients leave the backward."""

    reduce: str          # "all_reduce" | "reduce_scatter"
    bucket: bool         # gradients land in a transient per-layer bucket (else in a persistent buffer)
    offload: bool        # the rank's partition is copied to the CPU (ZeRO-Offload)
    offload_bytes_per_param: float = 2.0


def dtype_bytes(job: Job) -> int:
    return {"bf16": 2, "fp16": 2, "fp32": 4}[job.config.precision]


def gpu(r: int) -> str:
    return f"gpu{r}"


def declare_streams(b: PlanBuilder, n: int, *, cpu_adam: bool) -> None:
    for r in range(n):
        b.stream(f"{gpu(r)}.compute", gpu(r), "compute")
        b.stream(f"{gpu(r)}.h2d", gpu(r), "h2d")
        b.stream(f"{gpu(r)}.d2h", gpu(r), "d2h")
        if cpu_adam:
            b.stream(f"cpu.adam{r}", "cpu", "optim")
    if n > 1:
        b.stream("comm.grad", gpu(0), "comm")
        b.stream("comm.param", gpu(0), "comm")


def workspace(b: PlanBuilder, job: Job, n: int) -> None:
    """A persistent per-GPU buffer sized to the largest transient working set of any layer.

    A caching allocator keeps such a block once it has served the largest layer, so it is modelled as
    resident for the whole run rather than allocated and freed per kernel.
    """
    ws = max(layer.peak_transient_bytes for layer in job.trace.layers)
    for r in range(n):
        b.tensor(f"ws.{gpu(r)}", ws, "buffer", home=gpu(r), persistent=True)


def emit_microstep(b: PlanBuilder, job: Job, n: int, grads: Grads, *, gather_params: bool,
                   param_ready: dict[int, list[str]]) -> None:
    """Tasks of one micro-step for all ranks, in the current segment (which the caller declared).

    ``param_ready[i]`` are the dependencies that make layer i's parameters usable on every rank (e.g. the
    previous step's all-gather or upload). With ``gather_params`` (ZeRO-3) the layer is all-gathered into
    a transient full copy before its forward and its backward.
    """
    layers = job.trace.layers
    db = dtype_bytes(job)
    if gather_params and n == 1:
        raise ValueError("gathering parameters needs more than one rank")
    ranks = [gpu(r) for r in range(n)]
    for r in range(n):
        for i, layer in enumerate(layers):
            b.tensor(f"act{i}.{gpu(r)}", layer.activation_bytes, "activation", scope="iteration", layer=i)
            if grads.bucket:
                b.tensor(f"gb{i}.{gpu(r)}", layer.params * db, "grad", scope="iteration", layer=i)
            if gather_params:
                b.tensor(f"pg{i}.{gpu(r)}", layer.params * db, "param16", scope="iteration", layer=i)
    gathered = [(f"pg{{i}}.{g}", g) for g in ranks]

    def gather(i: int, phase: str, deps: list[str]) -> str:
        return b.task(f"ag{phase}{i}", "collective", "comm.param", deps, coll="all_gather",
                      bytes=layers[i].params * db, ranks=tuple(ranks),
                      allocs=[(t.format(i=i), g) for t, g in gathered], tags={"layer": i, "phase": phase})

    # forward
    for i, layer in enumerate(layers):
        pre = gather(i, "f", param_ready.get(i, [])) if gather_params else None
        for r, g in enumerate(ranks):
            deps = [pre] if pre else list(param_ready.get(i, []))
            frees = [(f"pg{i}.{g}", g)] if gather_params else []
            b.task(f"fwd{i}.{g}", "compute", f"{g}.compute", deps, flops=layer.fwd_flops,
                   hbm_bytes=layer.fwd_hbm_bytes, allocs=[(f"act{i}.{g}", g)], frees=frees,
                   tags={"layer": i, "phase": "fwd", "rank": r})
    # backward, last layer first
    for i in reversed(range(len(layers))):
        layer = layers[i]
        pre = gather(i, "b", [f"fwd{len(layers) - 1}.{g}" for g in ranks] if i == len(layers) - 1 else [])\
            if gather_params else None
        for r, g in enumerate(ranks):
            deps = [pre] if pre else []
            if layer.recompute_flops > 0:
                b.task(f"rc{i}.{g}", "compute", f"{g}.compute", deps, flops=layer.recompute_flops,
                       hbm_bytes=layer.fwd_hbm_bytes, tags={"layer": i, "phase": "recompute", "rank": r})
                deps = []
            frees = [(f"act{i}.{g}", g)] + ([(f"pg{i}.{g}", g)] if gather_params else [])
            allocs = [(f"gb{i}.{g}", g)] if grads.bucket else []
            b.task(f"bwd{i}.{g}", "compute", f"{g}.compute", deps, flops=layer.bwd_flops,
                   hbm_bytes=layer.bwd_hbm_bytes, allocs=allocs, frees=frees,
                   tags={"layer": i, "phase": "bwd", "rank": r})
        grad_bytes = layer.params * db
        red = None
        if n > 1:
            red = b.task(f"red{i}", "collective", "comm.grad", [f"bwd{i}.{g}" for g in ranks],
                         coll=grads.reduce, bytes=grad_bytes, ranks=tuple(ranks),
                         frees=[(f"gb{i}.{g}", g) for g in ranks] if grads.bucket and not grads.offload else [],
                         tags={"layer": i, "phase": "grad-reduce"})
        for r, g in enumerate(ranks):
            if grads.offload:
                b.task(f"d2h{i}.{g}", "copy", f"{g}.d2h", [red or f"bwd{i}.{g}"], src=g, dst="cpu",
                       bytes=layer.params / n * grads.offload_bytes_per_param, frees=[(f"gb{i}.{g}", g)],
                       tags={"layer": i, "phase": "grad-offload", "rank": r})
            elif grads.bucket and n == 1:
                b.task(f"acc{i}.{g}", "free", f"{g}.compute", [], frees=[(f"gb{i}.{g}", g)],
                       tags={"layer": i, "phase": "grad-accumulate", "rank": r})
