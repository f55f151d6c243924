"""Peaks that do not depend on timing: zero-infinity, tinypipe and synergyscale plans have one peak per pool
whatever the copies, the optimizer and the GPU cost, so the simulator and the torch runner (whose copies run at
other relative speeds) see the same peak for one plan (issue 12: replayed peaks within 5% on every pool)."""

from __future__ import annotations

import pytest

from hardware_models import load_hardware
from policies import get_policy, parse_knobs
from policies.job import JobRequest, make_job
from simulator import Plan, simulate_plan
from workloads import ModelSpec

SMALL = dict(name="small", family="custom", n_layers=4, hidden=256, n_heads=8, n_kv_heads=8, ffn=688, vocab=1024,
             max_pos=256, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False, learned_pos=False)
TINY = dict(name="tiny-llama", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=192, vocab=256,
            max_pos=128, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False, learned_pos=False)
BUDGET = ["gpu.reserved={}", "gpu.fragmentation=0"]
# each a timing far from the preset's: copies 100x slower / faster, CPU Adam 1000x slower, the GPU 1000x slower
TIMINGS = {
    "slow-copies": ["pcie.efficiency=0.005", "nvme.read_bw_each=0.07GB/s", "nvme.write_bw_each=0.035GB/s"],
    "fast-copies": ["pcie.efficiency=1", "nvme.read_bw_each=700GB/s", "nvme.write_bw_each=350GB/s",
                    "host.optimizer_params_per_s=5e12"],
    "slow-adam": ["host.optimizer_params_per_s=5e6"],
    "slow-gpu": ["gpu.peak_flops={bf16: 0.312TFLOPS, fp16: 0.312TFLOPS, tf32: 0.156TFLOPS, fp32: 0.0195TFLOPS}",
                 "gpu.hbm_bw=2.039GB/s"],
}
CASES = [  # (policy, knobs, GPU budget as a fraction of the no-offload plan's peak, model)
    ("zero-infinity", {"param_device": "nvme", "optimizer_device": "nvme", "tile_factor": 1}, 0.5, SMALL),
    ("zero-infinity", {"param_device": "cpu", "optimizer_device": "cpu", "tile_factor": 1}, 0.5, SMALL),
    ("tinypipe", {}, 0.5, SMALL),   # resident stage: CPU Adam into bounce buffers
    ("tinypipe", {}, 0.3, SMALL),   # swapped packs: pack buffers and gradient packs
    ("synergyscale", {"auto": False, "streams": 1, "chunks": 1, "cpu_fraction": 1}, 0.3, SMALL),
    ("synergyscale", {}, 0.3, SMALL),  # auto: chunks and streams searched
]


def _plan(policy: str, knobs: dict, frac: float, model: dict, seq: int = 128, mb: int = 2) -> tuple[Plan, list[str]]:
    req = JobRequest(micro_batch=mb, seq_len=seq, global_batch=2 * mb, precision="bf16", checkpointing="full",
                     flash_attention=True)
    job, _ = make_job("a100", ModelSpec(**model), req, hw_overrides=BUDGET)
    none = get_policy("none")
    full = simulate_plan(none.plan(job, parse_knobs(none, {})), job.hw).peak_bytes["gpu0"]
    over = [f"gpu.memory={frac * full:.0f}", *BUDGET]
    job, _ = make_job("a100", ModelSpec(**model), req, hw_overrides=over)
    info = get_policy(policy)
    return info.plan(job, parse_knobs(info, {k: str(v).lower() if isinstance(v, bool) else str(v)
                                              for k, v in knobs.items()})), over


def _offloads(peaks: dict[str, float]) -> bool:
    return peaks.get("cpu", 0.0) > 0 or peaks.get("nvme", 0.0) > 0


@pytest.mark.parametrize("policy,knobs,frac,model", CASES,
                         ids=["zinf-nvme", "zinf-cpu", "tinypipe-resident", "tinypipe-swap", "synergy-1x1",
                              "synergy-auto"])
def test_peak_of_every_pool_is_the_same_at_every_timing(policy: str, knobs: dict, frac: float, model: dict) -> None:
    plan, over = _plan(policy, knobs, frac, model)
    base = simulate_plan(plan, load_hardware("a100", over))
    assert base.feasible and _offloads(base.peak_bytes)
    steps = {"base": base.step_time_s}
    for name, extra in TIMINGS.items():
        r = simulate_plan(plan, load_hardware("a100", over + extra))
        steps[name] = r.step_time_s
        assert r.feasible, name
        for pool, peak in base.peak_bytes.items():
            assert r.peak_bytes.get(pool, 0.0) == pytest.approx(peak, rel=1e-9), (name, pool)
    # the timings really differ (else the check above proves nothing)
    assert max(steps.values()) > 5 * min(steps.values())


def test_tinypipe_swap_case_swaps_packs() -> None:
    plan, _ = _plan("tinypipe", {}, 0.3, SMALL)
    uses = {t.tags.get("use") for seg in plan.segments for t in seg.tasks if t.tags.get("phase") == "param-upload"}
    reserves = [t for seg in plan.segments for t in seg.tasks if t.tags.get("phase") == "buffer-reserve"]
    assert {"fwd", "bwd"} <= uses and reserves
    assert all(t.op == "alloc" and t.stream.endswith(".compute") for t in reserves)


@pytest.mark.parametrize("policy,knobs", [
    ("zero-infinity", {"param_device": "cpu", "optimizer_device": "cpu", "tile_factor": 1}),
    ("tinypipe", {}),
    ("synergyscale", {"auto": False, "streams": 1, "chunks": 1, "cpu_fraction": 1}),
], ids=["zero-infinity", "tinypipe", "synergyscale"])
def test_replayed_peaks_equal_the_simulated_ones(policy: str, knobs: dict) -> None:
    """The torch runner, whose copies and compute run at this machine's speeds, allocates and frees the plan's
    bytes in the same order on every pool: the same peaks as the simulation, to the byte."""
    pytest.importorskip("torch")
    from replay.runner import Runner, measured_result

    plan, over = _plan(policy, knobs, 0.4, TINY, seq=32, mb=1)
    hw = load_hardware("a100", [*over, "gpu.allocator=exact"])
    sim = simulate_plan(plan, hw)
    assert sim.feasible and _offloads(sim.peak_bytes)
    meas = Runner(plan, hw, device="cpu").run()
    assert not meas.leaked
    measured = measured_result(plan, hw, meas)
    for pool in ("gpu0", "cpu", "nvme"):
        assert measured.peak_bytes.get(pool, 0.0) == pytest.approx(sim.peak_bytes.get(pool, 0.0), rel=1e-9), pool
