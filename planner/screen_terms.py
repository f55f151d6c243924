"""Per-policy time terms of the screen: lower bounds of a policy's plan time bound (``planner.bounds``) on a
resource other than the GPUs' SMs, from (hardware, workload, knobs) alone.

``planner.bounds`` bounds a plan's step by the work of its busiest resource; the compute screen
(``planner.screen.compute_screen``) is the SM part of that. A term here is another resource's part, counted only
from tasks the policy emits whatever it decides, priced with the same functions as the bound:

- ``host_link_seconds``: bytes each GPU certainly copies to and from the host per step, routed as the bound
  routes them (``costs.RouteTable``); a link resource's work is the bytes of every GPU whose route crosses it,
  over its capacity (``costs.link_capacities``); a duplex budget counts both directions, as the bound does;
- ``cpu_optimizer_seconds``: the parameters the host's CPU Adam updates per step, priced as the bound prices
  each CPU optimizer task (``costs.cpu_adam_seconds`` over the node count).

The screen of a candidate is the largest of the compute screen and its policy's terms (each a lower bound of
one resource's work, so of the bound's maximum). Per policy (``TERMS``):

- ``zero-offload``: every micro-step each of the n GPUs copies ``1/n`` of every layer's gradients to the CPU
  (``kit.reduce_and_offload``, ``grad_offload_bytes_per_param`` bytes a parameter), once a step each uploads
  ``1/n`` of every layer's updated parameters (``kit.cpu_update_by_layer``, ``upload_bytes_per_param``) and
  the CPU steps Adam over every parameter once.
- ``zero-infinity`` (ZeRO-3, no tensor parallelism): every micro-step each rank uploads its ``1/n`` slice of
  every layer with parameters twice (the forward's and the backward's fetch, ``kit.sliced_fetch`` from the CPU,
  whichever device the parameters live on: NVMe reads land in pinned CPU memory first), and with
  ``offload_checkpoints`` copies each block's saved activations down after its forward and back before its
  backward (``states.offloads_ckpt``); the CPU steps Adam over every parameter once (in place or swapped).
  Gradient copies are not counted (with NVMe optimizer states they may stream to the drives).
- ``tinypipe``: each stage is a contiguous range of whole layers on one GPU, which runs the forward and backward
  (and the recomputation the checkpointing asks for) of each of its layers for every micro-batch of its
  replica, so its SMs do at least the stage's sum of ``planner.screen.layer_floors`` times the micro-batches.
  The policy only plans a partition whose every stage fits the GPU in some mode (it raises ``PlanInfeasible``
  otherwise); each such stage's least memory over the modes (``memory_screens.least_mode_memory``, which never
  falls as the range grows) is at most the capacity. So the busiest GPU does at least the least, over the
  partitions whose stages all pass that test, of the largest stage sum (``least_bottleneck``: a min-max
  partition by dynamic programming). Only where the stage count is known without a solve (as the memory
  screen); none where no partition passes (the memory screen rejects the candidate then).

Returns 0 where a figure is not certain (several nodes: the host is per node; GPUs the topology does not name).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from costs import RouteTable, cpu_adam_seconds, link_capacities
from hardware_models import Topology, build_topology
from planner.memory_screens import least_mode_memory, tinypipe_stages
from policies import Job, get_policy, kit, parse_knobs
from policies.base import gpu_pool
from policies.tinypipe.packing import Model
from policies.tinypipe.pipeline import packing_problem
from policies.zero_infinity.states import offloads_ckpt
from policies.zero_offload import auto_tp

Term = tuple[float, str]


class Links:
    """Routes and link capacities of one machine (built once per search)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.route = RouteTable(topo)
        self.caps = link_capacities(topo)


def links_of(job: Job) -> Links:
    return Links(build_topology(job.hw))


def host_link_seconds(job: Job, links: Links, down_per_gpu: float, up_per_gpu: float) -> Term:
    """The busiest link's seconds when each of the job's GPUs copies ``down_per_gpu`` bytes to the host ("cpu")
    and ``up_per_gpu`` bytes from it in one step (at least; the plan may copy more)."""
    gpus = [kit.gpu(r) for r in range(job.n_gpus)]
    if job.hw.nodes != 1 or "cpu" not in links.topo.pools or any(g not in links.topo.pools for g in gpus):
        return 0.0, "none"
    nbytes: dict[str, float] = defaultdict(float)
    for g in gpus:
        for src, dst, b in ((g, "cpu", down_per_gpu), ("cpu", g, up_per_gpu)):
            if b > 0:
                for r in links.route(src, dst).resources:
                    nbytes[r] += b
    work = [(b / links.caps[r], r) for r, b in sorted(nbytes.items()) if links.caps.get(r, 0) > 0]
    return max(work, default=(0.0, "none"))


def cpu_optimizer_seconds(job: Job, params: float) -> Term:
    """The CPU-Adam resource's seconds for ``params`` parameters stepped on the host per step."""
    return cpu_adam_seconds(job.hw, params) / job.hw.nodes, "cpu.adam"


def _params(job: Job) -> float:
    return float(sum(ly.params for ly in job.trace.layers))


def zero_offload(job: Job, knobs: Mapping[str, Any], links: Links) -> list[Term]:
    k = parse_knobs(get_policy("zero-offload"), dict(knobs))
    k.validate()
    tp = k.tp or auto_tp(job)
    if tp <= 0 or job.n_gpus % tp:
        return []
    accum = job.accumulation(job.n_gpus // tp)
    p = _params(job)
    per_gpu = p / job.n_gpus
    link = host_link_seconds(job, links, accum * per_gpu * k.grad_offload_bytes_per_param,
                             per_gpu * k.upload_bytes_per_param)
    return [link, cpu_optimizer_seconds(job, p)]


def zero_infinity(job: Job, knobs: Mapping[str, Any], links: Links) -> list[Term]:
    k = parse_knobs(get_policy("zero-infinity"), dict(knobs))
    k.validate()
    n = job.n_gpus
    accum = job.accumulation(n)
    db = kit.dtype_bytes(job)
    layers = job.trace.layers
    ckpt = sum(ly.activation_bytes for i, ly in enumerate(layers) if offloads_ckpt(job, k, i))
    fetched = 2 * sum(ly.params / n * db for ly in layers if ly.params > 0)  # the forward's and the backward's
    link = host_link_seconds(job, links, accum * ckpt, accum * (ckpt + fetched))
    return [link, cpu_optimizer_seconds(job, _params(job))]


def least_bottleneck(floors: list[float], stages: int, fits: Callable[[int, int, int], bool]) -> float | None:
    """The least, over every partition of the layers into ``stages`` contiguous non-empty stages whose every stage
    ``fits(first, last, stage)``, of the largest stage sum of ``floors``; None when no partition fits. ``fits``
    must hold for a range whenever it holds for a larger one of the same stage (then a stage ending at j fits
    exactly from some first start on; found by bisection). One stage is the whole range, asked directly."""
    n = len(floors)
    pre = [0.0]
    for f in floors:
        pre.append(pre[-1] + f)
    if stages == 1:
        return pre[n] if fits(0, n - 1, 0) else None
    inf = float("inf")
    prev = [pre[j + 1] if fits(0, j, 0) else inf for j in range(n)]  # stage 0 ends at j
    for s in range(1, stages):
        cur = [inf] * n
        for j in range(s, n - (stages - 1 - s)):
            lo, hi = s, j + 1  # the first start that fits lies in [lo, hi] (hi: none)
            while lo < hi:
                mid = (lo + hi) // 2
                if fits(mid, j, s):
                    hi = mid
                else:
                    lo = mid + 1
            for i in range(lo, j + 1):
                v = max(prev[i - 1], pre[j + 1] - pre[i])
                if v < cur[j]:
                    cur[j] = v
        prev = cur
    return None if prev[n - 1] == inf else prev[n - 1]


def tinypipe(job: Job, knobs: Mapping[str, Any], links: Links) -> list[Term]:
    from planner.screen import MEMORY_SLACK, layer_floors  # planner.screen imports this module

    k = parse_knobs(get_policy("tinypipe"), dict(knobs))
    k.validate()
    S = tinypipe_stages(job, k.stages)
    if S is None:
        return []
    dp = job.n_gpus // S
    accum = job.accumulation(dp)
    model = Model(packing_problem(job, k, S, dp, None))
    floors = layer_floors(job, job.config.checkpointing != "none")
    if model.n != len(floors):
        return []
    memory = least_mode_memory(model)
    limit = gpu_pool(job).capacity_bytes * (1 + MEMORY_SLACK)
    worst = least_bottleneck(floors, S, lambda i, j, s: memory(i, j, s) <= limit)
    if worst is None:
        return []  # the policy rejects it for the GPU (the memory screen says so)
    return [(worst * accum, f"gpu.sm (the busiest of {S} pipeline stages)")]


TERMS: dict[str, Callable[[Job, Mapping[str, Any], Links], list[Term]]] = {
    "zero-offload": zero_offload,
    "zero-infinity": zero_infinity,
    "tinypipe": tinypipe,
}
