"""Memory-centric tiling (ZeRO-Infinity Sec. 5.1.3; DeepSpeed ``deepspeed/runtime/zero/tiling.py``,
``TiledLinear``): a huge linear layer is split into ``in_splits x out_splits`` tiles, each its own
``torch.nn.Linear`` submodule, so ZeRO-3 fetches, gathers, computes and releases one tile's parameters at a
time and the GPU never holds the whole layer.

Our model: with ``tile_factor`` T every transformer block is split into T consecutive tiles, each a layer of the
plan with 1/T of the block's parameters, FLOPs, HBM traffic and model states; the block's saved activations (its
checkpoint) stay with the first tile and its transient working set with every tile (the activations a linear
layer reads and writes are not split by tiling its weights). The whole ZeRO-Infinity schedule (prefetch windows,
gathers, gradient reduce-scatter and offload, sub-groups) then runs over the tiles: T times as many, T times
smaller gathers and computes, priced by the same routes and efficiency curve (a smaller GEMM runs lower on it).
Embedding and head are not tiled. The plan's ``layer`` tags then count tiles (``plan.info['tile_factor']``).

``tile_factor=auto`` picks the smallest T with which the in-flight working set fits the GPU: the workspace,
X
buckets (in the backward: the tile computing, its gradient bucket, the previous tile's bucket still being
reduced and offloaded, and the gathers in flight ahead of it); T = 1 when the
untiled model fits, and T = 1 as well when no T helps (the feasibility check then names what does not fit).
"""

from __future__ import annotations

import dataclasses
import math

from hardware_models import build_topology
from policies import kit
from policies.base import Job
from workloads.trace import LayerTrace

__all__ = ["MAX_TILE_FACTOR", "auto_tile_factor", "tile_factor", "tiled_job"]

MAX_TILE_FACTOR = 64


def _tile(layer: LayerTrace, t: int, n: int, index: int) -> LayerTrace:
    def share(v: float) -> int:
        return int(v) // n + (1 if t < int(v) % n else 0)

    return dataclasses.replace(
        layer, index=index, name=f"{layer.name}.tile{t}", params=share(layer.params),
        param_bytes=share(layer.param_bytes), grad_bytes=share(layer.grad_bytes),
        master_bytes=share(layer.master_bytes), optimizer_bytes=share(layer.optimizer_bytes),
        fwd_flops=layer.fwd_flops / n, bwd_flops=layer.bwd_flops / n, recompute_flops=layer.recompute_flops / n,
        activation_bytes=layer.activation_bytes if t == 0 else 0,
        activation_bytes_nockpt=layer.activation_bytes_nockpt if t == 0 else 0,
        fwd_hbm_bytes=layer.fwd_hbm_bytes / n, bwd_hbm_bytes=layer.bwd_hbm_bytes / n)


def tiled_job(job: Job, factor: int) -> Job:
    """``job`` with every block split into ``factor`` tiles (module docstring); ``job`` itself when 1."""
    if factor <= 1:
        return job
    layers: list[LayerTrace] = []
    for layer in job.trace.layers:
        if layer.kind != "block":
            layers.append(dataclasses.replace(layer, index=len(layers)))
            continue
        base = len(layers)
        layers.extend([_tile(layer, t, factor, base + t) for t in range(factor)])
    return dataclasses.replace(job, trace=dataclasses.replace(job.trace, layers=tuple(layers)))


def auto_tile_factor(job: Job, gather_prefetch: int, kept_activations: float) -> int:
    """The smallest tile factor whose in-flight working set fits one GPU (module docstring)."""
    topo = build_topology(job.hw)
    cap = topo.pools[topo.pool_of[kit.gpu(0)]].capacity_bytes
    layers, db = job.trace.layers, kit.dtype_bytes(job)
    ws = max(layer.peak_transient_bytes for layer in layers)
    window = gather_prefetch + 3
    block = max((layer.params for layer in layers if layer.kind == "block"), default=0) * db
    other = max((layer.params for layer in layers if layer.kind != "block"), default=0) * db
    free = cap - ws - kept_activations
    if block <= 0 or free >= window * max(block, other) or free <= window * other:
        return 1
    factor = math.ceil(window * block / free)
    return factor if factor <= MAX_TILE_FACTOR else 1


def tile_factor(job: Job, knob: int | str, gather_prefetch: int, kept_activations: float) -> int:
    """The knob's value, or the automatic choice for ``auto``."""
    if knob == "auto":
        return auto_tile_factor(job, gather_prefetch, kept_activations)
    return int(knob)
