"""Policy ``zero-infinity``: NVMe traffic per step, invariants on presets, infeasibility, prefetch, memory."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from policies import KnobError, PlanInfeasible, parse_knobs
from policies import zero_infinity as zi
from simulator import Result, simulate_plan
from simulator.invariants import check_invariants
from tiersim.api import JobRequest, make_job


def job_for(hw: str, model: str = "gpt2", **kw):  # noqa: ANN003, ANN201
    req = JobRequest(**{"seq_len": 1024, "global_batch": None, **kw})
    job, _ = make_job(hw, model, req)
    return job


def run(job, **knobs) -> Result:  # noqa: ANN001
    plan = zi.plan(job, parse_knobs(zi.POLICY, knobs))
    return simulate_plan(plan, job.hw)


def nvme_bytes_by_phase(result: Result) -> dict[str, float]:
    """Bytes over nvme.io in the measured step, by the task's phase tag."""
    last = result.simulated_plan.steps - 1
    out: dict[str, float] = defaultdict(float)
    for r in result.records:
        if r.step == last and "nvme.io" in r.links:
            out[r.tags["phase"]] += r.bytes
    return dict(out)


def test_knob_defaults_follow_the_paper_and_deepspeed() -> None:
    k = zi.Knobs()
    assert (k.param_device, k.optimizer_device) == ("cpu", "cpu")
    assert (k.nvme_prefetch, k.cpu_prefetch, k.gather_prefetch) == (3, 2, 1)
    assert k.sub_group_size == 1_000_000_000 and k.pipeline_io and not k.offload_checkpoints
    assert k.grad_bytes_per_param == 2.0
    assert zi.POLICY.name == "zero-infinity" and "Where our reading is weakest" in zi.POLICY.doc


@pytest.mark.parametrize("item,match", [("param_device=disk", "param_device"), ("nvme_prefetch=-1", "nvme_prefetch"),
                                        ("grad_bytes_per_param=3", "grad_bytes_per_param"),
                                        ("sub_group_size=0", "sub_group_size"), ("pipeline_io=maybe", "pipeline_io")])
def test_bad_knobs_are_named(item: str, match: str) -> None:
    with pytest.raises(KnobError, match=match):
        parse_knobs(zi.POLICY, [item])


@pytest.mark.parametrize("knob", ["optimizer_device", "param_device"])
def test_nvme_placement_needs_an_nvme_drive(knob: str) -> None:
    job = job_for("a100")
    sources = {k: v for k, v in job.hw.sources.items() if not k.startswith("nvme.")}
    job = dataclasses.replace(job, hw=dataclasses.replace(job.hw, nvme=None, sources=sources))
    with pytest.raises(KnobError, match=f"'{knob}' = nvme"):
        zi.plan(job, zi.Knobs(**{knob: "nvme"}))


def test_cpu_holds_all_20_bytes_per_param_by_default() -> None:
    """ZeRO-Infinity's 20 B/param: fp16 p + g (2 + 2), fp32 p, m, v (12), fp32 g (4), all on the CPU here
    (accumulating over 2 micro-steps, so DeepSpeed keeps the 16-bit CPU gradient buffer)."""
    job = job_for("a100x8", "7b", global_batch=16)
    p = job.trace.params
    plan = zi.plan(job, zi.Knobs())
    assert sum(plan.info["model_state_bytes"]["cpu"].values()) == pytest.approx(20 * p, rel=1e-12)
    nv = zi.plan(job, zi.Knobs(param_device="nvme", optimizer_device="nvme")).info["model_state_bytes"]
    assert nv["cpu"] == {"grad": 2 * p}  # the 16-bit accumulation buffer stays on the CPU
    assert sum(nv["nvme"].values()) == pytest.approx(18 * p, rel=1e-12)
    result = simulate_plan(plan, job.hw)
    assert check_invariants(result) == []
    assert result.peak_bytes["cpu"] >= 20 * p
    assert result.peak_by_kind["gpu0"]["param16"] < 0.1 * 2 * p  # a window of layers, not the model


@pytest.mark.parametrize("global_batch", [8, 16])
def test_optimizer_on_nvme_moves_32_bytes_per_param_per_step(global_batch: int) -> None:
    """Per step: fp32 gradients written at the accumulation boundary (4 B/param), then per sub-group read of
    master, m, v and gradient (16) and write of master, m, v (12): 32 B/param whatever the micro-step count."""
    job = job_for("a100x8", global_batch=global_batch)
    p = job.trace.params
    result = run(job, optimizer_device="nvme", sub_group_size=5_000_000)
    assert result.simulated_plan.info["accumulation"] == global_batch // 8
    assert len(result.simulated_plan.info["sub_groups"]) > 1
    assert result.link_bytes["nvme.io"] == pytest.approx(32 * p, rel=1e-9)
    phases = nvme_bytes_by_phase(result)
    assert phases["optimizer-swap-in"] == pytest.approx(16 * p, rel=1e-9)
    assert phases["optimizer-swap-out"] == pytest.approx(12 * p, rel=1e-9)
    assert phases["grad-swap-out"] == pytest.approx(4 * p, rel=1e-9)
    assert result.simulated_plan.info["nvme_bytes_per_step"] == pytest.approx({"read": 16 * p, "write": 16 * p})
    assert check_invariants(result) == []


def test_params_on_nvme_move_2_bytes_per_param_per_fetch() -> None:
    """Each micro-step fetches every layer twice (forward, backward): 2 B/param each; the update writes 2."""
    job = job_for("a100x8", global_batch=16)
    p = job.trace.params
    result = run(job, param_device="nvme")
    phases = nvme_bytes_by_phase(result)
    assert phases["param-swap-in"] == pytest.approx(2 * 2 * 2 * p, rel=1e-9)  # 2 micro-steps x 2 fetches
    assert phases["param-swap-out"] == pytest.approx(2 * p, rel=1e-9)
    assert result.link_bytes["nvme.io"] == pytest.approx(10 * p, rel=1e-9)
    # every rank's PCIe link carries its 1/dp slice per fetch plus its gradient slice per micro-step
    assert result.link_bytes["gpu0.pcie"] == pytest.approx(2 * (2 * 2 + 2) * p / 8, rel=1e-9)
    assert check_invariants(result) == []


def test_cpu_placement_moves_nothing_over_nvme() -> None:
    job = job_for("a100x8", global_batch=8)
    assert run(job).link_bytes.get("nvme.io", 0.0) == 0.0


@pytest.mark.parametrize("hw", ["a100x8", "a100", "dgx2", "rtx4090x4", "dgx-spark"])
@pytest.mark.parametrize("knobs", [{}, {"param_device": "nvme", "optimizer_device": "nvme",
                                        "offload_checkpoints": True, "sub_group_size": 20_000_000}])
def test_invariants_hold_on_presets(hw: str, knobs: dict) -> None:
    job = job_for(hw)
    job = job_for(hw, global_batch=job.n_gpus)  # one micro-step (two-micro-step plans: tests above and below)
    result = run(job, **knobs)
    assert result.feasible, result.oom
    assert check_invariants(result) == []


def test_invariants_hold_for_70b_on_a100x8() -> None:
    job = job_for("a100x8", "70b", seq_len=4096, global_batch=16)
    result = run(job, param_device="nvme", optimizer_device="nvme")
    assert result.feasible and check_invariants(result) == []
    assert result.peak_bytes["gpu0"] < 0.25 * result.capacity_bytes["gpu0"]


def test_unified_memory_cpu_placement_saves_nothing() -> None:
    """dgx-spark: 'cpu' is the GPU's own pool, so only NVMe relieves it."""
    job = job_for("dgx-spark", "gpt2-xl", global_batch=2)
    p = job.trace.params
    cpu = run(job)
    # a sub-group of 1e8 parameters keeps the pinned swap buffers (16 B/param, 3 in flight) small
    nvme = run(job, param_device="nvme", optimizer_device="nvme", sub_group_size=100_000_000)
    assert set(cpu.peak_bytes) == {"unified", "nvme"}
    assert cpu.peak_bytes["unified"] >= 20 * p  # every model state in the shared pool
    assert cpu.peak_bytes["unified"] - nvme.peak_bytes["unified"] >= 0.5 * 18 * p
    assert any("unified memory" in n for n in cpu.notes)
    assert check_invariants(cpu) == [] and check_invariants(nvme) == []
    big = job_for("dgx-spark", "7b", seq_len=4096, global_batch=1)
    with pytest.raises(PlanInfeasible) as e:
        zi.plan(big, zi.Knobs())
    assert e.value.pool == "unified"
    zi.plan(big, zi.Knobs(param_device="nvme", optimizer_device="nvme"))  # fits once states go to NVMe


def test_infeasible_on_a_tiny_host_names_pool_and_overshoot() -> None:
    job = job_for("rtx4090x4", "70b", seq_len=4096, global_batch=4)
    with pytest.raises(PlanInfeasible) as e:
        zi.plan(job, zi.Knobs())
    assert e.value.pool == "cpu"
    # 18 B/param: no 16-bit CPU gradient buffer without accumulation (DeepSpeed 0.3-0.4)
    assert e.value.need_bytes >= 18 * job.trace.params > e.value.capacity_bytes
    assert "over by" in str(e.value) and "model states" in e.value.what
    zi.plan(job, zi.Knobs(param_device="nvme", optimizer_device="nvme"))  # the drive holds what the host cannot
    huge = job_for("rtx4090x4", "405b", seq_len=4096, global_batch=4)
    with pytest.raises(PlanInfeasible) as e:
        zi.plan(huge, zi.Knobs(param_device="nvme", optimizer_device="nvme"))
    assert e.value.pool == "gpu0" and "working set" in e.value.what
    assert e.value.need_bytes > e.value.capacity_bytes


def test_longer_prefetch_never_exposes_more_transfer_and_uses_more_gpu_memory() -> None:
    """gpt2 on a100x8 is transfer-bound (the GPUs idle most of the step). Scaling all three distances up
    never raises exposed transfer or step time, and holds more layers in flight on the GPU."""
    job = job_for("a100x8", global_batch=8)
    runs = [run(job, nvme_prefetch=a, cpu_prefetch=c, gather_prefetch=g)
            for a, c, g in [(0, 0, 0), (1, 1, 1), (3, 2, 1), (6, 4, 2), (12, 8, 4)]]
    assert runs[0].step_time_s > 1.5 * runs[0].compute_busy_s  # transfer-bound
    for a, b in zip(runs, runs[1:], strict=False):
        assert b.exposed_transfer_s <= a.exposed_transfer_s * (1 + 1e-9)
        assert b.step_time_s <= a.step_time_s * (1 + 1e-9)
        assert b.peak_bytes["gpu0"] >= a.peak_bytes["gpu0"]
    assert runs[-1].exposed_transfer_s < runs[0].exposed_transfer_s
    assert runs[-1].peak_bytes["gpu0"] > runs[0].peak_bytes["gpu0"]


def test_prefetch_window_bounds_gathered_layers() -> None:
    """With gather_prefetch d at most d+1 gathered layers live on a GPU (plus the one being released)."""
    job = job_for("a100", "7b", global_batch=1)
    block = max(layer.params for layer in job.trace.layers[1:-1]) * 2
    for d in (0, 2):
        r = run(job, gather_prefetch=d, cpu_prefetch=d + 1, nvme_prefetch=d + 2)
        assert r.peak_by_kind["gpu0"]["param16"] <= (d + 2) * block * 1.01


def test_pipelined_optimizer_io_overlaps_and_holds_more_buffers() -> None:
    job = job_for("a100", global_batch=1)
    kn = {"optimizer_device": "nvme", "sub_group_size": 10_000_000}
    piped = run(job, **kn)
    serial = run(job, **kn, pipeline_io=False)
    k = len(piped.simulated_plan.info["sub_groups"])
    assert k >= 6
    assert piped.step_time_s < serial.step_time_s
    assert piped.link_bytes["nvme.io"] == pytest.approx(serial.link_bytes["nvme.io"], rel=1e-12)
    q = max(piped.simulated_plan.info["sub_group_params_per_rank"])
    extra = piped.peak_bytes["cpu"] - serial.peak_bytes["cpu"]
    assert 0 < extra <= 2 * 16 * q * (1 + 1e-9)  # at most two more sub-groups' swap buffers in flight
    assert check_invariants(piped) == [] and check_invariants(serial) == []


def test_sub_groups_respect_sub_group_size() -> None:
    job = job_for("a100x8", "7b", global_batch=8)
    for size in (10**9, 3 * 10**8, 10**7):
        groups = zi.sub_groups(job, 8, size)
        assert [i for g in groups for i in g] == list(range(len(job.trace.layers)))
        for g in groups:
            per_rank = sum(job.trace.layers[i].params for i in g) / 8
            assert per_rank <= size or len(g) == 1


def test_offloaded_checkpoints_leave_the_gpu() -> None:
    job = job_for("a100", "7b", global_batch=1)
    base = run(job)
    off = run(job, offload_checkpoints=True)
    ckpt = sum(layer.activation_bytes for layer in job.trace.layers if layer.kind == "block")
    assert off.peak_by_kind["cpu"].get("checkpoint", 0.0) > 0
    assert off.peak_bytes["gpu0"] < base.peak_bytes["gpu0"]
    assert off.link_bytes["gpu0.pcie"] - base.link_bytes["gpu0.pcie"] == pytest.approx(2 * ckpt, rel=1e-9)
    assert check_invariants(off) == []
