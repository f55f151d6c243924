"""The public Python API: build a job, plan it with a policy, simulate the plan.

    import tiersim
    result = tiersim.simulate(hw="a100x8", model="70b", policy="zero-offload")
    print(result.step_time_s, result.feasible)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hardware_models import HardwareSpec
from planner.job import (
    DEFAULT_SEQ_CAP,
    DEFAULT_SEQS_PER_GPU,
    JobRequest,
    load_hardware_from_spec,
    make_job,
    make_plan,
    resolve_hardware,
    simulate_job,
)
from simulator import Result
from workloads import ModelSpec

__all__ = ["DEFAULT_SEQ_CAP", "DEFAULT_SEQS_PER_GPU", "JobRequest", "load_hardware_from_spec", "make_job",
           "make_plan", "resolve_hardware", "simulate"]

def simulate(hw: str | HardwareSpec = "a100x8", model: str | ModelSpec = "70b", policy: str = "zero-offload",
             knobs: Sequence[str] | Mapping[str, Any] = (), request: JobRequest | None = None,
             *, hw_overrides: Sequence[str] = ()) -> Result:
    """Plan ``model`` on ``hw`` with ``policy`` and simulate one training step.

    Raises ``PlanInfeasible`` when the policy can tell before simulating that the job cannot fit; an
    out-of-memory found by the simulation is a Result with ``feasible=False`` and ``oom`` set.
    """
    job, _ = make_job(hw, model, request, hw_overrides=hw_overrides)
    # a rank template where the policy can: identical figures; its ``simulated_plan`` is then rank 0's tasks
    return simulate_job(job, policy, knobs)[1]
