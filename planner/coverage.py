"""Training coverage: which policy can train which model on a machine, and how fast (Tiny-Pipe's matrix).

Each cell (policy, model) is ``planner.search.search`` restricted to that policy: its best plan's
throughput, or infeasible with the pool that overflows in the most candidates (the binding pool). The
whole matrix is bounded by ``total_budget_s`` (or ``deadline``), a wall-clock promise: each cell still to do
gets an equal share of what is left (time a cell does not use goes to the next); ``cell_budget_s`` caps
each cell besides, and ``max_candidates`` each search. A bounded cell searches exactly first and settles
feasibility with a first-feasible search only when that is cut short (``planner.whatif.best_within``). The
cells the budget cut are then searched exactly once more, each with an equal share of what is left
(``planner.whatif.exact_again``; not with ``cell_budget_s``): a slow cell early in the matrix uses the time the
quick ones left.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hardware_models import HardwareSpec
from planner.deadline import Deadline
from planner.job import JobRequest, resolve_hardware
from planner.whatif import Best, Progress, best_within, best_within_each, exact_again, retried
from policies import POLICIES
from workloads import ModelSpec, load_model


@dataclass(frozen=True)
class Cell:
    policy: str
    model: ModelSpec
    best: Best
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        b = self.best
        return {"policy": self.policy, "model": self.model.name, "params": self.model.params(),
                "feasible": b.feasible, "tokens_per_s": b.tokens_per_s, "tflops_per_gpu": b.tflops_per_gpu,
                "step_time_s": b.step_time_s, "binding": b.binding, "knobs": b.knobs}


@dataclass
class CoverageOutcome:
    hardware: str
    policies: list[str]
    models: list[ModelSpec]
    cells: list[Cell] = field(default_factory=list)
    wall_s: float = 0.0

    def cell(self, policy: str, model: str) -> Cell:
        for c in self.cells:
            if c.policy == policy and c.model.name == model:
                return c
        raise KeyError((policy, model))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "tiersim.coverage", "hardware": self.hardware, "policies": list(self.policies),
                "models": [m.name for m in self.models], "rows": [c.to_dict() for c in self.cells]}


def coverage(hw: str | HardwareSpec, models: Sequence[str | ModelSpec], *, policies: Sequence[str] | None = None,
             request: JobRequest | None = None, hw_overrides: Sequence[str] = (), objective: str = "tokens_per_s",
             cell_budget_s: float | None = None, total_budget_s: float | None = None,
             max_candidates: int | None = None, progress: Progress | None = None,
             cache: Any = None, workers: int = 1, knobs: Sequence[str] = (),
             deadline: Deadline | None = None) -> CoverageOutcome:
    """The policy x model matrix; cells in policy order, then model order (as given). ``knobs``
    (``name=value``) fix knobs of the policies that declare them. ``workers`` > 1 searches that many cells at a
    time, one process each (``planner.whatif.best_within_each``; the answers are the serial loop's)."""
    t0 = time.perf_counter()
    limit = deadline.within(total_budget_s) if deadline is not None else Deadline.after(total_budget_s)
    spec = resolve_hardware(hw, hw_overrides)
    specs = [m if isinstance(m, ModelSpec) else load_model(m) for m in models]
    names = list(policies) if policies else list(POLICIES)
    out = CoverageOutcome(hardware=spec.name, policies=names, models=specs)
    total = len(names) * len(specs)
    cells = [(policy, model) for policy in names for model in specs]

    def record(i: int, best: Best, wall_s: float) -> None:
        policy, model = cells[i]
        out.cells.append(Cell(policy, model, best, wall_s))
        if progress:
            progress(f"[{i + 1}/{total}] {policy} x {model.name}: {best.verdict()} ({wall_s:.1f} s)")

    opts = {"request": request, "objective": objective, "max_candidates": max_candidates, "cache": cache,
            "knobs": knobs}
    if workers > 1 and total > 1:  # the cells n at a time, one process each (the serial loop's answers)
        jobs = [{"hw": spec, "model": model, "policies": [policy], **opts} for policy, model in cells]
        answers = best_within_each(jobs, limit, workers, cap_s=cell_budget_s, finished=record)
        out.cells = [Cell(policy, model, best, wall_s)
                     for (policy, model), (best, wall_s) in zip(cells, answers, strict=True)]
    else:
        for i, (policy, model) in enumerate(cells):
            c0 = time.perf_counter()
            best = best_within(spec, model, policies=[policy], workers=workers,
                               deadline=limit.share(total - len(out.cells)).within(cell_budget_s), **opts)
            record(i, best, time.perf_counter() - c0)
    again = retried([c.best for c in out.cells], max_candidates) if cell_budget_s is None else []  # a capped cell stays
    for n, i in enumerate(again):
        cell = out.cells[i]
        if progress and not limit.expired():
            progress(f"[{i + 1}/{total}] {cell.policy} x {cell.model.name}: cut by its share of the budget; "
                     "searching it again ...")
        c0 = time.perf_counter()
        got = exact_again(spec, cell.model, objective,
                          limit.share(len(again) - n),
                          {"request": request, "policies": [cell.policy], "cache": cache, "workers": workers,
                           "knobs": knobs})
        if got is not None:
            out.cells[i] = Cell(cell.policy, cell.model, got, cell.wall_s + time.perf_counter() - c0)
            if progress:
                progress(f"[{i + 1}/{total}] {cell.policy} x {cell.model.name}: {got.verdict()}")
    out.wall_s = time.perf_counter() - t0
    return out
