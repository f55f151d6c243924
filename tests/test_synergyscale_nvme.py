"""SynergyScale's NVMe tier: its gradients take DeepSpeed's NVMe optimizer path (pinned staging, written to NVMe,
read back with the optimizer states) with one micro-step per step, a host buffer with accumulation; the host holds
only bounded pinned buffers for it, and an over-full host is reported with those buffers counted."""

from __future__ import annotations

import functools

import pytest

from hardware_models import load_hardware
from policies import PlanInfeasible
from policies import synergyscale as ss
from policies.synergyscale.context import GRAD32_BYTES, GRAD_STAGING_LAYERS, make_ctx
from policies.synergyscale.placement import host_fixed_bytes
from simulator import Plan, TaskSpec, simulate_plan
from simulator.invariants import check_invariants
from tiersim.api import JobRequest, make_job

KNOBS = ss.Knobs(auto=False, nvme_fraction="0.6", chunks=1, streams=1, prefetch=1)
TIER = {"g": "gpu", "p": "peer", "c": "cpu", "n": "nvme"}


@functools.cache
def job_for(global_batch: int, hw: str = "a100", model: str = "gpt2-xl", overrides: tuple[str, ...] = ()):  # noqa: ANN201
    job, _ = make_job(load_hardware(hw, ["gpu.memory=12GiB", *overrides]), model,
                      JobRequest(seq_len=1024, global_batch=global_batch))
    return job


def tasks(plan: Plan) -> dict[str, TaskSpec]:
    return {t.id: t for seg in plan.segments for t in seg.tasks}


def nvme_layers(plan: Plan) -> list[int]:
    return [i for i, t in enumerate(plan.info["layer_tiers"]) if t == "n"]


def test_one_micro_step_swaps_the_nvme_tiers_fp32_gradients_to_nvme() -> None:
    job = job_for(1)
    plan = ss.plan(job, KNOBS)
    by_id, layers, tensors = tasks(plan), job.trace.layers, plan.tensor_map()
    nv = nvme_layers(plan)
    assert len(nv) > GRAD_STAGING_LAYERS
    for i in nv:
        ly = layers[i]
        gw = by_id[f"gw{i}"]
        assert gw.src == "cpu" and gw.dst == "nvme" and gw.bytes == pytest.approx(GRAD32_BYTES * ly.params)
        assert gw.tags["phase"] == "grad-swap-out"
        swi = by_id[f"swi{i}"]  # master, m, v and the gradient read back together
        assert swi.bytes == pytest.approx(ly.master_bytes + ly.optimizer_bytes + GRAD32_BYTES * ly.params)
        assert f"gw{i}" in {str(d) for d in swi.deps}
    # no host gradient buffer for the NVMe tier: its fp32 gradients live on NVMe
    cpu_params = sum(layers[i].params for i, t in enumerate(plan.info["layer_tiers"]) if t == "c")
    host_grads = tensors["g32.cpu"].bytes if "g32.cpu" in tensors else 0.0
    assert host_grads == pytest.approx(KNOBS.host_grad_bytes * cpu_params)
    assert tensors["g32.nvme"].bytes == pytest.approx(GRAD32_BYTES * sum(layers[i].params for i in nv))
    # bounded staging: a layer's copy to the host waits for the NVMe write GRAD_STAGING_LAYERS NVMe layers back
    back = nv[::-1]
    for j, i in enumerate(back):
        deps = {str(d) for d in by_id[f"gd{i}.gpu0"].deps}
        assert (f"gw{back[j - GRAD_STAGING_LAYERS]}" in deps) == (j >= GRAD_STAGING_LAYERS)


def test_the_host_holds_only_the_nvme_tiers_pinned_buffers() -> None:
    job = job_for(1)
    plan = ss.plan(job, KNOBS)
    res = simulate_plan(plan, job.hw)
    assert res.feasible and check_invariants(res) == []
    ctx = make_ctx(job, KNOBS.host_grad_bytes)
    tiers = tuple(TIER[t] for t in plan.info["layer_tiers"])
    bound = plan.info["host_state_bytes"] + host_fixed_bytes(ctx, tiers, 1, plan.info["chosen"]["buffers"], False)
    assert res.peak_bytes["cpu"] <= bound + 1
    # priced NVMe traffic: the gradients go out and come back in (4 + 4 B/param a step beyond the states)
    nv = nvme_layers(plan)
    p = sum(job.trace.layers[i].params for i in nv)
    by_id = tasks(plan)
    written = sum(t.bytes for t in by_id.values() if t.dst == "nvme" and t.op == "copy")
    states = sum(job.trace.layers[i].master_bytes + job.trace.layers[i].optimizer_bytes
                 + job.trace.layers[i].param_bytes for i in nv)
    assert written == pytest.approx(states + GRAD32_BYTES * p)


def test_accumulation_sums_the_nvme_tiers_gradients_in_a_host_buffer() -> None:
    job = job_for(2)  # two micro-steps per step: no gradient is final before the last
    plan = ss.plan(job, KNOBS)
    by_id, tensors, layers = tasks(plan), plan.tensor_map(), job.trace.layers
    assert not any(t.startswith("gw") for t in by_id) and "g32.nvme" not in tensors
    host = sum(layers[i].params for i, t in enumerate(plan.info["layer_tiers"]) if t in "cn")
    assert tensors["g32.cpu"].bytes == pytest.approx(KNOBS.host_grad_bytes * host)
    res = simulate_plan(plan, job.hw)
    assert res.feasible and check_invariants(res) == []


def test_an_over_full_host_counts_its_buffers_in_the_overshoot() -> None:
    """The NVMe tier's gradients in a host buffer (accumulation) exceed a 300 GB host by a little; the message
    counts the pinned buffers the fill reserved, so what is over is positive and adds up."""
    job, _ = make_job(load_hardware("a100", ["host.dram=300GB"]), "70b", JobRequest(seq_len=1024, global_batch=4))
    with pytest.raises(PlanInfeasible) as e:
        ss.plan(job, ss.Knobs(auto=False))
    err = e.value
    assert err.pool == "cpu" and err.need_bytes > err.capacity_bytes
    assert "host buffers" in str(err) and "over by -" not in str(err)
