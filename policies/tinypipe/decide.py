"""What ``tinypipe`` decides before it names a task: the stage count, the partition and its packs.

- Stage count (``stages`` = 0, auto): the fewest stages (a divisor of the GPU count) with which every stage
  keeps everything, optimizer included, on its GPU — a pipeline exists to cut memory, and where memory
  allows, data-parallel replicas beat a pipeline's bubble; otherwise one stage per GPU (or, when the model
  has fewer layers than GPUs, the largest divisor of the GPU count it has layers for). Stage counts whose
  model states alone overflow a GPU (``all_gpu_need``) are not probed.
- Partition and packs: the exact search of ``policies/tinypipe/packing.py`` within ``balance_tolerance``;
  when nothing within it fits the GPU, the tolerance is dropped (a note says so); when nothing fits at all,
  PlanInfeasible names the stage, its GPU and the overshoot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hardware_models import build_topology
from policies.base import Job, KnobError, PlanInfeasible, gpu_pool, unified
from policies.kit import dtype_bytes
from policies.tinypipe.cost_model import ADAM_BYTES, layer_costs, master_bytes, table_params
from policies.tinypipe.knobs import NAME, Knobs
from policies.tinypipe.packing import MODES, Problem, Solution, solve
from policies.tinypipe.pipeline import stage_names

_FIT = 1 + 1e-12   # relative slack when comparing an estimated peak with the GPU's capacity


@dataclass(frozen=True)
class Decision:
    """The stage count, replicas, micro-batches per step and the chosen partition."""

    stages: int
    dp: int
    accumulation: int
    problem: Problem
    solution: Solution
    tolerance_dropped: bool
    notes: tuple[str, ...]


def all_gpu_need(job: Job) -> float:
    """A lower bound of the sum over stages of what ``gpu`` mode keeps (16-bit weights and gradients, master
    and Adam states), activations and workspace left out: the largest of ``d`` stages needs at least a
    ``1/d`` share of it. The tied table is counted once (a range holding both ends keeps one copy)."""
    costs, _ = layer_costs(job)
    table = table_params(job)
    total = sum(2 * c.param_bytes + c.state_bytes for c in costs)
    return total - 2 * table * dtype_bytes(job) - table * (master_bytes(job) + ADAM_BYTES)


def _all_gpu_with(job: Job, knobs: Knobs, d: int, need: float) -> bool:
    """Does a partition into ``d`` stages keep everything on every GPU (and fit)?"""
    try:
        job.accumulation(job.n_gpus // d)
    except KnobError:
        return False
    capacity = gpu_pool(job).capacity_bytes
    if need / d > capacity * (1 + 1e-9):
        return False  # some stage's weights, gradients and states alone overflow: no search can say "all gpu"
    _, sol = _search(job, knobs, d, job.n_gpus // d, None)
    return sol.peak_bytes <= capacity and all(st.mode == "gpu" for st in sol.stages)


def stage_count(job: Job, knobs: Knobs) -> tuple[int, int]:
    """(stages, data-parallel replicas): the knob, or auto (module docstring)."""
    n = job.n_gpus
    L = len(job.trace.layers)
    S = knobs.stages
    if not S:
        fits = [d for d in range(1, n + 1) if n % d == 0 and d <= L]
        need = all_gpu_need(job)
        S = next((d for d in fits[:-1] if _all_gpu_with(job, knobs, d, need)), fits[-1])
    if n % S:
        raise KnobError(f"{NAME}: knob 'stages' must divide the GPU count {n}, got {S}")
    if L < S:
        raise KnobError(f"{NAME}: knob 'stages' = {S} exceeds the model's {L} layers")
    return S, n // S


def search(job: Job, knobs: Knobs, tolerance: float | None = None) -> tuple[Problem, Solution]:
    """The packing problem of ``job`` with these knobs, and its exact solution."""
    return _search(job, knobs, *stage_count(job, knobs), tolerance)


def _search(job: Job, knobs: Knobs, S: int, dp: int, tolerance: float | None) -> tuple[Problem, Solution]:
    M = job.accumulation(dp)
    costs, overhead = layer_costs(job)
    inflight = tuple(M if knobs.gpipe else min(S - s, M) for s in range(S))
    table = table_params(job)
    prob = Problem(tuple(costs), S, inflight, gpu_pool(job).capacity_bytes, knobs.prefetch_packs, overhead,
                   knobs.balance_tolerance if tolerance is None else tolerance,
                   ("gpu",) if unified(job) else MODES,
                   shared_param_bytes=table * dtype_bytes(job),
                   shared_state_bytes=table * (master_bytes(job) + ADAM_BYTES))
    return prob, solve(prob)


def decide(job: Job, knobs: Knobs) -> Decision:
    """Stage count and partition; the tolerance dropped only when nothing within it fits the GPU."""
    S, dp = stage_count(job, knobs)
    M = job.accumulation(dp)
    prob, sol = _search(job, knobs, S, dp, None)
    if sol.peak_bytes <= prob.capacity * _FIT:
        return Decision(S, dp, M, prob, sol, False, ())
    _, sol = _search(job, knobs, S, dp, math.inf)
    if sol.peak_bytes > prob.capacity * _FIT:
        worst = max(sol.stages, key=lambda st: st.mem_bytes)
        pool = build_topology(job.hw).pool_of[f"gpu{worst.index}"]
        raise PlanInfeasible(NAME, pool, worst.mem_bytes, prob.capacity,
                             f"the minimal working set of stage {worst.index} "
                             f"({stage_names(job.trace.layers, worst)}, mode {worst.mode}, "
                             f"{prob.inflight[worst.index]} micro-batch(es) of activations in flight) "
                             f"in the best partition")
    note = (f"no partition within balance_tolerance={knobs.balance_tolerance:g} fits the GPU; "
            f"the tolerance was dropped (bottleneck {sol.bottleneck_s / sol.t_star:.2f}x the balanced one)")
    return Decision(S, dp, M, prob, sol, True, (note,))
