"""Jobs and plans for the planner, the CLI and the public API (``tiersim.api`` re-exports these).

Job construction lives in ``policies.job`` (it needs only hardware, workloads and policies); this module
adds what the planner owns: :func:`make_plan` hands a policy's ``refine`` hook the simulator's step seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from policies import Job
from policies import job as policy_job
from policies.job import (
    DEFAULT_SEQ_CAP,
    DEFAULT_SEQS_PER_GPU,
    JobRequest,
    load_hardware_from_spec,
    make_job,
    resolve_hardware,
)
from simulator import Plan, Result
from simulator.errors import TemplateRefused
from simulator.simulate import simulate_plan, step_seconds

__all__ = ["DEFAULT_SEQS_PER_GPU", "DEFAULT_SEQ_CAP", "JobRequest", "load_hardware_from_spec", "make_job",
           "make_plan", "resolve_hardware", "simulate_job", "step_seconds"]


def make_plan(job: Job, policy: str, knobs: Sequence[str] | Mapping[str, Any] = (), *,
              template: bool | None = None) -> Plan:
    """The policy's plan for ``job``, refined by the policy's ``refine`` hook (if any) with simulated prices;
    ``template``: a rank template where the policy can (None: as the job asks; ``policies.job.make_plan``)."""
    return policy_job.make_plan(job, policy, knobs, lambda p: step_seconds(p, job.hw), template=template)


def simulate_job(job: Job, policy: str, knobs: Sequence[str] | Mapping[str, Any] = (), *, extrapolate: bool = True,
                 plan: Plan | None = None, run: Callable[..., Result] = simulate_plan) -> tuple[Plan, Result]:
    """The policy's plan for ``job`` (or ``plan``, made by :func:`make_plan` of these) and its simulated step (``run``:
    ``simulate_plan``). A rank template where the policy gives one (``template=True``: the same figures at a cost
    independent of the rank count); where the machine's GPUs do not play one role for it (``TemplateRefused``), the
    full plan."""
    if plan is None:
        plan = make_plan(job, policy, knobs, template=True)
    try:
        return plan, run(plan, job.hw, extrapolate=extrapolate)
    except TemplateRefused:
        if plan.template is None:
            raise
    plan = make_plan(job, policy, knobs, template=False)
    return plan, run(plan, job.hw, extrapolate=extrapolate)
