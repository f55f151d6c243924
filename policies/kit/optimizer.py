"""The optimizer step: on the GPUs, or CPU Adam per partition with NVMe swapping of optimizer states and
parameters.

- GPU step (``gpu_step``): on the GPU's compute stream over the parameters it updates, bounded by HBM
  bandwidth (``gpu.optimizer_bytes_per_param`` of the hardware spec).
- CPU Adam (``cpu_adam``): DeepSpeed's vectorised kernel on the shared host CPU, one task per rank and
  layer (or sub-group) on ``cpu.adam{r}``; every rank's Adam shares the ``cpu.adam`` throughput.
- NVMe swap (``swap``): optimizer states (fp32 master, m, v, and the fp32 gradient) read into pinned
  buffers before Adam and written back after; updated 16-bit parameters written to their NVMe home.
  ``read_ahead`` bounds the reads: the read of unit k waits for the write ``window`` units back, so at
  most ``window`` units' buffers are live (a read-ahead window).
- Per-layer CPU update (``cpu_update_by_layer``): ZeRO-Offload's Adam per layer partition, each rank's
  upload of its updated partition on its H2D engine and the all-gather of the layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.base import Job
from policies.builder import PlanBuilder
from policies.kit.fetch import all_gather, upload
from policies.kit.layout import Layout, dtype_bytes
from policies.kit.tags import tags
from simulator.phase import Phase

Places = Sequence[tuple[str, str]]


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
         deps: Sequence[str], *, layer: int | None = None, rank: int | None = None, allocs: Places = (),
         frees: Places = (), reads: Places = (), extra: Mapping[str, Any] | None = None) -> str:
    """A copy between CPU memory and NVMe (``OPTIMIZER_SWAP_IN`` / ``_OUT``, ``PARAM_SWAP_IN`` / ``_OUT``,
    ``GRAD_SWAP_OUT``) on an io stream."""
    return b.task(tid, "copy", stream, deps, src=src, dst=dst, bytes=nbytes, allocs=allocs, frees=frees,
                  reads=reads, tags=tags(phase, layer=layer, rank=rank, extra=extra))


def read_ahead(k: int, window: int, written: str) -> list[str]:
    """The dependency of the read of unit k with a read-ahead ``window``: the write of unit
    ``k - window`` (``written`` is its id with ``{}`` for the unit), none for the first units."""
    return [written.format(k - window)] if k >= window else []


def cpu_update_by_layer(b: PlanBuilder, job: Job, lay: Layout, *, upload_bytes_per_param: float,
                        staged: bool, first_deps: Mapping[int, Sequence[str]]) -> None:
    """ZeRO-Offload's step: per layer in order, every rank's CPU Adam of its ``1/n`` partition
    (``adam{i}.r{r}``; layer 0's waits for ``first_deps[r]``), the upload of the updated partition
    (``up{i}.{g}``, through an fp32 staging buffer ``stage32_{i}.{g}`` when ``staged``) and, with more
    than one data-parallel rank, the all-gather of the layer in every group (``ag{i}.d{j}``)."""
    n = lay.n
    db = dtype_bytes(job)
    for i, layer in enumerate(job.trace.layers):
        for r, g in enumerate(lay.gpus()):
            cpu_adam(b, f"adam{i}.r{r}", r, list(first_deps.get(r, [])) if i == 0 else [], layer.params / n, layer=i)
            upload(b, f"up{i}.{g}", g, layer.params / n * upload_bytes_per_param, [f"adam{i}.r{r}"], layer=i,
                   rank=r, allocs=[(f"stage32_{i}.{g}", g)] if staged else [],
                   frees=[(f"stage32_{i}.{g}", g)] if staged and lay.dp == 1 else [])
        if lay.dp > 1:
            for j in range(lay.tp):
                grp = lay.dp_group(j)
                all_gather(b, f"ag{i}{lay.dp_suffix(j)}", lay.dp_stream(j, "param"), grp, layer.params / lay.tp * db,
                           [f"up{i}.{g}" for g in grp], layer=i,
                           frees=[(f"stage32_{i}.{g}", g) for g in grp] if staged else [])
