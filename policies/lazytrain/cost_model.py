"""LazyTrain's tierings and cost model: a job, a tiering and the knobs become an :class:`~.milp.Instance`.

Per GPU and per micro-step; every GPU moves the same bytes at once (data parallelism), so a link resource
carries the sum of the GPUs' routes over it. The rules are the executor's (``emit.py``, the package docstring).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import costs
from hardware_models import build_topology
from policies.base import Job
from policies.kit import dtype_bytes
from policies.lazytrain.milp import Instance, Opt, Window

TIERS = ("gpu", "cpu", "nvme")
SAFETY_BYTES = 2.0**20        # taken off every capacity the MILP sees (rounding of binaries, float sums)
ADAM8_BLOCK = 2048            # elements per block of an 8-bit optimizer state (one fp32 scale each)
#: gradient buckets on the GPU at a time (levels 2, 3): a backward waits for the copy-down of the bucket this
#: many before it in backward order (``kit.bucket_gate``)
GRAD_BUCKETS = 2
#: layers of optimizer states staged in DRAM when they live on NVMe: the read of layer i waits for the
#: write-back of layer i - OPTIMIZER_STAGES (``kit.read_ahead``)
OPTIMIZER_STAGES = 2

Terms = list[tuple[int, int, float]]


@dataclass(frozen=True)
class Tiering:
    """Where the fp16 parameters live (``gpu`` = resident, else streamed from ``cpu``/``nvme``) and the fp32
    master weights and Adam states (``gpu`` = GPU Adam, else CPU Adam with states in DRAM or on NVMe)."""

    params: str
    optim: str

    @property
    def level(self) -> int:
        """1: everything on the GPU; 2: parameters resident, optimizer on the CPU; 3: parameters streamed."""
        return (1 if self.optim == "gpu" else 2) if self.params == "gpu" else 3

    @property
    def streamed(self) -> bool:
        return self.level == 3

    @property
    def uses_nvme(self) -> bool:
        """The CPU optimizer reads or writes NVMe: its states live there, or the streamed parameters do."""
        return self.level >= 2 and "nvme" in (self.optim, self.params if self.streamed else "")

    def __str__(self) -> str:
        return f"params={self.params},optimizer={self.optim}"


def tierings(job: Job, param_home: str, optimizer_home: str) -> list[Tiering]:
    """Every tiering the hardware and the knobs allow: streamed parameters need a CPU optimizer, NVMe needs drives,
    and on a unified machine the CPU tier is the GPU's own pool (moving to it frees nothing)."""
    topo = build_topology(job.hw)
    unified = topo.pool_of["gpu0"] == topo.pool_of["cpu"]
    return [t for t in (Tiering(p, o) for p in TIERS for o in TIERS)
            if (t.params == "gpu" or t.optim != "gpu") and not (unified and "cpu" in (t.params, t.optim))
            and ("nvme" in topo.locations or "nvme" not in (t.params, t.optim))
            and param_home in ("auto", t.params) and optimizer_home in ("auto", t.optim)]


@dataclass(frozen=True)
class Costs:
    """The instance plus what the executor and the step-time estimate need to know about the job."""

    tiering: Tiering
    fixed_bytes: dict[str, float]    # the instance's, known before it is built
    capacity: dict[str, float]
    n: int
    db: int
    unit_params: tuple[float, ...]   # parameters streamed (and gradients reduced) with layer i
    compute_s: float                 # forward + backward of one micro-step
    act_bytes: tuple[dict[str, float], ...]   # per layer: mode -> saved bytes
    master_bpp: float
    optim_bpp: float
    optimizer_s: float               # estimated optimizer phase per step
    fixed_gpu_parts: dict[str, float]

    build: Callable[[], Instance] = field(default=lambda: _no_instance(), compare=False, repr=False)

    @cached_property
    def instance(self) -> Instance:
        """Built on first use: most tierings are ruled out by their fixed bytes or lower bound before it."""
        return self.build()

    def estimate_s(self, accumulation: int, pure_objective: float = 0.0) -> float:
        """Micro-steps x (compute + recompute + exposed) + optimizer phase; without an objective a lower bound."""
        return accumulation * (self.compute_s + pure_objective) + self.optimizer_s


def add_into(dst: dict[str, float], src: dict[str, float]) -> None:
    for r, s in src.items():
        dst[r] = dst.get(r, 0.0) + s


@dataclass
class _LayerRows:
    """One layer's options and their coefficients in the instance."""

    opts: list[Opt] = field(default_factory=list)
    recompute: list[float] = field(default_factory=list)
    transfer: list[float] = field(default_factory=list)     # copy out + copy back (tie-break)
    transient: list[float] = field(default_factory=list)
    staged: list[float] = field(default_factory=list)
    pool: dict[str, list[float]] = field(default_factory=dict)
    out_terms: dict[str, Terms] = field(default_factory=lambda: defaultdict(list))
    in_terms: dict[str, Terms] = field(default_factory=lambda: defaultdict(list))
    serial: Terms = field(default_factory=list)
    rc_terms: Terms = field(default_factory=list)


class _Model:
    """The shared facts of one job under one tiering, its link prices and the parts of its instance."""

    def __init__(self, job: Job, tiering: Tiering, prefetch_depth: int, optimizer_8bit: bool):
        self.job, self.tiering, self.depth = job, tiering, prefetch_depth
        self.topo = build_topology(job.hw)
        self.caps = costs.link_capacities(self.topo)
        self.routes = costs.RouteTable(self.topo)
        self.gpus = list(self.topo.gpu_locations())
        self._unit: dict[tuple[str, str], dict[str, float]] = {}
        self._rings: dict[tuple[float, str], dict[str, float]] = {}  # a ring over every GPU, once per size and kind
        self.n = job.hw.gpu.count
        self.layers = job.trace.layers
        self.nl = len(self.layers)
        self.db = dtype_bytes(job)
        self.gpool = self.topo.pool_of["gpu0"]
        self.unified = self.gpool == self.topo.pool_of["cpu"]
        self.master_bpp = 4.0 if any(layer.master_bytes for layer in self.layers) else 0.0
        # Adam m and v: fp32, or 8-bit with one fp32 scale per block of ADAM8_BLOCK elements
        self.optim_bpp = 2.0 + 2 * 4.0 / ADAM8_BLOCK if optimizer_8bit else 8.0
        self.p_total = float(sum(layer.params for layer in self.layers))
        self.pools = list(dict.fromkeys(self.topo.pool_of[loc] for loc in self.topo.locations
                                        if loc in ("gpu0", "cpu", "nvme")))
        self.pricer = costs.ComputePricer(job.hw, job.config.precision, (job.model, job.config))
        self.fwd = tuple(self.secs(ly.fwd_flops, ly.fwd_hbm_bytes, i, "fwd") for i, ly in enumerate(self.layers))
        self.bwd = tuple(self.secs(ly.bwd_flops, ly.bwd_hbm_bytes, i, "bwd") for i, ly in enumerate(self.layers))
        unit = [float(layer.params) for layer in self.layers]
        if job.model.tied_embeddings and self.nl > 1:
            unit[-1] += self.layers[0].params  # the head's matmul reads (and its backward writes) the embedding
        self.unit = tuple(unit)

    def secs(self, flops: float, hbm: float, layer: int, phase: str) -> float:
        """What the engine charges the task of layer ``layer``'s ``phase`` (``costs.ComputePricer``)."""
        return self.pricer.seconds(flops, hbm, layer, phase)

    def _ends(self, src: str, dst: str, g: str) -> tuple[str, str]:
        return g if src == "gpu" else src, g if dst == "gpu" else dst

    def _unit_seconds(self, src: str, dst: str) -> dict[str, float]:
        """Seconds per byte on each resource of every GPU's copy from ``src`` to ``dst`` at once."""
        got = self._unit.get((src, dst))
        if got is None:
            load = costs.resource_load(self.topo, [(*self._ends(src, dst, g), 1.0) for g in self.gpus])
            got = self._unit[(src, dst)] = costs.busy_seconds(load, self.caps)
        return got

    def _ring_seconds(self, nbytes: float, coll: str) -> dict[str, float]:
        """Seconds on each resource of a ring over every GPU (identical layers ask for the same ring: once)."""
        got = self._rings.get((nbytes, coll))
        if got is None:
            ring = costs.ring(self.routes, self.gpus, nbytes, coll)
            got = self._rings[(nbytes, coll)] = {r: b / self.caps[r] + ring.latency_s
                                                 for r, b in ring.resource_bytes().items()}
        return got

    @cached_property
    def _copy_pairs(self) -> list[tuple[str, str]]:
        """The copies the model prices: between the GPUs and each host tier the machine has."""
        places = [p for p in TIERS[1:] if p in self.topo.locations]
        return [pair for place in places for pair in (("gpu", place), (place, "gpu"))]

    def _ring_keys(self) -> list[tuple[float, str]]:
        """Every ring the model prices (``upload``, ``grads``, ``optimizer_seconds``), as ``ring``'s keys."""
        if len(self.gpus) <= 1:
            return []
        level, db = self.tiering.level, self.db
        keys = [(self.unit[j] * db, "all_gather") for j in range(self.nl)] if self.tiering.streamed else []
        keys += [(self.layers[j].params * db, "all_reduce") if level == 1 else (self.unit[j] * db, "reduce_scatter")
                 for j in range(self.nl)]
        keys += [(self.p_total * db, "all_gather")] if level == 2 else []
        return [k for k in keys if k[0] > 0]

    @cached_property
    def _kept(self) -> frozenset[str]:
        """One resource of each class whose members carry bitwise the same seconds in every copy and ring the model
        prices (the n data-parallel GPUs' own links, each switch's uplinks): every window then loads the members
        alike (the same values added in the same order), and the MILP keeps each distinct load once
        (``Window.distinct_loads``), so the other members only cost time (16,000 resources at 1024 GPUs)."""
        sources = [self._unit_seconds(*pair) for pair in self._copy_pairs]
        sources += [self._ring_seconds(*key) for key in dict.fromkeys(self._ring_keys())]
        classes: dict[tuple, str] = {}
        for r in dict.fromkeys(r for src in sources for r in src):
            classes.setdefault(tuple(src.get(r) for src in sources), r)
        return frozenset(classes.values())

    def copy(self, src: str, dst: str, nbytes: float) -> dict[str, float]:
        """Seconds per resource of every GPU's copy of ``nbytes`` ("gpu" = each GPU itself; latency added): one
        resource of each class of resources loaded alike (``_kept``)."""
        if nbytes <= 0:
            return {}
        if (src, dst) not in self._copy_pairs:
            raise ValueError(f"lazytrain cost model: a copy {src} -> {dst} is not among the classes' copies")
        lat = self.routes(*self._ends(src, dst, self.gpus[0])).latency_s
        kept = self._kept
        return {r: nbytes * s + lat for r, s in self._unit_seconds(src, dst).items() if r in kept}

    def ring(self, nbytes: float, coll: str) -> dict[str, float]:
        if len(self.gpus) <= 1 or nbytes <= 0:
            return {}
        if (nbytes, coll) not in self._rings_kept:
            raise ValueError(f"lazytrain cost model: a {coll} of {nbytes} bytes is not among the classes' rings")
        return dict(self._rings_kept[(nbytes, coll)])

    @cached_property
    def _rings_kept(self) -> dict[tuple[float, str], dict[str, float]]:
        kept = self._kept
        return {key: {r: v for r, v in self._ring_seconds(*key).items() if r in kept} for key in self._ring_keys()}

    def modes(self, i: int) -> dict[str, tuple[float, float, float]]:
        """Mode -> (saved bytes, transient bytes, recompute seconds): keep for every layer, ckpt for blocks."""
        layer = self.layers[i]
        full = float(layer.activation_bytes_nockpt)
        two_largest = float(layer.peak_transient_bytes - (layer.activation_bytes_nockpt - layer.activation_bytes))
        modes = {"keep": (full, two_largest if layer.kind == "block" else float(layer.peak_transient_bytes), 0.0)}
        if layer.kind == "block" and layer.fwd_flops > 0:
            ckpt_full = self.job.config.checkpointing == "full"
            ck = float(layer.activation_bytes if ckpt_full else self.layers[i - 1].output_bytes)
            if ck < full:
                rc = self.secs(layer.fwd_flops, layer.fwd_hbm_bytes, i, "recompute")
                modes["ckpt"] = (ck, full - ck + two_largest, rc)
        return modes

    def layer_rows(self, i: int, modes: dict[str, tuple[float, float, float]]) -> _LayerRows:
        """The GPU always, the CPU where it is a pool of its own, NVMe if any; each with every mode."""
        offer = [p for p in TIERS if p == "gpu" or (p == "cpu" and not self.unified)
                 or (p == "nvme" and "nvme" in self.topo.locations)]
        row = _LayerRows(pool={pk: [] for pk in self.pools})
        for mode, (nbytes, transient, rc) in modes.items():
            for place in (p for p in offer if p == "gpu" or nbytes > 0):
                k, both, off = len(row.opts), 0.0, place != "gpu"
                if off:
                    out_c, in_c = self.copy("gpu", place, nbytes), self.copy(place, "gpu", nbytes)
                    for terms, c in ((row.out_terms, out_c), (row.in_terms, in_c)):
                        for r, s in c.items():
                            terms[r].append((i, k, s))
                    both = max(out_c.values()) + max(in_c.values())
                    row.serial.append((i, k, both))
                if rc > 0:
                    row.rc_terms.append((i, k, rc))
                target = self.topo.pool_of[place] if off else self.gpool
                for pk in self.pools:
                    row.pool[pk].append((self.n * nbytes if off else nbytes) if pk == target else 0.0)
                row.opts.append(Opt(mode, place))
                row.recompute.append(rc)
                row.transfer.append(both)
                row.transient.append(transient)
                row.staged.append(nbytes if off else 0.0)
        return row

    def upload(self, j: int) -> dict[str, float]:
        """Layer j's parameters to every GPU (a slice each, then the all-gather), where they are streamed."""
        if not self.tiering.streamed:
            return {}
        unit_b = self.unit[j] * self.db
        out = dict(self.copy(self.tiering.params, "gpu", unit_b / self.n))
        add_into(out, self.ring(unit_b, "all_gather"))
        return out

    def grads(self, j: int) -> dict[str, float]:
        """Layer j's gradients: all-reduced (level 1), or reduce-scattered and copied to the CPU."""
        if self.tiering.level == 1:
            return self.ring(self.layers[j].params * self.db, "all_reduce")
        out = dict(self.ring(self.unit[j] * self.db, "reduce_scatter"))
        add_into(out, self.copy("gpu", "cpu", self.unit[j] * self.db / self.n))
        return out

    def windows(self, rows: list[_LayerRows]) -> tuple[Window, ...]:
        """start, fwd 0..L-1, turn, bwd L-1..0, end: what each window's compute may hide."""
        nl = self.nl
        tail_from = nl - 1 - self.depth  # layers >= tail_from keep their parameters from forward to backward
        out = [Window("start", 0.0, (), self.upload(0))]
        for i in range(nl):
            ahead = self.upload(i + 1) if i + 1 < nl else {}
            out.append(Window(f"fwd{i}", self.fwd[i], (), ahead, _terms(rows[i - 1].out_terms) if i >= 1 else {}))
        last = rows[nl - 1].serial
        out.append(Window("turn", 0.0, (), {}, {"serial": tuple(last)} if last else {}))
        for i in reversed(range(nl)):
            const: dict[str, float] = {}
            if i >= 1 and i - 1 < tail_from:
                add_into(const, self.upload(i - 1))
            if i + 1 < nl:
                add_into(const, self.grads(i + 1))
            var = _terms(rows[i - 1].in_terms) if i >= 1 else {}
            out.append(Window(f"bwd{i}", self.bwd[i], tuple(rows[i].rc_terms), const, var))
        out.append(Window("end", 0.0, (), self.grads(0)))
        return tuple(out)

    def gpu_parts(self) -> dict[str, float]:
        """What the GPU holds whatever the activations: model states (1), parameters (2) or their window (3)."""
        p, db, max_unit_b = self.p_total, self.db, max(self.unit) * self.db
        level = self.tiering.level
        if level == 1:
            return {"param16": p * db, "grad": p * db, "param32": p * self.master_bpp, "optim": p * self.optim_bpp}
        if level == 2:
            return {"param16": p * db, "grad buckets": GRAD_BUCKETS * max_unit_b}
        window = (self.depth + 1) * max_unit_b * (1 + (1 / self.n if self.n > 1 else 0.0))
        return {"param16 window": window, "grad buckets": GRAD_BUCKETS * max_unit_b}

    def fixed_bytes(self, parts: dict[str, float], cpu_grad_bytes: float) -> dict[str, float]:
        """Bytes per pool that every schedule needs: the GPU's parts, CPU gradients, states, parameter home."""
        fixed: dict[str, float] = defaultdict(float)
        fixed[self.gpool] += sum(parts.values())
        t, pool_of = self.tiering, self.topo.pool_of
        if t.level >= 2:
            cpool = pool_of["cpu"]
            fixed[cpool] += cpu_grad_bytes * self.p_total
            states_bpp = self.master_bpp + self.optim_bpp
            if t.optim == "cpu":
                fixed[cpool] += self.p_total * states_bpp
            else:
                fixed[pool_of["nvme"]] += self.p_total * states_bpp
                fixed[cpool] += OPTIMIZER_STAGES * max(layer.params for layer in self.layers) * states_bpp
            if t.streamed:
                fixed[pool_of[t.params]] += self.p_total * self.db
        return dict(fixed)

    def optimizer_seconds(self) -> float:
        """Estimated optimizer phase of one step (the chunks pipeline, so the slowest resource dominates)."""
        hw, t, p, db = self.job.hw, self.tiering, self.p_total, self.db
        if t.level == 1:
            return costs.gpu_optimizer_seconds(hw, p)
        adam = costs.cpu_adam_seconds(hw, p)
        parts = [adam]
        if "nvme" in (t.optim, t.params):
            io = self.topo.links["nvme.io"]
            rd = p * (self.master_bpp + self.optim_bpp) if t.optim == "nvme" else 0.0
            wr = rd + (p * db if t.params == "nvme" else 0.0)
            parts.append(rd / io.bw_rev + wr / io.bw_fwd)
        if t.level == 2:
            up = dict(self.copy("cpu", "gpu", p * db / len(self.gpus)))
            add_into(up, self.ring(p * db, "all_gather"))
            parts.append(max(up.values(), default=0.0))
        return max(parts) + adam / self.nl


def _terms(by_resource: dict[str, Terms]) -> dict[str, tuple[tuple[int, int, float], ...]]:
    return {r: tuple(v) for r, v in by_resource.items()}


def build_costs(job: Job, tiering: Tiering, *, prefetch_depth: int = 1, optimizer_8bit: bool = False,
                cpu_grad_bytes: float = 4.0, capacity: Callable[[str, float], float] | None = None) -> Costs:
    """The LazyTrain instance of ``job`` under ``tiering``; ``capacity(pool, usable_bytes)`` lets a caller (a test)
    change what the MILP may use of a pool."""
    m = _Model(job, tiering, prefetch_depth, optimizer_8bit)
    modes = [m.modes(i) for i in range(m.nl)]
    parts = m.gpu_parts()

    def usable(pk: str) -> float:
        cap = m.topo.pools[pk].capacity_bytes
        return (capacity(pk, cap) if capacity is not None else cap) - SAFETY_BYTES

    fixed, usable_bytes = m.fixed_bytes(parts, cpu_grad_bytes), {k: usable(k) for k in m.pools}

    def build() -> Instance:
        rows = [m.layer_rows(i, modes[i]) for i in range(m.nl)]
        return Instance(
            options=tuple(tuple(r.opts) for r in rows), recompute_s=tuple(tuple(r.recompute) for r in rows),
            transfer_s=tuple(tuple(r.transfer) for r in rows), transient=tuple(tuple(r.transient) for r in rows),
            staged=tuple(tuple(r.staged) for r in rows),
            pool_bytes={pk: tuple(tuple(r.pool[pk]) for r in rows) for pk in m.pools},
            fixed_bytes=fixed, capacity=usable_bytes, peak_pool=m.gpool, windows=m.windows(rows))

    act_bytes = tuple({mode: v[0] for mode, v in md.items()} for md in modes)
    return Costs(tiering, fixed, usable_bytes, m.n, m.db, m.unit, sum(m.fwd) + sum(m.bwd), act_bytes, m.master_bpp,
                 m.optim_bpp, m.optimizer_seconds(), parts, build)


def _no_instance() -> Instance:
    raise ValueError("Costs without an instance builder")
