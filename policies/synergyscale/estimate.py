"""SynergyScale's cost model: the analytic step time of a ``Choice`` (a per-rank list schedule of one
step's tasks), which ranks the candidates of its search."""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from costs import cpu_adam_seconds, gpu_optimizer_seconds, ring_per_rank_bytes
from policies.synergyscale.context import FETCHED, HOST, Choice, Ctx

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
            t = ctx.ctime(i, "fwd", c)
            prog += [_Op(t, uid[("f", i, k)], uid[("f", i, k)], -1, False) for k in range(c)]
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
    """A list schedule of two back-to-back micro-steps of one rank: fetch stages in unit order on their
    resources, a fetch starting when the buffer ``buffers`` units back is freed; compute in program order;
    each layer's gradients reduced (and offloaded) as they complete, within ``buckets`` in flight.
    Returns (start, end) of each micro-step, when each layer's gradients of the second one are off the GPU
    and when the last of them are."""
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
            nvme += 2 * ly.param_bytes / ctx.nvme_read
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
            io_in = (ly.master_bytes + ly.optimizer_bytes) / ctx.nvme_read
            io_out = (ly.master_bytes + ly.optimizer_bytes + ly.param_bytes) / ctx.nvme_write
            io_end = max(io_end, arrive - work) + io_in + io_out
            a_end = max(a_end, arrive, io_end - io_out) + work
            done = max(a_end, io_end)
        else:
            a_end = done = max(a_end, arrive) + work
        fetch = sum(s for _, s in _fetch_stages(ctx, i, t, c))
        exposed = max(exposed, done + fetch - (deadline_base + f_before[i]))
    return exposed


def estimate(ctx: Ctx, ch: Choice) -> float:
    """Step seconds of ``ch`` by a per-rank list schedule of one step's tasks.

    Fetch stages run in unit order on their resources (nvme read, PCIe upload, NVLink gather), a fetch
    starts when the buffer ``buffers`` units back is freed; compute runs in program order and waits for its
    chunk's fetch; gradients are reduced and offloaded per layer. Two micro-steps are scheduled back to
    back and the second one's length taken as the steady period; aggregate link loads per micro-step bound
    it from below. The optimizer adds the GPU Adam, the all-gather of the gpu tier and whatever part of
    the host optimizer (CPU Adam, NVMe swaps) the last backward and the next forward cannot hide.
    """
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
