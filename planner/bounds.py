"""Analytic lower bounds on a plan's peak memory and step time, computed from the plan without simulating.

Both are lower bounds by construction, so a search may reject a candidate on them without ever rejecting
one that a simulation would have found better (tests/test_planner_bounds.py checks bound <= simulated on
a sweep of policies, models and knobs):

- memory: a pool's peak is at least its usage at any instant. At time 0 every tensor with a ``home`` is
  resident (the engine places them). At the start of any task C, these are resident together: the
  homed tensors that no task ever frees or moves away, plus every tensor instance that a task A on C's
  stream allocated (A = C or A before C in the stream's order, in the same segment iteration) and that
  a task B on the same stream frees at its end (B = C or B after C): a stream runs its tasks in order,
  so A has started and B has not ended. Only tensors that B alone frees count (one moved away by
  another stream in between, or freed elsewhere too, may be gone earlier).
  This counts, e.g., the activations a compute stream keeps from its forward to its backward.
- time: the measured step repeats with its period in the steady state, so every resource must do one
  step's work within one period; no resource works faster than its capacity. Work per step, priced with
  the functions the engine charges with (``costs``):
  * each GPU's SMs (capacity 1 s/s, shared by all its compute streams): its compute tasks' seconds as the
    engine charges them (``costs.ComputePricer``: kernel by kernel on the curve, launch overhead included),
    and GPU optimizer steps (HBM-bound);
  * each link direction (and the duplex budget where the hardware has one): the bytes routed over it
    by copies and ring collectives, divided by its bandwidth;
  * the host's CPU-Adam resource: parameters updated on the CPU divided by its params/s rate.
  The step's tasks are every segment's tasks times its repeat count (one measured step).
  The time bound is lowered by a relative BOUND_SLACK so that floating-point summation order (the bound
  adds the same terms the simulator does, in another order) cannot lift a tight bound above the figure.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from costs import (
    CPU_ADAM,
    ComputePricer,
    RouteTable,
    cpu_adam_seconds,
    gpu_optimizer_seconds,
    link_capacities,
    ring,
    sm_resource,
)
from hardware_models import HardwareSpec, Topology, build_topology
from simulator import Plan
from simulator.engine import plan_symmetry
from simulator.errors import TemplateRefused
from simulator.opcost import task_seconds
from simulator.plan import TaskSpec, TensorSpec
from simulator.symmetry import Symmetry

BOUND_SLACK = 1e-9


@dataclass(frozen=True)
class Bounds:
    """Lower bounds of one plan: bytes per pool, the step time, and which resource gives it."""

    memory_bytes: dict[str, float]
    time_s: float
    time_resource: str

    def to_dict(self) -> dict[str, object]:
        return {"memory_bytes": dict(self.memory_bytes), "time_s": self.time_s, "time_resource": self.time_resource}


def memory_lower_bound(plan: Plan, topo: Topology, sym: Symmetry | None = None) -> dict[str, float]:
    """Bytes per pool that are resident together at some instant (see the module docstring); ``sym``: a rank
    template's symmetry (a rank-0 tensor resident in a pool the ranks share stands for every rank's, as the
    simulation counts it: ``Symmetry.memory_multiplier``)."""
    pools = sorted(topo.pools)
    pool_of = topo.pool_of
    at_start = {p: 0.0 for p in pools}
    tensors = plan.tensor_map()

    def resident(ts: TensorSpec) -> float:
        assert ts.home is not None
        return ts.bytes * (sym.memory_multiplier(ts.id, pool_of[ts.home]) if sym is not None else 1.0)

    for ts in plan.tensors:
        if ts.home is not None:
            at_start[pool_of[ts.home]] += resident(ts)
    releasers: dict[tuple[str, str], set[str]] = {}  # (tensor id, location) -> tasks freeing it
    for seg in plan.segments:
        for t in seg.tasks:
            for p in t.frees:
                key = (p.tensor.id, p.loc)
                got = releasers.get(key)
                if got is None:
                    releasers[key] = {t.id}
                else:
                    got.add(t.id)
            if t.op == "copy" and t.free_src and t.tensor is not None and t.src is not None:
                releasers.setdefault((t.tensor.id, t.src), set()).add(t.id)
    always = {p: 0.0 for p in pools}
    for ts in plan.tensors:
        if ts.home is not None and (ts.id, ts.home) not in releasers:
            always[pool_of[ts.home]] += resident(ts)
    best = dict(at_start)
    for seg in plan.segments:
        by_stream: dict[str, list] = defaultdict(list)
        for t in seg.tasks:
            by_stream[t.stream].append(t)
        for tasks in by_stream.values():
            _stacked(tasks, tensors, topo, always, best, releasers)
    for pm in sym.pool_maps if sym is not None else ():  # every rank's own pools are images of rank 0's
        for pool, image in pm.items():
            if image != pool:
                best[image] = best[pool]
    return best


def _plain(ref: object) -> bool:
    return getattr(ref, "iters_back", 1) == 0 and getattr(ref, "steps_back", 1) == 0


def _stacked(tasks: list, tensors: dict, topo: Topology, always: dict[str, float], best: dict[str, float],
             releasers: dict[tuple[str, str], set[str]]) -> None:
    """Walk one stream's tasks of one segment iteration; update ``best`` with what is resident at each start.

    Only tensors whose one and only releasing task in the whole plan is that later task of the stream
    count (a tensor moved away by another stream in between and brought back is not resident throughout).
    """
    alloc_at: dict[tuple[str, str], int] = {}
    free_at: dict[tuple[str, str], int] = {}
    for i, t in enumerate(tasks):
        copy = t.op == "copy" and t.tensor is not None
        for p in t.allocs:
            ref = p.tensor
            if _plain(ref):
                alloc_at.setdefault((ref.id, p.loc), i)
        if copy and t.alloc_dst and t.dst is not None and _plain(t.tensor):
            alloc_at.setdefault((t.tensor.id, t.dst), i)
        gone = [(p.tensor, p.loc) for p in t.frees]
        if copy and t.free_src and t.src is not None:
            gone.append((t.tensor, t.src))
        for ref, loc in gone:
            key = (ref.id, loc)
            if key in alloc_at and _plain(ref):
                only = releasers[key]
                if len(only) == 1 and t.id in only:
                    free_at.setdefault(key, i)
    if not free_at:
        return
    pool_of = topo.pool_of
    delta: dict[str, dict[int, float]] = defaultdict(dict)  # pool -> task position -> change (in the old order)
    for key, j in free_at.items():
        i = alloc_at[key]
        nbytes = tensors[key[0]].bytes
        d = delta[pool_of[key[1]]]
        d[i] = d.get(i, 0.0) + nbytes       # resident at the starts of tasks i..j
        d[j + 1] = d.get(j + 1, 0.0) - nbytes
    n = len(tasks)
    for pool, d in delta.items():
        run = 0.0
        peak = 0.0
        for k in sorted(d):  # the running sum only changes where a change is: the same sums as position by position
            if k < n:
                run += d[k]
                peak = max(peak, run)
        best[pool] = max(best[pool], always[pool] + peak)


def resource_work(plan: Plan, hw: HardwareSpec, topo: Topology, sym: Symmetry | None = None) -> dict[str, float]:
    """Seconds of work per resource in one measured step (each resource's minimum busy time); ``sym``: a rank
    template's symmetry, whose tasks stand for every rank's: each task's work folded onto its resources' orbit
    representatives as the simulation's quotient network does (``Symmetry.fold``), which is each member's work in
    the full plan (the symmetry's load check makes the members' loads equal)."""
    streams = plan.stream_map()
    dtype = plan.workload.config.precision
    caps = link_capacities(topo)
    route = RouteTable(topo)
    work: dict[str, float] = defaultdict(float)
    nbytes: dict[str, float] = defaultdict(float)
    tensors = plan.tensor_map()
    pricer = ComputePricer(hw, dtype, (plan.workload.model, plan.workload.config))  # as the engine charges
    rings: dict[tuple, dict[str, float]] = {}

    def add(into: dict[str, float], t: TaskSpec, amounts: Mapping[str, float]) -> None:
        if sym is None:
            for r, x in amounts.items():
                into[r] += x
            return
        reps, xs = sym.fold(tuple(amounts), tuple(amounts.values()), sym.multiplicity(t.id))
        for r, x in zip(reps, xs, strict=True):
            into[r] += x

    for seg in plan.segments:
        n = seg.repeat
        for t in seg.tasks:
            device = streams[t.stream].device
            if t.op == "compute" and device.startswith("gpu"):
                add(work, t, {sm_resource(device): n * task_seconds(pricer, t)})
            elif t.op == "optimizer":
                if device.startswith("gpu"):
                    add(work, t, {sm_resource(device): n * gpu_optimizer_seconds(hw, t.params)})
                else:  # every node's host
                    add(work, t, {CPU_ADAM: cpu_adam_seconds(hw, n * t.params) / hw.nodes})
            elif t.op == "copy" and t.src != t.dst and t.src is not None and t.dst is not None:
                b = t.bytes if t.bytes > 0 else (tensors[t.tensor.id].bytes if t.tensor is not None else 0.0)
                moved: dict[str, float] = defaultdict(float)
                for r in route(t.src, t.dst).resources:
                    moved[r] += n * b
                add(nbytes, t, moved)
            elif t.op == "collective" and len(t.ranks) > 1 and t.coll is not None:
                key = (t.ranks, t.bytes, t.coll)  # every layer's collective of a group: one ring (O(ranks) each)
                per = rings.get(key)
                if per is None:
                    per = rings[key] = ring(route, t.ranks, t.bytes, t.coll).resource_bytes()
                add(nbytes, t, {r: n * b for r, b in per.items()})
    for r, b in nbytes.items():
        work[r] += b / caps[r]
    return dict(work)


def plan_bounds(plan: Plan, hw: HardwareSpec, topo: Topology | None = None) -> Bounds:
    """The plan's bounds; a rank template's (``simulator.rank_template``) are the full plan's, worked out through its
    symmetry (TemplateRefused where its ranks do not play one role on this machine: bound the full plan then)."""
    topo = topo if topo is not None else build_topology(hw)
    sym = None
    if plan.template is not None:
        got = plan_symmetry(plan, hw, topo)
        if not isinstance(got, Symmetry):
            raise TemplateRefused(f"the rank template of {plan.template.ranks} ranks does not simulate as one rank "
                                  f"({got}); build the full plan")
        sym = got
    work = resource_work(plan, hw, topo, sym)
    # of resources equally loaded, the first in numeric order of their names (rank 0's: gpu2 before gpu10)
    resource, time_s = max(sorted(work.items(), key=lambda kv: _numeric(kv[0])), key=lambda kv: kv[1],
                           default=("none", 0.0))
    return Bounds(memory_lower_bound(plan, topo, sym), time_s * (1 - BOUND_SLACK), resource)


def _numeric(name: str) -> tuple[tuple[str, int], ...]:
    """``name``'s sort key with its numbers compared as numbers (``gpu2.sm`` before ``gpu10.sm``)."""
    return tuple((text, int(num or 0)) for text, num in re.findall(r"(\D*)(\d*)", name) if text or num)
