"""The policies' own fit checks charge what the simulator charges: every GPU tensor rounded by PyTorch's
caching allocator (``hardware_models.allocator``). At the edge (the raw model states fit the GPU, the
rounded ones do not) the policy says "infeasible" itself, naming the states, as the simulation would find
at its first allocation; one byte more than the rounded states and the policy builds its plan."""

from __future__ import annotations

import pytest

from hardware_models.allocator import caching_allocator_bytes
from policies import PlanInfeasible
from policies.base import gpu_pool
from policies.none import model_state_bytes
from tiersim.api import JobRequest, make_job, make_plan

REQ = JobRequest(micro_batch=1, global_batch=1, seq_len=128)


def _job_with_capacity(capacity: float, model: str = "gpt2"):  # type: ignore[no-untyped-def]
    job, _ = make_job("a100", model, REQ)
    pool = gpu_pool(job)
    reserved = pool.physical_bytes - pool.capacity_bytes
    job, _ = make_job("a100", model, REQ, hw_overrides=(f"gpu.memory={int(reserved + capacity)}B",))
    assert gpu_pool(job).capacity_bytes == pytest.approx(int(reserved + capacity) - reserved)
    return job


def test_none_states_between_raw_and_rounded_are_refused_by_the_policy() -> None:
    job, _ = make_job("a100", "gpt2", REQ)
    states = model_state_bytes(job, 0, 1)
    raw = sum(states.values())
    held = sum(caching_allocator_bytes(n) for n in states.values())
    assert held > raw  # gpt2's state tensors are not multiples of 2 MiB
    edge = _job_with_capacity((raw + held) / 2)
    with pytest.raises(PlanInfeasible, match="model states") as e:
        make_plan(edge, "none")
    assert e.value.need_bytes == pytest.approx(held)
    make_plan(_job_with_capacity(held + 1), "none")  # the states fit: the plan is built


def test_zero_offload_parameters_between_raw_and_rounded_are_refused_by_the_policy() -> None:
    job, _ = make_job("a100", "gpt2", REQ)
    raw = 2.0 * job.trace.params
    held = caching_allocator_bytes(raw)
    assert held > raw
    with pytest.raises(PlanInfeasible, match="fp16 parameters") as e:
        make_plan(_job_with_capacity((raw + held) / 2), "zero-offload", {"tp": 1})
    assert e.value.need_bytes == pytest.approx(held)
