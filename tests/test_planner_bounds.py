"""The analytic bounds of planner.bounds are lower bounds: never above what the simulation finds.

A bound that is not a bound could make the search reject the winner, so every candidate of several small
spaces (every policy and grid knob, micro-batches, checkpointing, several machines, tight GPU memory) is
simulated and compared with its bounds.
"""

from __future__ import annotations

import pytest

from planner.bounds import memory_lower_bound, plan_bounds
from planner.job import JobRequest, make_job, make_plan
from planner.search import search
from policies import POLICIES
from simulator import simulate_plan

CASES = [
    # hardware, overrides, model, policies, request
    ("a100", (), "gpt2", tuple(POLICIES), JobRequest(seq_len=256, micro_batch=2)),
    ("a100", ("gpu.memory=4GB",), "gpt2", ("none", "zero-offload", "zero-infinity"), JobRequest(seq_len=512)),
    ("a100x8", (), "gpt2", ("none", "tinypipe", "synergyscale"), JobRequest(seq_len=256, checkpointing="full")),
    ("dgx-spark", (), "gpt2", ("zero-offload", "lazytrain"), JobRequest(seq_len=256, micro_batch=4)),
]


@pytest.mark.parametrize(("hw", "sets", "model", "policies", "request_"), CASES,
                         ids=[f"{c[0]}{'+' + ','.join(c[1]) if c[1] else ''}-{c[2]}-{len(c[3])}p" for c in CASES])
def test_bounds_never_exceed_the_simulation(hw: str, sets: tuple[str, ...], model: str, policies: tuple[str, ...],
                                            request_: JobRequest) -> None:
    out = search(hw, model, request=request_, hw_overrides=sets, policies=policies, prune=False)
    simulated = [e for e in out.evaluated if e.simulated]
    assert len(simulated) >= 6, out.rejected
    for e in simulated:
        assert e.bound_time_s is not None and e.step_time_s is not None
        assert 0 < e.bound_time_s <= e.step_time_s, (e.policy, e.knobs, e.micro_batch, e.checkpointing)
        for pool, peak in e.peak_bytes.items():
            assert e.bound_memory_bytes[pool] <= peak * (1 + 1e-12) + 1.0, (e.policy, e.knobs, pool)


def test_time_bound_is_tight_for_a_compute_bound_plan() -> None:
    """Everything on one GPU: the step is its compute stream's work, so the bound is (nearly) the step."""
    job, _ = make_job("a100", "gpt2", JobRequest(seq_len=256, micro_batch=4, global_batch=8))
    plan = make_plan(job, "none", {})
    b = plan_bounds(plan, job.hw)
    r = simulate_plan(plan, job.hw)
    assert b.time_resource == "gpu0.sm"
    assert 0.9 * r.step_time_s <= b.time_s <= r.step_time_s


def test_memory_bound_counts_activations_kept_from_forward_to_backward() -> None:
    """Without checkpointing, the compute stream holds every layer's activations at the last forward:
    the bound must rise with the micro-batch (homed tensors alone would not)."""
    from hardware_models import build_topology

    def bound(mb: int) -> float:
        job, _ = make_job("a100", "gpt2", JobRequest(seq_len=512, micro_batch=mb, global_batch=8,
                                                     checkpointing="none"))
        return memory_lower_bound(make_plan(job, "none", {}), build_topology(job.hw))["gpu0"]

    assert bound(4) > bound(1) + 1e8
