"""SynergyScale's parameter search: a staged analytic search over order x GPU/peer split x chunks x
prefetch (the knobs left on auto), scored by ``estimate``, and the candidates its simulated refinement
(``refine.py``) prices when the job is small enough."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from policies.base import PlanInfeasible
from policies.synergyscale.context import BUCKETS_IN_FLIGHT, Choice, Ctx
from policies.synergyscale.estimate import estimate
from policies.synergyscale.knobs import (
    DEFAULT_CHUNKS,
    DEFAULT_ORDER,
    DEFAULT_PREFETCH,
    DEFAULT_STREAMS,
    FETCHED,
    NAME,
    Fractions,
    Knobs,
)
from policies.synergyscale.placement import place, resident_buckets

SEARCH_CHUNKS = (1, 2, 4, 8, 16)
SEARCH_PREFETCH = (1.0, 2.0, 4.0)
SEARCH_SHARES = (1.0, 0.75, 0.5, 0.25, 0.0)
SEARCH_STREAMS = (1, 2, 4)
SIM_TASK_BUDGET = 24_000   # tasks the refinement may simulate in all (the engine does ~15-20k tasks/s)
SIM_TOP = 3                # analytic best candidates simulated (besides the fixed defaults)


def make_choice(ctx: Ctx, knobs: Knobs, fr: Fractions, order: str, share: float, c: int, s: int,
                pf: float) -> Choice:
    """The Choice for one point of the search space: placement, then chunking moot when nothing is fetched."""
    buffers = max(1, round(pf * c))
    tiers = place(ctx, NAME, order, share, c, buffers, knobs.offload_activations, fr)
    buckets = BUCKETS_IN_FLIGHT
    s = max(1, min(s, c))  # more streams than chunks would stay idle
    if not any(t in FETCHED for t in tiers):  # nothing to fetch: chunking and streams are moot
        c, s, buffers = 1, 1, 1
        buckets = resident_buckets(ctx)
    return Choice(tiers, c, s, buffers, order, share, knobs.offload_activations, buckets)


def fixed_choice(ctx: Ctx, knobs: Knobs) -> Choice:
    """The fixed defaults (auto=False): fill fastest tiers first, tail order, knobs or default values."""
    return make_choice(ctx, knobs, knobs.fractions(), knobs.order if knobs.order != "auto" else DEFAULT_ORDER, 1.0,
                       knobs.chunks or DEFAULT_CHUNKS, knobs.streams or DEFAULT_STREAMS,
                       knobs.prefetch or DEFAULT_PREFETCH)


def _fixed_or_none(ctx: Ctx, knobs: Knobs) -> Choice | None:
    try:
        return fixed_choice(ctx, knobs)
    except PlanInfeasible:
        return None  # the fixed defaults do not fit; the search may still find a chunking that does


@dataclass(frozen=True)
class Analytic:
    """What the analytic search found: the choice it plans, the fixed defaults (None when they do not
    fit), every candidate it scored (best first) and what ``plan.info`` records about it."""

    choice: Choice
    best: Choice | None             # the analytic best before its stream count is set (None: not searched)
    default: Choice | None
    ranked: tuple[tuple[float, Choice], ...]
    info: dict[str, Any]


class _Scorer:
    """Estimates candidates once each, remembering the infeasible ones' verdicts."""

    def __init__(self, ctx: Ctx, knobs: Knobs):
        self.ctx = ctx
        self.knobs = knobs
        self.fr = knobs.fractions()
        self.seen: dict[tuple[str, float, int, float], tuple[float, Choice]] = {}
        self.infeasible: list[PlanInfeasible] = []

    def __call__(self, order: str, share: float, c: int, pf: float) -> tuple[float, Choice] | None:
        key = (order, share, c, pf)
        if key in self.seen:
            return self.seen[key]
        try:
            ch = make_choice(self.ctx, self.knobs, self.fr, order, share, c, 1, pf)
        except PlanInfeasible as e:
            self.infeasible.append(e)
            return None
        self.seen[key] = (estimate(self.ctx, ch).step_s, ch)
        return self.seen[key]

    def best_of(self, points: list[tuple[str, float, int, float]],
                best: tuple[float, Choice] | None = None) -> tuple[float, Choice] | None:
        """The fastest of ``points`` (first on ties) that beats ``best``."""
        for point in points:
            x = self(*point)
            if x and (best is None or x[0] < best[0]):
                best = x
        return best


def _staged(sc: _Scorer, knobs: Knobs, orders: list[str], shares: list[float]) -> tuple[float, Choice]:
    """Placement first (at the default chunking), then chunks x prefetch for the best placement, then the
    placement again at the best chunking."""
    chunk_opts = [knobs.chunks] if knobs.chunks else list(SEARCH_CHUNKS)
    pf_opts = [knobs.prefetch] if knobs.prefetch else list(SEARCH_PREFETCH)
    c0 = knobs.chunks or DEFAULT_CHUNKS
    p0 = knobs.prefetch or DEFAULT_PREFETCH
    best = sc.best_of([(o, s, c0, p0) for o in orders for s in shares])
    if best is None:  # the defaults do not fit: look for any chunking / prefetch that does
        best = sc.best_of([(o, s, c, p) for o in orders for s in shares for c in chunk_opts for p in pf_opts])
        if best is None:
            raise min(sc.infeasible, key=lambda e: e.need_bytes - e.capacity_bytes)
    if any(t in FETCHED for t in best[1].tiers):
        bo, bs = best[1].order, best[1].gpu_share
        best = sc.best_of([(bo, bs, c, p) for c in chunk_opts for p in pf_opts], best)
        assert best is not None
        bc, bp = best[1].chunks, best[1].buffers / best[1].chunks
        best = sc.best_of([(o, s, bc, bp) for o in orders for s in shares], best)
        assert best is not None
    return best


def search(ctx: Ctx, knobs: Knobs) -> Analytic:
    """The analytic choice for ``knobs`` (the fixed defaults when auto is off or nothing needs offloading)."""
    fr = knobs.fractions()
    if not knobs.auto:
        return Analytic(fixed_choice(ctx, knobs), None, None, (), {
            "search": "off (fixed defaults)", "candidates_evaluated": 1, "candidates_simulated": 0})
    default = _fixed_or_none(ctx, knobs)
    if default is not None and not any(t in FETCHED for t in default.tiers) and fr == Fractions():
        return Analytic(default, None, default, (), {
            "search": "none needed (everything fits on the GPUs)", "candidates_evaluated": 1,
            "candidates_simulated": 0})
    sc = _Scorer(ctx, knobs)
    orders = [knobs.order] if knobs.order != "auto" else ["tail", "spread"]
    shares = list(SEARCH_SHARES) if ctx.peer_ok and fr.peer is None else [1.0]
    best = _staged(sc, knobs, orders, shares)
    ranked = sorted({id(ch): (t, ch) for t, ch in sc.seen.values()}.values(), key=lambda x: x[0])
    info: dict[str, Any] = {"candidates_evaluated": len(sc.seen) + 1, "candidates_simulated": 0,
                            "estimate_step_s": best[0],
                            "default_estimate_step_s": estimate(ctx, default).step_s if default else None,
                            "search": "analytic"}
    return Analytic(replace(best[1], streams=knobs.streams or 1), best[1], default, tuple(ranked), info)


# -- what the simulated refinement prices ------------------------------------------------------------
def sim_tasks(ctx: Ctx, ch: Choice, micro_steps: int) -> int:
    """Tasks the simulator runs for ``ch`` with ``micro_steps`` per step (2 steps, the warm-up one with one
    micro-step), counted from the plan's structure without building it."""
    n = ctx.n
    L = ctx.layers
    micro = opt = 0
    for i, t in enumerate(ch.tiers):
        cc = ch.chunks if t in FETCHED else 1
        micro += n * cc * (2 + (L[i].recompute_flops > 0))
        if t in FETCHED:
            per_unit = {"peer": 1, "cpu": n + (ctx.sliced and 1), "nvme": n + (ctx.sliced and 1) + 2}[t]
            micro += 2 * cc * per_unit + (2 * n if ch.offload_activations else 0)
        micro += (n > 1) + (n if t in ("cpu", "nvme") else 0)
        opt += n if t in ("cpu", "nvme") else 0
        opt += 2 if t == "nvme" else 0
    opt += n + 1
    return micro * (micro_steps + 1) + 2 * opt


def sim_reps(ctx: Ctx) -> list[int]:
    """Micro-steps of the reduced plans the refinement simulates: 1 and 2 (extrapolated to the real
    accumulation), or the real one when it is 1 or 2."""
    accum = ctx.job.accumulation(ctx.n)
    return [1, 2] if accum > 2 else [accum]


def default_over_budget(ctx: Ctx, knobs: Knobs) -> bool:
    """The fixed defaults alone cost more simulated tasks than the budget (so nothing is simulated);
    False when they do not fit (the refinement's first candidate is then the analytic best)."""
    default = _fixed_or_none(ctx, knobs)
    return default is not None and sum(sim_tasks(ctx, default, r) for r in sim_reps(ctx)) > SIM_TASK_BUDGET


def sim_candidates(ctx: Ctx, knobs: Knobs, found: Analytic) -> list[tuple[int, Choice]]:
    """(candidate index, choice) pairs to simulate, index 0 the fixed defaults (or the analytic best when
    the defaults do not fit), then the analytic best few placements x chunkings, each with every stream
    count, while the simulated tasks stay within SIM_TASK_BUDGET. Empty or one-candidate lists mean the
    job is too large to refine."""
    first = found.default or found.best
    if first is None:
        return []
    pool: list[Choice] = [first]
    for _, ch in found.ranked:
        if len(pool) > SIM_TOP:
            break
        if all(ch.tiers != q.tiers or ch.chunks != q.chunks or ch.buffers != q.buffers for q in pool):
            pool.append(ch)
    stream_opts = [knobs.streams] if knobs.streams else list(SEARCH_STREAMS)
    todo: list[tuple[int, Choice]] = [(0, pool[0])]
    for k, ch in enumerate(pool[1:], start=1):
        todo += [(k, ch)] if ch.chunks == 1 else [(k, replace(ch, streams=s)) for s in stream_opts if s <= ch.chunks]
    reps = sim_reps(ctx)
    budget = SIM_TASK_BUDGET
    runs: list[tuple[int, Choice]] = []
    for k, ch in todo:
        cost = sum(sim_tasks(ctx, ch, r) for r in reps)
        if cost > budget:
            break
        budget -= cost
        runs.append((k, ch))
    return runs
