"""``tinypipe``'s knobs and its decided pipeline: stage count, partition and packs, and the bytes each piece holds.

Auto stage count (``stages`` = 0): the fewest stages (a divisor of the GPU count) with which every stage keeps
everything, optimizer included, on its GPU (where memory allows, data-parallel replicas beat a pipeline's
bubble), else one stage per GPU (or the largest divisor of the GPU count the model has layers for). Stage
counts whose model states alone overflow a GPU (``all_gpu_need``) are not probed. Replica r runs stage s on
``gpu{r * S + s}``.

Cost model (what the packing search knows of a layer): its time per micro-batch is its compute (forward,
recompute, backward: each task priced by ``costs.ComputePricer`` as the engine charges it) and, when swapped,
its transfers over a GPU's DRAM route with every GPU swapping (``swap_rates``): two fetches of its 16-bit
weights one way and its gradient the other, ``max(2 w / one-way, 3 w / both-ways)``. A pack adds the route's
copy latency three times (``pack_overhead_s``). The tied embedding table counts in the head's figures too.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

from costs import ComputePricer, link_capacities, slowest_transfer_rate, transfer_rates
from hardware_models import HardwareSpec, Topology, build_topology
from policies.base import Job, KnobError, PlanInfeasible, gpu_pool, unified
from policies.kit import dtype_bytes
from policies.tinypipe.emit import make_schedule
from policies.tinypipe.packing import MODES, LayerCost, Problem, Solution, StagePlan, solve
from simulator.phase import Phase
from simulator.rank_template import RankTemplate

NAME = "tinypipe"
SCHEDULES = ("1f1b", "gpipe")
_FIT = 1 + 1e-12        # relative slack when comparing an estimated peak with the GPU's capacity
GRAD32_BYTES = 4.0      # CPU-side fp32 gradient accumulator per parameter
ADAM_BYTES = 8.0        # Adam m and v, fp32
BOUNCE_BUFFERS = 2      # pinned upload buffers per GPU (resident stages)
SWAP_RATES_CACHE = 16   # machines whose swap rates are kept (three floats each: ``machine_swap_rates``)


def master_bytes(job: Job) -> float:
    """fp32 master weights per parameter: none when training in fp32."""
    return 0.0 if job.config.precision == "fp32" else 4.0


def table_params(job: Job) -> float:
    """Parameters of the tied embedding table (0 when the head has its own)."""
    return float(job.model.vocab * job.model.hidden) if job.model.tied_embeddings else 0.0


def swap_rates(topo: Topology) -> tuple[float, float, float]:
    """(one-way bytes/s, both-ways bytes/s, latency) of a GPU's DRAM route while every GPU swaps at once, priced
    as the engine shares links (max-min fair, ``costs``): one way, the slowest of every GPU's upload; both ways,
    the least over GPUs of its upload's and download's rates with every GPU uploading and downloading; the
    largest route latency. The search gives every stage these rates (the slowest GPU's)."""
    caps = link_capacities(topo)
    gpus = topo.gpu_locations()
    one, lat = slowest_transfer_rate(topo, [("cpu", g) for g in gpus], caps)
    rates = transfer_rates(topo, [pair for g in gpus for pair in (("cpu", g), (g, "cpu"))], caps)
    both = min(rates[2 * k] + rates[2 * k + 1] for k in range(len(gpus)))
    return one, both, lat


@functools.lru_cache(maxsize=SWAP_RATES_CACHE)
def machine_swap_rates(hw: HardwareSpec) -> tuple[float, float, float]:
    """``swap_rates`` of ``hw``'s topology, memoised on the (frozen, hashable) spec: a max-min fair sharing of two
    transfers per GPU (a third of a second at 1024 GPUs) that every candidate of a planner's search on one
    machine asks for again. A pure function of ``hw``, so the cache changes no result."""
    return swap_rates(build_topology(hw))


def layer_costs(job: Job) -> tuple[list[LayerCost], float]:
    """Per-layer costs for the search, and the per-pack overhead (seconds per micro-batch)."""
    price = ComputePricer(job.hw, job.config.precision, (job.model, job.config)).seconds
    one, both, lat = machine_swap_rates(job.hw)
    db, master, table, last = dtype_bytes(job), master_bytes(job), table_params(job), len(job.trace.layers) - 1
    out = []
    for i, ly in enumerate(job.trace.layers):
        c = price(ly.fwd_flops, ly.fwd_hbm_bytes, i, Phase.FWD)
        if ly.recompute_flops > 0:
            c += price(ly.recompute_flops, ly.fwd_hbm_bytes, i, Phase.RECOMPUTE)
        c += price(ly.bwd_flops, ly.bwd_hbm_bytes, i, Phase.BWD)
        extra = table if i == last else 0.0
        w = float(ly.param_bytes) + extra * db
        st = float(ly.master_bytes + ly.optimizer_bytes) + extra * (master + ADAM_BYTES)
        out.append(LayerCost(c, max(2 * w / one, 3 * w / both), w, st, float(ly.activation_bytes),
                             float(ly.peak_transient_bytes)))
    return out, 3 * lat


@dataclass(frozen=True)
class Knobs:
    stages: int = 0
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    balance_tolerance: float = 0.05
    prefetch_packs: int = 1
    active_cpu_mm: bool = True

    def validate(self) -> None:
        if self.stages < 0:
            raise KnobError(f"{NAME}: knob 'stages' must be 0 (= GPU count) or a divisor of the GPU count")
        if self.schedule not in SCHEDULES:
            raise KnobError(f"{NAME}: knob 'schedule' must be one of {', '.join(SCHEDULES)}, "
                            f"got {self.schedule!r}")
        if not (math.isfinite(self.balance_tolerance) and self.balance_tolerance >= 0):
            raise KnobError(f"{NAME}: knob 'balance_tolerance' must be a finite number >= 0")
        if self.prefetch_packs < 0:
            raise KnobError(f"{NAME}: knob 'prefetch_packs' must be an integer >= 0")


class Pipeline:
    """The decisions (``decide``) and the sizes that follow from them."""

    def __init__(self, job: Job, knobs: Knobs, dp: int, M: int, sol: Solution, dropped: bool, notes: tuple[str, ...]):
        self.solution, self.tolerance_dropped, self.notes = sol, dropped, notes
        self.layers, self.stages, self.S, self.dp, self.M = job.trace.layers, sol.stages, len(sol.stages), dp, M
        self.schedule, self.gpipe = make_schedule(knobs.schedule, self.S, M), knobs.schedule == "gpipe"
        self.prefetch, self.active_cpu_mm, self.unified = knobs.prefetch_packs, knobs.active_cpu_mm, unified(job)
        self.tied, self.table_params, self.last = job.model.tied_embeddings, table_params(job), len(self.layers) - 1
        self.table_bytes = self.table_params * dtype_bytes(job)   # 0 without a tied table
        self.template: RankTemplate | None = None   # set by ``build.plan``: the plan holds replica 0's tasks only

    def replicas(self) -> range:
        """The replicas whose tasks the plan holds: all, or replica 0 in a rank template."""
        return range(1 if self.template is not None else self.dp)

    def rank(self, r: int, s: int) -> int:
        """The GPU rank that runs stage s of replica r."""
        return r * self.S + s

    def gpu(self, r: int, s: int) -> str:
        return f"gpu{self.rank(r, s)}"

    def head_copy(self, s: int) -> bool:
        """Does stage s hold its own copy of the tied embedding table (the head's stage, S > 1)?"""
        return self.tied and self.S > 1 and s == self.S - 1

    def layer_params(self, s: int, x: int) -> float:
        return float(self.layers[x].params) + (self.table_params if self.head_copy(s) and x == self.last else 0.0)

    def layer_bytes(self, x: int) -> float:
        """16-bit bytes the GPU holds for layer x (the head also needs the tied table to compute)."""
        return float(self.layers[x].param_bytes) + (self.table_bytes if x == self.last else 0.0)

    def pack_bytes(self, u: int, t: int) -> float:
        return sum(self.layer_bytes(x) for x in range(u, t + 1)) - (self.table_bytes if u == 0 and t == self.last
                                                                     else 0.0)

    def pack_home_bytes(self, s: int, u: int, t: int) -> float:
        """DRAM home of a swapped pack: without the table when the stage also holds the embedding (S = 1)."""
        return self.pack_bytes(u, t) - (self.table_bytes if t == self.last and u > 0 and not self.head_copy(s) else 0.0)

    def stage_params(self, st: StagePlan) -> float:
        return sum(self.layer_params(st.index, x) for x in range(st.first, st.last + 1))

    def stage_bytes(self, st: StagePlan) -> float:
        return self.pack_bytes(st.first, st.last)


def all_gpu_need(job: Job) -> float:
    """A lower bound of the sum over stages of what ``gpu`` mode keeps (16-bit weights and gradients, master
    and Adam states; no activations or workspace): the largest of ``d`` stages needs at least a ``1/d`` share.
    The tied table is counted once (a range holding both ends keeps one copy)."""
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
    prob = packing_problem(job, knobs, S, dp, tolerance)
    return prob, solve(prob)


def packing_problem(job: Job, knobs: Knobs, S: int, dp: int, tolerance: float | None) -> Problem:
    """The packing search's problem for ``S`` stages x ``dp`` replicas (the planner's memory screen reads it too)."""
    M = job.accumulation(dp)
    costs, overhead = layer_costs(job)
    inflight = tuple(M if knobs.schedule == "gpipe" else min(S - s, M) for s in range(S))
    table = table_params(job)
    pool, master = gpu_pool(job), master_bytes(job)
    return Problem(tuple(costs), S, inflight, pool.capacity_bytes, knobs.prefetch_packs, overhead,
                   knobs.balance_tolerance if tolerance is None else tolerance, ("gpu",) if unified(job) else MODES,
                   table * dtype_bytes(job), table * (master + ADAM_BYTES),
                   # each GPU tensor as the simulator charges it (``build.declare_gpu_side``, ``tasks``): rounded by
                   # the GPU's allocator in an HBM pool; ``gpu`` mode's states are m32 (if any) and adam
                   allocator=job.hw.gpu.allocator if pool.kind == "hbm" else "exact",
                   stash=knobs.schedule == "gpipe",
                   state_split=(master / (master + ADAM_BYTES), ADAM_BYTES / (master + ADAM_BYTES)) if master
                   else (1.0,))


def decide(job: Job, knobs: Knobs) -> Pipeline:
    """Stage count and partition; the tolerance dropped only when nothing within it fits the GPU."""
    S, dp = stage_count(job, knobs)
    M = job.accumulation(dp)
    prob, sol = _search(job, knobs, S, dp, None)
    if sol.peak_bytes <= prob.capacity * _FIT:
        return Pipeline(job, knobs, dp, M, sol, False, ())
    _, sol = _search(job, knobs, S, dp, math.inf)
    if sol.peak_bytes > prob.capacity * _FIT:
        w = max(sol.stages, key=lambda st: st.mem_bytes)
        names = f"{job.trace.layers[w.first].name}..{job.trace.layers[w.last].name}"
        raise PlanInfeasible(NAME, build_topology(job.hw).pool_of[f"gpu{w.index}"], w.mem_bytes, prob.capacity,
                             f"the minimal working set of stage {w.index} ({names}, mode {w.mode}, "
                             f"{prob.inflight[w.index]} micro-batch(es) of activations in flight) in the best "
                             "partition")
    note = (f"no partition within balance_tolerance={knobs.balance_tolerance:g} fits the GPU; "
            f"the tolerance was dropped (bottleneck {sol.bottleneck_s / sol.t_star:.2f}x the balanced one)")
    return Pipeline(job, knobs, dp, M, sol, True, (note,))
