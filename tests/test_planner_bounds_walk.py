"""planner.bounds.memory_lower_bound is the position-by-position walk it replaced, figure for figure (the faster
walk visits only the task positions where the resident bytes change, in the same order, so the same sums)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from hardware_models import Topology, build_topology
from planner.bounds import memory_lower_bound
from planner.candidates import knob_grid
from planner.job import JobRequest, make_job, make_plan
from policies import POLICIES, KnobError, PlanInfeasible
from simulator import Plan


def reference_memory_lower_bound(plan: Plan, topo: Topology) -> dict[str, float]:
    """Bytes per pool that are resident together at some instant (see the module docstring)."""
    pools = sorted(topo.pools)
    at_start = {p: 0.0 for p in pools}
    tensors = plan.tensor_map()
    for ts in plan.tensors:
        if ts.home is not None:
            at_start[topo.pool_of[ts.home]] += ts.bytes
    releasers: dict[tuple[str, str], set[str]] = defaultdict(set)  # (tensor id, location) -> tasks freeing it
    for seg in plan.segments:
        for t in seg.tasks:
            for p in t.frees:
                releasers[(p.tensor.id, p.loc)].add(t.id)
            if t.op == "copy" and t.free_src and t.tensor is not None and t.src is not None:
                releasers[(t.tensor.id, t.src)].add(t.id)
    released = set(releasers)
    always = {p: 0.0 for p in pools}
    for ts in plan.tensors:
        if ts.home is not None and (ts.id, ts.home) not in released:
            always[topo.pool_of[ts.home]] += ts.bytes
    best = dict(at_start)
    for seg in plan.segments:
        by_stream: dict[str, list] = defaultdict(list)
        for t in seg.tasks:
            by_stream[t.stream].append(t)
        for tasks in by_stream.values():
            _reference_stacked(tasks, tensors, topo, always, best, releasers)
    return best


def _reference_plain(ref: object) -> bool:
    return getattr(ref, "iters_back", 1) == 0 and getattr(ref, "steps_back", 1) == 0


def _reference_stacked(tasks: list, tensors: dict, topo: Topology, always: dict[str, float], best: dict[str, float],
             releasers: dict[tuple[str, str], set[str]]) -> None:
    """Walk one stream's tasks of one segment iteration; update ``best`` with what is resident at each start.

    Only tensors whose one and only releasing task in the whole plan is that later task of the stream
    count (a tensor moved away by another stream in between and brought back is not resident throughout).
    """
    alloc_at: dict[tuple[str, str], int] = {}
    free_at: dict[tuple[str, str], int] = {}
    for i, t in enumerate(tasks):
        made = [(p.tensor, p.loc) for p in t.allocs]
        if t.op == "copy" and t.alloc_dst and t.tensor is not None and t.dst is not None:
            made.append((t.tensor, t.dst))
        for ref, loc in made:
            if _reference_plain(ref):
                alloc_at.setdefault((ref.id, loc), i)
        gone = [(p.tensor, p.loc) for p in t.frees]
        if t.op == "copy" and t.free_src and t.tensor is not None and t.src is not None:
            gone.append((t.tensor, t.src))
        for ref, loc in gone:
            if _reference_plain(ref) and (ref.id, loc) in alloc_at and releasers[(ref.id, loc)] == {t.id}:
                free_at.setdefault((ref.id, loc), i)
    if not free_at:
        return
    delta: dict[str, list[float]] = defaultdict(lambda: [0.0] * (len(tasks) + 1))
    for key, j in free_at.items():
        i = alloc_at[key]
        pool = topo.pool_of[key[1]]
        nbytes = tensors[key[0]].bytes
        d = delta[pool]
        d[i] += nbytes       # resident at the starts of tasks i..j
        d[j + 1] -= nbytes
    for pool, d in delta.items():
        run = 0.0
        peak = 0.0
        for x in d[:-1]:
            run += x
            peak = max(peak, run)
        best[pool] = max(best[pool], always[pool] + peak)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_memory_lower_bound_is_the_plain_walk(policy: str) -> None:
    for hw, model, mb, ckpt in [("a100", "gpt2", 2, "none"), ("a100x8", "7b", 1, "full")]:
        job, _ = make_job(hw, model, JobRequest(seq_len=512, micro_batch=mb, checkpointing=ckpt))
        topo = build_topology(job.hw)
        for knobs in [{}, *({k: vs[-1]} for k, vs in knob_grid(policy, job.n_gpus).items())]:
            try:
                plan = make_plan(job, policy, knobs)
            except (PlanInfeasible, KnobError):
                continue
            got, want = memory_lower_bound(plan, topo), reference_memory_lower_bound(plan, topo)
            assert got == want and list(got) == list(want)
