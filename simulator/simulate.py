"""Plan -> Result, with steady-state extrapolation of long runs of identical iterations.

Gradient accumulation makes a step a long run of identical micro-steps, which an event simulator would
otherwise grind through one by one. For every segment repeated more than ``EXPLICIT_MAX`` times we
simulate the plan with that segment repeated n, n+1 and n+2 times (n = ``STEADY_BASE``). If the step
time, the bytes per link, the busy times and the peak memory grow by the same amount from n to n+1 as
from n+1 to n+2, the segment is in a steady state and every additive figure is extrapolated linearly to
the real count; the peaks are those of the steady state. If not, the whole plan is simulated. The result
says which (``sim.method``).
"""

from __future__ import annotations

from hardware_models import HardwareSpec, Topology
from simulator.engine import run_plan
from simulator.plan import Plan
from simulator.result import (
    Result,
    SimInfo,
    StepMetrics,
    build_result,
    diff_metrics,
    scale_metrics,
    step_metrics,
)

STEADY_BASE = 2
EXPLICIT_MAX = 9
_REL_TOL = 1e-6


def _close(a: StepMetrics, b: StepMetrics, scale: float) -> bool:
    tol = _REL_TOL * max(scale, 1e-12)
    if abs(a.step_time_s - b.step_time_s) > tol:
        return False
    for x, y in ((a.link_bytes, b.link_bytes),):
        for k in set(x) | set(y):
            if abs(x.get(k, 0.0) - y.get(k, 0.0)) > _REL_TOL * max(1.0, abs(x.get(k, 0.0))):
                return False
    return abs(a.compute_busy_s - b.compute_busy_s) <= tol


def simulate_plan(plan: Plan, hw: HardwareSpec, *, extrapolate: bool = True,
                  topology: Topology | None = None) -> Result:
    long_segs = [s for s in plan.segments if s.repeat > EXPLICIT_MAX] if extrapolate else []
    if not long_segs:
        raw = run_plan(plan, hw, topology)
        n_tasks = len(raw.records)
        return build_result(plan, hw, raw, step_metrics(plan, raw),
                            SimInfo(raw.events, raw.wall_s, "full", n_tasks))
    base_counts = {s.name: STEADY_BASE for s in long_segs}
    base_plan = plan.with_repeats(base_counts)
    base_raw = run_plan(base_plan, hw, topology)
    base = step_metrics(base_plan, base_raw)
    events, wall, n_tasks = base_raw.events, base_raw.wall_s, len(base_raw.records)
    deltas: list[tuple[int, StepMetrics]] = []
    last_raw, last_plan = base_raw, base_plan
    steady = True
    for s in long_segs:
        runs = []
        for extra in (1, 2):
            p = plan.with_repeats({**base_counts, s.name: STEADY_BASE + extra})
            r = run_plan(p, hw, topology)
            events += r.events
            wall += r.wall_s
            n_tasks += len(r.records)
            runs.append((p, r, step_metrics(p, r)))
        d1 = diff_metrics(runs[0][2], base)
        d2 = diff_metrics(runs[1][2], runs[0][2])
        peaks1 = {k: v.peak for k, v in runs[0][1].memory.pools.items()}
        peaks2 = {k: v.peak for k, v in runs[1][1].memory.pools.items()}
        same_peaks = all(abs(peaks1[k] - peaks2[k]) <= 1e-6 * max(1.0, peaks2[k]) for k in peaks2)
        same_oom = bool(runs[0][1].memory.ooms) == bool(runs[1][1].memory.ooms)
        if not (_close(d1, d2, base.step_time_s) and same_peaks and same_oom):
            steady = False
            break
        deltas.append((s.repeat - STEADY_BASE, d2))
        last_plan, last_raw = runs[1][0], runs[1][1]
    if not steady:
        raw = run_plan(plan, hw, topology)
        return build_result(plan, hw, raw, step_metrics(plan, raw),
                            SimInfo(events + raw.events, wall + raw.wall_s,
                                    "full (no steady state within "
                                    f"{STEADY_BASE + 2} iterations of a repeated segment)",
                                    n_tasks + len(raw.records)))
    metrics = scale_metrics(base, deltas)
    what = ", ".join(f"{s.name} x{s.repeat} from {STEADY_BASE}..{STEADY_BASE + 2} simulated" for s in long_segs)
    res = build_result(last_plan, hw, last_raw, metrics,
                       SimInfo(events, wall, f"extrapolated ({what}; steady-state period verified)", n_tasks))
    return res
