"""The ranks of a multi-rank replay merged into one Measurement (one RawRun / Result for the comparison
table and ``--trace``).

- task records: each rank's own; a collective, which every one of its ranks ran, becomes one record from
  the moment the last rank entered it to the moment the first rank had its result (the collective is
  complete then: a rank that leaves later was descheduled, not waiting for data), with the bytes and links
  of every rank's hop (the simulator's accounting of a ring);
- memory: one tracker per pool, every rank's allocations and frees replayed in time order over the plan's
  initial tensors (counted once), so per-GPU pools hold their rank's timeline and shared pools (the host's
  ``cpu``, ``nvme``) the sum of every rank's; the merged tracker's capacity check is the run's verdict;
- the shared pools' peaks with data-parallel ranks aligned (``aligned_peaks``): the merged tracker's peak of a shared
  pool depends on how the ranks' processes happen to line up, to the millisecond: two ranks' 3.95 MB parameter
  staging buffers, each live for the 2-3 ms of its NVMe write, coincided in some replays of
  gpt-h256-zinf-nvme-bf16-2r and not in others (its cpu peak 78.92 or 74.97 MB, 2026-12-05), while a simulation
  runs symmetric ranks in lockstep and reports the aligned figure, the worst case a host must hold. The pool's
  initial tensors plus each rank's own peak on it, summed, is that figure measured (each rank's peak does not
  depend on the other's timing); the validation compares it with the simulation's, the merged one stays the
  run's verdict and the replay's printed peak;
- link bytes summed, step ends and wall time the latest of any rank, losses the union (each rank trains
  its own micro-batches), final weights: each layer from the ranks that compute it (a pipeline stage's
  layers from that stage), a partitioned layer's shards joined in rank order, a replicated layer from its
  first rank (``replica_spread`` says how far the other replicas are from it).

Times are each rank's ``perf_counter`` from the barrier all ranks leave together (``Runner._run``): on one
host that is one clock; across hosts the skew is the barrier's exit skew.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hardware_models import HardwareSpec, build_topology
from replay.errors import ReplayError, ReplayOom
from replay.runner import Measurement, Runner
from replay.tensor_parallel import TpPlace, is_tp_layer, unshard
from simulator.engine import TaskRecord
from simulator.errors import PlanError
from simulator.memory import MemoryTracker
from simulator.plan import Plan

MemEvent = tuple[float, float, str, str, str, str]  # time, bytes (-1: a free), instance, location, kind, task


@dataclass
class RankResult:
    """What one rank measured, small enough to send back to the launching process."""

    rank: int
    device: str
    records: list[TaskRecord]
    mem_log: list[MemEvent]
    link_bytes: dict[str, float]
    by_step: dict[int, dict[str, float]]
    real_bytes: dict[str, float]
    step_end: dict[int, float]
    wall_s: float
    losses: dict[tuple[int, int], float]
    weights: list[dict[str, Tensor]]
    sharded: frozenset[int]
    shapes: list[list[tuple[str, tuple[int, ...]]]]
    accum: dict[int, int]
    owned: frozenset[int]  # the layers this rank computes (its pipeline stage's; every layer without one)
    dp_world: int  # the data-parallel replicas of its layers (the reference trains that many waves)
    leaked: list[str] = field(default_factory=list)
    tp: TpPlace = TpPlace(0, 1, False)  # its place in its tensor-parallel group (replay.tensor_parallel)

    @classmethod
    def of(cls, rank: int, runner: Runner, m: Measurement) -> RankResult:
        shapes = [[(n, tuple(p.shape)) for n, p in layer.named_parameters()] for layer in runner.store.layers]
        records = [r._replace(tags=dict(r.tags)) for r in m.records]
        return cls(rank, m.device, records, list(runner.mem.log), m.link_bytes, m.link_bytes_by_step,
                   m.real_link_bytes, m.step_end, m.wall_s, m.losses, m.weights, frozenset(runner.sharded), shapes,
                   dict(runner.accum), frozenset(runner.computes), runner.dp_world, list(m.leaked), runner.tp)


def _records(results: list[RankResult]) -> list[TaskRecord]:
    by_uid: dict[str, list[TaskRecord]] = defaultdict(list)
    for res in results:
        for r in res.records:
            by_uid[r.uid].append(r)
    out = []
    for rs in by_uid.values():
        if len(rs) == 1:
            out.append(rs[0])
            continue
        links = tuple(dict.fromkeys(ln for r in rs for ln in r.links))
        out.append(rs[0]._replace(start=max(r.start for r in rs), end=max(min(r.end for r in rs),
                                                                          max(r.start for r in rs)),
                                  bytes=sum(r.bytes for r in rs), links=links))
    return sorted(out, key=lambda r: (r.start, r.stream))


def _memory(plan: Plan, hw: HardwareSpec, results: list[RankResult]) -> MemoryTracker:
    topo = build_topology(hw)
    mem = MemoryTracker({p.name: p.capacity_bytes for p in topo.pools.values()}, topo.pool_of)
    for ts in plan.tensors:
        if ts.home is not None:
            mem.alloc(0.0, ts.id, ts.home, ts.bytes, ts.kind, "<initial>")
    try:
        for now, nbytes, inst, loc, kind, task in heapq.merge(*(r.mem_log for r in results), key=lambda e: e[0]):
            if nbytes < 0:
                mem.free(now, inst, loc, task)
            else:
                mem.alloc(now, inst, loc, nbytes, kind, task)
    except PlanError as e:
        raise ReplayError(f"merging the ranks' memory: {e}") from None
    if mem.ooms:
        o = mem.ooms[0]
        raise ReplayOom(f"task {o.task!r}: out of memory on {o.pool} (all ranks together): allocating {o.tensor!r} "
                        f"({o.requested_bytes:.0f} bytes) with {o.free_bytes:.0f} of {o.capacity_bytes:.0f} bytes free")
    return mem


def _joined(i: int, holders: list[RankResult]) -> dict[str, Tensor]:
    """Layer i as its data-parallel holders hold it: the first one's, or a partition's shards joined."""
    first = holders[0]
    if i not in first.sharded:
        return first.weights[i]
    flat = torch.cat([r.weights[i]["flat"] for r in holders])
    layer, k = {}, 0
    for name, shape in first.shapes[i]:
        size = int(torch.Size(shape).numel())
        layer[name] = flat[k:k + size].view(shape).clone()
        k += size
    return layer


def _tp_split(i: int, n: int, holders: list[RankResult]) -> list[list[RankResult]]:
    """The holders of layer i by tensor-parallel rank (one list when the layer is not split)."""
    tp = holders[0].tp
    if not tp.active:
        return [holders]
    by_rank = [[r for r in holders if r.tp.rank == j] for j in range(tp.world)]
    return by_rank if is_tp_layer(i, n) else by_rank[:1]  # a replicated layer: the first rank's group holds it


def _weights(results: list[RankResult]) -> list[dict[str, Tensor]]:
    out: list[dict[str, Tensor]] = []
    n = len(results[0].weights)
    for i in range(n):
        holders = [r for r in results if i in r.owned] or results[:1]
        parts = [_joined(i, hs) for hs in _tp_split(i, n, holders)]
        out.append(parts[0] if len(parts) == 1 else unshard(i, n, parts, holders[0].tp.vocab_parallel))
    return out


def replica_spread(results: list[RankResult]) -> float:
    """Largest difference between rank 0's final weights of a replicated layer and another rank's copy
    (0.0 when data parallelism kept the replicas identical, as it must), the last pipeline stage's copy of
    a tied table included."""
    spread = 0.0
    n = len(results[0].weights)
    for i in range(n):
        every = [r for r in results if i in r.owned]
        groups = _tp_split(i, n, every) if every and is_tp_layer(i, n) else [every]
        for holders in groups:
            if len(holders) < 2 or i in holders[0].sharded:
                continue
            for res in holders[1:]:
                for name, t in holders[0].weights[i].items():
                    spread = max(spread, float((res.weights[i][name] - t).abs().max()))
    table = [r for r in results if 0 in r.owned][:1]
    for res in results:  # a pipeline's last stage keeps its own copy of the tied table: the same as the first's
        head = res.weights[-1]
        if "wte" in head and table:
            spread = max(spread, float((head["wte"] - table[0].weights[0]["wte"]).abs().max()))
    return spread


def _sum(dicts: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for d in dicts:
        for k, v in d.items():
            out[k] += v
    return dict(out)


def aligned_peaks(plan: Plan, hw: HardwareSpec, results: list[RankResult]) -> dict[str, float]:
    """Each pool that more than one rank allocates on (the host's ``cpu``, ``nvme``): its initial tensors' bytes
    plus every rank's own peak on it (the most that rank's allocations, less its frees, held at once), summed:
    the pool's peak with the ranks in lockstep (module docstring). Only where every rank is a data-parallel
    replica of the others (the same tasks, whose peaks a simulation lines up): a pipeline's stages peak at
    different moments in a simulation too (llama-h384-tinypipe-2r: 300.47 MB summed, 268.22 simulated and
    merged), so their merged peak is the figure (an empty mapping)."""
    if any(r.dp_world != len(results) or r.tp.world != 1 for r in results):
        return {}
    pool_of = build_topology(hw).pool_of
    base: dict[str, float] = defaultdict(float)
    initial: dict[tuple[str, str], float] = {}
    for ts in plan.tensors:
        if ts.home is not None:
            base[pool_of[ts.home]] += ts.bytes
            initial[(ts.id, ts.home)] = ts.bytes
    peaks: dict[str, list[float]] = defaultdict(list)
    for r in results:
        used: dict[str, float] = defaultdict(float)
        top: dict[str, float] = defaultdict(float)
        held: dict[tuple[str, str], float] = {}
        for _, nbytes, inst, loc, _, _ in r.mem_log:
            pool = pool_of[loc]
            if nbytes < 0:  # a free: what this rank allocated, or an initial tensor it released
                used[pool] -= held.pop((inst, loc), initial.get((inst, loc), 0.0))
                continue
            held[(inst, loc)] = nbytes
            used[pool] += nbytes
            top[pool] = max(top[pool], used[pool])
        for pool, v in top.items():
            peaks[pool].append(v)
    return {pool: base[pool] + sum(v) for pool, v in peaks.items() if len(v) > 1}


def merge(plan: Plan, hw: HardwareSpec, results: list[RankResult]) -> Measurement:
    steps = sorted({s for r in results for s in r.by_step})
    step_end: dict[int, float] = {}
    for r in results:
        for s, e in r.step_end.items():
            step_end[s] = max(step_end.get(s, 0.0), e)
    losses: dict[tuple[int, int], float] = {}
    for r in results:
        losses.update(r.losses)
    return Measurement(_records(results), _memory(plan, hw, results), _sum([r.link_bytes for r in results]),
                       {s: _sum([r.by_step.get(s, {}) for r in results]) for s in steps},
                       _sum([r.real_bytes for r in results]), step_end, max(r.wall_s for r in results), losses,
                       _weights(results), build_topology(hw), results[0].device,
                       sorted({x for r in results for x in r.leaked}), aligned_peaks(plan, hw, results))
