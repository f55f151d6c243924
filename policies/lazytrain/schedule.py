"""LazyTrain's decision: the tiering and the per-layer activation choices with the least estimated step.

Every tiering the knobs and the hardware allow is priced (:func:`~policies.lazytrain.cost_model.build_costs`);
they are tried in order of offloading (``least_offload``) or of their lower bound, the MILP (or the
heuristic the ``strategy`` knob names) picks each layer's mode and place, and the estimate
``micro-steps x (compute + recompute + exposed transfer) + optimizer phase`` ranks the feasible ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.base import Job, KnobError, PlanInfeasible
from policies.lazytrain.cost_model import Costs, build_costs
from policies.lazytrain.knobs import NAME, Knobs
from policies.lazytrain.milp import Evaluation, MilpResult, evaluate, heuristic, min_pool_need, solve_milp
from policies.lazytrain.tiering import Tiering, tierings

#: a tiering that yielded no schedule, and why: no solution (the MILP), an overfull evaluation, or None
#: (its fixed bytes alone exceed a pool)
Failure = tuple[Costs, MilpResult | Evaluation | None]


@dataclass(frozen=True)
class Schedule:
    costs: Costs
    choice: tuple[int, ...]
    evaluation: Evaluation
    milp: MilpResult | None
    estimate_s: float
    accumulation: int
    candidates: tuple[dict[str, Any], ...]

    @property
    def tiering(self) -> Tiering:
        return self.costs.tiering


def _costs(job: Job, knobs: Knobs, t: Tiering) -> Costs:
    return build_costs(job, t, prefetch_depth=knobs.prefetch_depth, optimizer_8bit=knobs.optimizer_8bit,
                       cpu_grad_bytes=knobs.cpu_grad_bytes)


def _candidates(job: Job, knobs: Knobs, accum: int) -> list[tuple[float, int, Costs]]:
    """(lower bound, index, costs) of every allowed tiering, in the order they are tried."""
    options = tierings(job, knobs.param_home, knobs.optimizer_home)
    if not options:
        raise KnobError(f"{NAME}: param_home={knobs.param_home}, optimizer_home={knobs.optimizer_home} is not "
                        f"possible on {job.hw.name} (no NVMe, or a unified machine whose CPU tier is the GPU's "
                        f"pool); use auto")
    least = knobs.tiering_rule == "least_offload"
    return sorted(((c.lower_bound_s(accum), i, c) for i, c in enumerate(_costs(job, knobs, t) for t in options)),
                  key=lambda x: ((x[2].tiering.level if least else 0), x[0], x[1]))


def _skip_reason(knobs: Knobs, best: Schedule | None, c: Costs, lb: float) -> str | None:
    """Why a tiering need not be tried, given the best schedule so far."""
    if best is None:
        return None
    if knobs.tiering_rule == "least_offload" and c.tiering.level > best.tiering.level:
        return f"skipped: level {best.tiering.level} fits and offloads less"
    if lb >= best.estimate_s:
        return "skipped: its lower bound is above the best estimate"
    return None


def _choose(knobs: Knobs, c: Costs, lb: float, best: Schedule | None, accum: int, rec: dict[str, Any],
            failed: list[Failure]) -> tuple[tuple[int, ...], MilpResult | None] | None:
    """The per-layer choice under tiering ``c``: the MILP's (cut off at the best estimate) or the heuristic's.
    None (with ``rec["result"]`` saying why) when there is none."""
    if knobs.strategy != "milp":
        return tuple(heuristic(c.instance, knobs.strategy)), None
    cutoff = None if best is None else (best.estimate_s - lb) / accum
    r = solve_milp(c.instance, time_limit_s=knobs.time_limit_s, mip_rel_gap=knobs.mip_rel_gap, cutoff_s=cutoff,
                   node_limit=knobs.node_limit)
    rec["milp"] = r.to_dict()
    if r.choice is not None:
        return r.choice, r
    if cutoff is not None and r.status_code == 2:
        rec["result"] = "cannot beat the best estimate (MILP with that cutoff is infeasible)"
    else:
        rec["result"] = f"no solution ({r.status})"
        failed.append((c, r))
    return None


def schedule(job: Job, knobs: Knobs) -> Schedule:
    """Pick the tiering and the per-layer choices (the MILP or a heuristic) with the least estimated step."""
    knobs.validate()
    accum = job.accumulation(job.n_gpus)
    best: Schedule | None = None
    log: list[dict[str, Any]] = []
    failed: list[Failure] = []
    for lb, _, c in _candidates(job, knobs, accum):
        rec: dict[str, Any] = {"tiering": str(c.tiering), "lower_bound_s": lb}
        log.append(rec)
        skip = _skip_reason(knobs, best, c, lb)
        if skip:
            rec["result"] = skip
            continue
        inst = c.instance
        if any(inst.fixed_bytes.get(k, 0.0) > cap for k, cap in inst.capacity.items()):
            rec["result"] = "does not fit: fixed bytes exceed a pool"
            failed.append((c, None))
            continue
        chosen = _choose(knobs, c, lb, best, accum, rec, failed)
        if chosen is None:
            continue
        choice, r = chosen
        ev = evaluate(inst, choice)
        if not ev.feasible:
            rec["result"] = "does not fit"
            failed.append((c, ev))
            continue
        est = c.estimate_s(accum, ev.pure_objective)
        rec.update(result="feasible", estimate_s=est, objective_s=ev.objective)
        if best is None or est < best.estimate_s:
            best = Schedule(c, choice, ev, r, est, accum, ())
    if best is None:
        raise _infeasible(knobs, failed)
    return Schedule(best.costs, best.choice, best.evaluation, best.milp, best.estimate_s, accum, tuple(log))


def _infeasible(knobs: Knobs, failed: list[Failure]) -> PlanInfeasible:
    """The verdict for the tiering closest to fitting: its most overfull pool and by how much."""
    worst: list[tuple[float, str, float, float, str]] = []
    for c, why in failed:
        inst = c.instance
        over: list[tuple[float, str, float, float, str]] = []
        for k, cap in inst.capacity.items():
            fixed = inst.fixed_bytes.get(k, 0.0)
            if fixed > cap:
                need, what = fixed, "model states and the parameter window alone"
            elif isinstance(why, Evaluation):
                need, what = why.need[k], f"the {knobs.strategy} schedule"
            else:
                need, what = min_pool_need(inst, k, time_limit_s=knobs.time_limit_s,
                                           node_limit=knobs.node_limit), \
                    "model states, workspace and the least activation memory of any schedule"
            over.append((need - cap, k, need, cap, f"{what} ({c.tiering})"))
        worst.append(max(over))
    _, pool, need, cap, what = min(worst)
    return PlanInfeasible(NAME, pool, need, cap, what)
