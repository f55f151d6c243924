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
prunes every one still running: a speculative simulation can take many times the winner's; the worker
processes are the search's own, ``planner.workers``, so stopping one is a public operation).

``budget_s`` (or a ``deadline``, ``planner.deadline``) is a wall-clock promise: the search returns by then
with the best of what it evaluated. It looks at the deadline before each plan and each simulation, and
with a deadline it builds plans and simulates in worker processes (even with ``workers=1``) that it stops
when the deadline passes, so no single long plan or simulation carries it past. ``max_candidates`` caps
the number of simulations. A search cut either way says so (``cut_short``) and counts the rest as
"skipped: budget" / "skipped: max candidates". Without a deadline, and when the deadline is not reached,
the outcome is the same: the worker path follows the sequential rule.
``prune=False`` simulates every candidate that passes the memory bounds (an exhaustive search, for
checking the pruning). ``first_feasible`` simulates candidates in a memory-frugal order (full checkpointing and small
micro-batches first) and stops at the first feasible one (for max-model and coverage).

What the search knows about a candidate is typed (``planner.search_state``: ``PlanSummary`` once its plan
is built, with a ``SimSummary`` once simulated); the objective has one definition (``Objective``: its
simulated value and its lower bound). Everything is deterministic for the same inputs, except what a
wall-time budget cuts. ``wall_s`` and
cache statistics are attributes of the outcome, not part of ``to_dict()``, so that output is
reproducible byte for byte.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hardware_models import HardwareInputError, HardwareSpec, Topology, build_topology
from planner.bounds import plan_bounds
from planner.cache import EvalCache, code_fingerprint, entry_problem, evaluation_key
from planner.candidates import Candidate, enumerate_candidates, memory_frugal
from planner.deadline import WAIT_STEP_S, Deadline
from planner.job import JobRequest, make_job, make_plan, resolve_hardware, simulate_job
from planner.pareto import pareto_front
from planner.screen import MEMORY_SLACK, Screener, memory_screen
from planner.search_outcome import Evaluated, SearchOutcome
from planner.search_state import CPU_KINDS, GPU_KINDS, OBJECTIVES, Objective, PlanSummary, SimSummary
from planner.workers import Workers
from policies import POLICIES, Job, KnobError, PlanInfeasible
from simulator import Plan, Result, simulate_plan
from simulator.errors import TemplateRefused
from workloads import ModelSpec, WorkloadInputError, load_model

__all__ = ["CPU_KINDS", "GPU_KINDS", "OBJECTIVES", "Evaluated", "SearchConfig", "SearchOutcome", "plan_summary",
           "search"]

KEEP_PLANS = 16  # built plans kept in memory for their simulation; others are built again when simulated
SHIP_MARGIN = 1.1  # a slow plan comes back from its worker only with a bound within 10% of the least built so far
SHIP_PLAN_AFTER_S = 2.0  # a plan built in a worker process comes back when building it took longer than this


def pool_label(topo: Topology, pool: str) -> str:
    """A pool's category for rejection reasons: gpu / cpu / nvme / unified memory."""
    kind = topo.pools[pool].kind if pool in topo.pools else pool
    return {"hbm": "gpu", "dram": "cpu"}.get(kind, kind) + " memory"


@dataclass(frozen=True)
class SearchConfig:
    """How a search runs (see the module docstring); validated on construction (KnobError, one line)."""

    objective: str = "tokens_per_s"
    budget_s: float | None = None
    max_candidates: int | None = None
    first_feasible: bool = False
    workers: int = 1
    keep_best_plan: bool = False
    prune: bool = True

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise KnobError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise KnobError(f"--budget must be positive, got {self.budget_s}")
        if self.max_candidates is not None and self.max_candidates < 1:
            raise KnobError(f"--max-candidates must be at least 1, got {self.max_candidates}")

    @property
    def parallel(self) -> bool:
        return self.workers > 1 and not self.first_feasible


# -- one candidate, in any process --------------------------------------------------------------------
def plan_summary(job: Job, cand: Candidate, topo: Topology) -> tuple[PlanSummary, Plan | None]:
    """Build the plan and its bounds: a "rejected" or "bounded" summary, and the plan where one was built."""
    try:
        plan = make_plan(job, cand.policy, cand.knob_dict)
    except PlanInfeasible as e:
        return PlanSummary.rejected(f"policy: {pool_label(topo, e.pool)}", e.pool, str(e)), None
    except KnobError as e:
        return PlanSummary.rejected("knobs: invalid", None, str(e)), None
    try:
        b = plan_bounds(plan, job.hw, topo)
    except TemplateRefused:  # a rank template whose ranks do not play one role here: the full plan
        plan = make_plan(job, cand.policy, cand.knob_dict, template=False)
        b = plan_bounds(plan, job.hw, topo)
    caps = {p: topo.pools[p].capacity_bytes for p in sorted(topo.pools)}
    over = [p for p, need in b.memory_bytes.items() if need > caps[p] * (1 + 1e-9)]
    # the fingerprint finds duplicate plans among the bounded ones only (a rejected plan needs none)
    summary = PlanSummary("bounded", fingerprint=None if over else plan_fingerprint(plan), bound_time_s=b.time_s,
                          bound_resource=b.time_resource, bound_memory_bytes=b.memory_bytes, capacity_bytes=caps,
                          model_flops_per_step=float(plan.metrics.get("model_flops_per_step", 0.0)),
                          n_gpus=int(plan.metrics.get("n_gpus", job.n_gpus)))
    if over:
        p = max(over, key=lambda x: (b.memory_bytes[x] - caps[x], x))
        summary = dataclasses.replace(
            summary, verdict="rejected", reason=f"bound: {pool_label(topo, p)}", binding=p,
            message=f"{p}: {b.memory_bytes[p] / 1e9:.1f} GB resident from the start, capacity {caps[p] / 1e9:.1f} GB")
    return summary, plan


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


def _plan_task(job: Job, cand: Candidate) -> PlanSummary:
    """Plan and bound in a worker process; the plan itself stays there (shipping it costs more)."""
    return plan_summary(job, cand, build_topology(job.hw))[0]


def _plan_sim_task(job: Job, cand: Candidate, simulate: bool) -> tuple[PlanSummary, Plan | None]:
    """Plan, bound and (when ``simulate`` and the bounds pass) simulate in a worker process: one step of a
    first-feasible search under a deadline. The plan comes back when its simulation fits."""
    summary, plan = plan_summary(job, cand, build_topology(job.hw))
    if plan is None or not summary.bounded or not simulate:
        return summary, None
    plan, r = simulate_job(job, cand.policy, cand.knob_dict, plan=plan, run=simulate_plan)
    return summary.with_sim(SimSummary.of(r)), plan if r.feasible else None


def _plan_keep_task(job: Job, cand: Candidate, ship_below: float = float("inf")) -> tuple[PlanSummary, Plan | None]:
    """Plan and bound in a worker process; the plan comes back too when building it took longer than
    SHIP_PLAN_AFTER_S (shipping a plan costs about as much as building a cheap one; a MILP's takes seconds) and
    its time bound is at most ``ship_below`` (a plan bounded above the best step found is never simulated: the
    unpickling of big plans that were not needed cost seconds of a 70b search)."""
    summary, plan, keep = _plan_ship(job, cand, ship_below)
    return summary, plan if keep else None


def _plan_ship(job: Job, cand: Candidate, ship_below: float) -> tuple[PlanSummary, Plan | None, bool]:
    """Plan and bound; whether ``_plan_keep_task`` ships the plan back."""
    t0 = time.perf_counter()
    summary, plan = plan_summary(job, cand, build_topology(job.hw))
    keep = (plan is not None and summary.bounded and time.perf_counter() - t0 > SHIP_PLAN_AFTER_S
            and summary.bound_time_s is not None and summary.bound_time_s <= ship_below)
    return summary, plan, keep


def _plan_next_task(scratch: dict[Any, Any], job: Job, cand: Candidate, ship_below: float,
                    sim_below: tuple[float, int], ship_simulated: bool
                    ) -> tuple[PlanSummary, Plan | None, SimSummary | None]:
    """``_plan_keep_task`` in a worker process (``Workers.submit_scratch``) for the candidate the screened search
    builds next. Simulated in the same task when its (time bound, index) is below ``sim_below`` (the least key
    left in the search's queue and the best found: it is then the next one the search simulates, unless its plan
    duplicates another's or the budget stops it, when the simulation is dropped); the plan comes back with the
    simulation only when ``ship_simulated`` (the search keeps the best plan). Otherwise a bounded plan is kept in
    the worker's ``scratch`` for its simulation (``_sim_kept_task``), the KEEP_PLANS lowest bounds."""
    summary, plan, keep = _plan_ship(job, cand, ship_below)
    if plan is None or not summary.bounded or summary.bound_time_s is None:
        return summary, None, None
    if (summary.bound_time_s, cand.index) < sim_below:
        plan, r = simulate_job(job, cand.policy, cand.knob_dict, plan=plan, run=simulate_plan)
        sim = SimSummary.of(r)
        return summary, plan if ship_simulated else None, sim
    scratch[cand] = (summary.bound_time_s, plan)
    if len(scratch) > KEEP_PLANS:
        del scratch[max(scratch, key=lambda c: (scratch[c][0], c.index))]
    return summary, plan if keep else None, None


def _sim_kept_task(scratch: dict[Any, Any], job: Job, cand: Candidate, ship: bool) -> tuple[SimSummary, Plan | None]:
    """Simulate a candidate in a worker process (``Workers.submit_scratch``): its plan from the worker's scratch
    where ``_plan_next_task`` left it there, else built again; the plan comes back when ``ship``."""
    kept = scratch.pop(cand, None)
    plan, r = simulate_job(job, cand.policy, cand.knob_dict, plan=kept[1] if kept is not None else None,
                           run=simulate_plan)  # (this module's name: tests stand in a slow simulation)
    return SimSummary.of(r), plan if ship else None


def _sim_plan_task(plan: Plan, hw: HardwareSpec) -> SimSummary:
    """Simulate a plan built earlier, in a worker process."""
    return SimSummary.of(simulate_plan(plan, hw))


def _sim_task(job: Job, cand: Candidate) -> tuple[SimSummary, Plan]:
    """Plan and simulate in a worker process; the plan comes back (the search keeps the best one's, which
    is what --plan-out writes: a policy with a time-limited solver may not build the same plan twice)."""
    plan, r = simulate_job(job, cand.policy, cand.knob_dict, run=simulate_plan)
    return SimSummary.of(r), plan


# -- the state of one search ----------------------------------------------------------------------------
class _Search:
    """One search run: its inputs, what it knows per candidate (``summaries`` by candidate index), which
    candidates it skipped and why, and the plans / results it keeps in memory."""

    def __init__(self, hw: HardwareSpec, model: ModelSpec, base: JobRequest, config: SearchConfig,
                 cache: EvalCache | None, progress: Callable[[str], None] | None, t0: float, deadline: Deadline):
        self.hw, self.model, self.base, self.config = hw, model, base, config
        self.deadline = deadline
        self.cache = cache
        self.progress = progress
        self.t0 = t0
        self.topo = build_topology(hw)
        self.objective = Objective(config.objective, {p: self.topo.pools[p].kind for p in sorted(self.topo.pools)})
        self.jobs: dict[tuple[int, str], Job | Exception] = {}
        self.code = code_fingerprint() if cache is not None else ""
        self.hw_dict = hw.to_dict()
        self.model_dict = model.to_dict()
        self.summaries: dict[int, PlanSummary] = {}
        self.keys: dict[int, str] = {}
        self.skipped: dict[int, str] = {}
        self.cut: list[str] = []
        self.n_sims = 0  # simulations run (speculative parallel ones included)
        self.plans: dict[int, Plan] = {}  # built, not yet simulated (the KEEP_PLANS lowest bounds)
        self.plan_bound: dict[int, float] = {}
        self.sim_plans: dict[int, Plan] = {}
        self.results: dict[int, Result] = {}
        self.pool: Workers | None = None  # the worker of bounded_call, started on first use
        self.mem_screens: dict[int, PlanSummary | None] = {}

    def over_budget(self) -> bool:
        return self.deadline.expired()

    def wait_s(self) -> float:
        """How long to wait for a worker before looking at the deadline again."""
        return min(WAIT_STEP_S, self.deadline.left())

    def bounded_call(self, key: int, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        """``(True, fn(*args))`` from this search's one worker process, or ``(False, None)`` when the deadline
        passes first (the worker is stopped; another starts for the next call)."""
        if self.pool is None:
            self.pool = Workers(1)
        self.pool.submit(key, fn, *args)
        while True:
            got = self.pool.wait(timeout=self.wait_s())
            if got:
                return True, got[0][1]
            if self.over_budget():
                self.pool.cancel(key)
                return False, None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.stop()
            self.pool = None

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
                # rank templates (simulator.rank_template: the same figures and bounds at a cost independent of
                # the rank count) unless the best plan itself is kept (to write or export: the full plan)
                self.jobs[key] = dataclasses.replace(make_job(self.hw, self.model, req)[0],
                                                     rank_template=not self.config.keep_best_plan)
            except (WorkloadInputError, KnobError, HardwareInputError) as e:
                self.jobs[key] = e
        return self.jobs[key]

    def memory_screened(self, c: Candidate) -> PlanSummary | None:
        """``_memory_screened`` of a candidate with a valid workload, memoised (the screened search asks for it
        when the candidate comes up, and its speculation before that)."""
        if c.index not in self.mem_screens:
            self.mem_screens[c.index] = _memory_screened(self, c, self.ready_job(c))
        return self.mem_screens[c.index]

    def ready_job(self, cand: Candidate) -> Job:
        """The job of a candidate whose workload is known to be valid."""
        job = self.job(cand)
        assert not isinstance(job, Exception)
        return job

    def key(self, cand: Candidate, job: Job) -> str:
        return evaluation_key(self.hw_dict, self.model_dict, job.config.to_dict(), cand.policy, cand.knob_dict,
                              self.code)

    def cached(self, key: str) -> PlanSummary | None:
        got = self.cache.get(key, _summary_problem) if self.cache is not None else None
        return PlanSummary.from_dict(got) if got is not None else None

    def store(self, c: Candidate, summary: PlanSummary) -> None:
        self.summaries[c.index] = summary
        if self.cache is not None and c.index in self.keys:
            self.cache.put(self.keys[c.index], summary.to_dict())

    def store_sim(self, c: Candidate, sim: SimSummary) -> None:
        self.store(c, self.summaries[c.index].with_sim(sim))

    def sim_one(self, c: Candidate) -> tuple[Plan, Result]:
        """Simulate in this process (plan from phase 1, or rebuilt)."""
        job = self.ready_job(c)
        plan, r = simulate_job(job, c.policy, c.knob_dict, plan=self.plans.pop(c.index, None), run=simulate_plan)
        self.store_sim(c, SimSummary.of(r))
        return plan, r

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def cut_note(self, note: str) -> None:
        if note not in self.cut:
            self.cut.append(note)


def _summary_problem(d: dict[str, object]) -> str | None:
    """What makes a cache entry unusable as a PlanSummary (None: nothing)."""
    problem = entry_problem(d, PlanSummary)
    if problem is None and d["verdict"] not in ("rejected", "bounded"):
        problem = f"'verdict': {d['verdict']!r} is not rejected or bounded"
    return problem


def _planning_order(cands: list[Candidate], first_feasible: bool) -> list[Candidate]:
    """Round-robin over policies (a cut-short search still sees every policy); memory-frugal first
    (full checkpointing, small micro-batches) when looking for any feasible plan."""
    by_policy: dict[str, list[Candidate]] = {}
    for c in cands:
        by_policy.setdefault(c.policy, []).append(c)
    if first_feasible:
        for lst in by_policy.values():
            lst.sort(key=memory_frugal)
    out: list[Candidate] = []
    queues = list(by_policy.values())
    depth = max((len(q) for q in queues), default=0)
    for i in range(depth):
        out.extend(q[i] for q in queues if i < len(q))
    return out


# -- phase 1: plans and bounds ----------------------------------------------------------------------------
def _plan_label(summary: PlanSummary) -> str:
    return summary.reason or f"bound {summary.bound_time_s:.3g} s"


def _to_plan(s: _Search, order: list[Candidate], screen_memory: bool = True) -> list[Candidate]:
    """Record candidates with an invalid workload and those the cache answers (and, with ``screen_memory``, those
    the memory screen rejects); the rest, to be planned."""
    todo: list[Candidate] = []
    for c in order:
        job = s.job(c)
        if isinstance(job, Exception):
            s.summaries[c.index] = PlanSummary.rejected("workload: invalid", None, str(job))
            continue
        s.keys[c.index] = k = s.key(c, job)
        got = s.cached(k)
        if got is not None:
            s.summaries[c.index] = got
        elif screen_memory and (over := _memory_screened(s, c, job)) is not None:
            s.store(c, over)
        else:
            todo.append(c)
    return todo


def _memory_screened(s: _Search, c: Candidate, job: Job) -> PlanSummary | None:
    """The rejection of a candidate whose GPU must hold more than its capacity by the memory screen
    (``planner.screen.memory_screen``: its plan would be rejected too), without building it; else None."""
    got = memory_screen(job, c.policy, c.knob_dict)
    if got is None:
        return None
    need, what = got
    pool = s.topo.pool_of["gpu0"]
    cap = s.topo.pools[pool].capacity_bytes
    if need <= cap * (1 + MEMORY_SLACK):
        return None
    return PlanSummary.rejected(f"screen: {pool_label(s.topo, pool)}", pool,
                                f"{pool}: {what}; capacity {cap / 1e9:.1f} GB")


def _plan_parallel(s: _Search, todo: list[Candidate]) -> None:
    """Phase 1 in worker processes; each summary lands under its candidate's index (order-independent)."""
    by_index = {c.index: c for c in todo}
    with Workers(s.config.workers) as pool:
        for c in todo:
            pool.submit(c.index, _plan_task, s.ready_job(c), c)
        n = 0
        while pool.pending():
            for index, summary in pool.wait(timeout=s.wait_s()):
                c = by_index[index]
                s.store(c, summary)
                n += 1
                s.say(f"[plan {n}/{len(todo)}] {c.label()}: {_plan_label(summary)}")
            left = pool.pending()
            if left and s.over_budget():  # a cut search does not wait for plans in progress: stop them
                pool.stop()
                for index in left:
                    s.skipped[index] = "skipped: budget"
                s.cut.append(f"wall-time {s.deadline.describe()} reached while building plans; "
                             f"{len(left)} candidates not evaluated")
                return


def _sim_bounded(s: _Search, c: Candidate) -> tuple[Plan, bool] | None:
    """Simulate one candidate in a worker process, stopped at the deadline (None then)."""
    done, got = s.bounded_call(c.index, _sim_task, s.ready_job(c), c)
    if not done:
        return None
    sim, plan = got
    s.store_sim(c, sim)
    return plan, sim.feasible


def _plan_here(s: _Search, c: Candidate, i: int, n: int) -> None:
    summary, plan = plan_summary(s.ready_job(c), c, s.topo)
    s.store(c, summary)
    if plan is not None and summary.bounded:
        s.keep_plan(c.index, plan, s.objective.bound(summary))
    s.say(f"[plan {i + 1}/{n}] {c.label()}: {_plan_label(summary)}")


def _plan_sim_bounded(s: _Search, c: Candidate, i: int, n: int) -> bool:
    """first_feasible under a deadline: plan, bound and simulate ``c`` in a worker process, stopped at the
    deadline (False then; nothing is stored)."""
    cap = s.config.max_candidates
    done, got = s.bounded_call(c.index, _plan_sim_task, s.ready_job(c), c, cap is None or s.n_sims < cap)
    if not done:
        return False
    summary, plan = got
    s.store(c, summary)
    s.say(f"[plan {i + 1}/{n}] {c.label()}: {_plan_label(summary)}")
    if summary.sim is not None:
        s.n_sims += 1
        if plan is not None:
            s.sim_plans, s.results = {c.index: plan}, {}
    return True


def _cut_at_deadline(s: _Search, rest: list[Candidate]) -> None:
    for x in rest:
        s.skipped[x.index] = "skipped: budget"
    s.cut_note(f"wall-time {s.deadline.describe()} reached; the work in progress was stopped and "
               f"{len(rest)} candidates not evaluated")


def _first_feasible_step(s: _Search, c: Candidate, rest: list[Candidate]) -> bool:
    """first_feasible: simulate a bounded candidate; True once one is feasible (the rest are skipped)."""
    summary = s.summaries[c.index]
    if not summary.bounded:
        return False
    if summary.sim is None:
        if s.config.max_candidates is not None and s.n_sims >= s.config.max_candidates:
            s.skipped[c.index] = "skipped: max candidates"
            s.cut_note(f"simulated the maximum of {s.config.max_candidates} candidates")
            return False
        if s.deadline.bounded:  # a cached plan summary without its simulation: simulate in a worker
            done = _sim_bounded(s, c)
            if done is None:
                _cut_at_deadline(s, [c, *rest])
                return True
            plan_or_none, feasible = done
            if feasible and plan_or_none is not None:
                s.sim_plans, s.results = {c.index: plan_or_none}, {}
        else:
            plan, r = s.sim_one(c)
            if r.feasible:
                s.sim_plans, s.results = {c.index: plan}, {c.index: r}
        s.n_sims += 1
    sim = s.summaries[c.index].sim
    if sim is not None and sim.feasible:
        for x in rest:
            s.skipped[x.index] = "skipped: first feasible found"
        return True
    s.plans.pop(c.index, None)
    return False


def _plan_phase(s: _Search, cands: list[Candidate]) -> None:
    """Phase 1: plans and bounds (cheap), in round-robin order so that a budget cut leaves no policy out;
    with first_feasible, each bounded candidate is simulated as soon as it is planned."""
    first_feasible = s.config.first_feasible
    order = _planning_order(cands, first_feasible)
    todo = _to_plan(s, order, screen_memory=not first_feasible)  # first-feasible: as each comes up
    if (s.config.parallel and len(todo) > 1) or (s.deadline.bounded and not first_feasible and todo):
        _plan_parallel(s, todo)
    for i, c in enumerate(order):
        if c.index in s.skipped and (first_feasible or c.index not in s.summaries):
            continue
        if c.index not in s.summaries and first_feasible and (over := s.memory_screened(c)) is not None:
            s.store(c, over)
        if c.index not in s.summaries:
            if s.over_budget():
                rest = [x for x in order[i:] if x.index not in s.summaries]
                for x in rest:
                    s.skipped[x.index] = "skipped: budget"
                s.cut.append(f"wall-time {s.deadline.describe()} reached while building plans; "
                             f"{len(rest)} candidates not evaluated")
                break
            if first_feasible and s.deadline.bounded:
                if not _plan_sim_bounded(s, c, i, len(order)):
                    _cut_at_deadline(s, [x for x in order[i:] if x.index not in s.summaries])
                    break
            else:
                _plan_here(s, c, i, len(order))
        if first_feasible and _first_feasible_step(s, c, order[i + 1:]):
            break


# -- phase 2: best-first simulation of the survivors --------------------------------------------------------
def _survivors(s: _Search, cands: list[Candidate]) -> list[Candidate]:
    """Bounded candidates not skipped, without duplicate plans (an auto knob resolving to an explicit value's
    choice gives the same plan twice), in order of their objective bound, ties by enumeration order."""
    survivors = [c for c in cands if c.index in s.summaries and s.summaries[c.index].bounded
                 and c.index not in s.skipped]
    if not s.config.first_feasible:
        first_of: dict[str, int] = {}
        for c in survivors:
            fp = s.summaries[c.index].fingerprint
            if fp is not None and fp in first_of:
                s.skipped[c.index] = "duplicate plan"
            elif fp is not None:
                first_of[fp] = c.index
        survivors = [c for c in survivors if c.index not in s.skipped]
    return sorted(survivors, key=lambda c: (s.objective.bound(s.summaries[c.index]), c.index))


class _Frontier:
    """The best simulated candidate so far, and what the sequential rule prunes or skips because of it."""

    def __init__(self, s: _Search, survivors: list[Candidate]):
        self.s = s
        self.survivors = survivors
        self.lb = {c.index: s.objective.bound(s.summaries[c.index]) for c in survivors}
        self.best: tuple[float, int] | None = None

    def note(self, c: Candidate, plan: Plan | None = None, result: Result | None = None) -> None:
        v = self.s.objective.done_value(self.s.summaries[c.index])
        if v is not None and (self.best is None or (v, c.index) < self.best):
            self.best = (v, c.index)
            # keep the simulated plan (and Result) of the best so far only, for memory: the overall best is
            # the best of all simulated (a speculative extra simulation never beats the sequential rule's)
            self.s.sim_plans = {c.index: plan} if plan is not None else {}
            self.s.results = {c.index: result} if result is not None else {}

    def prunable(self, c: Candidate) -> bool:
        return self.s.config.prune and self.best is not None and (self.lb[c.index], c.index) > self.best

    def simulated(self, c: Candidate) -> bool:
        return self.s.summaries[c.index].sim is not None

    def budget_hit(self, i: int) -> bool:
        """Whether the simulation cap or the wall-time budget stops simulating at survivor ``i`` (then the
        rest that the rule would still simulate are skipped, and the outcome says it was cut short)."""
        s = self.s
        cap = s.config.max_candidates
        if cap is not None and s.n_sims >= cap:
            reason, note = "skipped: max candidates", f"simulated the maximum of {cap} candidates"
        elif s.over_budget():
            reason, note = "skipped: budget", f"wall-time {s.deadline.describe()} reached while simulating"
        else:
            return False
        for rest in self.survivors[i:]:
            if not self.simulated(rest) and not self.prunable(rest):
                s.skipped[rest.index] = reason
        s.cut.append(note)
        return True

    def announce(self, c: Candidate) -> None:
        self.s.say(f"[simulate] {c.label()} (bound {self.lb[c.index]:.4g})")


def _best_first(s: _Search, survivors: list[Candidate]) -> None:
    """Simulate survivors in bound order until the best simulated beats the next bound."""
    f = _Frontier(s, survivors)
    for c in survivors:  # cached simulations count as done
        if f.simulated(c):
            f.note(c)
    if s.config.workers > 1 or s.deadline.bounded:
        _best_first_parallel(f)
        return
    for i, c in enumerate(survivors):
        if f.prunable(c):
            break
        if f.simulated(c):
            f.note(c)
            continue
        if f.budget_hit(i):
            break
        f.announce(c)
        plan, r = s.sim_one(c)
        s.n_sims += 1
        f.note(c, plan, r)


def _next_to_simulate(f: _Frontier, i: int) -> int | None:
    """The position of the next survivor from ``i`` on that needs a simulation; None when none does (the
    rest is pruned, or the cap or budget is reached)."""
    survivors = f.survivors
    while i < len(survivors):
        c = survivors[i]
        if f.prunable(c):
            return None
        if not f.simulated(c):
            return None if f.budget_hit(i) else i
        i += 1
    return None


def _best_first_parallel(f: _Frontier) -> None:
    """Best-first with speculative simulations in worker processes; those the sequential rule prunes
    while they run are stopped, not waited for (one can take minutes)."""
    s, survivors = f.s, f.survivors
    by_index = {c.index: c for c in survivors}
    jobs = {c.index: s.ready_job(c) for c in survivors}
    with Workers(s.config.workers) as pool:
        i: int | None = 0
        while True:
            while i is not None and len(pool.running()) < s.config.workers:
                i = _next_to_simulate(f, i)
                if i is not None:
                    c = survivors[i]
                    f.announce(c)
                    pool.submit(c.index, _sim_task, jobs[c.index], c)
                    s.n_sims += 1
                    i += 1
            running = [by_index[k] for k in pool.running()]
            if not running or (i is None and all(f.prunable(c) for c in running)):
                return  # what still runs is speculative and the sequential rule prunes it: stopped on exit
            if s.over_budget():  # the promise: stop what runs (on exit) and say so
                stopped = [c for c in running if not f.prunable(c)]
                for c in stopped:
                    s.skipped[c.index] = "skipped: budget"
                s.cut_note(f"wall-time {s.deadline.describe()} reached while simulating; "
                           f"{len(stopped)} simulations in progress stopped")
                return
            for index, (sim, plan) in pool.wait(timeout=s.wait_s()):
                c = by_index[index]
                s.store_sim(c, sim)
                f.note(c, plan)


# -- screened best-first: plans built lazily in screen order ---------------------------------------------------
SCREENED_OUT = "screen: slower than best"


def _screened(config: SearchConfig) -> bool:
    """Whether the search builds plans lazily in screen order (``planner.screen``): a pruned search for
    step time (tokens_per_s). Memory objectives, first_feasible and the exhaustive search build every plan."""
    return config.prune and not config.first_feasible and config.objective == "tokens_per_s"


class _Lazy:
    """The queue of the screened search: (key, index, planned) with key = the screen until the plan is built,
    then the plan's bound (never lower: the screen is a lower bound of it), so keys pop in order."""

    def __init__(self, s: _Search, cands: list[Candidate]):
        self.s = s
        self.cands = {c.index: c for c in cands}
        self.heap: list[tuple[float, int, bool]] = []
        self.best: tuple[float, int] | None = None
        self.first_of: dict[str, int] = {}  # plan fingerprint -> the lowest index planned with it
        self.n_built = 0  # plans built so far (progress)
        self.least_bound = float("inf")  # the least time bound of a plan built so far
        self.screener = Screener()
        self.termed: dict[int, float] = {}  # unbuilt candidates' keys once their policy's terms are counted

    def ship_below(self) -> float:
        """The time bound above which a plan built in a worker stays there (``_plan_keep_task``): above the best
        step found it is never simulated, and one more than SHIP_MARGIN above the least bound built so far is
        unlikely to be (if it is, its simulation builds it again, as an evicted kept plan is)."""
        best = self.best[0] if self.best is not None else float("inf")
        return min(best, self.least_bound * SHIP_MARGIN)

    def next_key(self) -> tuple[float, int]:
        """The least (key, index) left in the queue, or the best found if less: a plan built now whose (bound,
        index) is below it is the next one the search simulates (``_plan_next_task``)."""
        least = (self.heap[0][0], self.heap[0][1]) if self.heap else (float("inf"), -1)
        return min(least, self.best) if self.best is not None else least

    def push(self, key: float, index: int, planned: bool) -> None:
        heapq.heappush(self.heap, (key, index, planned))

    def raise_by_terms(self, index: int, key: float) -> bool:
        """The policy's time terms of an unbuilt candidate (``planner.screen_terms``), computed once when its
        compute screen ``key`` comes up (or a worker would build it ahead); True when they exceed the key: the
        candidate is queued again under them (a lower bound of its plan's bound too), the old entry goes stale."""
        if index in self.termed:
            return False
        c = self.cands[index]
        term = self.screener.term(self.s.ready_job(c), c.policy, c.knob_dict).time_s
        self.termed[index] = max(term, key)
        if term > key:
            self.push(term, index, False)
            return True
        return False

    def stale(self, key: float, index: int, planned: bool) -> bool:
        """An unbuilt candidate's entry below the key its terms raised it to (it waits under that one too)."""
        return not planned and key < self.termed.get(index, key)

    def note(self, index: int, plan: Plan | None, result: Result | None) -> None:
        v = self.s.objective.done_value(self.s.summaries[index])
        if v is not None and (self.best is None or (v, index) < self.best):
            self.best = (v, index)
            self.s.sim_plans = {index: plan} if plan is not None else {}
            self.s.results = {index: result} if result is not None else {}

    def planned(self, c: Candidate) -> None:
        """A built plan: queue it by its bound, unless a lower-index candidate has the same plan (the
        enumeration's first of equal plans is the one kept, as in the exhaustive search)."""
        s = self.s
        summary = s.summaries[c.index]
        if not summary.bounded:
            return
        fp = summary.fingerprint
        other = self.first_of.get(fp) if fp is not None else None
        if other is not None and other < c.index:
            s.skipped[c.index] = "duplicate plan"
            s.plans.pop(c.index, None)
            return
        if fp is not None:
            self.first_of[fp] = c.index
        if other is not None:  # c comes first: it takes over the other's place (and its simulation)
            s.skipped[other] = "duplicate plan"
            s.plans.pop(other, None)
            done = s.summaries[other].sim
            if done is not None:
                s.store_sim(c, done)
                if self.best is not None and self.best[1] == other:
                    self.best = None
                self.note(c.index, s.sim_plans.get(other), s.results.get(other))
        if summary.bound_time_s is not None:
            self.least_bound = min(self.least_bound, summary.bound_time_s)
        self.push(s.objective.bound(s.summaries[c.index]), c.index, True)

    def cut(self, reason: str, note: str, key: float, index: int, planned: bool) -> None:
        """The cap or the budget stops the search: what the rule would still look at is skipped."""
        for k, i, p in [(key, index, planned), *self.heap]:
            if i in self.s.skipped or (p and self.s.summaries[i].sim is not None):
                continue
            k = k if p else max(k, self.termed.get(i, k))  # an unbuilt one waits under its terms' key
            if self.best is None or (k, i) <= self.best:
                self.s.skipped[i] = reason
            elif not p:
                self.s.skipped[i] = SCREENED_OUT
        self.heap = []
        self.s.cut_note(note)

    def stop_reason(self, planned: bool) -> tuple[str, str] | None:
        """Why the search stops before its next step (simulating ``planned`` or building a plan), if it does."""
        s = self.s
        cap = s.config.max_candidates
        if cap is not None and s.n_sims >= cap:
            return "skipped: max candidates", f"simulated the maximum of {cap} candidates"
        if s.over_budget():
            return "skipped: budget", (f"wall-time {s.deadline.describe()} reached while "
                                       f"{'simulating' if planned else 'building plans'}")
        return None


class _Runner:
    """Where the screened search builds plans and simulates under a deadline or with ``workers > 1``: in
    worker processes, stopped at the deadline. Idle workers build the next unbuilt candidates in key order
    ahead of need (speculatively); a result is used only when the sequential search asks for it, so the
    outcome is the sequential one whatever the worker count (a speculative plan it never asks for is
    dropped). Task keys: a candidate's index for its plan, ``-(index + 1)`` for its simulation."""

    def __init__(self, s: _Search, lz: _Lazy):
        self.s, self.lz = s, lz
        self.n = max(1, s.config.workers)
        self.pool: Workers | None = None
        self.done: dict[int, Any] = {}
        self.submitted: set[int] = set()

    @property
    def parallel(self) -> bool:
        return self.s.deadline.bounded or self.s.config.workers > 1

    def call(self, key: int, fn: Callable[..., Any], *args: Any, scratch: bool = False) -> tuple[bool, Any]:
        """``(True, fn(*args))`` from a worker (or from a speculative run of it), ``(False, None)`` when the
        deadline passes first (the workers are stopped). ``scratch``: ``fn(worker's scratch, *args)``."""
        if key in self.done:
            return True, self.done.pop(key)
        if self.pool is None:
            self.pool = Workers(self.n)
        if key not in self.submitted:
            (self.pool.submit_scratch if scratch else self.pool.submit)(key, fn, *args)
            self.submitted.add(key)
        while True:
            self.speculate()
            for k, v in self.pool.wait(timeout=self.s.wait_s()):
                self.submitted.discard(k)
                self.done[k] = v
            if key in self.done:
                return True, self.done.pop(key)
            if self.s.over_budget():
                self.close()
                return False, None

    def speculate(self) -> None:
        """Fill idle workers with the plans of the next unbuilt candidates in key order (not pruned yet)."""
        assert self.pool is not None
        s, lz = self.s, self.lz
        free = self.n - len(self.pool.pending())
        if free <= 0:
            return
        for key, index, planned in sorted(lz.heap):
            if free <= 0 or (lz.best is not None and (key, index) > lz.best):
                return
            if planned or index in s.skipped or index in self.submitted or index in self.done:
                continue
            if lz.stale(key, index, planned) or s.memory_screened(lz.cands[index]) is not None:
                continue  # waits under a higher key, or rejected unbuilt when it comes up
            if lz.raise_by_terms(index, key):
                continue
            self.pool.submit(index, _plan_keep_task, s.ready_job(lz.cands[index]), lz.cands[index], lz.ship_below())
            self.submitted.add(index)
            free -= 1

    def close(self) -> None:
        if self.pool is not None:
            self.pool.stop()
            self.pool = None
        self.submitted.clear()


def _screen_plan(s: _Search, run: _Runner, c: Candidate) -> bool:
    """Build, bound and record ``c``'s plan (in a worker process under a deadline or with workers); False at
    the deadline."""
    if run.parallel:
        # one worker keeps its plans in its scratch: nothing to ship back for the simulation
        ship_below = run.lz.ship_below() if run.n > 1 else -float("inf")
        done, got = run.call(c.index, _plan_next_task, s.ready_job(c), c, ship_below, run.lz.next_key(),
                             s.config.keep_best_plan, scratch=True)
        if not done:
            return False
        summary, plan, *sim = got  # a speculative build (``_plan_keep_task``) has no simulation
        s.store(c, summary)
        if sim and sim[0] is not None:  # simulated with its plan: kept until the search asks for it
            run.done[-(c.index + 1)] = (sim[0], plan)
        elif plan is not None:
            s.keep_plan(c.index, plan, s.objective.bound(summary))
    else:
        summary, plan = plan_summary(s.ready_job(c), c, s.topo)
        s.store(c, summary)
        if plan is not None and summary.bounded:
            s.keep_plan(c.index, plan, s.objective.bound(summary))
    run.lz.n_built += 1
    s.say(f"[plan {run.lz.n_built}/{len(run.lz.cands)}] {c.label()}: {_plan_label(summary)}")
    return True


def _screen_simulate(s: _Search, run: _Runner, lz: _Lazy, c: Candidate) -> bool:
    """Simulate ``c`` (in a worker process under a deadline or with workers); False at the deadline."""
    s.say(f"[simulate] {c.label()} (bound {s.objective.bound(s.summaries[c.index]):.4g})")
    if run.parallel and c.index in s.plans and run.n > 1:  # built before, kept: simulated without building it again
        plan = s.plans.pop(c.index)
        done, sim = run.call(-(c.index + 1), _sim_plan_task, plan, s.hw)
        if not done:
            return False
        s.store_sim(c, sim)
        s.n_sims += 1
        lz.note(c.index, plan, None)
    elif run.parallel:  # simulated where it was built (``_plan_next_task``), or from the worker's scratch
        s.plans.pop(c.index, None)
        done, got = run.call(-(c.index + 1), _sim_kept_task, s.ready_job(c), c, s.config.keep_best_plan,
                             scratch=True)
        if not done:
            return False
        sim, plan = got
        s.store_sim(c, sim)
        s.n_sims += 1
        lz.note(c.index, plan, None)
    else:
        plan, r = s.sim_one(c)
        s.n_sims += 1
        lz.note(c.index, plan, r)
    return True


def _screened_search(s: _Search, cands: list[Candidate]) -> None:
    """Best-first over screens and plan bounds: pop the lowest key; an unbuilt candidate gets its plan built
    and comes back with its plan bound, a built one is simulated; stop once the best simulated is at least
    as good as the lowest key (every candidate left, built or not, is pruned: its step time is at least its
    key). The same best as the exhaustive search, because screen <= plan bound <= simulated."""
    lz = _Lazy(s, cands)
    run = _Runner(s, lz)
    try:
        _screened_loop(s, lz, run, cands)
    finally:
        run.close()


def _screened_loop(s: _Search, lz: _Lazy, run: _Runner, cands: list[Candidate]) -> None:
    screener = lz.screener
    for c in _to_plan(s, cands, screen_memory=False):  # memory screens when a candidate comes up (module doc)
        lz.push(screener.compute(s.ready_job(c), c.policy).time_s, c.index, False)
    for c in cands:  # answered by the cache
        if c.index in s.summaries and s.summaries[c.index].bounded:
            lz.planned(c)
            if s.summaries[c.index].sim is not None and c.index not in s.skipped:
                lz.note(c.index, None, None)
    while lz.heap:
        key, index, planned = heapq.heappop(lz.heap)
        if index in s.skipped:
            continue
        if lz.best is not None and (key, index) > lz.best:  # a built plan left reads as the bound's pruning
            for _, i, p in [(key, index, planned), *lz.heap]:
                if not p and i not in s.skipped:
                    s.skipped[i] = SCREENED_OUT
            return
        c = lz.cands[index]
        if lz.stale(key, index, planned):
            continue
        if planned and s.summaries[index].sim is not None:
            lz.note(index, None, None)
            continue
        stop = lz.stop_reason(planned)
        if stop is not None:
            lz.cut(*stop, key, index, planned)
            return
        if not planned:
            if (over := s.memory_screened(c)) is not None:
                s.store(c, over)
                continue
            if lz.raise_by_terms(index, key):
                continue
            if not _screen_plan(s, run, c):
                lz.cut("skipped: budget", f"wall-time {s.deadline.describe()} reached while building plans",
                       key, index, planned)
                return
            lz.planned(c)
        elif not _screen_simulate(s, run, lz, c):
            lz.cut("skipped: budget", f"wall-time {s.deadline.describe()} reached while simulating",
                   key, index, planned)
            return


# -- the outcome: the sequential rule over what is known ----------------------------------------------------
def _counted(s: _Search, cands: list[Candidate]) -> set[int]:
    """The candidates the sequential rule simulates (a speculative extra simulation is not one of them)."""
    summaries = s.summaries
    if s.config.first_feasible:
        return {c.index for c in cands if c.index in summaries and summaries[c.index].sim is not None
                and c.index not in s.skipped}
    bounded = [c for c in cands if c.index in summaries and summaries[c.index].bounded]
    lb = {c.index: s.objective.bound(summaries[c.index]) for c in bounded}
    best: tuple[float, int] | None = None
    counted: set[int] = set()
    for c in sorted(bounded, key=lambda c: (lb[c.index], c.index)):
        if c.index in s.skipped or summaries[c.index].sim is None:
            continue
        if s.config.prune and best is not None and (lb[c.index], c.index) > best:
            break
        counted.add(c.index)
        v = s.objective.done_value(summaries[c.index])
        if v is not None and (best is None or (v, c.index) < best):
            best = (v, c.index)
    return counted


def _evaluated(s: _Search, c: Candidate, counted: set[int]) -> Evaluated:
    e = Evaluated(c.index, c.policy, c.knob_dict, dataclasses.replace(
        s.base, micro_batch=c.micro_batch, checkpointing=c.checkpointing))
    summ = s.summaries.get(c.index)
    if summ is not None:
        e.reason, e.binding, e.message = summ.reason, summ.binding, summ.message
        if summ.bound_time_s is not None:
            e.bound_time_s, e.bound_resource = summ.bound_time_s, summ.bound_resource
            e.bound_memory_bytes, e.capacity_bytes = dict(summ.bound_memory_bytes), dict(summ.capacity_bytes)
    if c.index in s.skipped:
        e.reason = s.skipped[c.index]
    elif c.index in counted and summ is not None and summ.sim is not None:
        sim = summ.sim
        e.simulated, e.feasible = True, sim.feasible
        e.reason, e.binding, e.message = sim.reason, sim.binding, sim.message
        e.step_time_s, e.tokens_per_s, e.tflops_per_gpu = sim.step_time_s, sim.tokens_per_s, sim.tflops_per_gpu
        e.peak_bytes, e.capacity_bytes = dict(sim.peak_bytes), dict(sim.capacity_bytes)
        e.result = s.results.get(c.index)
        e.plan = s.sim_plans.get(c.index)
    elif summ is not None and summ.bounded:
        e.reason = s.objective.pruned_reason
    return e


def _outcome(s: _Search, cands: list[Candidate], assumed: list[str], workload: dict[str, object]) -> SearchOutcome:
    """Which candidates the sequential rule simulates, prunes and ranks, whatever ran in parallel."""
    counted = _counted(s, cands)
    evaluated = [_evaluated(s, c, counted) for c in cands]
    obj = s.objective

    def rank(e: Evaluated) -> tuple[float, int]:
        sim = s.summaries[e.index].sim
        assert sim is not None
        return obj.value(sim), e.index

    ranked = sorted((e for e in evaluated if e.simulated and e.feasible), key=rank)
    best_e = ranked[0] if ranked else None
    if best_e is not None and s.config.keep_best_plan and best_e.plan is None:
        best_e.plan = make_plan(s.ready_job(cands[best_e.index]), best_e.policy, best_e.knobs)
    for e in evaluated:  # keep only the best's plan and result in memory
        if e is not best_e:
            e.plan = e.result = None
    rejected: dict[str, int] = {}
    for e in evaluated:
        if e.reason is not None:
            rejected[e.reason] = rejected.get(e.reason, 0) + 1
    kinds = dict(obj.pool_kinds)
    pareto = pareto_front(ranked, lambda e: (-(e.tokens_per_s or 0.0), e.peak_of(GPU_KINDS, kinds),
                                             e.peak_of(CPU_KINDS, kinds)))
    n_pruned = sum(1 for e in evaluated if not e.simulated and e.reason is not None
                   and not e.reason.startswith("skipped"))
    return SearchOutcome(
        objective=obj.name, hardware=s.hw.name, model=s.model.name, workload=workload, assumed=assumed,
        best=best_e, ranked=ranked, rejected=dict(sorted(rejected.items())), pareto=pareto, evaluated=evaluated,
        n_candidates=len(cands), n_pruned=n_pruned, n_simulated=len(counted),
        cut_short="; ".join(s.cut) if s.cut else None, pool_kinds=kinds, wall_s=time.perf_counter() - s.t0,
        cache_hits=s.cache.hits if s.cache else 0, cache_misses=s.cache.misses if s.cache else 0,
        n_extra_simulated=max(0, s.n_sims - len(counted)))


def search(hw: str | HardwareSpec, model: str | ModelSpec, *, request: JobRequest | None = None,
           hw_overrides: Sequence[str] = (), objective: str = "tokens_per_s", policies: Sequence[str] | None = None,
           budget_s: float | None = None, max_candidates: int | None = None, first_feasible: bool = False,
           progress: Callable[[str], None] | None = None, cache: EvalCache | None = None,
           workers: int = 1, keep_best_plan: bool = False, prune: bool = True,
           knobs: Sequence[str] = (), deadline: Deadline | None = None) -> SearchOutcome:
    """Search policies x knobs x micro-batch x checkpointing for ``objective``; see the module docstring.
    ``knobs`` (``name=value``) fix knobs of the policies that declare them (``candidates.fixed_knobs``).
    ``deadline`` (with ``budget_s``, whichever ends first) is the wall-clock promise."""
    t0 = time.perf_counter()
    config = SearchConfig(objective, budget_s, max_candidates, first_feasible, workers, keep_best_plan, prune)
    limit = deadline.within(budget_s) if deadline is not None else Deadline.after(budget_s)
    spec = resolve_hardware(hw, hw_overrides)
    m = model if isinstance(model, ModelSpec) else load_model(model)
    req = request or JobRequest()
    # the defaults a job would pick with micro-batch 1 fix the global batch for every candidate
    job0, assumed = make_job(spec, m, dataclasses.replace(req, micro_batch=req.micro_batch or 1,
                                                          checkpointing=req.checkpointing or "full"))
    c0 = job0.config
    assert c0.global_batch is not None  # WorkloadConfig fills it in on construction
    base = JobRequest(micro_batch=req.micro_batch, seq_len=c0.seq_len, global_batch=c0.global_batch,
                      precision=c0.precision, checkpointing=req.checkpointing, flash_attention=c0.flash_attention,
                      checkpoint_early_stop=req.checkpoint_early_stop)
    assumed = [a for a in assumed if not a.startswith(("micro_batch=", "checkpointing="))]
    names = list(policies) if policies else list(POLICIES)
    cands = list(enumerate_candidates(names, spec.gpu.count, c0.global_batch, micro_batch=req.micro_batch,
                                      checkpointing=req.checkpointing, knobs=knobs))
    s = _Search(spec, m, base, config, cache, progress, t0, limit)
    try:
        if _screened(config):
            _screened_search(s, cands)
        else:
            _plan_phase(s, cands)
            survivors = _survivors(s, cands)
            if not first_feasible and survivors:
                _best_first(s, survivors)
    finally:
        s.close()
    return _outcome(s, cands, assumed, c0.to_dict())
