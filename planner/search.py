"""Search every policy, its knobs, micro-batch and checkpointing for the best plan of a job.

    outcome = search("a100x8", "70b", request=JobRequest(global_batch=64))
    outcome.best.policy, outcome.best.knobs, outcome.best.tokens_per_s, outcome.rejected

The user's request fixes global batch, sequence length and precision (defaults picked as ``make_job``
does, with micro-batch 1); a micro-batch or checkpointing given in the request fixes that too, else the
search varies them (``planner.candidates``). Cheapest work first:

1. build each candidate's plan (``make_plan``): a policy raises ``PlanInfeasible`` when it knows the job
   cannot fit ("policy: gpu memory"), a knob that does not fit the job raises ``KnobError``
   ("knobs: invalid", e.g. a micro-batch that does not divide a policy's per-rank batch);
2. analytic lower bounds from the plan (``planner.bounds``): bytes that must be resident together in a
   pool above its capacity reject it ("bound: gpu memory"); the step-time bound orders the rest;
3. best-first: simulate survivors in order of their objective bound (time for tokens_per_s, model FLOPs
   over the time bound for tflops, the memory bound for gpu_memory / cpu_memory), ties by enumeration
   order; once a simulated feasible candidate is at least as good as the next one's bound, that one and
   every later one are pruned ("bound: slower than best" / "bound: more memory than best"). The bound
   never exceeds the simulated value, so no pruned candidate could have won.

With ``workers > 1`` the simulations run in parallel processes, speculatively in the same order; the
outcome is then recomputed by the sequential rule from the results, so it does not depend on the worker
count (surplus simulations only fill the cache, and are stopped, not waited for, once the sequential rule
prunes every one still running: a speculative simulation can take many times the winner's). ``budget_s``
stops planning and simulating once that much wall time has passed and ``max_candidates`` caps the number
of simulations; the outcome then says it was cut short (``cut_short``) and counts the rest as
"skipped: budget" / "skipped: max candidates".
``prune=False`` simulates every candidate that passes the memory bounds (an exhaustive search, for
checking the pruning). ``first_feasible`` simulates candidates in a memory-frugal order (full checkpointing and small
micro-batches first) and stops at the first feasible one (for max-model and coverage).

Everything is deterministic for the same inputs, except what a wall-time budget cuts. ``wall_s`` and
cache statistics are attributes of the outcome, not part of ``to_dict()``, so that output is
reproducible byte for byte.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from hardware_models import HardwareInputError, HardwareSpec, Topology, build_topology
from planner.bounds import plan_bounds
from planner.cache import EvalCache, code_fingerprint, evaluation_key
from planner.candidates import Candidate, enumerate_candidates
from planner.job import JobRequest, make_job, make_plan, resolve_hardware
from planner.pareto import pareto_front
from policies import POLICIES, Job, KnobError, PlanInfeasible
from simulator import Plan, Result, simulate_plan
from workloads import ModelSpec, WorkloadInputError, load_model

OBJECTIVES = ("tokens_per_s", "tflops", "gpu_memory", "cpu_memory")
GPU_KINDS = ("hbm", "unified")
CPU_KINDS = ("dram", "unified")
_CKPT_FRUGAL = {"full": 0, "selective": 1, "none": 2}
KEEP_PLANS = 16  # built plans kept in memory for their simulation; others are built again when simulated


def pool_label(topo: Topology, pool: str) -> str:
    """A pool's category for rejection reasons: gpu / cpu / nvme / unified memory."""
    kind = topo.pools[pool].kind if pool in topo.pools else pool
    return {"hbm": "gpu", "dram": "cpu"}.get(kind, kind) + " memory"


@dataclass
class Evaluated:
    """One candidate and what the search learnt about it.

    ``reason`` is None for a feasible simulated candidate, else a short category ("policy: gpu memory",
    "bound: gpu memory", "bound: slower than best", "oom: gpu0", "knobs: invalid", "duplicate plan" (an
    earlier candidate, e.g. an auto knob's explicit twin, builds the same plan), "skipped: budget").
    ``binding``: for an infeasible candidate the pool that overflows; for a feasible one the pool with
    the highest peak / capacity. ``plan`` and ``result`` are set where this search built or simulated
    them in its own process (the best one's plan on request), else None (e.g. answered from the cache).
    """

    index: int
    policy: str
    knobs: dict[str, Any]
    request: JobRequest
    feasible: bool = False
    reason: str | None = None
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    step_time_s: float | None = None
    peak_bytes: dict[str, float] = field(default_factory=dict)
    capacity_bytes: dict[str, float] = field(default_factory=dict)
    binding: str | None = None
    bound_time_s: float | None = None
    bound_resource: str | None = None
    bound_memory_bytes: dict[str, float] = field(default_factory=dict)
    simulated: bool = False
    message: str | None = None
    plan: Plan | None = None
    result: Result | None = None

    @property
    def micro_batch(self) -> int:
        return int(self.request.micro_batch or 1)

    @property
    def checkpointing(self) -> str:
        return str(self.request.checkpointing)

    def peak_of(self, kinds: Sequence[str], topo_kinds: Mapping[str, str]) -> float:
        return max((b for p, b in self.peak_bytes.items() if topo_kinds.get(p) in kinds), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "policy": self.policy, "knobs": dict(self.knobs),
            "request": dataclasses.asdict(self.request), "feasible": self.feasible, "reason": self.reason,
            "binding": self.binding, "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu, "peak_bytes": dict(self.peak_bytes),
            "capacity_bytes": dict(self.capacity_bytes), "bound_time_s": self.bound_time_s,
            "bound_resource": self.bound_resource, "bound_memory_bytes": dict(self.bound_memory_bytes),
            "simulated": self.simulated, "message": self.message,
        }


@dataclass
class SearchOutcome:
    objective: str
    hardware: str
    model: str
    workload: dict[str, Any]
    assumed: list[str]
    best: Evaluated | None
    ranked: list[Evaluated]
    rejected: dict[str, int]
    pareto: list[Evaluated]
    evaluated: list[Evaluated]
    n_candidates: int
    n_pruned: int
    n_simulated: int
    cut_short: str | None = None
    pool_kinds: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    n_extra_simulated: int = 0  # speculative parallel simulations the sequential rule did not need

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "tiersim.plan_search", "objective": self.objective, "hardware": self.hardware,
            "model": self.model, "workload": dict(self.workload), "assumed": list(self.assumed),
            "best": self.best.to_dict() if self.best else None,
            "ranked": [e.to_dict() for e in self.ranked], "rejected": dict(self.rejected),
            "pareto": [e.index for e in self.pareto], "n_candidates": self.n_candidates,
            "n_pruned": self.n_pruned, "n_simulated": self.n_simulated, "cut_short": self.cut_short,
            "pool_kinds": dict(self.pool_kinds),
        }


# -- one candidate, in any process --------------------------------------------------------------------
def plan_summary(job: Job, cand: Candidate, topo: Topology) -> tuple[dict[str, Any], Plan | None]:
    """Build the plan and its bounds: ``({"verdict": "rejected"|"bounded", ...}, plan or None)``."""
    try:
        plan = make_plan(job, cand.policy, cand.knob_dict)
    except PlanInfeasible as e:
        return {"verdict": "rejected", "reason": f"policy: {pool_label(topo, e.pool)}", "binding": e.pool,
                "message": str(e)}, None
    except KnobError as e:
        return {"verdict": "rejected", "reason": "knobs: invalid", "binding": None, "message": str(e)}, None
    b = plan_bounds(plan, job.hw, topo)
    caps = {p: topo.pools[p].capacity_bytes for p in sorted(topo.pools)}
    over = [p for p, need in b.memory_bytes.items() if need > caps[p] * (1 + 1e-9)]
    d = {"verdict": "bounded", "fingerprint": plan_fingerprint(plan), "bound_time_s": b.time_s,
         "bound_resource": b.time_resource,
         "bound_memory_bytes": b.memory_bytes, "capacity_bytes": caps,
         "model_flops_per_step": float(plan.metrics.get("model_flops_per_step", 0.0)),
         "n_gpus": int(plan.metrics.get("n_gpus", job.n_gpus))}
    if over:
        p = max(over, key=lambda x: (b.memory_bytes[x] - caps[x], x))
        d.update(verdict="rejected", reason=f"bound: {pool_label(topo, p)}", binding=p,
                 message=f"{p}: {b.memory_bytes[p] / 1e9:.1f} GB resident from the start, "
                         f"capacity {caps[p] / 1e9:.1f} GB")
    return d, plan


def plan_fingerprint(plan: Plan) -> str:
    """Hash of what the simulator executes (tensors, streams, segments, steps, workload), not of the
    knobs' spelling: two candidates with equal fingerprints are the same plan."""
    h = hashlib.sha256()
    h.update(repr((sorted(plan.workload.to_dict().items(), key=lambda kv: kv[0]), plan.steps, plan.tensors,
                   plan.streams)).encode())
    for seg in plan.segments:
        h.update(repr((seg.name, seg.repeat)).encode())
        for t in seg.tasks:
            h.update(repr((t.id, t.op, t.stream, t.deps, t.flops, t.hbm_bytes, t.bytes, t.tensor, t.src, t.dst,
                           t.alloc_dst, t.free_src, t.params, t.coll, t.ranks, t.allocs, t.frees,
                           t.reads)).encode())
    return h.hexdigest()


def sim_summary(result: Result) -> dict[str, Any]:
    peaks = {p: float(v) for p, v in sorted(result.peak_bytes.items())}
    caps = {p: float(v) for p, v in sorted(result.capacity_bytes.items())}
    if result.feasible:
        binding = max(sorted(peaks), key=lambda p: peaks[p] / caps[p] if caps.get(p) else 0.0)
        reason = None
    else:
        binding = result.oom.pool if result.oom else None
        reason = f"oom: {binding}"
    return {"feasible": result.feasible, "reason": reason, "binding": binding,
            "step_time_s": result.step_time_s, "tokens_per_s": result.tokens_per_s,
            "tflops_per_gpu": result.tflops_per_gpu, "peak_bytes": peaks, "capacity_bytes": caps,
            "message": (f"{result.oom.pool}: demand {result.oom.total_demand_bytes / 1e9:.1f} GB, capacity "
                        f"{result.oom.capacity_bytes / 1e9:.1f} GB") if result.oom else None}


def _plan_task(job: Job, cand: Candidate) -> dict[str, Any]:
    """Plan and bound in a worker process; the plan itself stays there (shipping it costs more)."""
    return plan_summary(job, cand, build_topology(job.hw))[0]


def _plan_parallel(s: _Search, todo: list[Candidate], summaries: dict[int, dict[str, Any]], keys: dict[int, str],
                   workers: int, over_budget: Callable[[], bool], skipped: dict[int, str], cut: list[str],
                   budget_s: float | None) -> None:
    """Phase 1 in worker processes; each summary lands under its candidate's index (order-independent)."""
    pool = ProcessPoolExecutor(max_workers=workers)
    try:
        futs = {pool.submit(_plan_task, s.job(c), c): c for c in todo}
        pending = set(futs)
        n = 0
        while pending:
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: futs[f].index):
                c = futs[fut]
                summaries[c.index] = summ = fut.result()
                if s.cache is not None:
                    s.cache.put(keys[c.index], summ)
                n += 1
                s.say(f"[plan {n}/{len(todo)}] {c.label()}: "
                      + (summ.get("reason") or f"bound {summ['bound_time_s']:.3g} s"))
            if pending and over_budget():
                for f in pending:
                    f.cancel()
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.terminate()  # a cut search does not wait for plans in progress
                left = [futs[f] for f in pending]
                for c in left:
                    skipped[c.index] = "skipped: budget"
                cut.append(f"wall-time budget of {budget_s:g} s reached while building plans; "
                           f"{len(left)} candidates not evaluated")
                break
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _sim_task(job: Job, cand: Candidate) -> tuple[dict[str, Any], Plan]:
    """Plan and simulate in a worker process; the plan comes back (the search keeps the best one's, which
    is what --plan-out writes: a policy with a time-limited solver may not build the same plan twice)."""
    plan = make_plan(job, cand.policy, cand.knob_dict)
    return sim_summary(simulate_plan(plan, job.hw)), plan


# -- the search ---------------------------------------------------------------------------------------
class _Search:
    def __init__(self, hw: HardwareSpec, model: ModelSpec, base: JobRequest, objective: str,
                 cache: EvalCache | None, progress: Callable[[str], None] | None, prune: bool = True):
        self.hw, self.model, self.base, self.objective = hw, model, base, objective
        self.prune = prune
        self.cache = cache
        self.progress = progress
        self.topo = build_topology(hw)
        self.jobs: dict[tuple[int, str], Job | Exception] = {}
        self.code = code_fingerprint() if cache is not None else ""
        self.hw_dict = hw.to_dict()
        self.model_dict = model.to_dict()
        self.plans: dict[int, Plan] = {}  # built, not yet simulated (the KEEP_PLANS lowest bounds)
        self.plan_bound: dict[int, float] = {}
        self.sim_plans: dict[int, Plan] = {}
        self.results: dict[int, Result] = {}

    def keep_plan(self, index: int, plan: Plan, bound: float) -> None:
        """Keep a built plan for its simulation, but only the KEEP_PLANS with the lowest bounds (memory)."""
        self.plans[index] = plan
        self.plan_bound[index] = bound
        if len(self.plans) > KEEP_PLANS:
            worst = max(self.plans, key=lambda i: (self.plan_bound[i], i))
            del self.plans[worst]

    def job(self, cand: Candidate) -> Job | Exception:
        key = (cand.micro_batch, cand.checkpointing)
        if key not in self.jobs:
            req = dataclasses.replace(self.base, micro_batch=cand.micro_batch, checkpointing=cand.checkpointing)
            try:
                self.jobs[key] = make_job(self.hw, self.model, req)[0]
            except (WorkloadInputError, KnobError, HardwareInputError) as e:
                self.jobs[key] = e
        return self.jobs[key]

    def key(self, cand: Candidate, job: Job) -> str:
        return evaluation_key(self.hw_dict, self.model_dict, job.config.to_dict(), cand.policy, cand.knob_dict,
                              self.code)

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)


def _request_of(base: JobRequest, cand: Candidate) -> JobRequest:
    return dataclasses.replace(base, micro_batch=cand.micro_batch, checkpointing=cand.checkpointing)


def _objective_value(obj: str, e: Evaluated, kinds: Mapping[str, str]) -> float:
    """Smaller is better."""
    if obj == "tflops":
        return -float(e.tflops_per_gpu or 0.0)
    if obj == "tokens_per_s":
        return float(e.step_time_s if e.step_time_s is not None else float("inf"))
    return e.peak_of(GPU_KINDS if obj == "gpu_memory" else CPU_KINDS, kinds)


def _objective_bound(obj: str, summary: Mapping[str, Any], kinds: Mapping[str, str]) -> float:
    """A lower bound of ``_objective_value`` from the plan alone (TFLOP/s: the plan's model FLOPs over the
    time bound is an upper bound of the achieved rate)."""
    if obj == "tflops":
        t = float(summary["bound_time_s"])
        return -(summary["model_flops_per_step"] / t / summary["n_gpus"] / 1e12) if t > 0 else -float("inf")
    if obj == "tokens_per_s":
        return float(summary["bound_time_s"])
    want = GPU_KINDS if obj == "gpu_memory" else CPU_KINDS
    return max((b for p, b in summary["bound_memory_bytes"].items() if kinds.get(p) in want), default=0.0)


def _planning_order(cands: list[Candidate], first_feasible: bool) -> list[Candidate]:
    """Round-robin over policies (a cut-short search still sees every policy); memory-frugal first
    (full checkpointing, small micro-batches) when looking for any feasible plan."""
    by_policy: dict[str, list[Candidate]] = {}
    for c in cands:
        by_policy.setdefault(c.policy, []).append(c)
    if first_feasible:
        for lst in by_policy.values():
            lst.sort(key=lambda c: (_CKPT_FRUGAL.get(c.checkpointing, 9), c.micro_batch, c.index))
    out: list[Candidate] = []
    queues = list(by_policy.values())
    depth = max((len(q) for q in queues), default=0)
    for i in range(depth):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def search(hw: str | HardwareSpec, model: str | ModelSpec, *, request: JobRequest | None = None,
           hw_overrides: Sequence[str] = (), objective: str = "tokens_per_s", policies: Sequence[str] | None = None,
           budget_s: float | None = None, max_candidates: int | None = None, first_feasible: bool = False,
           progress: Callable[[str], None] | None = None, cache: EvalCache | None = None,
           workers: int = 1, keep_best_plan: bool = False, prune: bool = True) -> SearchOutcome:
    """Search policies x knobs x micro-batch x checkpointing for ``objective``; see the module docstring."""
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise KnobError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if budget_s is not None and budget_s <= 0:
        raise KnobError(f"--budget must be positive, got {budget_s}")
    if max_candidates is not None and max_candidates < 1:
        raise KnobError(f"--max-candidates must be at least 1, got {max_candidates}")
    spec = resolve_hardware(hw, hw_overrides)
    m = model if isinstance(model, ModelSpec) else load_model(model)
    req = request or JobRequest()
    # the defaults a job would pick with micro-batch 1 fix the global batch for every candidate
    job0, assumed = make_job(spec, m, dataclasses.replace(req, micro_batch=req.micro_batch or 1,
                                                          checkpointing=req.checkpointing or "full"))
    c0 = job0.config
    base = JobRequest(micro_batch=req.micro_batch, seq_len=c0.seq_len, global_batch=c0.global_batch,
                      precision=c0.precision, checkpointing=req.checkpointing, flash_attention=c0.flash_attention)
    assumed = [a for a in assumed if not a.startswith(("micro_batch=", "checkpointing="))]
    names = list(policies) if policies else list(POLICIES)
    cands = list(enumerate_candidates(names, spec.gpu.count, c0.global_batch, micro_batch=req.micro_batch,
                                      checkpointing=req.checkpointing))
    s = _Search(spec, m, base, objective, cache, progress, prune)
    kinds = {p: s.topo.pools[p].kind for p in sorted(s.topo.pools)}
    summaries: dict[int, dict[str, Any]] = {}
    keys: dict[int, str] = {}
    skipped: dict[int, str] = {}
    cut: list[str] = []

    def over_budget() -> bool:
        return budget_s is not None and time.perf_counter() - t0 > budget_s

    def sim_one(c: Candidate) -> tuple[Plan, Result]:
        """Simulate in this process (plan from phase 1, or rebuilt)."""
        job = s.job(c)
        assert not isinstance(job, Exception)
        plan = s.plans.pop(c.index, None) or make_plan(job, c.policy, c.knob_dict)
        r = simulate_plan(plan, job.hw)
        _store_sim(c, sim_summary(r))
        return plan, r

    def _store_sim(c: Candidate, sim: dict[str, Any]) -> None:
        summaries[c.index]["sim"] = sim
        if cache is not None and c.index in keys:
            cache.put(keys[c.index], summaries[c.index])

    # phase 1: plans and bounds (cheap), in round-robin order so that a budget cut leaves no policy out
    order = _planning_order(cands, first_feasible)
    n_sims = 0
    todo: list[Candidate] = []
    for c in order:
        job = s.job(c)
        if isinstance(job, Exception):
            summaries[c.index] = {"verdict": "rejected", "reason": "workload: invalid", "binding": None,
                                  "message": str(job)}
            continue
        keys[c.index] = k = s.key(c, job)
        got = cache.get(k) if cache is not None else None
        if got is not None:
            summaries[c.index] = got
        else:
            todo.append(c)
    if workers > 1 and not first_feasible and len(todo) > 1:
        _plan_parallel(s, todo, summaries, keys, workers, over_budget, skipped, cut, budget_s)
    for i, c in enumerate(order):
        if first_feasible or c.index not in summaries:
            if c.index in skipped:
                continue
            if c.index not in summaries:
                if over_budget():
                    rest = [x for x in order[i:] if x.index not in summaries]
                    for x in rest:
                        skipped[x.index] = "skipped: budget"
                    cut.append(f"wall-time budget of {budget_s:g} s reached while building plans; "
                               f"{len(rest)} candidates not evaluated")
                    break
                job = s.job(c)
                assert not isinstance(job, Exception)
                summ, plan = plan_summary(job, c, s.topo)
                summaries[c.index] = summ
                if plan is not None and summ["verdict"] == "bounded":
                    s.keep_plan(c.index, plan, _objective_bound(objective, summ, kinds))
                if cache is not None:
                    cache.put(keys[c.index], summ)
                s.say(f"[plan {i + 1}/{len(order)}] {c.label()}: "
                      + (summ.get("reason") or f"bound {summ['bound_time_s']:.3g} s"))
        if first_feasible and summaries[c.index]["verdict"] == "bounded":
            if "sim" not in summaries[c.index]:
                if max_candidates is not None and n_sims >= max_candidates:
                    skipped[c.index] = "skipped: max candidates"
                    note = f"simulated the maximum of {max_candidates} candidates"
                    if note not in cut:
                        cut.append(note)
                    continue
                plan, r = sim_one(c)
                n_sims += 1
                if r.feasible:
                    s.sim_plans, s.results = {c.index: plan}, {c.index: r}
            if summaries[c.index]["sim"]["feasible"]:
                for rest in order[i + 1:]:
                    skipped[rest.index] = "skipped: first feasible found"
                break
            s.plans.pop(c.index, None)
    # phase 2: best-first simulation of the survivors
    survivors = [c for c in cands if c.index in summaries and summaries[c.index]["verdict"] == "bounded"
                 and c.index not in skipped]
    if not first_feasible:  # an auto knob resolving to an explicit value's choice gives the same plan twice
        first_of: dict[str, int] = {}
        for c in survivors:
            fp = summaries[c.index].get("fingerprint")
            if fp is not None and fp in first_of:
                skipped[c.index] = "duplicate plan"
            elif fp is not None:
                first_of[fp] = c.index
        survivors = [c for c in survivors if c.index not in skipped]
    lb = {c.index: _objective_bound(objective, summaries[c.index], kinds) for c in survivors}
    survivors.sort(key=lambda c: (lb[c.index], c.index))
    if not first_feasible and survivors:
        n_sims = _best_first(s, survivors, lb, summaries, kinds, workers, max_candidates, over_budget,
                             sim_one, _store_sim, skipped, cut)
    return _outcome(s, cands, summaries, lb, skipped, cut, kinds, assumed, c0.to_dict(), t0, first_feasible,
                    keep_best_plan, n_sims)


def _done_value(objective: str, summ: Mapping[str, Any], kinds: Mapping[str, str]) -> float | None:
    """The simulated objective value (smaller is better) of a feasible candidate, else None."""
    sim = summ.get("sim")
    if not sim or not sim["feasible"]:
        return None
    if objective == "tflops":
        return -float(sim["tflops_per_gpu"])
    if objective == "tokens_per_s":
        return float(sim["step_time_s"])
    want = GPU_KINDS if objective == "gpu_memory" else CPU_KINDS
    return max((b for p, b in sim["peak_bytes"].items() if kinds.get(p) in want), default=0.0)


def _best_first(s: _Search, survivors: list[Candidate], lb: Mapping[int, float], summaries: dict[int, dict[str, Any]],
                kinds: Mapping[str, str], workers: int, max_candidates: int | None,
                over_budget: Callable[[], bool], sim_one: Callable[[Candidate], None],
                store: Callable[[Candidate, dict[str, Any]], None], skipped: dict[int, str], cut: list[str]) -> int:
    """Simulate survivors in bound order until the best simulated beats the next bound; returns the count."""
    best: tuple[float, int] | None = None
    n = 0

    def note(c: Candidate, plan: Plan | None = None, result: Result | None = None) -> None:
        nonlocal best
        v = _done_value(s.objective, summaries[c.index], kinds)
        if v is not None and (best is None or (v, c.index) < best):
            best = (v, c.index)
            # keep the simulated plan (and Result) of the best so far only, for memory: the overall best is
            # the best of all simulated (a speculative extra simulation never beats the sequential rule's)
            s.sim_plans = {c.index: plan} if plan is not None else {}
            s.results = {c.index: result} if result is not None else {}

    def prunable(c: Candidate) -> bool:
        return s.prune and best is not None and (lb[c.index], c.index) > best

    def budget_hit(i: int) -> bool:
        if max_candidates is not None and n >= max_candidates:
            for rest in survivors[i:]:
                if "sim" not in summaries[rest.index] and not prunable(rest):
                    skipped[rest.index] = "skipped: max candidates"
            cut.append(f"simulated the maximum of {max_candidates} candidates")
            return True
        if over_budget():
            for rest in survivors[i:]:
                if "sim" not in summaries[rest.index] and not prunable(rest):
                    skipped[rest.index] = "skipped: budget"
            cut.append("wall-time budget reached while simulating")
            return True
        return False

    for c in survivors:  # cached simulations count as done
        if "sim" in summaries[c.index]:
            note(c)
    if workers <= 1:
        for i, c in enumerate(survivors):
            if prunable(c):
                break
            if "sim" not in summaries[c.index]:
                if budget_hit(i):
                    break
                s.say(f"[simulate] {c.label()} (bound {lb[c.index]:.4g})")
                plan, r = sim_one(c)
                n += 1
                note(c, plan, r)
            else:
                note(c)
        return n
    jobs = {c.index: s.job(c) for c in survivors}
    pool = ProcessPoolExecutor(max_workers=workers)
    running: dict[Future, Candidate] = {}
    try:
        i = 0
        while True:
            while i < len(survivors) and len(running) < workers:
                c = survivors[i]
                if prunable(c):
                    i = len(survivors)
                    break
                if "sim" in summaries[c.index]:
                    i += 1
                    continue
                if budget_hit(i):
                    i = len(survivors)
                    break
                s.say(f"[simulate] {c.label()} (bound {lb[c.index]:.4g})")
                running[pool.submit(_sim_task, jobs[c.index], c)] = c
                n += 1
                i += 1
            if not running or (i >= len(survivors) and all(prunable(c) for c in running.values())):
                break  # what still runs is speculative and the sequential rule prunes it: abandon it
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: running[f].index):
                c = running.pop(fut)
                summ, plan = fut.result()
                store(c, summ)
                note(c, plan)
    finally:
        if running:  # abandoned speculative simulations: stop them rather than wait (one can take minutes)
            for f in running:
                f.cancel()
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=not running, cancel_futures=True)
    return n


def _outcome(s: _Search, cands: list[Candidate], summaries: dict[int, dict[str, Any]], lb: Mapping[int, float],
             skipped: dict[int, str], cut: list[str], kinds: dict[str, str], assumed: list[str],
             workload: dict[str, Any], t0: float, first_feasible: bool, keep_best_plan: bool,
             n_run: int) -> SearchOutcome:
    """The sequential rule over what is known: which candidates it simulates, prunes, ranks."""
    obj = s.objective
    pruned_reason = "bound: slower than best" if obj in ("tokens_per_s", "tflops") else "bound: more memory than best"
    best: tuple[float, int] | None = None
    counted_sim: set[int] = set()
    if not first_feasible:
        order = sorted((c for c in cands if c.index in lb), key=lambda c: (lb[c.index], c.index))
        for c in order:
            if c.index in skipped or "sim" not in summaries[c.index]:
                continue
            if s.prune and best is not None and (lb[c.index], c.index) > best:
                break
            counted_sim.add(c.index)
            v = _done_value(obj, summaries[c.index], kinds)
            if v is not None and (best is None or (v, c.index) < best):
                best = (v, c.index)
    else:
        counted_sim = {c.index for c in cands if c.index in summaries and "sim" in summaries[c.index]
                       and c.index not in skipped}
    evaluated: list[Evaluated] = []
    for c in cands:
        e = Evaluated(c.index, c.policy, c.knob_dict, _request_of(s.base, c))
        summ = summaries.get(c.index)
        if summ is not None:
            e.reason, e.binding, e.message = summ.get("reason"), summ.get("binding"), summ.get("message")
            if summ["verdict"] == "bounded" or "bound_time_s" in summ:
                e.bound_time_s = summ.get("bound_time_s")
                e.bound_resource = summ.get("bound_resource")
                e.bound_memory_bytes = dict(summ.get("bound_memory_bytes", {}))
                e.capacity_bytes = dict(summ.get("capacity_bytes", {}))
        if c.index in skipped:
            e.reason = skipped[c.index]
        elif c.index in counted_sim:
            sim = summ["sim"]  # type: ignore[index]
            e.simulated = True
            e.feasible = bool(sim["feasible"])
            e.reason, e.binding, e.message = sim["reason"], sim["binding"], sim.get("message")
            e.step_time_s, e.tokens_per_s, e.tflops_per_gpu = sim["step_time_s"], sim["tokens_per_s"], \
                sim["tflops_per_gpu"]
            e.peak_bytes, e.capacity_bytes = dict(sim["peak_bytes"]), dict(sim["capacity_bytes"])
            e.result = s.results.get(c.index)
            e.plan = s.sim_plans.get(c.index)
        elif summ is not None and summ["verdict"] == "bounded":
            e.reason = pruned_reason
        evaluated.append(e)
    ranked = sorted((e for e in evaluated if e.simulated and e.feasible),
                    key=lambda e: (_objective_value(obj, e, kinds), e.index))
    best_e = ranked[0] if ranked else None
    if best_e is not None and keep_best_plan and best_e.plan is None:
        job = s.job(cands[best_e.index])
        assert not isinstance(job, Exception)
        best_e.plan = make_plan(job, best_e.policy, best_e.knobs)
    for e in evaluated:  # keep only the best's plan and result in memory
        if e is not best_e:
            e.plan = e.result = None
    rejected: dict[str, int] = {}
    for e in evaluated:
        if e.reason is not None:
            rejected[e.reason] = rejected.get(e.reason, 0) + 1
    pareto = pareto_front(ranked, lambda e: (-(e.tokens_per_s or 0.0), e.peak_of(GPU_KINDS, kinds),
                                             e.peak_of(CPU_KINDS, kinds)))
    n_pruned = sum(1 for e in evaluated if not e.simulated and e.reason is not None
                   and not e.reason.startswith("skipped"))
    return SearchOutcome(
        objective=obj, hardware=s.hw.name, model=s.model.name, workload=workload, assumed=assumed,
        best=best_e, ranked=ranked, rejected=dict(sorted(rejected.items())), pareto=pareto, evaluated=evaluated,
        n_candidates=len(cands), n_pruned=n_pruned, n_simulated=len(counted_sim),
        cut_short="; ".join(cut) if cut else None, pool_kinds=kinds, wall_s=time.perf_counter() - t0,
        cache_hits=s.cache.hits if s.cache else 0, cache_misses=s.cache.misses if s.cache else 0,
        n_extra_simulated=max(0, n_run - len(counted_sim)))
