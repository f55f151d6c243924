"""tiersim's model-state bytes against DeepSpeed's own estimators (DeepSpeed imported once for the module)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from planner.job import JobRequest, make_job, make_plan
from tiersim.deepspeed_memory import compare, zero2_estimate, zero3_estimate

_t0 = time.perf_counter()
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs  # noqa: E402

DS_IMPORT_S = time.perf_counter() - _t0
REQUEST = JobRequest(micro_batch=1, seq_len=128, global_batch=8, precision="bf16", checkpointing="full")


@pytest.mark.parametrize("params", [124_439_808, 6_738_415_616])
@pytest.mark.parametrize("gpus", [1, 4, 8])
@pytest.mark.parametrize("factor", [1.0, 1.5])
def test_restated_estimators_equal_deepspeeds(params: int, gpus: int, factor: float) -> None:
    print(f"deepspeed estimators imported in {DS_IMPORT_S:.2f} s")
    for offload in (True, False):
        assert zero2_estimate(params, gpus, 1, offload, factor) == \
            estimate_zero2_model_states_mem_needs(params, gpus, 1, offload, factor)
        for offload_params in (True, False):
            for zero_init in (True, False):
                args: tuple[Any, ...] = (params, params // 40, gpus, 1, offload, offload_params, zero_init, factor)
                assert zero3_estimate(*args) == estimate_zero3_model_states_mem_needs(*args)


def _comparison(hw: str, policy: str, knobs: dict[str, Any]) -> Any:
    job, _ = make_job(hw, "gpt2", REQUEST)
    c = compare(make_plan(job, policy, knobs))
    assert c is not None
    assert not [why for _, _, why in c.differences if why.startswith("unexplained")], c.lines()
    return c


def test_zero_offload_counts_what_deepspeed_counts() -> None:
    c = _comparison("a100", "zero-offload", {"tp": 1})
    ds_cpu, ds_gpu = estimate_zero2_model_states_mem_needs(124_439_808, 1, 1, True, 1)
    assert (c.ds_gpu, c.ds_host) == (ds_gpu, ds_cpu)
    assert c.differences == () and (c.tiersim_gpu, c.tiersim_host) == (c.ds_gpu, c.ds_host)


def test_zero_offload_on_eight_gpus_names_the_startup_copies() -> None:
    c = _comparison("a100x8", "zero-offload", {"tp": 1})
    (side, nbytes, why), = c.differences
    assert side == "host" and nbytes == pytest.approx(c.tiersim_host - c.ds_host) and "start-up" in why
    copies = _comparison("a100x8", "zero-offload", {"tp": 1, "cpu_param_copy_per_rank": True})
    assert copies.tiersim_host - c.tiersim_host == pytest.approx(4 * 8 * 124_439_808)


@pytest.mark.parametrize("policy,knobs", [("none", {"stage": 2}), ("none", {"stage": 3}),
                                          ("zero-infinity", {}), ("zero-infinity", {"optimizer_device": "nvme"})])
def test_other_stages_differ_only_by_named_terms(policy: str, knobs: dict[str, Any]) -> None:
    c = _comparison("a100x8", policy, knobs)
    for side, mine, theirs in (("gpu", c.tiersim_gpu, c.ds_gpu), ("host", c.tiersim_host, c.ds_host)):
        named = sum(b for s, b, _ in c.differences if s == side)
        assert mine - theirs == pytest.approx(named, abs=16)
    assert c.differences  # each of these counts something DeepSpeed does not (or the reverse), and says what
