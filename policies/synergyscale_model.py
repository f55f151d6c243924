"""SynergyScale's cost model: tier capacities, layer placement and the analytic step-time estimate.

The plan builder (``policies/synergyscale.py``) and the search use these; the docstring there states the
reading of the paper. Everything here is per data-parallel rank (all ranks are alike) unless it says
"pool" (host DRAM and NVMe are shared by every rank).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from costs import compute_seconds
from hardware_models import Topology, build_topology
from policies.base import Job, PlanInfeasible, gpu_pool

TIERS = ("gpu", "peer", "cpu", "nvme")
FETCHED = ("peer", "cpu", "nvme")      # tiers whose parameters are brought to the GPU before each use
GPU_HEADROOM = 0.01                    # fraction of a GPU's usable memory the placement leaves free
BUCKETS_IN_FLIGHT = 3                  # gradient buckets alive at once (bounded: bwd of layer i waits for i+3)
NVME_SWAP_BUFFERS = 2                  # host buffers of the NVMe optimizer swap (double buffering)


@dataclass(frozen=True)
class Choice:
    """One point of the search space (everything the plan builder needs besides the job)."""

    tiers: tuple[str, ...]          # tier of every layer
    chunks: int                     # chunks per fetched layer
    streams: int                    # compute streams per GPU
    buffers: int                    # chunk buffers per GPU for fetched parameters (prefetch window)
    order: str                      # "tail" | "spread": which layers get the fast tiers first
    gpu_share: float                # share of the GPU's spare memory the 'gpu' tier may take (the rest: peer)
    offload_activations: bool
    buckets: int = 3                # gradient buckets in flight per GPU (the backward waits beyond that)

    @property
    def prefetch_layers(self) -> float:
        return self.buffers / self.chunks

    def params(self) -> dict[str, object]:
        return {"chunks": self.chunks, "streams": self.streams, "buffers": self.buffers,
                "prefetch_layers": round(self.prefetch_layers, 3), "order": self.order,
                "gpu_share": self.gpu_share, "offload_activations": self.offload_activations,
                "grad_buckets": self.buckets}


@dataclass
class Ctx:
    """Per-job facts computed once: sizes, link rates, capacities, compute-time cache."""

    job: Job
    topo: Topology
    n: int
    unified: bool
    has_nvme: bool
    peer_ok: bool                   # peer-GPU tier possible: more than one GPU and NVLink
    sliced: bool                    # offloaded parameters: each rank uploads 1/n, then an NVLink all-gather
    gpu_cap: float
    cpu_cap: float                  # host pool (on a unified machine: the same pool as the GPU's)
    nvme_cap: float
    dtype: str
    launch: float
    up_rate: float                  # cpu -> gpu bytes/s per GPU with every GPU uploading
    up_lat: float
    down_rate: float
    ring_rate: float                # per-rank bytes/s of a ring collective over all GPUs
    ring_lat: float
    nvme_read: float
    nvme_write: float
    nvme_lat: float
    adam_rate: float                # host CPU-Adam params/s (shared by all ranks)
    gpu_adam_bpp: float
    hbm_bw: float
    host_grad_bytes: float = 4.0    # host gradient buffer per parameter (fp32 in DeepSpeed's offload path)
    _ct: dict[tuple[int, str, int], float] = field(default_factory=dict)

    @property
    def layers(self):  # noqa: ANN201
        return self.job.trace.layers

    # -- per-layer sizes -----------------------------------------------------------------------------
    def gpu_cost(self, i: int, tier: str) -> float:
        """Persistent bytes on each GPU for layer i's model states in ``tier``."""
        ly = self.layers[i]
        rest = ly.grad_bytes + ly.master_bytes + ly.optimizer_bytes
        if tier == "gpu":
            return ly.param_bytes + rest / self.n
        if tier == "peer":
            return (ly.param_bytes + rest) / self.n
        return 0.0

    def host_cost(self, i: int, tier: str) -> float:
        """Bytes in the host pool for layer i's states in ``tier``."""
        ly = self.layers[i]
        if tier == "cpu":
            return ly.param_bytes + ly.master_bytes + ly.optimizer_bytes + self.host_grad_bytes * ly.params
        if tier == "nvme":
            return self.host_grad_bytes * ly.params
        return 0.0

    def nvme_cost(self, i: int, tier: str) -> float:
        ly = self.layers[i]
        return ly.param_bytes + ly.master_bytes + ly.optimizer_bytes if tier == "nvme" else 0.0

    def grad_bytes_per_param(self, i: int) -> float:
        ly = self.layers[i]
        return ly.grad_bytes / ly.params if ly.params else 0.0

    # -- compute -------------------------------------------------------------------------------------
    def ctime(self, i: int, phase: str, c: int) -> float:
        """Seconds of one of c chunks of layer i's ``phase`` (fwd | rc | bwd), launch overhead included.

        A chunk does 1/c of the FLOPs at the efficiency of its own size (the GPU's gemm_efficiency curve),
        reads 1/c of the weights and activations and, for c > 1, reads the whole layer input and writes a
        partial-sum output (2 x output bytes) that the chunks add up.
        """
        key = (i, phase, c)
        t = self._ct.get(key)
        if t is None:
            ly = self.layers[i]
            flops = {"fwd": ly.fwd_flops, "rc": ly.recompute_flops, "bwd": ly.bwd_flops}[phase]
            hbm = ly.bwd_hbm_bytes if phase == "bwd" else ly.fwd_hbm_bytes
            t = compute_seconds(self.job.hw, flops / c, chunk_hbm(hbm, ly.output_bytes, c), self.dtype) + self.launch
            self._ct[key] = t
        return t


def chunk_hbm(hbm: float, output_bytes: float, c: int) -> float:
    return hbm / c + (2.0 * output_bytes if c > 1 else 0.0)


def _share_rate(topo: Topology, pairs: list[tuple[str, str]]) -> tuple[float, float]:
    """Rate of each of ``pairs`` (equal concurrent flows) when they share every resource of their routes:
    min over resources of capacity / number of flows on it, and the largest route latency."""
    count: dict[str, int] = defaultdict(int)
    cap: dict[str, float] = {}
    lat = 0.0
    for src, dst in pairs:
        if src == dst:
            continue
        lat = max(lat, topo.route_latency(src, dst))
        for h in topo.route(src, dst):
            ln = topo.links[h.link]
            key = f"{h.link}:{'fwd' if h.forward else 'rev'}"
            count[key] += 1
            cap[key] = ln.bw(h.forward)
            if ln.duplex_bw is not None:
                count[f"{h.link}:duplex"] += 1
                cap[f"{h.link}:duplex"] = ln.duplex_bw
    if not count:
        return math.inf, 0.0
    return min(cap[k] / count[k] for k in count), lat


def make_ctx(job: Job, host_grad_bytes: float = 4.0) -> Ctx:
    hw = job.hw
    topo = build_topology(hw)
    n = job.n_gpus
    gpus = [f"gpu{r}" for r in range(n)]
    unified = topo.pool_of["gpu0"] == topo.pool_of["cpu"]
    up_rate, up_lat = _share_rate(topo, [("cpu", g) for g in gpus])
    down_rate, _ = _share_rate(topo, [(g, "cpu") for g in gpus])
    if n > 1:
        ring_rate, ring_lat = _share_rate(topo, [(gpus[r], gpus[(r + 1) % n]) for r in range(n)])
    else:
        ring_rate, ring_lat = math.inf, 0.0
    has_nvme = "nvme" in topo.locations
    nv = hw.nvme
    return Ctx(
        job=job, topo=topo, n=n, unified=unified, has_nvme=has_nvme,
        peer_ok=n > 1 and hw.nvlink is not None, sliced=n > 1 and hw.nvlink is not None,
        gpu_cap=gpu_pool(job).capacity_bytes, cpu_cap=topo.pools[topo.pool_of["cpu"]].capacity_bytes,
        nvme_cap=topo.pools["nvme"].capacity_bytes if has_nvme else 0.0,
        dtype=job.config.precision, launch=hw.gpu.launch_overhead_s,
        up_rate=up_rate, up_lat=up_lat, down_rate=down_rate, ring_rate=ring_rate, ring_lat=ring_lat,
        nvme_read=nv.read_bw if nv else 1.0, nvme_write=nv.write_bw if nv else 1.0,
        nvme_lat=nv.latency_s if nv else 0.0, adam_rate=hw.host.optimizer_params_per_s,
        gpu_adam_bpp=hw.gpu.optimizer_bytes_per_param, hbm_bw=hw.gpu.hbm_bw, host_grad_bytes=host_grad_bytes)


# -- memory ------------------------------------------------------------------------------------------
def gpu_fixed_bytes(ctx: Ctx, tiers: tuple[str, ...] | None, chunks: int, buffers: int,
                    offload_activations: bool, buckets_in_flight: int = 0) -> float:
    """Per-GPU bytes besides persistent model states: workspace, saved activations of one micro-step,
    the chunk buffers of fetched parameters, gradient buckets in flight, and a small headroom.
    With ``tiers`` None the bound assumes every layer may be fetched (used before placement)."""
    L = ctx.layers
    fetched = [i for i in range(len(L)) if tiers is None or tiers[i] in FETCHED]
    ws = max(ly.peak_transient_bytes for ly in L)
    acts = sum(ly.activation_bytes for i, ly in enumerate(L)
               if not (offload_activations and (tiers is None or tiers[i] in FETCHED)))
    if offload_activations:
        acts += 2 * max(ly.activation_bytes for ly in L)  # in flight to / from the host
    buf = buffers * max((L[i].param_bytes / chunks for i in fetched), default=0.0)
    bucket_layers = [i for i in range(len(L)) if ctx.n > 1 or (tiers is None or tiers[i] != "gpu")]
    nb = min(buckets_in_flight or BUCKETS_IN_FLIGHT, len(bucket_layers))
    buckets = sum(sorted((L[i].grad_bytes for i in bucket_layers), reverse=True)[:nb])
    if ctx.n == 1 and tiers is not None and not fetched:
        buckets = 0.0
    return ws + acts + buf + buckets + GPU_HEADROOM * ctx.gpu_cap


def host_fixed_bytes(ctx: Ctx, tiers: tuple[str, ...], chunks: int, buffers: int,
                     offload_activations: bool) -> float:
    """Host-pool bytes besides model states: NVMe staging chunks and optimizer swap buffers,
    offloaded activations of every rank."""
    L = ctx.layers
    nv = [i for i, t in enumerate(tiers) if t == "nvme"]
    out = 0.0
    if nv:
        out += buffers * max(L[i].param_bytes / chunks for i in nv)
        out += NVME_SWAP_BUFFERS * max(L[i].master_bytes + L[i].optimizer_bytes for i in nv)
    if offload_activations:
        out += ctx.n * sum(L[i].activation_bytes for i, t in enumerate(tiers) if t in FETCHED)
    return out


def resident_buckets(ctx: Ctx) -> int:
    """Gradient buckets in flight for an all-resident placement: unbounded (every layer's) when that fits,
    as plain data parallelism does, else BUCKETS_IN_FLIGHT."""
    nl = len(ctx.layers)
    tiers = ("gpu",) * nl
    need = gpu_fixed_bytes(ctx, tiers, 1, 1, False, nl) + sum(ctx.gpu_cost(i, "gpu") for i in range(nl))
    return nl if need <= ctx.gpu_cap else BUCKETS_IN_FLIGHT


def priority(ctx: Ctx, order: str) -> list[int]:
    """Layers in the order they claim the fastest tiers. 'tail': first layers first, so offloaded layers
    sit at the end (their gradients arrive first in the backward, giving the CPU optimizer the most time);
    'spread': a van der Corput order, so offloaded layers interleave with resident ones (their transfers
    hide behind the neighbours' compute). Tied embeddings: the embedding always comes first."""
    L = len(ctx.layers)
    if order == "tail":
        return list(range(L))

    def vdc(k: int) -> float:
        x, d = 0.0, 0.5
        while k:
            if k & 1:
                x += d
            k >>= 1
            d /= 2
        return x
    rest = sorted(range(1, L), key=lambda i: (vdc(i), i))
    return [0, *rest]


@dataclass(frozen=True)
class Fractions:
    """Explicit placement fractions (of parameters) per tier; None = auto (filled fastest first)."""

    peer: float | None = None
    cpu: float | None = None
    nvme: float | None = None

    def get(self, tier: str) -> float | None:
        return None if tier == "gpu" else getattr(self, tier)


def place(ctx: Ctx, policy: str, order: str, gpu_share: float, chunks: int, buffers: int,
          offload_activations: bool, fr: Fractions) -> tuple[str, ...]:
    """Assign a tier to every layer: layers in ``priority`` order fill the fastest tier with room left
    (gpu up to ``gpu_share`` of the GPU's spare memory, then peer, cpu, nvme); a tier with an explicit
    fraction takes that share of the parameters instead. Raises PlanInfeasible naming the pool that
    overflows and by how much."""
    L = ctx.layers
    nl = len(L)
    total = float(sum(ly.params for ly in L))
    gpool = ctx.topo.pool_of["gpu0"]
    hpool = ctx.topo.pool_of["cpu"]
    all_auto = fr.peer is None and fr.cpu is None and fr.nvme is None
    if all_auto or sum(fr.get(t) or 0.0 for t in FETCHED) == 0.0:
        resident = ("gpu",) * nl
        need = gpu_fixed_bytes(ctx, resident, chunks, buffers, offload_activations) + sum(
            ctx.gpu_cost(i, "gpu") for i in range(nl))
        if need <= ctx.gpu_cap:
            return resident
    fixed = gpu_fixed_bytes(ctx, None, chunks, buffers, offload_activations)
    spare = ctx.gpu_cap - fixed
    if spare < 0:
        raise PlanInfeasible(policy, gpool, fixed, ctx.gpu_cap,
                             "workspace, activations, parameter chunk buffers and gradient buckets "
                             "with every layer offloaded")
    host_cap = ctx.cpu_cap - (fixed if ctx.unified else 0.0)  # unified: one pool for both sides
    # host buffers are only known after placement: reserve them as if any layer might land on NVMe
    worst = tuple("nvme" if ctx.has_nvme else "cpu" for _ in L)
    host_cap -= host_fixed_bytes(ctx, worst, chunks, buffers, offload_activations)
    usable = [t for t in TIERS if t == "gpu" or (t == "peer" and ctx.peer_ok)
              or (t == "cpu" and not (ctx.unified and fr.cpu is None)) or (t == "nvme" and ctx.has_nvme)]
    target = {t: fr.get(t) for t in usable}
    if all(target[t] is not None for t in usable if t != "gpu"):
        target["gpu"] = max(0.0, 1.0 - sum(target[t] or 0.0 for t in usable if t != "gpu"))
    last = usable[-1]
    used = {"gpu": 0.0, "host": 0.0, "nvme": 0.0}
    tiers: dict[int, str] = {}
    todo = priority(ctx, order)
    left = total

    def over(tier: str, rest: list[int]) -> PlanInfeasible:
        what = (f"the model states left for the {tier} tier ({len(rest)} layer(s), "
                f"{sum(L[j].params for j in rest) / 1e9:.2f}B parameters) after filling the faster tiers")
        if tier in ("gpu", "peer"):
            return PlanInfeasible(policy, gpool, fixed + used["gpu"] + sum(ctx.gpu_cost(j, tier) for j in rest),
                                  ctx.gpu_cap, what)
        nv = used["nvme"] + sum(ctx.nvme_cost(j, tier) for j in rest)
        if tier == "nvme" and nv > ctx.nvme_cap:
            return PlanInfeasible(policy, "nvme", nv, ctx.nvme_cap, what)
        extra = (ctx.cpu_cap - host_cap) if ctx.unified else 0.0
        return PlanInfeasible(policy, hpool, extra + used["host"] + sum(ctx.host_cost(j, tier) for j in rest),
                              ctx.cpu_cap, what)

    # what the layers still unplaced need at least in the host pool (in the slowest tier): an auto tier that
    # draws on the host pool (cpu; gpu and peer on a unified machine) leaves that much free
    prio = list(todo)
    suffix = [0.0] * (len(prio) + 1)
    for j in range(len(prio) - 1, -1, -1):
        suffix[j] = suffix[j + 1] + ctx.host_cost(prio[j], last)
    pos = {i: j for j, i in enumerate(prio)}

    for k, tier in enumerate(usable):
        want = target[tier]
        reserve = sum(target[t] or 0.0 for t in usable[k + 1:]) * total
        cap_gpu = spare * gpu_share if tier == "gpu" and ctx.peer_ok else spare
        taken = 0.0
        while todo:
            i = todo[0]
            p = float(L[i].params)
            pinned = tier == "gpu" and i == 0 and _tied(ctx)  # the head's matmul reads the tied embedding
            if not pinned and tier != last:  # the last tier takes whatever is left
                if want is not None and taken + p / 2 > want * total + 1e-9:
                    break
                if want is None and left - p < reserve - p / 2:
                    break
            g, h, v = ctx.gpu_cost(i, tier), ctx.host_cost(i, tier), ctx.nvme_cost(i, tier)
            keep = suffix[pos[i] + 1] if want is None and tier != last else 0.0
            fits = (used["gpu"] + g <= cap_gpu and (not ctx.unified or used["host"] + g + keep <= host_cap)
                    if tier in ("gpu", "peer") else
                    used["host"] + h + keep <= host_cap and used["nvme"] + v <= ctx.nvme_cap)
            if not fits:
                if want is None and tier != last and not pinned:
                    break
                raise over(tier, list(todo) if want is None or tier == last else [i])
            used["gpu"] += g
            used["host"] += h + (g if ctx.unified else 0.0)
            used["nvme"] += v
            tiers[i] = tier
            taken += p
            left -= p
            todo.pop(0)
    if todo:
        raise over(last, todo)
    out = tuple(tiers[i] for i in range(nl))
    # the exact working set now that the placement is known (the bound above assumed every layer fetched)
    need = gpu_fixed_bytes(ctx, out, chunks, buffers, offload_activations) + used["gpu"]
    if need > ctx.gpu_cap + 1:
        raise PlanInfeasible(policy, gpool, need, ctx.gpu_cap, "the placed layers and their working set")
    hx = host_fixed_bytes(ctx, out, chunks, buffers, offload_activations)
    if used["host"] + hx > ctx.cpu_cap - (fixed if ctx.unified else 0.0) + 1:
        raise PlanInfeasible(policy, hpool, used["host"] + hx, ctx.cpu_cap, "host-side model states and buffers")
    return out


def _tied(ctx: Ctx) -> bool:
    return bool(ctx.job.model.tied_embeddings)


def tier_params(ctx: Ctx, tiers: tuple[str, ...]) -> dict[str, float]:
    out = dict.fromkeys(TIERS, 0.0)
    for i, t in enumerate(tiers):
        out[t] += ctx.layers[i].params
    return out


# -- analytic estimate -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    step_s: float
    micro_s: float
    optimizer_exposed_s: float
    bound: str          # what limits the micro-step: compute | pipeline | nvlink | pcie | nvme


def _fetch_stages(ctx: Ctx, i: int, tier: str, c: int) -> list[tuple[str, float]]:
    """(resource, seconds) stages of fetching one of c chunks of layer i to every GPU."""
    b = ctx.layers[i].param_bytes / c
    n = ctx.n
    gather = ("nvl", b * (n - 1) / n / ctx.ring_rate + ctx.ring_lat * (n - 1))
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


def estimate(ctx: Ctx, ch: Choice) -> Estimate:
    """Step time of ``ch`` by a per-rank list schedule of one step's tasks.

    Fetch stages run in unit order on their resources (nvme read, PCIe upload, NVLink gather), a fetch
    starts when the buffer ``buffers`` units back is freed; compute runs in program order and waits for its
    chunk's fetch; gradients are reduced and offloaded per layer. Two micro-steps are scheduled back to
    back and the second one's length taken as the steady period; aggregate link loads per micro-step bound
    it from below. The optimizer adds the GPU Adam, the all-gather of the gpu tier and whatever part of
    the host optimizer (CPU Adam, NVMe swaps) the last backward and the next forward cannot hide.
    """
    L = ctx.layers
    n = ctx.n
    c = ch.chunks
    D = max(1, ch.buffers)
    tiers = ch.tiers
    fetched = [t in FETCHED for t in tiers]
    idx = range(len(L))
    # fetch units in consumption order
    units: list[list[tuple[str, float]]] = []
    uid: dict[tuple[str, int, int], int] = {}
    for p, order in (("f", idx), ("b", reversed(idx))):
        for i in order:
            if fetched[i]:
                st = _fetch_stages(ctx, i, tiers[i], c)
                for k in range(c):
                    uid[(p, i, k)] = len(units)
                    units.append(st)
    # compute program: (seconds, needs unit, frees unit, grads of layer ready)
    prog: list[tuple[float, int, int, int]] = []
    for i in idx:
        if fetched[i]:
            t = ctx.ctime(i, "fwd", c)
            for k in range(c):
                u = uid[("f", i, k)]
                prog.append((t, u, u, -1, False))
        else:
            prog.append((ctx.ctime(i, "fwd", 1), -1, -1, -1, False))
    for i in reversed(idx):
        rc = L[i].recompute_flops > 0
        if fetched[i]:
            tr, tb = ctx.ctime(i, "rc", c), ctx.ctime(i, "bwd", c)
            for k in range(c):
                u = uid[("b", i, k)]
                if rc:
                    prog.append((tr, u, -1, -1, False))
                prog.append((tb, -1 if rc else u, u, i if k == c - 1 else -1, k == 0))
        else:
            if rc:
                prog.append((ctx.ctime(i, "rc", 1), -1, -1, -1, False))
            prog.append((ctx.ctime(i, "bwd", 1), -1, -1, i, n > 1))
    U = len(units)
    free_at: dict[str, float] = defaultdict(float)
    cons_end: list[float] = []
    ready: list[float] = []
    now = 0.0
    marks = []
    gd_end: dict[int, float] = {}
    gend: list[float] = []
    bucket_starts: list[float] = []
    red_free = 0.0
    d2h_free = 0.0
    red_t = [ly.grad_bytes * (n - 1) / n / ctx.ring_rate + ctx.ring_lat * (n - 1) if n > 1 else 0.0 for ly in L]
    d2h_t = [ly.params / n * ctx.grad_bytes_per_param(i) / ctx.down_rate + ctx.up_lat if tiers[i] in ("cpu", "nvme")
             else 0.0 for i, ly in enumerate(L)]
    for m in range(2):
        start = now
        for dur, need, frees, gl, bg in prog:
            if bg:  # a gradient bucket: wait until the one ch.buckets layers back is reduced / offloaded
                if len(bucket_starts) - ch.buckets >= 0:
                    now = max(now, gend[len(bucket_starts) - ch.buckets])
                bucket_starts.append(now)
            if need >= 0:
                g = m * U + need
                while len(ready) <= g:  # schedule fetches up to g in order
                    q = len(ready)
                    t0 = cons_end[q - D] if q - D >= 0 else 0.0
                    for res, sec in units[q % U]:
                        t0 = max(t0, free_at[res]) + sec
                        free_at[res] = t0
                    ready.append(t0)
                now = max(now, ready[g])
            now += dur
            if frees >= 0:
                cons_end.append(now)
            if gl >= 0:
                r_end = max(red_free, now) + red_t[gl]
                red_free = r_end
                if d2h_t[gl] > 0:
                    d2h_free = max(d2h_free, r_end) + d2h_t[gl]
                    r_end = d2h_free
                if m == 1:
                    gd_end[gl] = r_end
                if n > 1 or tiers[gl] != "gpu":
                    gend.append(r_end)
        marks.append((start, now))
    micro_pipe = marks[1][1] - marks[1][0]
    end = marks[1][1]
    grad_tail = max(0.0, max([red_free, d2h_free]) - end)
    # aggregate loads per micro-step (lower bounds)
    comp = sum(d for d, *_ in prog)
    nvl = pcie = nvme = 0.0
    for i, t in enumerate(tiers):
        ly = L[i]
        if n > 1:
            nvl += red_t[i]
        if t == "peer" or (t in ("cpu", "nvme") and ctx.sliced):
            nvl += 2 * ly.param_bytes * (n - 1) / n / ctx.ring_rate
        if t in ("cpu", "nvme"):
            pcie += 2 * ly.param_bytes / (n if ctx.sliced else 1) / ctx.up_rate + d2h_t[i]
        if t == "nvme":
            nvme += 2 * ly.param_bytes / ctx.nvme_read
    bounds = {"compute": comp, "pipeline": micro_pipe, "nvlink": nvl, "pcie": pcie, "nvme": nvme}
    bound = max(bounds, key=lambda k: bounds[k])
    micro = bounds[bound]
    # optimizer
    tp = tier_params(ctx, tiers)
    gpu_states = (tp["gpu"] + tp["peer"]) / n if n > 1 else tp["gpu"]
    t_gopt = gpu_states * ctx.gpu_adam_bpp / ctx.hbm_bw + ctx.launch if gpu_states else 0.0
    t_agg = 0.0
    if n > 1 and tp["gpu"]:
        gbytes = sum(L[i].param_bytes for i, t in enumerate(tiers) if t == "gpu")
        t_agg = gbytes * (n - 1) / n / ctx.ring_rate + ctx.ring_lat * (n - 1)
    # host optimizer: layers in backward order as their gradients land; deadline = when the next forward
    # needs them (after the GPU optimizer, the gpu-tier all-gather and the forward of earlier layers)
    exposed = 0.0
    a_end = 0.0
    io_end = 0.0
    fwd_acc = 0.0
    deadline_base = end + grad_tail + t_gopt + t_agg
    f_before = []
    for i in idx:
        f_before.append(fwd_acc)
        fwd_acc += ctx.ctime(i, "fwd", c if fetched[i] else 1) * (c if fetched[i] else 1)
    for i in reversed(idx):
        t = tiers[i]
        if t not in ("cpu", "nvme"):
            continue
        ly = L[i]
        arrive = gd_end.get(i, end)
        work = ly.params / ctx.adam_rate
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
    opt = grad_tail + t_gopt + t_agg + max(0.0, exposed)
    accum = ctx.job.accumulation(n)
    return Estimate(accum * micro + opt, micro, opt, bound)
