"""tinypipe's packing search charges every GPU tensor as the simulator does (PyTorch's caching allocator rounds each
one, ``hardware_models.allocator``): a stage that keeps its layers on the GPU has the simulated peak exactly, and a
GPU whose capacity lies between the raw and the rounded peak gets a plan that fits, or a verdict, never an OOM."""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import pytest

from policies import PlanInfeasible
from policies.base import gpu_pool
from policies.tinypipe.packing import Model, solve
from policies.tinypipe.pipeline import Knobs, search
from simulator import simulate_plan
from tiersim.api import JobRequest, make_job, make_plan

REQ = JobRequest(seq_len=1024, global_batch=8, micro_batch=1)


@functools.cache
def job_with(capacity: float | None = None):  # noqa: ANN201
    job, _ = make_job("a100x8", "gpt2-xl", REQ, hw_overrides=("gpu.memory=4GiB",))
    if capacity is None:
        return job
    pool = gpu_pool(job)
    reserved = pool.physical_bytes - pool.capacity_bytes
    job, _ = make_job("a100x8", "gpt2-xl", REQ, hw_overrides=(f"gpu.memory={int(reserved + capacity)}B",))
    return job


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_resident_stages_are_charged_what_the_simulator_charges(schedule: Literal["1f1b", "gpipe"]) -> None:
    job = job_with()
    _, sol = search(job, Knobs(schedule=schedule))
    res = simulate_plan(make_plan(job, "tinypipe", {"schedule": schedule}), job.hw)
    assert res.feasible
    kept = [st for st in sol.stages if st.mode != "swap"]
    assert kept  # 8 stages of gpt2-xl on 4 GiB GPUs: every stage resident or on the GPU
    for st in kept:  # one data-parallel replica: stage s runs on gpu s
        assert st.mem_bytes == pytest.approx(res.peak_bytes[f"gpu{st.index}"], rel=1e-9)


def raw_peak(job) -> float:  # noqa: ANN001
    """The search's least peak were nothing rounded (the model before the allocator was charged)."""
    prob, _ = search(job, Knobs())
    return solve(dataclasses.replace(prob, allocator="exact")).peak_bytes


def test_a_capacity_just_over_the_raw_peak_never_ends_in_an_oom() -> None:
    """With raw bytes the search passed a GPU 0.1 MiB over its peak, and the simulation found the GPU over by
    0.8 MiB (the rounding of the stage's tensors); charged as held, the search picks what fits or says no."""
    cap = raw_peak(job_with(1.25 * 2**30))
    for _ in range(2):  # the mode rule sees the capacity: settle the raw peak at its own capacity
        cap = raw_peak(job_with(cap + 0.1 * 2**20))
    edge = job_with(cap + 0.1 * 2**20)
    prob, _ = search(edge, Knobs())
    unrounded = solve(dataclasses.replace(prob, allocator="exact"))  # what the search chose before
    assert unrounded.peak_bytes <= prob.capacity
    held = Model(prob)  # that choice (its modes, its packs) charged as the simulator charges it does not fit
    assert max(held.swap_memory(st.first, st.last, st.index, max(held.weights(u, t) for u, t in st.packs))
               if st.mode == "swap" else held.mode_memory(st.first, st.last, st.index, st.mode)
               for st in unrounded.stages) > prob.capacity
    try:
        plan = make_plan(edge, "tinypipe", {})
    except PlanInfeasible as e:  # a verdict is an answer
        assert e.need_bytes > e.capacity_bytes
        return
    res = simulate_plan(plan, edge.hw)
    assert res.feasible, res.oom
