"""Per-pool memory accounting with a time series per tensor kind and an OOM verdict.

An allocation that exceeds a pool's capacity does not block and does not raise: it is recorded as an OOM
event (pool, time, task, bytes requested, bytes free) and the run goes on, so the total demand of the
plan is known. This is a deliberate choice over SimPy's ``Container``, which would block FIFO with
head-of-line blocking and hide how far over capacity the plan is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hardware_models.allocator import allocator_overhead
from simulator.errors import PlanError


@dataclass(frozen=True)
class OomEvent:
    pool: str
    time_s: float
    task: str
    tensor: str
    requested_bytes: float
    free_bytes: float
    capacity_bytes: float


@dataclass
class PoolState:
    capacity: float
    used: float = 0.0
    peak: float = 0.0
    peak_time: float = 0.0
    by_kind: dict[str, float] = field(default_factory=dict)
    peak_by_kind: dict[str, float] = field(default_factory=dict)
    series: list[tuple[float, str, float]] = field(default_factory=list)  # (time, kind, bytes of that kind)
    min_used: float = 0.0


ALLOCATOR_KIND = "allocator"  # the series of bytes the GPU's caching allocator holds beyond the tensors


class MemoryTracker:
    """Pools, resident tensors and their series. ``allocators`` maps a pool to the allocator its tensors go
    through (``hardware_models.allocator``: "caching" or "exact"); what it holds beyond a tensor's bytes is
    charged to the pool under the kind ``allocator``, so each tensor kind's series keeps its own bytes."""

    def __init__(self, capacities: Mapping[str, float], pool_of: Mapping[str, str],
                 allocators: Mapping[str, str] | None = None):
        self.pools = {p: PoolState(c) for p, c in capacities.items()}
        self.pool_of = dict(pool_of)
        self.allocators = dict(allocators or {})
        self.resident: dict[tuple[str, str], tuple[float, str]] = {}  # (instance, loc) -> (bytes, kind)
        self.ooms: list[OomEvent] = []
        self._oom_pools: set[str] = set()
        self._mult: dict[tuple[str, str], float] = {}  # allocations that stand for several ranks' (symmetry)

    def pool(self, loc: str) -> str:
        try:
            return self.pool_of[loc]
        except KeyError:
            raise PlanError(f"location {loc!r} is not on this hardware ({', '.join(sorted(self.pool_of))})") from None

    def is_resident(self, inst: str, loc: str) -> bool:
        return (inst, loc) in self.resident

    def alloc(self, now: float, inst: str, loc: str, nbytes: float, kind: str, task: str,
              mult: float = 1.0) -> None:
        """Allocate ``nbytes`` of ``inst`` on ``loc``; ``mult`` > 1: the allocation stands for ``mult``
        identical ones made at the same instant (a symmetric plan's other ranks, ``simulator.symmetry``)."""
        if (inst, loc) in self.resident:
            raise PlanError(f"task {task!r}: allocates tensor {inst!r} on {loc!r} where it already is")
        pname = self.pool(loc)
        ps = self.pools[pname]
        extra = allocator_overhead(nbytes, self.allocators[pname]) if pname in self.allocators else 0.0
        if pname not in self._oom_pools:
            self._check_oom(ps, pname, now, task, inst, nbytes + extra, mult)
        self.resident[(inst, loc)] = (nbytes, kind)
        if mult != 1.0:
            self._mult[(inst, loc)] = mult
        self._change(ps, now, kind, nbytes * mult)
        if extra:
            self._change(ps, now, ALLOCATOR_KIND, extra * mult)

    def _check_oom(self, ps: PoolState, pname: str, now: float, task: str, inst: str, need: float,
                   mult: float) -> None:
        if ps.used + need * mult <= ps.capacity + 1e-6:
            return
        # the first of the ``mult`` identical allocations that does not fit
        j = 0
        while j + 1 < mult and ps.used + need * (j + 1) <= ps.capacity + 1e-6:
            j += 1
        used = ps.used + need * j
        self._oom_pools.add(pname)
        self.ooms.append(OomEvent(pname, now, task, inst, need, max(0.0, ps.capacity - used), ps.capacity))

    def free(self, now: float, inst: str, loc: str, task: str) -> None:
        try:
            nbytes, kind = self.resident.pop((inst, loc))
        except KeyError:
            raise PlanError(f"task {task!r}: frees tensor {inst!r} on {loc!r} where it is not resident") from None
        mult = self._mult.pop((inst, loc), 1.0) if self._mult else 1.0
        pname = self.pool(loc)
        self._change(self.pools[pname], now, kind, -nbytes * mult)
        extra = allocator_overhead(nbytes, self.allocators[pname]) if pname in self.allocators else 0.0
        if extra:
            self._change(self.pools[pname], now, ALLOCATOR_KIND, -extra * mult)

    def _change(self, ps: PoolState, now: float, kind: str, delta: float) -> None:
        ps.used += delta
        ps.min_used = min(ps.min_used, ps.used)
        v = ps.by_kind.get(kind, 0.0) + delta
        ps.by_kind[kind] = v
        ps.series.append((now, kind, v))
        if ps.used > ps.peak:
            ps.peak = ps.used
            ps.peak_time = now
            ps.peak_by_kind = dict(ps.by_kind)
