"""SynergyScale's parameter search: a staged analytic search over order x GPU/peer split x chunks x
prefetch (the knobs left on auto), scored by ``estimate``, and the candidates its simulated refinement
prices when the job is small enough."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from policies.base import PlanInfeasible
from policies.synergyscale.context import FETCHED, NAME, Choice, Ctx, Fractions, Knobs
from policies.synergyscale.estimate import estimate
from policies.synergyscale.placement import place, resident_buckets

SEARCH_CHUNKS = (1, 2, 4, 8, 16)
SEARCH_PREFETCH = (1.0, 2.0, 4.0)
SEARCH_SHARES = (1.0, 0.75, 0.5, 0.25, 0.0)
SEARCH_STREAMS = (1, 2, 4)
SIM_TASK_BUDGET = 24_000   # tasks the refinement may simulate in all (the engine does ~15-20k tasks/s)
SIM_TOP = 3                # analytic best candidates simulated (besides the fixed defaults)
Point = tuple[str, float, int, float]  # order, gpu share, chunks, prefetch


def make_choice(ctx: Ctx, knobs: Knobs, fr: Fractions, order: str, share: float, c: int, s: int,
                pf: float) -> Choice:
    """The Choice for one point of the search space: placement, then chunking moot when nothing is fetched."""
    buffers = max(1, round(pf * c))
    tiers = place(ctx, NAME, order, share, c, buffers, knobs.offload_activations, fr)
    if not any(t in FETCHED for t in tiers):  # nothing to fetch: chunking and streams are moot
        return Choice(tiers, 1, 1, 1, order, share, knobs.offload_activations, resident_buckets(ctx))
    return Choice(tiers, c, max(1, min(s, c)), buffers, order, share, knobs.offload_activations)  # no idle streams


def fixed_choice(ctx: Ctx, knobs: Knobs) -> Choice | None:
    """The fixed defaults (auto=False: fill fastest tiers first, tail order); None when they do not fit."""
    order, c, s, pf = knobs.fixed()
    try:
        return make_choice(ctx, knobs, knobs.fractions(), order, 1.0, c, s, pf)
    except PlanInfeasible:
        return None  # the search may still find a chunking that fits


@dataclass(frozen=True)
class Analytic:
    """What the analytic search found: the choice it plans, the fixed defaults (None when they do not
    fit), every candidate it scored (best first) and what ``plan.info`` records about it."""

    choice: Choice
    best: Choice | None             # the analytic best before its stream count is set (None: not searched)
    default: Choice | None
    ranked: tuple[tuple[float, Choice], ...]
    info: dict[str, Any]


def search(ctx: Ctx, knobs: Knobs) -> Analytic:
    """The analytic choice for ``knobs`` (the fixed defaults when auto is off or nothing needs offloading).
    Staged: placement first (at the default chunking), then chunks x prefetch for the best placement, then
    the placement again at the best chunking."""
    fr = knobs.fractions()
    if not knobs.auto:
        order, c, s, pf = knobs.fixed()
        return Analytic(make_choice(ctx, knobs, fr, order, 1.0, c, s, pf), None, None, (),
                        {"search": "off (fixed defaults)", "candidates_evaluated": 1, "candidates_simulated": 0})
    default = fixed_choice(ctx, knobs)
    if default is not None and not default.fetches and fr == Fractions():
        return Analytic(default, None, default, (), {"search": "none needed (everything fits on the GPUs)",
                                                     "candidates_evaluated": 1, "candidates_simulated": 0})
    seen: dict[Point, tuple[float, Choice]] = {}
    infeasible: list[PlanInfeasible] = []

    def best_of(points: list[Point], best: tuple[float, Choice] | None = None) -> tuple[float, Choice] | None:
        """The fastest of ``points`` (first on ties) that beats ``best``, each estimated once."""
        for o, sh, c, p in points:
            if (o, sh, c, p) not in seen:
                try:
                    ch = make_choice(ctx, knobs, fr, o, sh, c, 1, p)
                except PlanInfeasible as e:
                    infeasible.append(e)
                    continue
                seen[(o, sh, c, p)] = (estimate(ctx, ch), ch)
            if best is None or seen[(o, sh, c, p)][0] < best[0]:
                best = seen[(o, sh, c, p)]
        return best

    orders = [knobs.order] if knobs.order != "auto" else ["tail", "spread"]
    shares = list(SEARCH_SHARES) if ctx.peer_ok and fr.peer is None else [1.0]
    chunk_opts = [knobs.chunks] if knobs.chunks else list(SEARCH_CHUNKS)
    pf_opts = [knobs.prefetch] if knobs.prefetch else list(SEARCH_PREFETCH)
    _, c0, _, p0 = knobs.fixed()
    best = best_of([(o, s, c0, p0) for o in orders for s in shares])
    if best is None:  # the defaults do not fit: look for any chunking / prefetch that does
        best = best_of([(o, s, c, p) for o in orders for s in shares for c in chunk_opts for p in pf_opts])
        if best is None:
            raise min(infeasible, key=lambda e: e.need_bytes - e.capacity_bytes)
    if best[1].fetches:
        best = best_of([(best[1].order, best[1].gpu_share, c, p) for c in chunk_opts for p in pf_opts], best)
        assert best is not None
        best = best_of([(o, s, best[1].chunks, best[1].buffers / best[1].chunks) for o in orders for s in shares], best)
        assert best is not None
    ranked = sorted({id(ch): (t, ch) for t, ch in seen.values()}.values(), key=lambda x: x[0])
    info: dict[str, Any] = {"candidates_evaluated": len(seen) + 1, "candidates_simulated": 0,
                            "estimate_step_s": best[0], "search": "analytic",
                            "default_estimate_step_s": estimate(ctx, default) if default else None}
    return Analytic(replace(best[1], streams=knobs.streams or 1), best[1], default, tuple(ranked), info)


# -- what the simulated refinement prices ------------------------------------------------------------
def sim_tasks(ctx: Ctx, ch: Choice, micro_steps: int) -> int:
    """Tasks the simulator runs for ``ch`` with ``micro_steps`` per step (2 steps, the warm-up one with one
    micro-step), counted from the plan's structure without building it."""
    n, L = ctx.n, ctx.layers
    micro = opt = 0
    for i, t in enumerate(ch.tiers):
        cc = ch.chunks if t in FETCHED else 1
        micro += n * cc * (2 + (L[i].recompute_flops > 0))
        if t in FETCHED:
            per_unit = {"peer": 1, "cpu": n + (ctx.sliced and 1), "nvme": n + (ctx.sliced and 1) + 2}[t]
            micro += 2 * cc * per_unit + (2 * n if ch.offload_activations else 0)
        micro += (n > 1) + (n if t in ("cpu", "nvme") else 0)
        opt += (n if t in ("cpu", "nvme") else 0) + (2 if t == "nvme" else 0)
    return micro * (micro_steps + 1) + 2 * (opt + n + 1)


def sim_reps(ctx: Ctx) -> list[int]:
    """Micro-steps of the reduced plans the refinement simulates: 1 and 2 (extrapolated to the real
    accumulation), or the real one when it is 1 or 2."""
    accum = ctx.job.accumulation(ctx.n)
    return [1, 2] if accum > 2 else [accum]


def default_over_budget(ctx: Ctx, knobs: Knobs) -> bool:
    """The fixed defaults alone cost more simulated tasks than the budget (so nothing is simulated);
    False when they do not fit (the refinement's first candidate is then the analytic best)."""
    default = fixed_choice(ctx, knobs)
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
    budget, runs = SIM_TASK_BUDGET, []
    for k, ch in todo:
        cost = sum(sim_tasks(ctx, ch, r) for r in sim_reps(ctx))
        if cost > budget:
            break
        budget -= cost
        runs.append((k, ch))
    return runs
