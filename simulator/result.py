"""The Result of a simulation: typed, with ``to_dict()`` (the JSON the CLI prints)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hardware_models import HardwareSpec, Topology
from simulator.engine import RawRun, TaskRecord
from simulator.phase import COMPUTE_PHASES
from simulator.plan import Plan
from simulator.symmetry import ExpandedRecords

TRANSFER_OPS = ("copy", "collective")


@dataclass(frozen=True)
class Oom:
    pool: str
    time_s: float
    task: str
    tensor: str
    requested_bytes: float
    free_bytes: float
    capacity_bytes: float
    total_demand_bytes: float

    @property
    def over_by_bytes(self) -> float:
        return self.total_demand_bytes - self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "time_s": self.time_s, "task": self.task, "tensor": self.tensor,
                "requested_bytes": self.requested_bytes, "free_bytes": self.free_bytes,
                "capacity_bytes": self.capacity_bytes, "total_demand_bytes": self.total_demand_bytes,
                "over_by_bytes": self.over_by_bytes}


@dataclass(frozen=True)
class SimInfo:
    events: int
    wall_s: float
    method: str  # "full" or "extrapolated: ..."
    simulated_tasks: int
    reduction: str = ""  # symmetric ranks simulated once ("8 ranks simulated as 1 class of 8"), else ""

    def to_dict(self) -> dict[str, Any]:
        return {"events": self.events, "wall_s": self.wall_s, "method": self.method,
                "simulated_tasks": self.simulated_tasks, "reduction": self.reduction}


@dataclass(frozen=True)
class Result:
    feasible: bool
    policy: str
    knobs: Mapping[str, Any]
    hardware: str
    model: Mapping[str, Any]
    workload: Mapping[str, Any]
    n_gpus: int
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float                    # model FLOPs (no recompute) per second per GPU, in TFLOP/s
    mfu: float                               # model FLOPs utilisation: tflops_per_gpu / peak
    hw_tflops_per_gpu: float                 # hardware FLOPs (checkpointing recompute included), TFLOP/s
    hfu: float                               # hardware FLOPs utilisation: hw_tflops_per_gpu / peak
    peak_bytes: Mapping[str, float]
    capacity_bytes: Mapping[str, float]
    reserved_bytes: Mapping[str, Mapping[str, float]]
    peak_by_kind: Mapping[str, Mapping[str, float]]
    link_bytes: Mapping[str, float]          # bytes moved per link in the measured step
    link_busy_s: Mapping[str, float]         # time with at least one flow on the link, measured step
    stream_busy_s: Mapping[str, float]       # measured step
    compute_busy_s: float                    # busiest GPU's compute time in the measured step
    exposed_transfer_s: float                # worst GPU: transfer time not hidden behind its compute
    oom: Oom | None
    ooms: tuple[Oom, ...]
    sim: SimInfo
    notes: tuple[str, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)
    records: Sequence[TaskRecord] = ()       # timeline of the simulated run, every rank's (traces, reports)
    memory_series: Mapping[str, tuple[tuple[float, str, float], ...]] = field(default_factory=dict)
    link_rate_log: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    window: tuple[float, float] = (0.0, 0.0)  # the measured step in simulated time
    leaked: tuple[str, ...] = ()             # non-persistent tensors still allocated at the end
    min_used_bytes: Mapping[str, float] = field(default_factory=dict)
    simulated_plan: Plan | None = None       # the plan actually simulated (fewer repeats if extrapolated)
    warmup_repeat: int | None = None         # repeat cap of the warm-up steps in that simulation
    topology: Topology | None = None
    measured_step: int = 0                   # index of the measured step in the simulated plan

    def to_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "policy": self.policy,
            "knobs": dict(self.knobs),
            "hardware": self.hardware,
            "model": dict(self.model),
            "workload": dict(self.workload),
            "n_gpus": self.n_gpus,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "hw_tflops_per_gpu": self.hw_tflops_per_gpu,
            "hfu": self.hfu,
            "peak_bytes": dict(self.peak_bytes),
            "capacity_bytes": dict(self.capacity_bytes),
            "reserved_bytes": {k: dict(v) for k, v in self.reserved_bytes.items()},
            "peak_by_kind": {k: dict(v) for k, v in self.peak_by_kind.items()},
            "link_bytes": dict(self.link_bytes),
            "link_busy_s": dict(self.link_busy_s),
            "stream_busy_s": dict(self.stream_busy_s),
            "compute_busy_s": self.compute_busy_s,
            "exposed_transfer_s": self.exposed_transfer_s,
            "oom": self.oom.to_dict() if self.oom else None,
            "ooms": [o.to_dict() for o in self.ooms],
            "sim": self.sim.to_dict(),
            "notes": list(self.notes),
            "info": dict(self.info),
        }


# -- helpers over intervals ---------------------------------------------------------------------------
def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def clip(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """a minus b, both sorted disjoint unions."""
    out: list[tuple[float, float]] = []
    j = 0
    for lo, hi in a:
        cur = lo
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def busy_intervals(log: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals with a positive total rate, from a resource's (time, total rate) log."""
    pts = list(log)
    return [(t, pts[i + 1][0] if i + 1 < len(pts) else t) for i, (t, r) in enumerate(pts) if r > 0]


@dataclass(frozen=True)
class StepMetrics:
    """The additive figures of one measured step (what steady-state extrapolation scales)."""

    step_time_s: float
    link_bytes: dict[str, float]
    link_busy_s: dict[str, float]
    stream_busy_s: dict[str, float]
    compute_busy_s: float
    exposed_transfer_s: float
    window: tuple[float, float]


def step_metrics(plan: Plan, raw: RawRun, measured: int | None = None) -> StepMetrics:
    """Figures of the measured (last) step.

    The step time is the period between the ends of the last two steps. Busy times and exposed transfer
    are those of the measured step's own tasks (wherever they fall in time: with a delayed update the
    next step's compute overlaps this step's optimizer), bytes those it moved.
    """
    last = plan.steps - 1 if measured is None else measured
    hi = raw.step_end.get(last, 0.0)
    lo = raw.step_end.get(last - 1, 0.0) if last >= 1 else 0.0
    mine = [r for r in raw.records if r.step == last]
    link_iv: dict[str, list[tuple[float, float]]] = defaultdict(list)
    rank_iv: dict[str, list[tuple[float, float]]] = defaultdict(list)
    by_stream: dict[str, list[tuple[float, float]]] = defaultdict(list)
    sym = raw.symmetry
    rank_tasks = sym.rank_tasks if sym is not None else frozenset()
    for r in mine:
        by_stream[r.stream].append((r.start, r.end))
        target = rank_iv if r.id in rank_tasks else link_iv
        orbit = sym.coll_orbit.get(r.id, ()) if sym is not None else ()
        if len(orbit) > 1:  # a collective of one group of ranks: its images ran on their own links then
            for cid in orbit:
                for ln in sym.coll_links[cid]:  # type: ignore[union-attr]
                    link_iv[ln].append((r.start, r.end))
            continue
        for ln in r.links:
            target[ln].append((r.start, r.end))
    stream_busy = {s: length(union(iv)) for s, iv in sorted(by_stream.items())}
    busy_of: dict[tuple, float] = {}  # links that carried the same tasks (a ring's) were busy alike

    def busy(iv: list[tuple[float, float]]) -> float:
        key = tuple(iv)
        got = busy_of.get(key)
        if got is None:
            got = busy_of[key] = length(union(iv))
        return got

    if sym is None:
        link_busy = {ln: busy(link_iv.get(ln, [])) for ln in raw.topology.links}
        compute_busy, exposed = gpu_overlap(mine, raw.records)
    else:  # every rank's tasks ran when rank 0's did: a link is busy when the rank-0 links landing on it are
        sources = sym.link_sources(rank_iv)
        link_busy = {}
        for ln in raw.topology.links:
            iv = list(link_iv.get(ln, []))
            for src in sources.get(ln, ()):
                iv.extend(rank_iv[src])
            link_busy[ln] = busy(iv)
        stream_busy = sym.expand_streams(stream_busy)
        compute_busy, exposed = gpu_overlap(mine, raw.records, sym.gpus)
    return StepMetrics(hi - lo, dict(raw.link_bytes_by_step.get(last, {})), link_busy, stream_busy, compute_busy,
                       exposed, (lo, hi))


def gpu_overlap(step_records: Iterable[TaskRecord], all_records: Iterable[TaskRecord],
                only: frozenset[str] | None = None) -> tuple[float, float]:
    """(busiest GPU's compute time in the step, worst GPU's transfer time in the step not hidden by compute).

    A transfer involves a GPU when it is one end of a copy or a rank of a collective; it is hidden where
    that GPU computes (for any step) at the same time. ``only``: the GPUs to consider (a symmetric run's
    representative rank, whose figures every rank shares).
    """
    comp_all: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in all_records:
        if r.op in ("compute", "optimizer"):
            for g in r.gpus:
                comp_all[g].append((r.start, r.end))
    comp: dict[str, list[tuple[float, float]]] = defaultdict(list)
    xfer: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in step_records:
        target = comp if r.op in ("compute", "optimizer") else xfer if r.op in TRANSFER_OPS else None
        if target is not None:
            for g in r.gpus:
                if only is None or g in only:
                    target[g].append((r.start, r.end))
    busiest = max((length(union(iv)) for iv in comp.values()), default=0.0)
    worst = 0.0
    for g, iv in xfer.items():
        worst = max(worst, length(subtract(union(iv), union(comp_all.get(g, [])))))
    return busiest, worst


def plan_hardware_flops(plan: Plan) -> float:
    """FLOPs the GPUs execute in one step of ``plan``: every compute task of a compute phase (forward,
    backward, recompute) times its segment's repeat count, summed over the GPUs (the HFU numerator); a rank
    template's (``simulator.rank_template``: rank 0's compute tasks only) once per rank."""
    total = 0.0
    for seg in plan.segments:
        flops = sum(t.flops for t in seg.tasks if t.op == "compute" and t.tags.get("phase") in COMPUTE_PHASES)
        total += seg.repeat * flops
    return total * (plan.template.ranks if plan.template is not None else 1)


def with_hardware_flops(result: Result, plan: Plan, hw: HardwareSpec) -> Result:
    """``result`` with ``hw_tflops_per_gpu`` and ``hfu`` counted from ``plan`` (the plan as written, not a
    shortened copy simulated for extrapolation). A plan without compute tasks of a compute phase (a
    hand-written benchmark) keeps the model figures."""
    flops = plan_hardware_flops(plan)
    step = result.step_time_s
    if flops <= 0 or step <= 0 or not result.n_gpus:
        return result
    hw_tflops = flops / step / result.n_gpus / 1e12
    return replace(result, hw_tflops_per_gpu=hw_tflops,
                   hfu=hw_tflops * 1e12 / hw.peak_flops_for(plan.workload.config.precision))


def build_result(plan: Plan, hw: HardwareSpec, raw: RawRun, metrics: StepMetrics, sim: SimInfo,
                 measured: int | None = None) -> Result:
    mem = raw.memory
    topo = raw.topology
    peaks = {p: s.peak for p, s in mem.pools.items()}
    oom_list = tuple(Oom(o.pool, o.time_s, o.task, o.tensor, o.requested_bytes, o.free_bytes,
                         o.capacity_bytes, peaks[o.pool]) for o in sorted(mem.ooms, key=lambda o: o.time_s))
    n_gpus = int(plan.metrics.get("n_gpus", len(topo.gpu_locations())))
    tokens = float(plan.metrics.get("tokens_per_step", 0.0))
    flops = float(plan.metrics.get("model_flops_per_step", 0.0))
    step = metrics.step_time_s
    dtype = plan.workload.config.precision
    workload = plan.workload.to_dict()
    tflops = flops / step / n_gpus / 1e12 if step > 0 and n_gpus else 0.0
    mfu = tflops * 1e12 / hw.peak_flops_for(dtype) if tflops else 0.0
    return Result(
        feasible=not oom_list,
        policy=plan.policy,
        knobs=dict(plan.knobs),
        hardware=hw.name,
        model=workload.pop("model"),
        workload=workload,
        n_gpus=n_gpus,
        step_time_s=step,
        tokens_per_s=tokens / step if step > 0 else 0.0,
        tflops_per_gpu=tflops,
        mfu=mfu,
        hw_tflops_per_gpu=tflops,  # simulate_plan sets the hardware figures from the whole plan
        hfu=mfu,
        peak_bytes=peaks,
        capacity_bytes={p: s.capacity for p, s in mem.pools.items()},
        reserved_bytes={p.name: dict(p.reserved) for p in topo.pools.values()},
        peak_by_kind={p: dict(sorted(s.peak_by_kind.items())) for p, s in mem.pools.items()},
        link_bytes=metrics.link_bytes,
        link_busy_s=metrics.link_busy_s,
        stream_busy_s=metrics.stream_busy_s,
        compute_busy_s=metrics.compute_busy_s,
        exposed_transfer_s=metrics.exposed_transfer_s,
        oom=oom_list[0] if oom_list else None,
        ooms=oom_list,
        sim=sim,
        notes=tuple(plan.notes),
        info=dict(plan.info),
        records=ExpandedRecords(raw.symmetry, raw.records) if raw.symmetry is not None else tuple(raw.records),
        memory_series={p: tuple(s.series) for p, s in mem.pools.items()},
        link_rate_log={r: tuple(s.rate_log) for r, s in raw.net.stats.items()},
        window=metrics.window,
        leaked=tuple(sorted(raw.leaked)),
        min_used_bytes={p: s.min_used for p, s in mem.pools.items()},
        simulated_plan=plan,
        warmup_repeat=raw.warmup_repeat,
        topology=topo,
        measured_step=plan.steps - 1 if measured is None else measured,
    )


def scale_metrics(base: StepMetrics, deltas: list[tuple[int, StepMetrics]]) -> StepMetrics:
    """base + sum(k * delta) for every additive figure."""

    def add(a: Mapping[str, float], parts: list[tuple[int, Mapping[str, float]]]) -> dict[str, float]:
        keys = set(a).union(*(set(d) for _, d in parts)) if parts else set(a)
        return {k: a.get(k, 0.0) + sum(n * d.get(k, 0.0) for n, d in parts) for k in sorted(keys)}

    lo = base.window[0]
    step = base.step_time_s + sum(n * d.step_time_s for n, d in deltas)
    return StepMetrics(
        step_time_s=step,
        link_bytes=add(base.link_bytes, [(n, d.link_bytes) for n, d in deltas]),
        link_busy_s=add(base.link_busy_s, [(n, d.link_busy_s) for n, d in deltas]),
        stream_busy_s=add(base.stream_busy_s, [(n, d.stream_busy_s) for n, d in deltas]),
        compute_busy_s=base.compute_busy_s + sum(n * d.compute_busy_s for n, d in deltas),
        exposed_transfer_s=base.exposed_transfer_s + sum(n * d.exposed_transfer_s for n, d in deltas),
        window=(lo, lo + step),
    )


def diff_metrics(a: StepMetrics, b: StepMetrics) -> StepMetrics:
    """a - b."""
    keys = lambda x, y: sorted(set(x) | set(y))  # noqa: E731
    return StepMetrics(
        a.step_time_s - b.step_time_s,
        {k: a.link_bytes.get(k, 0.0) - b.link_bytes.get(k, 0.0) for k in keys(a.link_bytes, b.link_bytes)},
        {k: a.link_busy_s.get(k, 0.0) - b.link_busy_s.get(k, 0.0) for k in keys(a.link_busy_s, b.link_busy_s)},
        {k: a.stream_busy_s.get(k, 0.0) - b.stream_busy_s.get(k, 0.0)
         for k in keys(a.stream_busy_s, b.stream_busy_s)},
        a.compute_busy_s - b.compute_busy_s, a.exposed_transfer_s - b.exposed_transfer_s, (0.0, 0.0))
