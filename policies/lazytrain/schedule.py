"""LazyTrain's knobs and decision: the tiering and the per-layer activation choices with the least estimated step.

Every allowed tiering is priced and tried in order of offloading (``least_offload``) or of its lower bound; the
MILP (or the ``strategy`` heuristic) picks each layer's mode and place; the estimated step ranks the feasible ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from policies.base import Job, KnobError, PlanInfeasible
from policies.lazytrain import milp
from policies.lazytrain.cost_model import Costs, build_costs, tierings
from policies.lazytrain.milp import Evaluation, MilpResult

NAME = "lazytrain"
HEURISTICS = ("keep_all", "checkpoint_all", "offload_all")
HOMES = ("auto", "gpu", "cpu", "nvme")


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


@dataclass(frozen=True)
class Knobs:
    strategy: Literal["milp", "keep_all", "checkpoint_all", "offload_all"] = "milp"
    time_limit_s: float = milp.TIME_LIMIT_S
    node_limit: int = milp.NODE_LIMIT
    mip_rel_gap: float = 1e-4
    prefetch_depth: int = 1
    optimizer_8bit: bool = False
    param_home: Literal["auto", "gpu", "cpu", "nvme"] = "auto"
    optimizer_home: Literal["auto", "gpu", "cpu", "nvme"] = "auto"
    cpu_grad_bytes: float = 4.0
    tiering_rule: Literal["least_offload", "fastest_estimate"] = "least_offload"

    def validate(self) -> None:
        """Raise :class:`KnobError` (one line naming the knob) for the first bad value."""
        for ok, why in [
            (self.strategy in ("milp", *HEURISTICS), f"knob 'strategy' must be one of milp, {', '.join(HEURISTICS)}"),
            (self.time_limit_s > 0, f"knob 'time_limit_s' must be > 0 seconds, got {self.time_limit_s}"),
            (_positive_int(self.node_limit), f"knob 'node_limit' must be an integer >= 1, got {self.node_limit}"),
            (0 <= self.mip_rel_gap < 1, f"knob 'mip_rel_gap' must be in [0, 1), got {self.mip_rel_gap}"),
            (_positive_int(self.prefetch_depth),
             f"knob 'prefetch_depth' must be an integer >= 1, got {self.prefetch_depth}"),
            (self.param_home in HOMES, "knob 'param_home' must be one of auto, gpu, cpu, nvme"),
            (self.optimizer_home in HOMES, "knob 'optimizer_home' must be one of auto, gpu, cpu, nvme"),
            (not (self.param_home in ("cpu", "nvme") and self.optimizer_home == "gpu"),
             f"knob 'optimizer_home' cannot be gpu when 'param_home' is {self.param_home} "
             "(streamed parameters use the CPU optimizer)"),
            (self.cpu_grad_bytes in (2.0, 4.0), "knob 'cpu_grad_bytes' must be 2 or 4"),
            (self.tiering_rule in ("least_offload", "fastest_estimate"),
             "knob 'tiering_rule' must be least_offload or fastest_estimate"),
        ]:
            if not ok:
                raise KnobError(f"{NAME}: {why}")


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


def _candidates(job: Job, knobs: Knobs, accum: int) -> list[tuple[float, int, Costs]]:
    """(lower bound, index, costs) of every allowed tiering, in the order they are tried."""
    options = tierings(job, knobs.param_home, knobs.optimizer_home)
    if not options:
        raise KnobError(f"{NAME}: param_home={knobs.param_home}, optimizer_home={knobs.optimizer_home} is not "
                        f"possible on {job.hw.name} (no NVMe, or a unified machine whose CPU tier is the GPU's "
                        f"pool); use auto")
    least = knobs.tiering_rule == "least_offload"
    priced = (build_costs(job, t, prefetch_depth=knobs.prefetch_depth, optimizer_8bit=knobs.optimizer_8bit,
                          cpu_grad_bytes=knobs.cpu_grad_bytes) for t in options)
    return sorted(((c.estimate_s(accum), i, c) for i, c in enumerate(priced)),
                  key=lambda x: ((x[2].tiering.level if least else 0), x[0], x[1]))


def _choose(knobs: Knobs, c: Costs, lb: float, best: Schedule | None, accum: int, rec: dict[str, Any],
            failed: list[Failure]) -> tuple[tuple[int, ...], MilpResult | None] | None:
    """The per-layer choice under tiering ``c``: the MILP's (cut off at the best estimate) or the heuristic's.
    None (with ``rec["result"]`` saying why) when there is none."""
    if knobs.strategy != "milp":
        return tuple(milp.heuristic(c.instance, knobs.strategy)), None
    cutoff = None if best is None else (best.estimate_s - lb) / accum
    r = milp.solve_milp(c.instance, time_limit_s=knobs.time_limit_s, mip_rel_gap=knobs.mip_rel_gap, cutoff_s=cutoff,
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
        if best is not None and knobs.tiering_rule == "least_offload" and c.tiering.level > best.costs.tiering.level:
            rec["result"] = f"skipped: level {best.costs.tiering.level} fits and offloads less"
        elif best is not None and lb >= best.estimate_s:
            rec["result"] = "skipped: its lower bound is above the best estimate"
        elif any(c.fixed_bytes.get(k, 0.0) > cap for k, cap in c.capacity.items()):
            rec["result"] = "does not fit: fixed bytes exceed a pool"
            failed.append((c, None))
        elif (chosen := _choose(knobs, c, lb, best, accum, rec, failed)) is not None:
            inst = c.instance
            ev = milp.evaluate(inst, chosen[0])
            if not ev.feasible:
                rec["result"] = "does not fit"
                failed.append((c, ev))
                continue
            est = c.estimate_s(accum, ev.pure_objective)
            rec.update(result="feasible", estimate_s=est, objective_s=ev.objective)
            if best is None or est < best.estimate_s:
                best = Schedule(c, chosen[0], ev, chosen[1], est, accum, ())
    if best is None:
        raise _infeasible(knobs, failed)
    return replace(best, candidates=tuple(log))


def _infeasible(knobs: Knobs, failed: list[Failure]) -> PlanInfeasible:
    """The verdict for the tiering closest to fitting: its most overfull pool and by how much."""
    worst: list[tuple[float, str, float, float, str]] = []
    for c, why in failed:
        over: list[tuple[float, str, float, float, str]] = []
        for k, cap in c.capacity.items():
            fixed = c.fixed_bytes.get(k, 0.0)
            if fixed > cap:
                need, what = fixed, "model states and the parameter window alone"
            elif isinstance(why, Evaluation):
                need, what = why.need[k], f"the {knobs.strategy} schedule"
            else:
                need = milp.min_pool_need(c.instance, k, time_limit_s=knobs.time_limit_s, node_limit=knobs.node_limit)
                what = "model states, workspace and the least activation memory of any schedule"
            over.append((need - cap, k, need, cap, f"{what} ({c.tiering})"))
        worst.append(max(over))
    _, pool, need, cap, what = min(worst)
    return PlanInfeasible(NAME, pool, need, cap, what)
