"""Laws over the adaptive policies (issue "seed policies"): with GPU memory large enough for the whole job,
`tinypipe`, `lazytrain` and `synergyscale` offload nothing they need not and are not slower than `none`
by more than 5%.

"Nothing offloaded" is checked on the result: no byte crosses a host link (PCIe, switch uplink, NVMe,
unified memcpy) and nothing lives in CPU or NVMe memory. The comparison uses checkpointing "none", since
LazyTrain chooses recomputation itself (by its MILP) and ignores the workload's setting. The bound is
one-sided: SynergyScale keeps its resident tier ZeRO-2-partitioned, which on several GPUs is faster
than `none`'s default ZeRO stage 0 (plain data parallelism) — that is not an offload.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware_models import build_topology, load_hardware
from simulator import simulate_plan
from tiersim.api import JobRequest, make_job, make_plan

HOST_LINK_KINDS = ("pcie", "nvme", "memcpy", "c2c")


@settings(max_examples=8, deadline=None)
@given(policy=st.sampled_from(["tinypipe", "lazytrain", "synergyscale"]),
       hw=st.sampled_from(["a100", "a100x8", "h200"]), model=st.sampled_from(["gpt2", "gpt2-xl", "opt-1.3b"]),
       micro=st.integers(1, 2), accum=st.integers(1, 3))
def test_ample_gpu_memory_offloads_nothing_and_is_not_slower_than_none(policy: str, hw: str, model: str,
                                                                        micro: int, accum: int) -> None:
    spec = load_hardware(hw, ["gpu.memory=2TB"])
    n = spec.gpu.count
    job, _ = make_job(spec, model, JobRequest(micro_batch=micro, global_batch=micro * accum * n, seq_len=1024,
                                              checkpointing="none"))
    adaptive = simulate_plan(make_plan(job, policy), spec)
    base = simulate_plan(make_plan(job, "none"), spec)
    links = build_topology(spec).links
    host_bytes = {ln: b for ln, b in adaptive.link_bytes.items() if links[ln].kind in HOST_LINK_KINDS and b > 0}
    assert host_bytes == {}, f"{policy} moved bytes over host links with ample GPU memory"
    assert adaptive.peak_bytes.get("cpu", 0.0) == 0.0 and adaptive.peak_bytes.get("nvme", 0.0) == 0.0
    assert adaptive.step_time_s <= base.step_time_s * 1.05, (adaptive.step_time_s, base.step_time_s)


@pytest.mark.parametrize("policy", ["tinypipe", "lazytrain", "synergyscale"])
def test_on_one_gpu_with_ample_memory_the_adaptive_policy_is_none(policy: str) -> None:
    spec = load_hardware("a100", ["gpu.memory=2TB"])
    job, _ = make_job(spec, "gpt2-xl", JobRequest(global_batch=2, seq_len=1024, checkpointing="none"))
    adaptive = simulate_plan(make_plan(job, policy), spec)
    base = simulate_plan(make_plan(job, "none"), spec)
    assert adaptive.step_time_s == pytest.approx(base.step_time_s, rel=0.05)
