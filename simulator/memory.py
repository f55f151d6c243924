"""Per-pool memory accounting with a time series per tensor kind and an OOM verdict.

An allocation that exceeds a pool's capacity does not block and does not raise: it is recorded as an OOM
event (pool, time, task, bytes requested, bytes free) and the run goes on, so the total demand of the
plan is known. This is a deliberate choice over SimPy's ``Container``, which would block FIFO with
head-of-line blocking and hide how far over capacity the plan is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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


class MemoryTracker:
    def __init__(self, capacities: Mapping[str, float], pool_of: Mapping[str, str]):
        self.pools = {p: PoolState(c) for p, c in capacities.items()}
        self.pool_of = dict(pool_of)
        self.resident: dict[tuple[str, str], tuple[float, str]] = {}  # (instance, loc) -> (bytes, kind)
        self.ooms: list[OomEvent] = []
        self._oom_pools: set[str] = set()

    def pool(self, loc: str) -> str:
        try:
            return self.pool_of[loc]
        except KeyError:
            raise PlanError(f"location {loc!r} is not on this hardware ({', '.join(sorted(self.pool_of))})") from None

    def is_resident(self, inst: str, loc: str) -> bool:
        return (inst, loc) in self.resident

    def alloc(self, now: float, inst: str, loc: str, nbytes: float, kind: str, task: str) -> None:
        if (inst, loc) in self.resident:
            raise PlanError(f"task {task!r}: allocates tensor {inst!r} on {loc!r} where it already is")
        pname = self.pool(loc)
        ps = self.pools[pname]
        if ps.used + nbytes > ps.capacity + 1e-6 and pname not in self._oom_pools:
            self._oom_pools.add(pname)
            self.ooms.append(OomEvent(pname, now, task, inst, nbytes, max(0.0, ps.capacity - ps.used),
                                      ps.capacity))
        self.resident[(inst, loc)] = (nbytes, kind)
        self._change(ps, now, kind, nbytes)

    def free(self, now: float, inst: str, loc: str, task: str) -> None:
        try:
            nbytes, kind = self.resident.pop((inst, loc))
        except KeyError:
            raise PlanError(f"task {task!r}: frees tensor {inst!r} on {loc!r} where it is not resident") from None
        self._change(self.pools[self.pool(loc)], now, kind, -nbytes)

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
