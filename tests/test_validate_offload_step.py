"""ZeRO-Offload's CPU update sits between the backward and the next forward (DeepSpeed's stage-2 ``step()``
runs CPU Adam over the whole partition before it returns): without DPU the next step's first forward
starts after the last upload; with DPU it does not wait for it. This is what moved the ZeRO-Offload 10B
validation case from +31% to inside its tolerance."""

from __future__ import annotations

from simulator import simulate_plan
from tiersim.api import JobRequest, make_job, make_plan


def _records(delayed: bool) -> tuple[float, float, float]:
    job, _ = make_job("a100", "gpt2", JobRequest(micro_batch=2, global_batch=2, seq_len=256))
    res = simulate_plan(make_plan(job, "zero-offload", {"delayed_update": delayed}), job.hw)
    last = len(job.trace.layers) - 1
    by = {(r.id, r.step): r for r in res.records}
    measured = max(r.step for r in res.records)  # the last step is the measured one
    up_end = by[(f"up{last}.gpu0", measured - 1)].end
    fwd_start = by[("fwd1.gpu0", measured)].start
    return up_end, fwd_start, res.step_time_s


def test_without_dpu_the_next_forward_waits_for_the_whole_update() -> None:
    up_end, fwd_start, _ = _records(False)
    assert fwd_start >= up_end


def test_with_dpu_the_forward_does_not_wait_for_the_last_upload() -> None:
    up_end, fwd_start, dpu_step = _records(True)
    assert fwd_start < up_end
    assert dpu_step < _records(False)[2]
