"""SynergyScale's cost model: the analytic step time of a ``Choice`` (a per-rank list schedule of one
step's tasks), which ranks the candidates of its search."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from costs import cpu_adam_seconds, gpu_optimizer_seconds, ring_per_rank_bytes
from policies.synergyscale.context import Choice, Ctx
from policies.synergyscale.knobs import FETCHED
from policies.synergyscale.placement import tier_params


@dataclass(frozen=True)
class Estimate:
    step_s: float
    micro_s: float
    optimizer_exposed_s: float
    bound: str          # what limits the micro-step: compute | pipeline | nvlink | pcie | nvme


class _Op(NamedTuple):
    """One compute task of a rank's micro-step program."""

    seconds: float
    needs: int          # fetch unit it waits for (-1: none)
    frees: int          # fetch unit whose buffer it frees (-1: none)
    grads_of: int       # layer whose gradients are complete after it (-1: none)
    bucket: bool        # opens a gradient bucket (waits for the one ``buckets`` back)


def _fetch_stages(ctx: Ctx, i: int, tier: str, c: int) -> list[tuple[str, float]]:
    """(resource, seconds) stages of fetching one of c chunks of layer i to every GPU."""
    b = ctx.layers[i].param_bytes / c
    n = ctx.n
    gather = ("nvl", ctx.ring_seconds(b))
    if tier == "peer":
        return [gather]
    stages = []
    if tier == "nvme":
        stages.append(("nvme", b / ctx.nvme_read + ctx.nvme_lat))
    if ctx.sliced:
        stages += [("h2d", b / n / ctx.up_rate + ctx.up_lat), gather]
    else:
        stages.append(("h2d", b / ctx.up_rate + ctx.up_lat))
    return stages


def _fetch_units(ctx: Ctx, ch: Choice) -> tuple[list[list[tuple[str, float]]], dict[tuple[str, int, int], int]]:
    """Fetch units (forward chunks, then backward chunks) in consumption order, and their index."""
    idx = range(len(ctx.layers))
    units: list[list[tuple[str, float]]] = []
    uid: dict[tuple[str, int, int], int] = {}
    for p, order in (("f", idx), ("b", reversed(idx))):
        for i in order:
            if ch.tiers[i] in FETCHED:
                st = _fetch_stages(ctx, i, ch.tiers[i], ch.chunks)
                for k in range(ch.chunks):
                    uid[(p, i, k)] = len(units)
                    units.append(st)
    return units, uid


def _program(ctx: Ctx, ch: Choice, uid: dict[tuple[str, int, int], int]) -> list[_Op]:
    """One rank's micro-step: forward in layer order, then recompute + backward in reverse order."""
    L, c, n = ctx.layers, ch.chunks, ctx.n
    idx = range(len(L))
    prog: list[_Op] = []
    for i in idx:
        if ch.tiers[i] in FETCHED:
            t = ctx.ctime(i, "fwd", c)
            prog += [_Op(t, uid[("f", i, k)], uid[("f", i, k)], -1, False) for k in range(c)]
        else:
            prog.append(_Op(ctx.ctime(i, "fwd", 1), -1, -1, -1, False))
    for i in reversed(idx):
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


class _Schedule:
    """A list schedule of two back-to-back micro-steps of one rank: fetch stages in unit order on their
    resources, a fetch starting when the buffer ``buffers`` units back is freed; compute in program order;
    each layer's gradients reduced (and offloaded) as they complete, within ``buckets`` in flight."""

    def __init__(self, ctx: Ctx, ch: Choice, units: list[list[tuple[str, float]]], red_t: list[float],
                 d2h_t: list[float]):
        self.ch = ch
        self.n = ctx.n
        self.units = units
        self.D = max(1, ch.buffers)
        self.red_t = red_t
        self.d2h_t = d2h_t
        self.free_at: dict[str, float] = defaultdict(float)
        self.cons_end: list[float] = []
        self.ready: list[float] = []
        self.now = 0.0
        self.gd_end: dict[int, float] = {}      # second micro-step: when layer i's gradients are off the GPU
        self.gend: list[float] = []
        self.bucket_starts: list[float] = []
        self.red_free = 0.0
        self.d2h_free = 0.0

    def _fetched_by(self, g: int) -> float:
        """When global fetch unit g is ready (scheduling the fetches up to it in order)."""
        U = len(self.units)
        while len(self.ready) <= g:
            q = len(self.ready)
            t0 = self.cons_end[q - self.D] if q - self.D >= 0 else 0.0
            for res, sec in self.units[q % U]:
                t0 = max(t0, self.free_at[res]) + sec
                self.free_at[res] = t0
            self.ready.append(t0)
        return self.ready[g]

    def _grads_done(self, gl: int, m: int) -> None:
        r_end = max(self.red_free, self.now) + self.red_t[gl]
        self.red_free = r_end
        if self.d2h_t[gl] > 0:
            self.d2h_free = max(self.d2h_free, r_end) + self.d2h_t[gl]
            r_end = self.d2h_free
        if m == 1:
            self.gd_end[gl] = r_end
        if self.n > 1 or self.ch.tiers[gl] != "gpu":
            self.gend.append(r_end)

    def run(self, prog: list[_Op]) -> list[tuple[float, float]]:
        """(start, end) of each of the two micro-steps."""
        B = self.ch.buckets
        marks = []
        for m in range(2):
            start = self.now
            for op in prog:
                if op.bucket:  # a gradient bucket: wait until the one B layers back is reduced / offloaded
                    if len(self.bucket_starts) - B >= 0:
                        self.now = max(self.now, self.gend[len(self.bucket_starts) - B])
                    self.bucket_starts.append(self.now)
                if op.needs >= 0:
                    self.now = max(self.now, self._fetched_by(m * len(self.units) + op.needs))
                self.now += op.seconds
                if op.frees >= 0:
                    self.cons_end.append(self.now)
                if op.grads_of >= 0:
                    self._grads_done(op.grads_of, m)
            marks.append((start, self.now))
        return marks


def _link_loads(ctx: Ctx, ch: Choice, red_t: list[float], d2h_t: list[float]) -> dict[str, float]:
    """Aggregate seconds per micro-step on NVLink, PCIe and NVMe (lower bounds of the micro-step)."""
    L, n = ctx.layers, ctx.n
    nvl = pcie = nvme = 0.0
    for i, t in enumerate(ch.tiers):
        ly = L[i]
        if n > 1:
            nvl += red_t[i]
        if t == "peer" or (t in ("cpu", "nvme") and ctx.sliced):
            nvl += 2 * ring_per_rank_bytes(ly.param_bytes, n, "all_gather") / ctx.ring_rate
        if t in ("cpu", "nvme"):
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
    idx = range(len(L))
    fetched = [t in FETCHED for t in ch.tiers]
    exposed = a_end = io_end = fwd_acc = 0.0
    f_before = []
    for i in idx:
        f_before.append(fwd_acc)
        fwd_acc += ctx.ctime(i, "fwd", c if fetched[i] else 1) * (c if fetched[i] else 1)
    for i in reversed(idx):
        t = ch.tiers[i]
        if t not in ("cpu", "nvme"):
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
            a_end = max(a_end, arrive) + work
            done = a_end
        fetch = sum(s for _, s in _fetch_stages(ctx, i, t, c))
        exposed = max(exposed, done + fetch - (deadline_base + f_before[i]))
    return exposed


def _gpu_optimizer_seconds(ctx: Ctx, ch: Choice) -> tuple[float, float]:
    """GPU Adam over this rank's gpu + peer states, and the all-gather of the gpu tier's weights."""
    L, n = ctx.layers, ctx.n
    tp = tier_params(ctx, ch.tiers)
    gpu_states = (tp["gpu"] + tp["peer"]) / n if n > 1 else tp["gpu"]
    t_gopt = gpu_optimizer_seconds(ctx.job.hw, gpu_states) if gpu_states else 0.0
    t_agg = 0.0
    if n > 1 and tp["gpu"]:
        gbytes = sum(L[i].param_bytes for i, t in enumerate(ch.tiers) if t == "gpu")
        t_agg = ctx.ring_seconds(gbytes)
    return t_gopt, t_agg


def estimate(ctx: Ctx, ch: Choice) -> Estimate:
    """Step time of ``ch`` by a per-rank list schedule of one step's tasks.

    Fetch stages run in unit order on their resources (nvme read, PCIe upload, NVLink gather), a fetch
    starts when the buffer ``buffers`` units back is freed; compute runs in program order and waits for its
    chunk's fetch; gradients are reduced and offloaded per layer. Two micro-steps are scheduled back to
    back and the second one's length taken as the steady period; aggregate link loads per micro-step bound
    it from below. The optimizer adds the GPU Adam, the all-gather of the gpu tier and whatever part of
    the host optimizer (CPU Adam, NVMe swaps) the last backward and the next forward cannot hide.
    """
    L, n = ctx.layers, ctx.n
    units, uid = _fetch_units(ctx, ch)
    prog = _program(ctx, ch, uid)
    red_t = [ctx.ring_seconds(ly.grad_bytes) if n > 1 else 0.0 for ly in L]
    d2h_t = [ly.params / n * ctx.grad_bytes_per_param(i) / ctx.down_rate + ctx.up_lat
             if ch.tiers[i] in ("cpu", "nvme") else 0.0 for i, ly in enumerate(L)]
    sched = _Schedule(ctx, ch, units, red_t, d2h_t)
    marks = sched.run(prog)
    end = marks[1][1]
    grad_tail = max(0.0, max([sched.red_free, sched.d2h_free]) - end)
    bounds = {"compute": sum(op.seconds for op in prog), "pipeline": marks[1][1] - marks[1][0],
              **_link_loads(ctx, ch, red_t, d2h_t)}
    bound = max(bounds, key=lambda k: bounds[k])
    micro = bounds[bound]
    t_gopt, t_agg = _gpu_optimizer_seconds(ctx, ch)
    exposed = _host_optimizer_exposed(ctx, ch, sched.gd_end, end, end + grad_tail + t_gopt + t_agg)
    opt = grad_tail + t_gopt + t_agg + max(0.0, exposed)
    accum = ctx.job.accumulation(n)
    return Estimate(accum * micro + opt, micro, opt, bound)

