"""Jobs and plans for the planner, the CLI and the public API (``tiersim.api`` re-exports these).

Job construction lives in ``policies.job`` (it needs only hardware, workloads and policies); this module
adds what the planner owns: :func:`make_plan` hands a policy's ``refine`` hook the simulator's step seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from simulator import Plan
from simulator.simulate import step_seconds

__all__ = ["DEFAULT_SEQS_PER_GPU", "DEFAULT_SEQ_CAP", "JobRequest", "load_hardware_from_spec", "make_job",
           "make_plan", "resolve_hardware", "step_seconds"]


def make_plan(job: Job, policy: str, knobs: Sequence[str] | Mapping[str, Any] = ()) -> Plan:
    """The policy's plan for ``job``, refined by the policy's ``refine`` hook (if any) with simulated prices."""
    return policy_job.make_plan(job, policy, knobs, lambda p: step_seconds(p, job.hw))
