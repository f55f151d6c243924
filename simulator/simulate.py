"""Plan -> Result, with steady-state extrapolation of long runs of identical iterations.

Gradient accumulation makes a step a long run of identical micro-steps, which an event simulator would
otherwise grind through one by one. Two devices keep that cheap, and the result says which were used
(``sim.method``):

- warm-up steps (every step but the last, measured one) run each repeated segment (the micro-steps)
  once: they only have to leave the measured step in its steady state (parameters updated and
  uploaded, the previous iteration's tasks done); the measured step runs from the end of the previous
  step to its own end;
- a segment repeated more than ``EXPLICIT_MAX`` times is simulated with 1, 2 and 3 repeats; if the step
  time, bytes per link and compute time grow by the same amount from 1 to 2 as from 2 to 3 (and the
  peak memory is the same), every additive figure is extrapolated linearly to the real count and the
  peaks are the steady state's; and every stream of the segment must start its last iteration exactly
  one period after its previous one (a stream running ahead of the others drifts: its backlog or memory
  grows with the repeat count, which two aggregate increments cannot see). If not, 4 repeats are tried
  against 2 and 3; if that fails too, the plan is simulated whole;
- both shortcuts need the previous step to be over before the measured step's repeated segment starts
  its second iteration. Where consecutive steps overlap for longer (a delayed parameter update's CPU
  optimizer beside the next step's micro-steps) the step time is a max() of regimes, a few iterations
  say nothing about many, and a shortened warm-up changes the interaction: such plans are simulated
  whole, every step in full.

``extrapolate=False`` simulates every iteration of every step.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

from costs import both_ways_bw
from hardware_models import HardwareSpec, Topology, build_topology
from simulator.engine import RawRun, plan_symmetry, run_plan
from simulator.errors import TemplateRefused
from simulator.gc_pause import no_cyclic_gc
from simulator.plan import Plan
from simulator.result import (
    Result,
    SimInfo,
    StepMetrics,
    build_result,
    diff_metrics,
    scale_metrics,
    step_metrics,
    with_hardware_flops,
)
from simulator.symmetry import Symmetry

EXPLICIT_MAX = 6
STEADY_FROM = 1  # first repeat count tried; falls back to later ones when the ends of the run are not periodic
WARMUP_REPEAT = 1
_REL_TOL = 1e-6


def _close(a: StepMetrics, b: StepMetrics, scale: float) -> bool:
    tol = _REL_TOL * max(scale, 1e-12)
    if abs(a.step_time_s - b.step_time_s) > tol or abs(a.compute_busy_s - b.compute_busy_s) > tol:
        return False
    keys = set(a.link_bytes) | set(b.link_bytes)
    return all(abs(a.link_bytes.get(k, 0.0) - b.link_bytes.get(k, 0.0))
               <= _REL_TOL * max(1.0, abs(a.link_bytes.get(k, 0.0))) for k in keys)


def _tail_reaches(plan: Plan, raw: RawRun, seg: str, iteration: int) -> bool:
    """Does the previous step still run when the measured step's ``seg`` starts ``iteration``?"""
    last = plan.steps - 1
    if last < 1:
        return False
    si = [s.name for s in plan.segments].index(seg)
    starts = [r.start for r in raw.records if r.step == last and r.segment == si and r.iteration == iteration]
    return bool(starts) and raw.step_end.get(last - 1, 0.0) > min(starts) + 1e-12


def _peaks(raw: RawRun) -> dict[str, float]:
    return {k: v.peak for k, v in raw.memory.pools.items()}


class _Runner:
    def __init__(self, plan: Plan, hw: HardwareSpec, topology: Topology | None, warmup: int | None,
                 symmetry: Symmetry | None = None):
        self.plan, self.hw, self.topology, self.warmup = plan, hw, topology, warmup
        self.symmetry = symmetry
        self.events = 0
        self.wall = 0.0
        self.tasks = 0
        self._cache: dict[tuple, tuple[Plan, RawRun, StepMetrics]] = {}

    def run(self, counts: dict[str, int]) -> tuple[Plan, RawRun, StepMetrics]:
        key = (self.warmup, tuple(sorted(counts.items())))
        if key not in self._cache:
            p = self.plan.with_repeats(counts) if counts else self.plan
            raw = run_plan(p, self.hw, self.topology, self.warmup, self.symmetry)
            self.events += raw.events
            self.wall += raw.wall_s
            self.tasks += len(raw.records)
            self._cache[key] = (p, raw, step_metrics(p, raw))
        return self._cache[key]

    def info(self, method: str) -> SimInfo:
        return SimInfo(self.events, self.wall, method, self.tasks,
                       self.symmetry.describe() if self.symmetry is not None else "")


def _simulate(plan: Plan, hw: HardwareSpec, *, extrapolate: bool = True,
              topology: Topology | None = None, symmetry: Symmetry | None = None) -> Result:
    warm = WARMUP_REPEAT if extrapolate and plan.steps > 1 else None
    runner = _Runner(plan, hw, topology, warm, symmetry)
    warm_note = (f"warm-up steps with {WARMUP_REPEAT} iteration per repeated segment"
                 if warm is not None and any(s.repeat > 1 for s in plan.segments) else "")
    repeated = [s.name for s in plan.segments if s.repeat > 1]
    long_segs = [s for s in plan.segments if s.repeat > EXPLICIT_MAX] if extrapolate else []
    first = runner.run({s.name: min(s.repeat, 2) for s in long_segs})
    if warm is not None and any(_tail_reaches(first[0], first[1], name, 1) for name in repeated):
        # a shortened warm-up is only safe when the previous step is over before the measured step's
        # repeated segment starts its second iteration; otherwise the steps interact (a delayed update)
        runner.warmup = None
        p, raw, m = runner.run({})
        return build_result(p, hw, raw, m, runner.info(
            "full (consecutive steps overlap beyond one iteration of a repeated segment, so neither a "
            "shortened warm-up nor extrapolation is safe)"))
    if not long_segs:
        p, raw, m = first
        return build_result(p, hw, raw, m, runner.info("full" + (f" ({warm_note})" if warm_note else "")))
    counts = {s.name: STEADY_FROM for s in long_segs}
    base = runner.run(counts)
    deltas: list[tuple[int, StepMetrics]] = []
    last = base
    how = []
    for s in long_segs:
        found = _steady(runner, counts, s.name, base)
        if found is None:
            p, raw, m = runner.run({})
            return build_result(p, hw, raw, m, runner.info(
                f"full (no steady state within {STEADY_FROM + 3} iterations of a repeated segment"
                + (f"; {warm_note})" if warm_note else ")")))
        k, delta, at_k, last = found
        deltas.append((s.repeat - k, delta))
        # the base run has this segment at STEADY_FROM repeats: add what the iterations up to k added
        deltas.append((1, diff_metrics(at_k, base[2])))
        counts = {**counts, s.name: STEADY_FROM}
        how.append(f"{s.name} x{s.repeat} from {k}..{k + 1}")
    p, raw, last_metrics = last
    # additive figures extrapolated; the window stays that of the simulated run the records come from
    metrics = replace(scale_metrics(base[2], deltas), window=last_metrics.window)
    method = f"extrapolated ({', '.join(how)} simulated; steady-state period verified" + (
        f"; {warm_note})" if warm_note else ")")
    return build_result(p, hw, raw, metrics, runner.info(method))


def _steady(runner: _Runner, counts: dict[str, int], seg: str,
            base: tuple[Plan, RawRun, StepMetrics]) -> tuple[int, StepMetrics, StepMetrics, tuple] | None:
    """Find k where the segment's per-iteration increment is stable: (k, increment, metrics at k, run at k+1)."""
    runs = [base]
    for n in range(STEADY_FROM + 1, STEADY_FROM + 4):
        runs.append(runner.run({**counts, seg: n}))
        if len(runs) < 3:
            continue
        a, b, c = runs[-3], runs[-2], runs[-1]
        d1, d2 = diff_metrics(b[2], a[2]), diff_metrics(c[2], b[2])
        pb, pc = _peaks(b[1]), _peaks(c[1])
        same_peaks = all(abs(pb[x] - pc[x]) <= 1e-6 * max(1.0, pc[x]) for x in pc)
        same_oom = bool(b[1].memory.ooms) == bool(c[1].memory.ooms)
        if _close(d1, d2, base[2].step_time_s) and same_peaks and same_oom and \
                _lockstep(c[0], c[1], seg, d2.step_time_s, base[2].step_time_s):
            k = n - 1  # metrics(R) = metrics(k) + (R - k) * d2
            return k, d2, b[2], c
    return None


def _lockstep(plan: Plan, raw: RawRun, seg: str, period: float, scale: float) -> bool:
    """Does every stream of the repeated segment advance by exactly one period per iteration?

    A stream that runs ahead of the others (nothing holds it back) drifts: its backlog, memory or a
    later change of bottleneck grows with the repeat count, which two aggregate increments cannot see.
    """
    last = plan.steps - 1
    si = [s.name for s in plan.segments].index(seg)
    n = plan.segments[si].repeat
    if n < 2:
        return True
    first: dict[tuple[str, int], float] = {}
    for r in raw.records:
        if r.step == last and r.segment == si and r.iteration >= n - 2:
            key = (r.stream, r.iteration)
            first[key] = min(first.get(key, r.start), r.start)
    tol = _REL_TOL * max(scale, 1e-12)
    for (stream, it), t in first.items():
        if it == n - 1 and (stream, n - 2) in first and abs(t - first[(stream, n - 2)] - period) > tol:
            return False
    return True


MAX_EXTRA_STEPS = 6
CHECK_ENV = "TIERSIM_CHECK_INVARIANTS"  # "1": check the invariants after every simulation (the test suite sets it)


def physically_possible(result: Result) -> bool:
    """Could a steady state really repeat with this period? Every stream of a step fits in it, and every
    link can carry the step's bytes in it. A period that fails this was measured before the steps
    settled (the previous step still ran inside the measured one's window)."""
    st = result.step_time_s * (1 + 1e-9) + 1e-12
    if any(busy > st for busy in result.stream_busy_s.values()):
        return False
    topo = result.topology
    if topo is None:
        return True
    for ln, nbytes in result.link_bytes.items():
        link = topo.links[ln]
        cap = both_ways_bw(link)
        if nbytes / cap > st:
            return False
    return True


def simulate_plan(plan: Plan, hw: HardwareSpec, *, extrapolate: bool = True,
                  topology: Topology | None = None, symmetric: bool = True) -> Result:
    """Simulate ``plan`` on ``hw`` and return the Result of its measured step.

    The measured step is the plan's last one. If its period is shorter than its own streams or links
    need, it was cut short by an end effect: nothing came after it to contend with its tail (a delayed
    update's optimizer overlaps the next step), or the steps had not settled. Then the plan is simulated
    whole with a trailing step after the measured one and more warm-up steps, until two consecutive
    two-step mean periods agree and the period is physically possible; the result says so.

    ``symmetric``: where the ranks provably run the same tasks, simulate one representative rank with
    the others' load on shared resources accounted (``simulator.symmetry``: identical figures, a cost
    independent of the GPU count); ``False`` simulates every rank.
    """
    # the collector is paused for the whole call (simulator.gc_pause): with a large plan alive, every collection
    # its allocations trigger walks the plan's million objects (half a second at 1024 GPUs in the topology alone)
    with no_cyclic_gc():
        if topology is None:  # built once for every run below (a large machine's topology is not free)
            topology = build_topology(hw)
        sym = plan_symmetry(plan, hw, topology) if symmetric or plan.template is not None else None
        if plan.template is not None and not isinstance(sym, Symmetry):
            raise TemplateRefused(f"the rank template of {plan.template.ranks} ranks does not simulate as one rank "
                                  f"({sym}); build the full plan (make_plan without template)")
        result = with_hardware_flops(_settled(plan, hw, extrapolate, topology,
                                              sym if isinstance(sym, Symmetry) else None), plan, hw)
    if os.environ.get(CHECK_ENV) == "1":
        from simulator.invariants import check_invariants

        bad = check_invariants(result)
        if bad:
            raise AssertionError(f"simulator invariants violated ({CHECK_ENV}=1): " + "; ".join(bad[:5]))
    return result


def step_seconds(plan: Plan, hw: HardwareSpec) -> float:
    """Simulated seconds per step of ``plan`` on ``hw``; ``inf`` when it does not fit (what a policy's
    ``refine`` hook prices alternatives with: ``policies.job.make_plan``)."""
    res = simulate_plan(plan, hw)
    return res.step_time_s if res.feasible else math.inf


def _settled(plan: Plan, hw: HardwareSpec, extrapolate: bool, topology: Topology | None,
             symmetry: Symmetry | None = None) -> Result:
    result = _simulate(plan, hw, extrapolate=extrapolate, topology=topology, symmetry=symmetry)
    if physically_possible(result):
        return result
    prev = None
    sym_note = symmetry.describe() if symmetry is not None else ""
    events, wall, tasks = result.sim.events, result.sim.wall_s, result.sim.simulated_tasks
    res = result
    for extra in range(2, MAX_EXTRA_STEPS + 1):
        longer = replace(plan, steps=plan.steps + extra)
        raw = run_plan(longer, hw, topology, None, symmetry)
        measured = longer.steps - 2  # the last step only trails, to contend with the measured one's tail
        m = step_metrics(longer, raw, measured)
        # the period over the measured step and its predecessor: steady states that alternate between two
        # step lengths (two streams taking turns on a link) have a stable two-step mean
        ends = raw.step_end
        period = (ends[measured] - ends[measured - 2]) / 2
        m = replace(m, step_time_s=period)
        events, wall, tasks = events + raw.events, wall + raw.wall_s, tasks + len(raw.records)
        res = build_result(longer, hw, raw, m, SimInfo(events, wall, "", tasks, sym_note), measured)
        stable = prev is not None and abs(period - prev) <= _REL_TOL * max(period, 1e-12)
        if stable and physically_possible(res):
            return replace(res, sim=SimInfo(events, wall, f"full with {longer.steps} steps, measuring steps "
                                            f"{measured}-{measured + 1} (the plan's last step ended early: "
                                            "nothing contended with its tail)", tasks, sym_note))
        prev = period
    return replace(res, sim=SimInfo(events, wall, f"full with {plan.steps + MAX_EXTRA_STEPS} steps; NOT steady: "
                                    "consecutive periods still differ", tasks, sym_note),
                   notes=(*res.notes, "the simulated steps did not reach a steady state; the step time is "
                          "that of the last simulated step"))
