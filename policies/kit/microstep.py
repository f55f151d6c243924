"""One micro-step of data- and tensor-parallel training on every GPU (``none``, ``zero-offload``).

Per GPU and micro-step: the forward of every layer on a 1/tp slice of its weights (saving its
activations, or only its input under full checkpointing), then in reverse the recomputation (when
checkpointing) and the backward of every layer; with tp > 1 each ends with its tensor-parallel sync
(``layers.tp_sync``). Each layer's gradients are reduced (and offloaded) as soon as its backward ends
(``grads.reduce_and_offload``); with offload the backward waits on the bucket gate
(``Grads.buckets_in_flight``). ZeRO-3 all-gathers
each layer's parameters before its forward and again before its backward and frees them after use,
prefetching one layer ahead: layer i is gathered while layer i-1 computes, not earlier, so at most two
gathered layers are live (DeepSpeed's prefetch; without the bound every gather runs ahead).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.base import Job
from policies.builder import PlanBuilder
from policies.kit.fetch import gather_layer
from policies.kit.grads import Grads, bucket_gate, reduce_and_offload
from policies.kit.layers import backward, forward, recompute, saved_activation_bytes, tp_sync
from policies.kit.layout import Layout, dtype_bytes

ParamReady = Mapping[int, Sequence[str]]


def microstep_tensors(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, *, gather_params: bool) -> None:
    """Per GPU and layer: saved activations, the gradient bucket and (ZeRO-3) the gathered parameters."""
    db = dtype_bytes(job)
    t = lay.tp
    for g in lay.gpus():
        for i, layer in enumerate(job.trace.layers):
            b.tensor(f"act{i}.{g}", saved_activation_bytes(job, layer.activation_bytes, layer.kind, t),
                     "activation", scope="iteration", layer=i)
            if grads.bucket:
                b.tensor(f"gb{i}.{g}", layer.params / t * db, "grad", scope="iteration", layer=i)
            if gather_params:
                b.tensor(f"pg{i}.{g}", layer.params / t * db, "param16", scope="iteration", layer=i)


def emit_microstep(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, *, gather_params: bool,
                   param_ready: ParamReady) -> None:
    """Tasks of one micro-step for all GPUs, in the current segment (which the caller declared).

    ``param_ready[i]`` are the dependencies that make layer i's parameters usable (e.g. the previous
    step's all-gather or upload); with ``gather_params`` (ZeRO-3) layer i is all-gathered in each
    data-parallel group into a transient full copy before its forward and before its backward.
    """
    if gather_params and lay.dp == 1:
        raise ValueError("gathering parameters needs more than one data-parallel rank")
    microstep_tensors(b, job, lay, grads, gather_params=gather_params)
    prev_sync = forward_pass(b, job, lay, gather_params=gather_params, param_ready=param_ready)
    backward_pass(b, job, lay, grads, gather_params=gather_params, prev_sync=prev_sync)


def forward_pass(b: PlanBuilder, job: Job, lay: Layout, *, gather_params: bool,
                 param_ready: ParamReady) -> dict[int, str]:
    """The forward of every layer on every GPU; returns the last layer's TP syncs (group -> task)."""
    layers = job.trace.layers
    db = dtype_bytes(job)
    prev_sync: dict[int, str] = {}
    for i, layer in enumerate(layers):
        pre: dict[int, str] = {}
        if gather_params:
            bound = {j: [f"fwd{i - 2}.{g}" for g in lay.dp_group(j)] if i >= 2 else [] for j in range(lay.tp)}
            pre = gather_layer(b, lay, i, "f", layer.params / lay.tp * db,
                               {j: list(param_ready.get(i, [])) + bound[j] for j in range(lay.tp)})
        for r, g in enumerate(lay.gpus()):
            k, j = lay.tp_index(r)
            deps = ([pre[j]] if pre else list(param_ready.get(i, []))) + ([prev_sync[k]] if k in prev_sync else [])
            forward(b, i, layer, g, r, deps, share=lay.tp, allocs=[(f"act{i}.{g}", g)],
                    frees=[(f"pg{i}.{g}", g)] if gather_params else [])
        prev_sync = tp_sync(b, lay, i, layer, "f", "fwd")
    return prev_sync


def backward_pass(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, *, gather_params: bool,
                  prev_sync: dict[int, str]) -> None:
    """Recomputation and backward of every layer, last first, each followed by its gradient reduction."""
    layers = job.trace.layers
    L = len(layers)
    db = dtype_bytes(job)
    order = list(reversed(range(L)))
    for i in order:
        layer = layers[i]
        pre: dict[int, str] = {}
        if gather_params:
            after = f"fwd{L - 1}" if i >= L - 2 else f"bwd{i + 2}"  # backward prefetch: also one layer ahead
            pre = gather_layer(b, lay, i, "b", layer.params / lay.tp * db,
                               {j: [f"{after}.{g}" for g in lay.dp_group(j)] for j in range(lay.tp)})
        rc_sync: dict[int, str] = {}
        if layer.recompute_flops > 0:
            for r, g in enumerate(lay.gpus()):
                k, j = lay.tp_index(r)
                deps = ([pre[j]] if pre else []) + ([prev_sync[k]] if k in prev_sync else [])
                recompute(b, i, layer, g, r, deps, share=lay.tp)
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
