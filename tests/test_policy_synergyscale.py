"""Policy `synergyscale`: tiers, search, chunking, feasibility verdicts and invariants on the presets."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardware_models import load_hardware
from policies import KnobError, PlanInfeasible, parse_knobs
from policies import synergyscale as ss
from policies.base import Job
from simulator import simulate_plan
from simulator.invariants import check_invariants
from tiersim.api import JobRequest, make_job, make_plan


@functools.cache
def job_for(hw: str, model: str, overrides: tuple[str, ...] = (), **req):  # noqa: ANN003, ANN201
    spec = load_hardware(hw, list(overrides))
    job, _ = make_job(spec, model, JobRequest(**req))
    return job


@functools.cache
def run(job, knobs: ss.Knobs = ss.Knobs()):  # noqa: ANN001, ANN201, B008
    """The plan as the planner makes it (``make_plan``: the analytic choice, refined by simulation)."""
    plan = make_plan(job, "synergyscale", dataclasses.asdict(knobs))
    return plan, simulate_plan(plan, job.hw)


# jobs whose GPUs are too small for the model, so every tier and the search matter
SMALL_A100 = ("a100", "gpt2-xl", ("gpu.memory=12GiB",), (("seq_len", 1024), ("global_batch", 4)))
SMALL_A100_MB2 = ("a100", "opt-1.3b", ("gpu.memory=16GiB",),
                  (("seq_len", 1024), ("global_batch", 2), ("micro_batch", 2)))
SMALL_A100X8 = ("a100x8", "opt-6.7b", ("gpu.memory=16GiB",), (("seq_len", 1024), ("global_batch", 8)))


def job_of(case) -> Job:  # noqa: ANN001
    hw, model, ov, req = case
    return job_for(hw, model, ov, **dict(req))


# (1) ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [SMALL_A100, SMALL_A100_MB2, SMALL_A100X8], ids=["a100-gpt2xl", "a100-opt1.3b",
                                                                                   "a100x8-opt6.7b"])
def test_auto_selection_is_never_worse_than_the_fixed_defaults(case) -> None:  # noqa: ANN001
    job = job_of(case)
    plan, auto = run(job)
    _, fixed = run(job, ss.Knobs(auto=False))
    assert auto.feasible and fixed.feasible
    assert auto.step_time_s <= fixed.step_time_s * (1 + 1e-9)
    assert plan.info["candidates_evaluated"] > 1
    assert set(plan.info["chosen"]) >= {"chunks", "streams", "buffers", "order", "gpu_share"}
    assert {"gpu", "peer", "cpu", "nvme"} == set(plan.info["tiers"])
    assert check_invariants(auto) == []


def test_search_records_what_it_did_and_is_analytic_for_70b() -> None:
    job = job_for("a100x8", "70b", global_batch=16)
    plan, result = run(job)
    info = plan.info
    assert info["search"] == "analytic" and info["candidates_simulated"] == 0
    assert info["candidates_evaluated"] >= 10
    assert info["estimate_step_s"] <= info["default_estimate_step_s"]
    assert result.step_time_s == pytest.approx(info["estimate_step_s"], rel=0.05)  # the estimate is close
    assert info["tiers"]["cpu"]["layers"] > 0 and info["tiers"]["nvme"]["layers"] == 0
    assert check_invariants(result) == []


# (2) ------------------------------------------------------------------------------------------------
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hw=st.sampled_from(["a100", "a100x8", "rtx4090x4"]), model=st.sampled_from(["gpt2", "opt-1.3b"]),
       micro_batch=st.sampled_from([1, 2]), seq_len=st.sampled_from([512, 1024]))
def test_with_ample_gpu_memory_nothing_is_offloaded_and_it_matches_no_offload(hw: str, model: str, micro_batch: int,
                                                                             seq_len: int) -> None:
    n = load_hardware(hw).gpu.count
    job = job_for(hw, model, ("gpu.memory=2TB",), micro_batch=micro_batch, seq_len=seq_len,
                  global_batch=micro_batch * n * 2)
    plan, ours = run(job)
    assert plan.info["tiers"]["gpu"]["fraction"] == 1.0
    assert ours.peak_bytes["cpu"] == 0 and ours.peak_bytes.get("nvme", 0) == 0
    assert plan.info["gpu_bytes_saved_per_gpu"] == 0
    if n == 1:
        assert not any(ours.link_bytes.values())  # not a byte leaves the GPU
    # the resident tier is ZeRO-2 (gradients and optimizer states partitioned): the same plan as `none` at
    # stage 2 (identical to stage 0 on one GPU), and never slower than plain data parallelism
    zero2 = simulate_plan(make_plan(job, "none", {"stage": 2}), job.hw)
    ddp = simulate_plan(make_plan(job, "none"), job.hw)
    assert ours.step_time_s == pytest.approx(zero2.step_time_s, rel=0.05)
    assert ours.step_time_s <= ddp.step_time_s * 1.05
    if n == 1:
        assert ours.step_time_s == pytest.approx(ddp.step_time_s, rel=1e-9)


# (3) ------------------------------------------------------------------------------------------------
def test_peer_tier_uses_nvlink_and_stays_within_the_peers_spare_memory() -> None:
    job = job_of(SMALL_A100X8)
    plan, result = run(job)
    info = plan.info
    assert info["tiers"]["peer"]["layers"] > 0
    assert 0 < info["peer_bytes_per_gpu"] <= info["gpu_spare_bytes_per_gpu"]
    assert result.feasible
    for g in (f"gpu{r}" for r in range(8)):
        assert result.peak_bytes[g] <= result.capacity_bytes[g]
    gathers = [r for r in result.records if r.tags.get("tier") == "peer"]
    assert gathers and all(ln.endswith(".nvlink") for r in gathers for ln in r.links)


@pytest.mark.parametrize("hw,model", [("rtx4090x4", "7b"), ("a100", "13b")])
def test_no_peer_tier_without_nvlink_or_peers(hw: str, model: str) -> None:
    job = job_for(hw, model, seq_len=1024, global_batch=4)
    plan = ss.plan(job, ss.Knobs(auto=False))
    assert plan.info["tiers"]["peer"]["layers"] == 0 and plan.info["tiers"]["cpu"]["layers"] > 0
    with pytest.raises(KnobError, match="peer_fraction"):
        ss.plan(job, ss.Knobs(peer_fraction="0.2"))


# (4) ------------------------------------------------------------------------------------------------
MIXED = {"a100x8": ss.Knobs(auto=False, peer_fraction="0.3", cpu_fraction="0.3", nvme_fraction="0.2", chunks=3,
                            streams=2),
         "h200x8": ss.Knobs(auto=False, peer_fraction="0.4", cpu_fraction="0.2", chunks=2, streams=2,
                            offload_activations=True),
         "dgx2": ss.Knobs(auto=False, peer_fraction="0.5", nvme_fraction="0.2", chunks=1),
         "a100": ss.Knobs(auto=False, cpu_fraction="0.4", nvme_fraction="0.3", chunks=2, streams=2, order="spread"),
         "rtx4090x4": ss.Knobs(auto=False, cpu_fraction="0.5", nvme_fraction="0.2", chunks=2, streams=1,
                               offload_activations=True),
         "dgx-spark": ss.Knobs(auto=False, nvme_fraction="0.5", chunks=2, streams=2)}


@pytest.mark.parametrize("hw", list(MIXED))
@pytest.mark.parametrize("mixed", [False, True], ids=["auto", "every-tier"])
def test_invariants_hold_on_the_presets(hw: str, mixed: bool) -> None:
    job = job_for(hw, "gpt2", seq_len=512, global_batch=load_hardware(hw).gpu.count)
    plan, result = run(job, MIXED[hw] if mixed else ss.Knobs())
    assert result.feasible, result.oom
    assert check_invariants(result) == []
    if mixed:
        used = {t for t, v in plan.info["tiers"].items() if v["layers"]}
        assert used >= {"gpu"} | {t for t in ("peer", "cpu", "nvme") if getattr(MIXED[hw], f"{t}_fraction") != "auto"}


def test_unified_memory_cpu_placement_reports_no_savings() -> None:
    """dgx-spark: auto never uses the CPU tier (it is the GPU's own pool); forced, it saves nothing."""
    job = job_for("dgx-spark", "13b", seq_len=1024, global_batch=1)
    plan, result = run(job)
    assert plan.info["tiers"]["cpu"]["layers"] == 0 and plan.info["tiers"]["nvme"]["layers"] > 0
    assert result.feasible and check_invariants(result) == []
    small = job_for("dgx-spark", "gpt2", seq_len=512, global_batch=1)
    forced, res_forced = run(small, ss.Knobs(auto=False, cpu_fraction="0.5"))
    _, res_resident = run(small)
    assert forced.info["tiers"]["cpu"]["layers"] > 0
    assert forced.info["gpu_bytes_saved_per_gpu"] <= 0
    assert res_forced.peak_bytes["unified"] >= res_resident.peak_bytes["unified"]
    assert any("unified memory" in n for n in forced.notes)


# (5) ------------------------------------------------------------------------------------------------
def test_infeasible_when_no_tier_has_room_names_the_pool_and_overshoot() -> None:
    job = job_for("a100", "405b", seq_len=1024, global_batch=1)
    with pytest.raises(PlanInfeasible) as e:
        ss.plan(job, ss.Knobs())
    assert e.value.pool in ("cpu", "nvme")
    assert e.value.need_bytes > e.value.capacity_bytes
    assert "over by" in str(e.value) and e.value.to_dict()["over_by_bytes"] > 0


def test_infeasible_when_the_gpu_working_set_alone_does_not_fit() -> None:
    job = job_for("a100-40g", "gpt2-xl", seq_len=1024, micro_batch=64, global_batch=64, checkpointing="none",
                  flash_attention=False)
    with pytest.raises(PlanInfeasible) as e:
        ss.plan(job, ss.Knobs())
    assert e.value.pool == "gpu0" and e.value.need_bytes > e.value.capacity_bytes


def without_nvme(hw: str):  # noqa: ANN201
    return dataclasses.replace(load_hardware(hw), nvme=None, sources={})


def test_without_nvme_the_host_is_the_last_tier() -> None:
    job, _ = make_job(without_nvme("a100"), "70b", JobRequest(seq_len=1024, global_batch=1))
    with pytest.raises(PlanInfeasible) as e:
        ss.plan(job, ss.Knobs())
    assert e.value.pool == "cpu" and e.value.need_bytes > e.value.capacity_bytes
    with pytest.raises(KnobError, match="nvme_fraction"):
        ss.plan(job, ss.Knobs(nvme_fraction="0.5"))


def test_host_gradient_width_decides_whether_70b_fits_one_a100_when_accumulating() -> None:
    """With gradient accumulation the NVMe tier sums its gradients in a host buffer (``host_grad_bytes``), so
    DRAM bounds the model; with one micro-step they go to NVMe (tests/test_synergyscale_nvme.py)."""
    job = job_for("a100", "70b", seq_len=1024, global_batch=4)
    with pytest.raises(PlanInfeasible) as e:  # fp32 host gradients of ~64B parameters exceed its DRAM
        ss.plan(job, ss.Knobs(auto=False))
    assert e.value.pool == "cpu"
    plan = ss.plan(job, ss.Knobs(auto=False, host_grad_bytes=2))  # bf16 host gradients: fits, mostly on NVMe
    assert plan.info["tiers"]["nvme"]["fraction"] > 0.5
    one = ss.plan(job_for("a100", "70b", seq_len=1024, global_batch=1), ss.Knobs(auto=False))
    assert one.info["tiers"]["nvme"]["fraction"] > 0.5  # fp32 gradients, swapped to NVMe


# (6) ------------------------------------------------------------------------------------------------
def test_more_chunks_help_then_stop_helping() -> None:
    """Chunking lets compute start after 1/c of a layer's transfer; tiny chunks lose efficiency on the
    GPU's gemm_efficiency curve (and pay a launch and a copy latency each), so the curve turns up."""
    job = job_for("a100", "gpt2-xl", seq_len=1024, global_batch=1)
    times = {}
    for c in (1, 4, 64):
        plan, result = run(job, ss.Knobs(auto=False, cpu_fraction="0.6", chunks=c, streams=1, prefetch=1))
        times[c] = result.step_time_s
        fwd = [t for t in plan.segments[0].tasks if t.tags.get("phase") == "fwd" and t.tags.get("chunk") == 0]
        layer = job.trace.layers[fwd[-1].tags["layer"]]
        assert fwd[-1].flops == pytest.approx(layer.fwd_flops / c)
        assert check_invariants(result) == []
    assert times[4] < times[1]
    assert times[64] > times[4]
    hw = job.hw
    block = job.trace.layers[1].fwd_flops
    assert hw.gpu.gemm_efficiency(block / 64) < hw.gpu.gemm_efficiency(block / 4)


# semantics and knobs --------------------------------------------------------------------------------
def test_no_delayed_update_every_fetch_waits_for_its_layers_update() -> None:
    job = job_of(SMALL_A100X8)
    plan, _ = run(job, MIXED["a100x8"])
    tiers = plan.info["layer_tiers"]
    tasks = {t.id: t for t in plan.segments[0].tasks}
    assert {"p", "c", "n"} <= set(tiers)
    for i, t in enumerate(tiers):
        deps = set()
        for tid in (f"agf{i}_0", f"upf{i}_0.gpu0", f"rdf{i}_0"):
            if tid in tasks:
                deps |= {str(d) for d in tasks[tid].deps}
        want = {"p": "gopt.gpu0^1", "c": "adam{i}.r0^1", "n": f"swo{i}^1", "g": None}[t]
        if want:
            assert want.format(i=i) in deps, (i, t, deps)
    assert plan.steps == 2


def test_knobs_parse_and_validate() -> None:
    knobs = parse_knobs(ss.POLICY, ["peer_fraction=0.25", "cpu_fraction=auto", "chunks=4", "order=spread"])
    assert knobs.fractions().peer == 0.25 and knobs.fractions().cpu is None and knobs.chunks == 4
    for bad in (["cpu_fraction=1.5"], ["cpu_fraction=lots"], ["peer_fraction=0.6", "cpu_fraction=0.6"],
                ["chunks=-1"], ["order=middle"], ["prefetch=-2"], ["host_grad_bytes=3"]):
        with pytest.raises(KnobError):
            parse_knobs(ss.POLICY, bad)
    job = job_for("a100", "gpt2", seq_len=512, global_batch=1)
    with pytest.raises(KnobError, match="chunks"):
        ss.plan(job, ss.Knobs(chunks=-3))


# the simulated refinement runs through the refine hook, never inside plan() ----------------------------
def test_plan_is_the_analytic_choice_and_make_plan_refines_it_by_simulation() -> None:
    job = job_of(SMALL_A100)
    analytic = ss.plan(job, ss.Knobs())
    assert analytic.info["search"] == "analytic" and analytic.info["candidates_simulated"] == 0
    refined, _ = run(job)
    assert refined.info["search"] == "analytic + simulated" and refined.info["candidates_simulated"] > 1
    assert refined.info["simulated_step_s"] > 0
    assert refined.info["estimate_step_s"] == analytic.info["estimate_step_s"]


def test_refine_prices_candidates_only_with_the_step_seconds_it_is_given() -> None:
    job = job_of(SMALL_A100)
    knobs = ss.Knobs()
    analytic = ss.plan(job, knobs)
    seen: list[str] = []

    def flat(plan) -> float:  # noqa: ANN001 - every candidate costs 10 s
        seen.append(repr(plan.info["chosen"]))
        return 10.0

    refined = ss.refine(job, knobs, analytic, flat)
    candidates = list(dict.fromkeys(seen))
    assert len(candidates) == refined.info["candidates_simulated"] > 1
    assert len(seen) == 2 * len(candidates)  # 1 and 2 micro-steps each (4 micro-steps: extrapolated)
    assert refined.info["simulated_step_s"] == 10.0
    # on a tie the fixed defaults (the first candidate priced) are kept
    assert repr(refined.info["chosen"]) == candidates[0]
    assert refined.info["chosen"] == ss.plan(job, ss.Knobs(auto=False)).info["chosen"]

    def prefer_last(plan) -> float:  # noqa: ANN001 - the last candidate is the fast one
        return 1.0 if repr(plan.info["chosen"]) == candidates[-1] else 10.0

    faster = ss.refine(job, knobs, analytic, prefer_last)
    assert repr(faster.info["chosen"]) == candidates[-1] and faster.info["simulated_step_s"] == 1.0


def test_refine_leaves_unsearched_and_too_large_plans_alone() -> None:
    def never(plan) -> float:  # noqa: ANN001
        raise AssertionError("nothing to simulate")

    small = job_of(SMALL_A100)
    fixed = ss.plan(small, ss.Knobs(auto=False))
    assert ss.refine(small, ss.Knobs(auto=False), fixed, never) is fixed
    big = job_for("a100x8", "70b", global_batch=16)
    analytic = ss.plan(big, ss.Knobs())
    assert ss.refine(big, ss.Knobs(), analytic, never) is analytic


def test_policies_never_run_the_simulator() -> None:
    import pathlib

    root = pathlib.Path(ss.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "simulate_plan" not in text and "simulator.engine" not in text, path
