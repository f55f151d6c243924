"""Policies `none` and `zero-offload`: mechanisms, memory formulas, invariants on every preset."""

from __future__ import annotations

import pytest

from hardware_models import list_presets
from policies import KnobError, PlanInfeasible, get_policy, parse_knobs
from policies.none import model_state_bytes
from simulator import simulate_plan
from simulator.invariants import check_invariants
from tiersim.api import JobRequest, make_job, make_plan


def job_for(hw: str, model: str = "gpt2", **kw):  # noqa: ANN003, ANN201
    req = JobRequest(**{"seq_len": 1024, "global_batch": None, **kw})
    job, _ = make_job(hw, model, req)
    return job


@pytest.mark.parametrize("hw", list_presets())
@pytest.mark.parametrize("policy", ["none", "zero-offload"])
def test_every_policy_runs_on_every_preset_and_keeps_the_invariants(hw: str, policy: str) -> None:
    job = job_for(hw)
    result = simulate_plan(make_plan(job, policy), job.hw)
    assert result.feasible, result.oom
    assert result.step_time_s > 0
    assert check_invariants(result) == []


@pytest.mark.parametrize("stage,expected", [(0, 16.0), (1, 4 + 12 / 8), (2, 2 + 14 / 8), (3, 16 / 8)])
def test_none_model_states_follow_zero_formulas(stage: int, expected: float) -> None:
    job = job_for("a100x8")
    states = model_state_bytes(job, stage, 8)
    assert sum(states.values()) / job.trace.params == pytest.approx(expected, rel=1e-12)


def test_zero_offload_moves_minimal_traffic_per_step() -> None:
    """ZeRO-Offload: 2 B/param down per micro-step and 2 B/param up per step over each GPU's PCIe link."""
    job = job_for("a100", "gpt2-xl", global_batch=4)
    result = simulate_plan(make_plan(job, "zero-offload"), job.hw)
    p = job.trace.params
    assert result.link_bytes["gpu0.pcie"] == pytest.approx(2 * p * 4 + 2 * p, rel=1e-9)


def test_zero_offload_fp32_upload_knob_doubles_upload_and_stages_on_gpu() -> None:
    job = job_for("a100", "gpt2-xl", global_batch=1)
    p = job.trace.params
    base = simulate_plan(make_plan(job, "zero-offload"), job.hw)
    old = simulate_plan(make_plan(job, "zero-offload", ["upload_bytes_per_param=4"]), job.hw)
    assert old.link_bytes["gpu0.pcie"] - base.link_bytes["gpu0.pcie"] == pytest.approx(2 * p, rel=1e-9)
    assert old.peak_by_kind["gpu0"].get("buffer", 0) >= base.peak_by_kind["gpu0"].get("buffer", 0)
    assert check_invariants(old) == []


def test_delayed_update_hides_the_cpu_optimizer() -> None:
    """DPU: step time ~ max(fwd+bwd, D2H + Adam + H2D) instead of their sum (ZeRO-Offload §4.2).

    In our plans D2H already overlaps the backward and H2D overlaps the chunked Adam, so the bound is
    max(GPU compute, CPU Adam, gradient D2H) of one step, plus the tail that cannot overlap: the backward
    waits for the double-buffered gradient copies, and the next micro-step's forward waits for the last ones
    (DeepSpeed synchronises the device after each backward with overlap_comm: ``kit.release_buckets``)
    (here 0.364 s vs max 0.304 s and sum 0.532 s; 0.346 s with the folded Ampere curve, whose GPU compute was
    0.174 s against 0.228 s now; 0.332 s before that wait was modelled).
    """
    job = job_for("a100", "gpt2-xl", global_batch=2)
    plain = simulate_plan(make_plan(job, "zero-offload"), job.hw)
    dpu = simulate_plan(make_plan(job, "zero-offload", {"delayed_update": True}), job.hw)
    adam = plain.stream_busy_s["cpu.adam0"]
    compute = plain.stream_busy_s["gpu0.compute"]
    assert adam > 0.1 * compute  # the case is only meaningful if the optimizer matters
    assert dpu.step_time_s < plain.step_time_s
    d2h = dpu.stream_busy_s["gpu0.d2h"]
    assert dpu.step_time_s >= max(compute, adam, d2h) * (1 - 1e-9)
    hidden = max(compute, adam, d2h)
    assert dpu.step_time_s - hidden < 0.5 * (compute + adam - hidden)  # nearer the max than the sum
    assert dpu.stream_busy_s["gpu0.compute"] == pytest.approx(compute, rel=1e-9)
    assert check_invariants(dpu) == []


@pytest.mark.parametrize("dpu", [False, True])
def test_zero_offload_slow_link_stalls_the_backward_instead_of_piling_gradients_up(dpu: bool) -> None:
    """Gradient offload is double-buffered (DeepSpeed overlap_comm): when PCIe is slower than the backward,
    the backward waits for the bucket two layers back, so at most GRAD_BUCKETS_IN_FLIGHT + 1 layers' gradient buckets
    are on the GPU however slow the link (before, a 7B job on a100 at Gen4 held 92 GB of gradients)."""
    from policies.zero_offload import GRAD_BUCKETS_IN_FLIGHT

    job, _ = make_job("a100", "llama2-7b", JobRequest(seq_len=256, global_batch=4, micro_batch=1),
                      hw_overrides=["pcie.gen=3"])
    result = simulate_plan(make_plan(job, "zero-offload", {"delayed_update": dpu}), job.hw)
    assert result.feasible, result.oom
    bucket = max(layer.params for layer in job.trace.layers) * 2
    assert result.peak_by_kind["gpu0"]["grad"] <= (GRAD_BUCKETS_IN_FLIGHT + 1) * bucket * (1 + 1e-9)
    # the gradient copies are the bottleneck of this case, and the step cannot be shorter than them
    assert result.stream_busy_s["gpu0.d2h"] > result.stream_busy_s["gpu0.compute"]
    assert result.step_time_s >= result.stream_busy_s["gpu0.d2h"] * (1 - 1e-9)
    assert check_invariants(result) == []


def test_tensor_parallel_splits_params_and_adds_allreduces() -> None:
    job = job_for("a100x8", "7b", global_batch=8)
    r1 = simulate_plan(make_plan(job, "zero-offload", {"tp": 1}), job.hw)
    r4 = simulate_plan(make_plan(job, "zero-offload", {"tp": 4}), job.hw)
    p16 = lambda r: r.peak_by_kind["gpu0"]["param16"]  # noqa: E731
    assert p16(r1) == pytest.approx(4 * p16(r4), rel=1e-9)
    assert r4.link_bytes["gpu0.nvlink"] > 0
    assert check_invariants(r4) == []


def test_zero_offload_auto_tp_makes_70b_fit_on_a100x8() -> None:
    job = job_for("a100x8", "70b", seq_len=4096, global_batch=16)
    plan = make_plan(job, "zero-offload")
    assert plan.info["tp"] > 1
    assert any("picked automatically" in n for n in plan.notes)
    with pytest.raises(PlanInfeasible) as e:
        make_plan(job, "zero-offload", {"tp": 1})
    assert e.value.pool == "gpu0" and e.value.need_bytes > e.value.capacity_bytes


def test_unified_memory_offload_frees_nothing() -> None:
    """dgx-spark: the CPU-side states land in the same pool as the GPU's."""
    job = job_for("dgx-spark", "gpt2-xl", global_batch=1)
    none = simulate_plan(make_plan(job, "none"), job.hw)
    off = simulate_plan(make_plan(job, "zero-offload"), job.hw)
    assert set(none.peak_bytes) == {"unified", "nvme"}
    assert off.peak_bytes["unified"] >= none.peak_bytes["unified"] * 0.99
    assert any("unified memory" in n for n in off.notes)


def test_none_infeasible_names_pool_and_overshoot() -> None:
    job = job_for("a100-40g", "13b", seq_len=4096, global_batch=1)
    with pytest.raises(PlanInfeasible) as e:
        make_plan(job, "none")
    assert e.value.pool == "gpu0"
    assert "over by" in str(e.value)


def test_oom_found_by_simulation_is_a_verdict_not_a_crash() -> None:
    """Model states fit but activations without checkpointing do not: the simulator reports the overshoot."""
    job = job_for("a100-40g", "gpt2-xl", seq_len=1024, micro_batch=64, global_batch=64, checkpointing="none",
                  flash_attention=False)
    result = simulate_plan(make_plan(job, "none"), job.hw)
    assert not result.feasible
    assert result.oom is not None and result.oom.pool == "gpu0"
    assert result.oom.total_demand_bytes > result.oom.capacity_bytes
    assert check_invariants(result) == []


@pytest.mark.parametrize("policy,knobs", [("none", {"stage": 2}), ("zero-offload", {"tp": 2}),
                                          ("zero-offload", {"delayed_update": True})])
def test_steady_state_extrapolation_equals_full_simulation(policy: str, knobs: dict) -> None:
    job = job_for("a100x8", "gpt2", global_batch=8 * 12)
    plan = make_plan(job, policy, knobs)
    fast = simulate_plan(plan, job.hw)
    full = simulate_plan(plan, job.hw, extrapolate=False)
    if knobs.get("delayed_update"):
        # the CPU optimizer may span the next step's micro-steps: extrapolated only where the steady-state period
        # is verified (here it is: the optimizer ends inside the next step's compute), else simulated in full
        assert fast.sim.method.startswith(("full", "extrapolated"))
    else:
        assert fast.sim.method.startswith("extrapolated")
        assert fast.sim.simulated_tasks < full.sim.simulated_tasks
    assert full.sim.method.startswith("full")
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    for link, nbytes in full.link_bytes.items():
        assert fast.link_bytes[link] == pytest.approx(nbytes, rel=1e-9)
    for pool, peak in full.peak_bytes.items():
        assert fast.peak_bytes[pool] == pytest.approx(peak, rel=1e-9)
    assert fast.exposed_transfer_s == pytest.approx(full.exposed_transfer_s, rel=1e-6, abs=1e-9)


def test_a_plan_whose_last_step_ends_early_is_measured_on_a_longer_run() -> None:
    """DPU over PCIe gen 3: the CPU optimizer of the plan's last step has nothing after it to contend with, so
    that step ends early; the simulator runs more steps and measures one that a trailing step contends with."""
    from planner.job import JobRequest, make_job

    # seq 512: at 1024 the GPU's compute covers the last step's tail (the optimizer ends inside it)
    job, _ = make_job("a100", "gpt2-xl", JobRequest(global_batch=2, seq_len=512), hw_overrides=["pcie.gen=3"])
    plan = make_plan(job, "zero-offload", {"delayed_update": True})
    res = simulate_plan(plan, job.hw)
    assert res.sim.method.startswith("full with 6 steps, measuring steps 4-5"), res.sim.method
    assert res.step_time_s >= res.stream_busy_s["gpu0.compute"] * (1 - 1e-9)
    assert res.step_time_s >= res.stream_busy_s["cpu.adam0"] * (1 - 1e-9)
    assert check_invariants(res) == []


def test_unknown_knob_and_bad_values_are_clear() -> None:
    info = get_policy("zero-offload")
    with pytest.raises(KnobError, match="did you mean 'delayed_update'"):
        parse_knobs(info, ["delayed_updat=1"])
    with pytest.raises(KnobError, match="expects a bool"):
        parse_knobs(info, ["delayed_update=maybe"])
    with pytest.raises(KnobError, match="stage"):
        parse_knobs(get_policy("none"), ["stage=5"])
    with pytest.raises(KnobError, match="unknown policy"):
        get_policy("tinypipe2")
