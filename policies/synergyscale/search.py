"""SynergyScale's parameter search: a staged analytic search over order x GPU/peer split x chunks x
prefetch (the knobs left on auto), scored by its cost model ``estimate`` (the analytic step time of a
``Choice``: a per-rank list schedule of one step's tasks), and the candidates its simulated refinement
prices when the job is small enough."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from costs import cpu_adam_seconds, gpu_optimizer_seconds, ring_per_rank_bytes
from policies.base import PlanInfeasible
from policies.synergyscale.context import FETCHED, HOST, NAME, Choice, Ctx, Fractions, Knobs
from policies.synergyscale.placement import place, resident_buckets

SEARCH_CHUNKS = (1, 2, 4, 8, 16)
SEARCH_PREFETCH = (1.0, 2.0, 4.0)
SEARCH_SHARES = (1.0, 0.75, 0.5, 0.25, 0.0)
SEARCH_STREAMS = (1, 2, 4)
SIM_TASK_BUDGET = 24_000   # tasks the refinement may simulate in all (the engine does ~15-20k tasks/s)
SIM_TOP = 3                # analytic best candidates simulated (besides the fixed defaults)
Point = tuple[str, float, int, float]  # order, gpu share, chunks, prefetch
Stages = list[tuple[str, float]]  # (resource, seconds) of the stages of one fetch


class _Op(NamedTuple):
    """One compute task of a rank's micro-step program."""

    seconds: float
    needs: int          # fetch unit it waits for (-1: none)
    frees: int          # fetch unit whose buffer it frees (-1: none)
    grads_of: int       # layer whose gradients are complete after it (-1: none)
    bucket: bool        # opens a gradient bucket (waits for the one ``buckets`` back)


def _fetch_stages(ctx: Ctx, i: int, tier: str, c: int) -> Stages:
    """Fetching one of c chunks of layer i to every GPU."""
    b = ctx.layers[i].param_bytes / c
    gather = ("nvl", ctx.ring_seconds(b))
    if tier == "peer":
        return [gather]
    stages = [("nvme", b / ctx.nvme_read + ctx.nvme_lat)] if tier == "nvme" else []
    if ctx.sliced:
        return [*stages, ("h2d", b / ctx.n / ctx.up_rate + ctx.up_lat), gather]
    return [*stages, ("h2d", b / ctx.up_rate + ctx.up_lat)]


def _program(ctx: Ctx, ch: Choice, uid: dict[tuple[str, int, int], int]) -> list[_Op]:
    """One rank's micro-step: forward in layer order, then recompute + backward in reverse order."""
    L, c, n = ctx.layers, ch.chunks, ctx.n
    prog: list[_Op] = []
    for i in range(len(L)):
        if ch.tiers[i] in FETCHED:
            prog += [_Op(ctx.ctime(i, "fwd", c), uid[("f", i, k)], uid[("f", i, k)], -1, False) for k in range(c)]
        else:
            prog.append(_Op(ctx.ctime(i, "fwd", 1), -1, -1, -1, False))
    for i in reversed(range(len(L))):
        rc = L[i].recompute_flops > 0
        if ch.tiers[i] in FETCHED:
            tr, tb = ctx.ctime(i, "rc", c), ctx.ctime(i, "bwd", c)
            for k in range(c):
                u = uid[("b", i, k)]
                if rc:
                    prog.append(_Op(tr, u, -1, -1, False))
                prog.append(_Op(tb, -1 if rc else u, u, i if k == c - 1 else -1, k == 0))
        else:
            if rc:
                prog.append(_Op(ctx.ctime(i, "rc", 1), -1, -1, -1, False))
            prog.append(_Op(ctx.ctime(i, "bwd", 1), -1, -1, i, n > 1))
    return prog


def _schedule(ch: Choice, n: int, units: list[Stages], prog: list[_Op], red_t: list[float],
              d2h_t: list[float]) -> tuple[list[tuple[float, float]], dict[int, float], float]:
    """Two back-to-back micro-steps of one rank (see ``estimate``): (start, end) of each, when each layer's
    gradients of the second one are off the GPU and when the last of them are."""
    U, D, B = len(units), max(1, ch.buffers), ch.buckets
    free_at: dict[str, float] = defaultdict(float)
    cons_end: list[float] = []   # when each fetch unit's buffer is freed
    ready: list[float] = []      # when each fetch unit is on the GPU
    gend: list[float] = []       # when each bucket is reduced / offloaded
    gd_end: dict[int, float] = {}
    now = red_free = d2h_free = 0.0
    opened = 0
    marks = []
    for m in range(2):
        start = now
        for op in prog:
            if op.bucket:  # a gradient bucket: wait until the one B layers back is reduced / offloaded
                if opened >= B:
                    now = max(now, gend[opened - B])
                opened += 1
            if op.needs >= 0:
                g = m * U + op.needs
                while len(ready) <= g:  # schedule the fetches up to g in order
                    q = len(ready)
                    t0 = cons_end[q - D] if q >= D else 0.0
                    for res, sec in units[q % U]:
                        t0 = free_at[res] = max(t0, free_at[res]) + sec
                    ready.append(t0)
                now = max(now, ready[g])
            now += op.seconds
            if op.frees >= 0:
                cons_end.append(now)
            if op.grads_of >= 0:
                gl = op.grads_of
                r_end = red_free = max(red_free, now) + red_t[gl]
                if d2h_t[gl] > 0:
                    r_end = d2h_free = max(d2h_free, r_end) + d2h_t[gl]
                if m == 1:
                    gd_end[gl] = r_end
                if n > 1 or ch.tiers[gl] != "gpu":
                    gend.append(r_end)
        marks.append((start, now))
    return marks, gd_end, max([red_free, d2h_free])


def _link_loads(ctx: Ctx, ch: Choice, red_t: list[float], d2h_t: list[float]) -> dict[str, float]:
    """Aggregate seconds per micro-step on NVLink, PCIe and NVMe (lower bounds of the micro-step)."""
    L, n = ctx.layers, ctx.n
    nvl = pcie = nvme = 0.0
    for i, t in enumerate(ch.tiers):
        ly = L[i]
        if n > 1:
            nvl += red_t[i]
        if t == "peer" or (t in HOST and ctx.sliced):
            nvl += 2 * ring_per_rank_bytes(ly.param_bytes, n, "all_gather") / ctx.ring_rate
        if t in HOST:
            pcie += 2 * ly.param_bytes / (n if ctx.sliced else 1) / ctx.up_rate + d2h_t[i]
        if t == "nvme":
            nvme += 2 * ly.param_bytes / ctx.nvme_read + ctx.grad32_bytes(i) / ctx.nvme_write
    return {"nvlink": nvl, "pcie": pcie, "nvme": nvme}


def _host_optimizer_exposed(ctx: Ctx, ch: Choice, gd_end: dict[int, float], end: float,
                            deadline_base: float) -> float:
    """Seconds of the host optimizer (CPU Adam, NVMe swaps) the next forward cannot hide: layers in
    backward order as their gradients land; deadline = when the next forward needs them (after the GPU
    optimizer, the gpu-tier all-gather and the forward of earlier layers)."""
    L, c = ctx.layers, ch.chunks
    exposed = a_end = io_end = fwd_acc = 0.0
    f_before = []
    for i, t in enumerate(ch.tiers):
        f_before.append(fwd_acc)
        cc = c if t in FETCHED else 1
        fwd_acc += ctx.ctime(i, "fwd", cc) * cc
    for i in reversed(range(len(L))):
        t = ch.tiers[i]
        if t not in HOST:
            continue
        ly = L[i]
        arrive = gd_end.get(i, end)
        work = cpu_adam_seconds(ctx.job.hw, ly.params)
        if t == "nvme":
            io_in = ctx.swap_in_bytes(i) / ctx.nvme_read
            io_out = (ly.master_bytes + ly.optimizer_bytes + ly.param_bytes) / ctx.nvme_write
            grad_out = ctx.grad32_bytes(i) / ctx.nvme_write  # its gradient first goes out and comes back in
            io_end = (max(io_end, arrive) + grad_out if grad_out else max(io_end, arrive - work)) + io_in + io_out
            a_end = max(a_end, arrive, io_end - io_out) + work
            done = max(a_end, io_end)
        else:
            a_end = done = max(a_end, arrive) + work
        fetch = sum(s for _, s in _fetch_stages(ctx, i, t, c))
        exposed = max(exposed, done + fetch - (deadline_base + f_before[i]))
    return exposed


def estimate(ctx: Ctx, ch: Choice) -> float:
    """Step seconds of ``ch`` by a per-rank list schedule of one step's tasks. Fetch stages run in unit order
    on their resources (nvme read, PCIe upload, NVLink gather), a fetch starting when the buffer ``buffers``
    units back is freed; compute runs in program order and waits for its chunk's fetch; gradients are
    reduced and offloaded per layer as they complete, within ``buckets`` in flight. Two micro-steps are
    scheduled back to back and the second one's length taken as the steady period; aggregate link loads per
    micro-step bound it from below. The optimizer adds the GPU Adam, the all-gather of the gpu tier and
    whatever part of the host optimizer (CPU Adam, NVMe swaps) the last backward and the next forward cannot
    hide."""
    L, n = ctx.layers, ctx.n
    units = ch.units()
    stages = {i: _fetch_stages(ctx, i, ch.tiers[i], ch.chunks) for _, i, _ in units}
    prog = _program(ctx, ch, {u: j for j, u in enumerate(units)})
    red_t = [ctx.ring_seconds(ly.grad_bytes) if n > 1 else 0.0 for ly in L]
    d2h_t = [ctx.grad_part(i) / ctx.down_rate + ctx.up_lat if ch.tiers[i] in HOST else 0.0 for i in range(len(L))]
    marks, gd_end, grads_off = _schedule(ch, n, [stages[i] for _, i, _ in units], prog, red_t, d2h_t)
    end = marks[1][1]
    grad_tail = max(0.0, grads_off - end)
    micro = max(sum(op.seconds for op in prog), marks[1][1] - marks[1][0], *_link_loads(ctx, ch, red_t, d2h_t).values())
    gpu_params = ctx.gpu_adam_params(ch.tiers)
    t_gopt = gpu_optimizer_seconds(ctx.job.hw, gpu_params) if gpu_params else 0.0
    t_agg = ctx.ring_seconds(ctx.tier_sum(ch.tiers, "gpu", "param_bytes")) if n > 1 and ctx.tier_sum(
        ch.tiers, "gpu") else 0.0
    exposed = _host_optimizer_exposed(ctx, ch, gd_end, end, end + grad_tail + t_gopt + t_agg)
    return ctx.job.accumulation(n) * micro + (grad_tail + t_gopt + t_agg + max(0.0, exposed))


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
    """What the analytic search found (``ranked``: every candidate it scored, best first)."""

    choice: Choice
    best: Choice | None             # the analytic best before its stream count is set (None: not searched)
    default: Choice | None          # the fixed defaults (None when they do not fit)
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
        best = best_of([(best[1].order, best[1].gpu_share, c, p) for c in chunk_opts for p in pf_opts], best) or best
        bc, bp = best[1].chunks, best[1].buffers / best[1].chunks
        best = best_of([(o, s, bc, bp) for o in orders for s in shares], best) or best
    ranked = sorted({id(ch): (t, ch) for t, ch in seen.values()}.values(), key=lambda x: x[0])
    info: dict[str, Any] = {"candidates_evaluated": len(seen) + 1, "candidates_simulated": 0,
                            "estimate_step_s": best[0], "search": "analytic",
                            "default_estimate_step_s": estimate(ctx, default) if default else None}
    return Analytic(replace(best[1], streams=knobs.streams or 1), best[1], default, tuple(ranked), info)


# -- what the simulated refinement prices ------------------------------------------------------------
def sim_tasks(ctx: Ctx, ch: Choice, micro_steps: int) -> int:
    """Tasks the simulator runs for ``ch`` with ``micro_steps`` per step (2 steps, the warm-up one with one
    micro-step), counted without building the plan."""
    n, L = ctx.n, ctx.layers
    micro = opt = 0
    for i, t in enumerate(ch.tiers):
        cc = ch.chunks if t in FETCHED else 1
        micro += n * cc * (2 + (L[i].recompute_flops > 0))
        if t in FETCHED:
            per_unit = {"peer": 1, "cpu": n + (ctx.sliced and 1), "nvme": n + (ctx.sliced and 1) + 2}[t]
            micro += 2 * cc * per_unit + (2 * n if ch.offload_activations else 0)
        micro += (n > 1) + (n if t in ("cpu", "nvme") else 0) + (t == "nvme" and ctx.grads_to_nvme)
        opt += (n if t in ("cpu", "nvme") else 0) + (2 if t == "nvme" else 0)
    return micro * (micro_steps + 1) + 2 * (opt + n + 1)


def sim_reps(ctx: Ctx) -> list[int]:
    """Micro-steps of the reduced plans the refinement simulates: 1 and 2, or the real one when it is 1 or 2."""
    accum = ctx.job.accumulation(ctx.n)
    return [1, 2] if accum > 2 else [accum]


def sim_candidates(ctx: Ctx, knobs: Knobs, found: Analytic) -> list[tuple[int, Choice]]:
    """(candidate index, choice) pairs to simulate, index 0 the fixed defaults (or the analytic best when
    the defaults do not fit), then the analytic best few placements x chunkings, each with every stream
    count, while the simulated tasks stay within SIM_TASK_BUDGET."""
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
