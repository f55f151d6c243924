"""The answer of a plan search: every candidate as :class:`Evaluated`, and the :class:`SearchOutcome`.

``wall_s`` and cache statistics are attributes of the outcome, not part of ``to_dict()``, so that output
is reproducible byte for byte.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner.job import JobRequest
from simulator import Plan, Result


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
