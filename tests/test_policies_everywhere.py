"""Every policy on every hardware preset (issue "seed policies": including dgx-spark): a small model plans
and simulates, or the policy says why it cannot (PlanInfeasible with the pool and the overshoot)."""

from __future__ import annotations

import pytest

from hardware_models import list_presets
from policies import POLICIES, PlanInfeasible
from simulator import simulate_plan
from tiersim.api import JobRequest, make_job, make_plan


@pytest.mark.parametrize("hw", list_presets())
@pytest.mark.parametrize("policy", list(POLICIES))
def test_policy_runs_on_preset(policy: str, hw: str) -> None:
    job, _ = make_job(hw, "gpt2", JobRequest(seq_len=512))
    try:
        plan = make_plan(job, policy)
    except PlanInfeasible as e:  # an answer, not a crash: it names the pool and how far over it is
        assert e.need_bytes > e.capacity_bytes and e.pool
        return
    result = simulate_plan(plan, job.hw)  # invariants are checked by the suite's conftest
    assert result.feasible, result.oom
    assert result.step_time_s > 0 and result.tokens_per_s > 0
    if job.hw.unified_memory:
        assert "cpu" not in result.peak_bytes  # one pool: nothing can claim CPU-side savings
