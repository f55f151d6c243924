"""LazyTrain's cost model: a job, a tiering and the knobs become an :class:`~policies.lazytrain_milp.Instance`.

Everything here is per GPU and per micro-step, read from the hardware (roofline compute times as the
engine computes them, link bandwidths and routes from the topology) and the workload trace. The rules it
encodes (windows, fixed bytes, staging) are those of the executor in ``policies/lazytrain.py``; its
docstring states them in words.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from costs import compute_seconds
from costs import link_capacities as link_resources
from hardware_models import build_topology
from policies.base import Job
from policies.dataparallel import dtype_bytes
from policies.lazytrain_milp import Instance, Opt, Terms, Window

TIERS = ("gpu", "cpu", "nvme")
SAFETY_BYTES = 2.0**20        # taken off every capacity the MILP sees (rounding of binaries, float sums)
ADAM8_BLOCK = 2048            # elements per block of an 8-bit optimizer state (one fp32 scale each)


@dataclass(frozen=True)
class Tiering:
    """Where the fp16 parameters live (``gpu`` = resident, else streamed from ``cpu``/``nvme``) and where the
    fp32 master weights and Adam states live (``gpu`` = GPU Adam, else CPU Adam with states in DRAM or on
    NVMe)."""

    params: str
    optim: str

    @property
    def level(self) -> int:
        """1: everything on the GPU; 2: parameters resident, optimizer on the CPU; 3: parameters streamed."""
        if self.params == "gpu":
            return 1 if self.optim == "gpu" else 2
        return 3

    def __str__(self) -> str:
        return f"params={self.params},optimizer={self.optim}"


def tierings(job: Job, param_home: str, optimizer_home: str) -> list[Tiering]:
    """Every valid tiering the hardware and the knobs allow."""
    topo = build_topology(job.hw)
    unified = topo.pool_of["gpu0"] == topo.pool_of["cpu"]
    out = []
    for p in TIERS:
        for o in TIERS:
            t = Tiering(p, o)
            if p != "gpu" and o == "gpu":
                continue  # streamed parameters with a GPU optimizer is not an executor we model
            if "nvme" in (p, o) and "nvme" not in topo.locations:
                continue
            if unified and "cpu" in (p, o):
                continue  # the CPU tier is the GPU's own pool there: moving to it frees nothing
            if param_home not in ("auto", p) or optimizer_home not in ("auto", o):
                continue
            out.append(t)
    return out


class Links:
    """Per-GPU transfer costs when every GPU moves the same bytes at the same time (data parallelism)."""

    def __init__(self, job: Job):
        self.topo = build_topology(job.hw)
        self.caps = link_resources(self.topo)
        self.gpus = list(self.topo.gpu_locations())
        self._unit: dict[tuple[str, str], dict[str, float]] = {}

    def _resources(self, src: str, dst: str) -> list[str]:
        out = []
        for h in self.topo.route(src, dst):
            ln = self.topo.links[h.link]
            out.append(f"{h.link}:{'fwd' if h.forward else 'rev'}")
            if ln.duplex_bw is not None:
                out.append(f"{h.link}:duplex")
        return out

    def unit(self, src: str, dst: str) -> dict[str, float]:
        """Seconds per byte moved by each GPU, per resource, from ``src`` to ``dst`` ("gpu" = each GPU)."""
        key = (src, dst)
        if key not in self._unit:
            load: dict[str, float] = defaultdict(float)
            for g in self.gpus:
                for r in self._resources(g if src == "gpu" else src, g if dst == "gpu" else dst):
                    load[r] += 1.0
            self._unit[key] = {r: n / self.caps[r] for r, n in load.items()}
        return self._unit[key]

    def latency(self, src: str, dst: str) -> float:
        g = self.gpus[0]
        return self.topo.route_latency(g if src == "gpu" else src, g if dst == "gpu" else dst)

    def copy(self, src: str, dst: str, nbytes: float) -> dict[str, float]:
        """Seconds each resource needs for every GPU's copy of ``nbytes`` (latency added to each)."""
        if nbytes <= 0:
            return {}
        lat = self.latency(src, dst)
        return {r: nbytes * s + lat for r, s in self.unit(src, dst).items()}

    def copy_time(self, src: str, dst: str, nbytes: float) -> float:
        return max(self.copy(src, dst, nbytes).values(), default=0.0)

    def ring(self, nbytes: float, coll: str) -> dict[str, float]:
        """Seconds per resource of a ring collective of ``nbytes`` over all GPUs (as the engine runs it)."""
        n = len(self.gpus)
        if n <= 1 or nbytes <= 0:
            return {}
        per_rank = nbytes * (n - 1) / n * (2.0 if coll == "all_reduce" else 1.0)
        steps = (n - 1) * (2 if coll == "all_reduce" else 1)
        load: dict[str, float] = defaultdict(float)
        lat = 0.0
        for i, g in enumerate(self.gpus):
            nxt = self.gpus[(i + 1) % n]
            for r in self._resources(g, nxt):
                load[r] += per_rank
            lat = max(lat, self.topo.route_latency(g, nxt))
        return {r: b / self.caps[r] + lat * steps for r, b in load.items()}


def _add(dst: dict[str, float], src: dict[str, float]) -> None:
    for r, s in src.items():
        dst[r] = dst.get(r, 0.0) + s


@dataclass(frozen=True)
class Costs:
    """The instance plus what the executor and the step-time estimate need to know about the job."""

    tiering: Tiering
    instance: Instance
    n: int
    db: int
    unit_params: tuple[float, ...]   # parameters streamed (and gradients reduced) with layer i
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    act_bytes: tuple[dict[str, float], ...]   # per layer: mode -> saved bytes
    master_bpp: float
    optim_bpp: float
    optimizer_s: float               # estimated optimizer phase per step
    fixed_gpu_parts: dict[str, float]

    @property
    def compute_s(self) -> float:
        return sum(self.fwd_s) + sum(self.bwd_s)

    def lower_bound_s(self, accumulation: int) -> float:
        return accumulation * self.compute_s + self.optimizer_s

    def estimate_s(self, accumulation: int, pure_objective: float) -> float:
        return accumulation * (self.compute_s + pure_objective) + self.optimizer_s


def optim_bytes_per_param(optimizer_8bit: bool) -> float:
    """Adam m and v: fp32 (8 B/param) or 8-bit with one fp32 scale per block of ADAM8_BLOCK (2 + 8/2048)."""
    return 2.0 + 2 * 4.0 / ADAM8_BLOCK if optimizer_8bit else 8.0


def build_costs(job: Job, tiering: Tiering, *, prefetch_depth: int = 1, optimizer_8bit: bool = False,
                cpu_grad_bytes: float = 4.0, places: Sequence[str] | None = None,
                capacity: Callable[[str, float], float] | None = None) -> Costs:
    """The LazyTrain instance of ``job`` under ``tiering``.

    ``places`` restricts the activation tiers offered (default: every tier the hardware has, the CPU only
    where it is a pool of its own); ``capacity(pool, usable_bytes)`` lets a caller (a test) change what the
    MILP may use of a pool.
    """
    hw = job.hw
    links = Links(job)
    topo = links.topo
    n = hw.gpu.count
    layers = job.trace.layers
    nl = len(layers)
    db = dtype_bytes(job)
    prec = job.config.precision
    launch = hw.gpu.launch_overhead_s
    depth = prefetch_depth
    gpool = topo.pool_of["gpu0"]
    unified = gpool == topo.pool_of["cpu"]
    master_bpp = 4.0 if any(layer.master_bytes for layer in layers) else 0.0
    optim_bpp = optim_bytes_per_param(optimizer_8bit)
    level = tiering.level
    p_total = float(sum(layer.params for layer in layers))

    def secs(flops: float, hbm: float) -> float:
        return compute_seconds(hw, flops, hbm, prec) + launch

    fwd = tuple(secs(layer.fwd_flops, layer.fwd_hbm_bytes) for layer in layers)
    bwd = tuple(secs(layer.bwd_flops, layer.bwd_hbm_bytes) for layer in layers)
    unit = [float(layer.params) for layer in layers]
    if job.model.tied_embeddings and nl > 1:
        unit[-1] += layers[0].params  # the head's matmul reads (and its backward writes) the embedding table
    unit_t = tuple(unit)
    max_unit_b = max(unit) * db

    # -- options per layer -------------------------------------------------------------------------
    offer = [p for p in (places or TIERS) if p == "gpu" or (p == "cpu" and not unified)
             or (p == "nvme" and "nvme" in topo.locations)]
    if "gpu" not in offer:
        offer.insert(0, "gpu")
    options, rcs, trs, trans, staged = [], [], [], [], []
    pool_rows: dict[str, list[list[float]]] = defaultdict(lambda: [[] for _ in range(nl)])
    pools = list(dict.fromkeys(topo.pool_of[loc] for loc in topo.locations if loc in ("gpu0", "cpu", "nvme")))
    act_bytes = []
    out_terms: list[dict[str, Terms]] = []   # per layer: resource -> terms of its copy out
    in_terms: list[dict[str, Terms]] = []
    serial: list[Terms] = []
    rc_terms: list[Terms] = []
    for i, layer in enumerate(layers):
        full = float(layer.activation_bytes_nockpt)
        two_largest = float(layer.peak_transient_bytes - (layer.activation_bytes_nockpt - layer.activation_bytes))
        modes = {"keep": (full, two_largest if layer.kind == "block" else float(layer.peak_transient_bytes), 0.0)}
        if layer.kind == "block" and layer.fwd_flops > 0:
            ck = float(layer.activation_bytes if job.config.checkpointing == "full" else layers[i - 1].output_bytes)
            if ck < full:
                modes["ckpt"] = (ck, full - ck + two_largest, secs(layer.fwd_flops, layer.fwd_hbm_bytes))
        act_bytes.append({m: v[0] for m, v in modes.items()})
        opts, rc_row, tr_row, trans_row, st_row = [], [], [], [], []
        o_terms: dict[str, list] = defaultdict(list)
        i_terms: dict[str, list] = defaultdict(list)
        s_terms, r_terms = [], []
        for mode, (nbytes, transient, rc) in modes.items():
            for place in offer:
                if place != "gpu" and nbytes <= 0:
                    continue
                k = len(opts)
                opts.append(Opt(mode, place))
                rc_row.append(rc)
                trans_row.append(transient)
                st_row.append(nbytes if place != "gpu" else 0.0)
                for pk in pools:
                    pool_rows[pk][i].append(0.0)
                if place == "gpu":
                    pool_rows[gpool][i][k] += nbytes
                    tr_row.append(0.0)
                else:
                    pool_rows[topo.pool_of[place]][i][k] += n * nbytes
                    out_c = links.copy("gpu", place, nbytes)
                    in_c = links.copy(place, "gpu", nbytes)
                    for r, s in out_c.items():
                        o_terms[r].append((i, k, s))
                    for r, s in in_c.items():
                        i_terms[r].append((i, k, s))
                    both = max(out_c.values()) + max(in_c.values())
                    s_terms.append((i, k, both))
                    tr_row.append(both)
                if rc > 0:
                    r_terms.append((i, k, rc))
        options.append(tuple(opts))
        rcs.append(tuple(rc_row))
        trs.append(tuple(tr_row))
        trans.append(tuple(trans_row))
        staged.append(tuple(st_row))
        out_terms.append({r: tuple(v) for r, v in o_terms.items()})
        in_terms.append({r: tuple(v) for r, v in i_terms.items()})
        serial.append(tuple(s_terms))
        rc_terms.append(tuple(r_terms))

    # -- fixed transfers of the executor -----------------------------------------------------------
    streamed = level == 3
    tail_from = nl - 1 - depth  # layers >= tail_from keep their parameters from forward to backward

    def upload(j: int) -> dict[str, float]:
        if not streamed:
            return {}
        per_gpu = unit[j] * db / n
        out = dict(links.copy(tiering.params, "gpu", per_gpu))
        _add(out, links.ring(unit[j] * db, "all_gather"))
        return out

    def grads(j: int) -> dict[str, float]:
        if level == 1:
            return links.ring(layers[j].params * db, "all_reduce")
        out = dict(links.ring(unit[j] * db, "reduce_scatter"))
        _add(out, links.copy("gpu", "cpu", unit[j] * db / n))
        return out

    windows = [Window("start", 0.0, (), upload(0))]
    for i in range(nl):
        const = upload(i + 1) if i + 1 < nl else {}
        var = out_terms[i - 1] if i >= 1 else {}
        windows.append(Window(f"fwd{i}", fwd[i], (), const, var))
    windows.append(Window("turn", 0.0, (), {}, {"serial": serial[nl - 1]} if serial[nl - 1] else {}))
    for i in reversed(range(nl)):
        const: dict[str, float] = {}
        if i >= 1 and i - 1 < tail_from:
            _add(const, upload(i - 1))
        if i + 1 < nl:
            _add(const, grads(i + 1))
        var = in_terms[i - 1] if i >= 1 else {}
        windows.append(Window(f"bwd{i}", bwd[i], rc_terms[i], const, var))
    windows.append(Window("end", 0.0, (), grads(0)))

    # -- fixed bytes per pool ----------------------------------------------------------------------
    fixed: dict[str, float] = defaultdict(float)
    parts: dict[str, float] = {}
    if level == 1:
        parts = {"param16": p_total * db, "grad": p_total * db, "param32": p_total * master_bpp,
                 "optim": p_total * optim_bpp}
    elif level == 2:
        parts = {"param16": p_total * db, "grad buckets": 2 * max_unit_b}
    else:
        window = (depth + 1) * max_unit_b * (1 + (1 / n if n > 1 else 0.0))
        parts = {"param16 window": window, "grad buckets": 2 * max_unit_b}
    fixed[gpool] += sum(parts.values())
    if level >= 2:
        cpool = topo.pool_of["cpu"]
        fixed[cpool] += cpu_grad_bytes * p_total
        states = p_total * (master_bpp + optim_bpp)
        if tiering.optim == "cpu":
            fixed[cpool] += states
        else:
            fixed[topo.pool_of["nvme"]] += states
            fixed[cpool] += 2 * max(layer.params for layer in layers) * (master_bpp + optim_bpp)
        if level == 3:
            fixed[topo.pool_of[tiering.params]] += p_total * db

    def usable(pk: str) -> float:
        cap = topo.pools[pk].capacity_bytes
        cap = capacity(pk, cap) if capacity is not None else cap
        return cap - SAFETY_BYTES

    inst = Instance(
        options=tuple(options), recompute_s=tuple(rcs), transfer_s=tuple(trs), transient=tuple(trans),
        staged=tuple(staged),
        pool_bytes={k: tuple(tuple(r) for r in rows) for k, rows in pool_rows.items()},
        fixed_bytes=dict(fixed), capacity={k: usable(k) for k in pools}, peak_pool=gpool,
        windows=tuple(windows))
    return Costs(tiering, inst, n, db, unit_t, fwd, bwd, tuple(act_bytes), master_bpp, optim_bpp,
                 _optimizer_seconds(job, links, tiering, p_total, db, master_bpp, optim_bpp, nl), parts)


def _optimizer_seconds(job: Job, links: Links, tiering: Tiering, p: float, db: int, master_bpp: float,
                       optim_bpp: float, nl: int) -> float:
    """Estimated optimizer phase of one step (the chunks pipeline, so the slowest resource dominates)."""
    hw = job.hw
    if tiering.level == 1:
        return p * hw.gpu.optimizer_bytes_per_param / hw.gpu.hbm_bw + hw.gpu.launch_overhead_s
    adam = p / hw.host.optimizer_params_per_s
    parts = [adam]
    if "nvme" in (tiering.optim, tiering.params):
        io = links.topo.links["nvme.io"]
        rd = p * (master_bpp + optim_bpp) if tiering.optim == "nvme" else 0.0
        wr = rd + (p * db if tiering.params == "nvme" else 0.0)
        parts.append(rd / io.bw_rev + wr / io.bw_fwd)
    if tiering.level == 2:
        up = dict(links.copy("cpu", "gpu", p * db / len(links.gpus)))
        _add(up, links.ring(p * db, "all_gather"))
        parts.append(max(up.values(), default=0.0))
    return max(parts) + adam / nl
