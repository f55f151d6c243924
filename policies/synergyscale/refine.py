"""SynergyScale's simulated refinement (the ``PolicyInfo.refine`` hook): when the job is small enough,
the fixed defaults and the analytic best few candidates are priced with the simulator's step seconds
(handed in by ``planner.job.make_plan``; the policy never runs the simulator itself) and the fastest kept."""

from __future__ import annotations

from policies.base import Job, StepSeconds
from policies.synergyscale.context import Choice, Ctx, make_ctx
from policies.synergyscale.emit import build
from policies.synergyscale.knobs import Knobs
from policies.synergyscale.search import default_over_budget, search, sim_candidates, sim_reps
from simulator import Plan

DEFAULT_TOLERANCE = 2e-3   # extrapolated scores: keep the defaults unless beaten by more than this share


def simulated_seconds(ctx: Ctx, knobs: Knobs, ch: Choice, step_seconds: StepSeconds) -> float:
    """Step seconds of ``ch``: simulated at the real accumulation when it is 1 or 2 micro-steps, else at 1
    and 2 micro-steps and extrapolated linearly."""
    plan = build(ctx, knobs, ch, {})
    times = [step_seconds(plan.with_repeats({"micro-steps": r})) for r in sim_reps(ctx)]
    if len(times) == 1:
        return times[0]
    return times[0] + (ctx.job.accumulation(ctx.n) - 1) * (times[1] - times[0])


def refine(job: Job, knobs: Knobs, plan: Plan, step_seconds: StepSeconds) -> Plan:
    """``plan`` (the analytic choice), or the plan of the fastest simulated candidate when the job is small
    enough to simulate the defaults and at least one other candidate within the task budget."""
    if plan.info.get("search") != "analytic":
        return plan  # not searched (auto off, or everything resident)
    ctx = make_ctx(job, knobs.host_grad_bytes)
    if default_over_budget(ctx, knobs):
        return plan  # too large to simulate even the defaults: skip re-running the search
    found = search(ctx, knobs)
    runs = sim_candidates(ctx, knobs, found)
    if len(runs) < 2 or runs[-1][0] == 0:
        return plan
    scored = [(simulated_seconds(ctx, knobs, ch, step_seconds), k, ch) for k, ch in runs]
    t_def = scored[0][0]
    t_best, _, ch_best = min(scored, key=lambda x: (x[0], x[2].streams))
    tol = 0.0 if job.accumulation(ctx.n) <= 2 else DEFAULT_TOLERANCE
    keep_default = found.default is not None and not t_best < t_def * (1 - tol)
    info = {**found.info, "candidates_simulated": len(scored), "search": "analytic + simulated",
            "simulated_step_s": t_def if keep_default else t_best}
    return build(ctx, knobs, scored[0][2] if keep_default else ch_best, info)
