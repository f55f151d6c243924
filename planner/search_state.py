"""What a plan search knows about each candidate, and the objective it minimises, as typed values.

- :class:`PlanSummary`: what building a candidate's plan taught (``verdict`` "rejected" or "bounded", the
  reason, the analytic bounds), and :class:`SimSummary`, what simulating it taught, once it has been;
- :class:`Objective`: the one definition of the objective, for a simulated candidate (``value``) and as
  a lower bound from its plan alone (``bound``); smaller is better for every objective.

Both summaries round-trip through plain dicts (``to_dict`` / ``from_dict``): the evaluation cache stores
them as JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator import Result

OBJECTIVES = ("tokens_per_s", "tflops", "gpu_memory", "cpu_memory")
GPU_KINDS = ("hbm", "unified")
CPU_KINDS = ("dram", "unified")


@dataclass(frozen=True)
class SimSummary:
    """A simulated candidate: feasible or not (``reason`` "oom: <pool>"), its step and peaks.

    ``binding``: for an infeasible candidate the pool that overflows; for a feasible one the pool with
    the highest peak / capacity.
    """

    feasible: bool
    reason: str | None
    binding: str | None
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    peak_bytes: dict[str, float]
    capacity_bytes: dict[str, float]
    message: str | None = None

    @classmethod
    def of(cls, result: Result) -> SimSummary:
        peaks = {p: float(v) for p, v in sorted(result.peak_bytes.items())}
        caps = {p: float(v) for p, v in sorted(result.capacity_bytes.items())}
        if result.feasible:
            binding: str | None = max(sorted(peaks), key=lambda p: peaks[p] / caps[p] if caps.get(p) else 0.0)
            reason = None
        else:
            binding = result.oom.pool if result.oom else None
            reason = f"oom: {binding}"
        message = (f"{result.oom.pool}: demand {result.oom.total_demand_bytes / 1e9:.1f} GB, capacity "
                   f"{result.oom.capacity_bytes / 1e9:.1f} GB") if result.oom else None
        return cls(result.feasible, reason, binding, result.step_time_s, result.tokens_per_s,
                   result.tflops_per_gpu, peaks, caps, message)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SimSummary:
        return cls(**d)


@dataclass(frozen=True)
class PlanSummary:
    """A candidate whose plan was built (or could not be): ``verdict`` "rejected" (``reason`` says why:
    "policy: gpu memory", "knobs: invalid", "workload: invalid", "bound: gpu memory") or "bounded" (it
    passed the memory bounds; ``bound_time_s`` orders it). A candidate rejected by a memory bound keeps its
    bounds too. ``sim`` is set once it has been simulated."""

    verdict: str
    reason: str | None = None
    binding: str | None = None
    message: str | None = None
    fingerprint: str | None = None
    bound_time_s: float | None = None
    bound_resource: str | None = None
    bound_memory_bytes: dict[str, float] = field(default_factory=dict)
    capacity_bytes: dict[str, float] = field(default_factory=dict)
    model_flops_per_step: float = 0.0
    n_gpus: int = 0
    sim: SimSummary | None = None

    @property
    def bounded(self) -> bool:
        return self.verdict == "bounded"

    @classmethod
    def rejected(cls, reason: str, binding: str | None, message: str) -> PlanSummary:
        return cls("rejected", reason, binding, message)

    def with_sim(self, sim: SimSummary) -> PlanSummary:
        return dataclasses.replace(self, sim=sim)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlanSummary:
        sim = d.get("sim")
        return cls(**{**d, "sim": SimSummary.from_dict(sim) if sim is not None else None})


@dataclass(frozen=True)
class Objective:
    """What the search minimises: step time (``tokens_per_s``), minus TFLOP/s per GPU (``tflops``), or the
    peak of the GPU / CPU pools (``gpu_memory`` / ``cpu_memory``); ``pool_kinds`` maps pool to kind."""

    name: str
    pool_kinds: Mapping[str, str]

    @property
    def pruned_reason(self) -> str:
        return "bound: slower than best" if self.name in ("tokens_per_s", "tflops") else "bound: more memory than best"

    def peak(self, peak_bytes: Mapping[str, float]) -> float:
        want = GPU_KINDS if self.name == "gpu_memory" else CPU_KINDS
        return max((b for p, b in peak_bytes.items() if self.pool_kinds.get(p) in want), default=0.0)

    def value(self, sim: SimSummary) -> float:
        """The objective of a simulated candidate (smaller is better)."""
        if self.name == "tflops":
            return -float(sim.tflops_per_gpu)
        if self.name == "tokens_per_s":
            return float(sim.step_time_s)
        return self.peak(sim.peak_bytes)

    def done_value(self, summary: PlanSummary) -> float | None:
        """The objective of a simulated feasible candidate, else None."""
        return self.value(summary.sim) if summary.sim is not None and summary.sim.feasible else None

    def bound(self, summary: PlanSummary) -> float:
        """A lower bound of ``value`` from the plan alone (TFLOP/s: the plan's model FLOPs over the time
        bound is an upper bound of the achieved rate)."""
        t = float(summary.bound_time_s or 0.0)
        if self.name == "tflops":
            return -(summary.model_flops_per_step / t / summary.n_gpus / 1e12) if t > 0 else -float("inf")
        if self.name == "tokens_per_s":
            return t
        return self.peak(summary.bound_memory_bytes)
