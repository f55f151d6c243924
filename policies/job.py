"""A job from what the user asked for (hardware, model, workload request, the defaults picked) and the plan
a policy makes of it.

It needs only the hardware models, the workloads and the policy registry, so every layer above can build
jobs and plans the same way: the planner (``planner.job`` re-exports it and hands :func:`make_plan` the
simulator's step seconds), the CLI and public API (``tiersim.api``), sweeps and replay's validation suite.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hardware_models import HardwareSpec, load_hardware, spec_from_dict
from hardware_models.gpu_arch import flash_attention_default
from policies import get_policy
from policies.base import Job, StepSeconds, parse_knobs
from simulator import Plan
from workloads import ModelSpec, WorkloadConfig, build_trace, load_model

DEFAULT_SEQ_CAP = 4096
DEFAULT_SEQS_PER_GPU = 8


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for; ``None`` means "pick a default and say so"."""

    micro_batch: int | None = None
    seq_len: int | None = None
    global_batch: int | None = None
    precision: str | None = None
    checkpointing: str | None = None
    flash_attention: bool | None = None
    checkpoint_early_stop: bool | None = None


def resolve_hardware(hw: str | HardwareSpec, overrides: Sequence[str] = ()) -> HardwareSpec:
    if isinstance(hw, HardwareSpec):
        if overrides:
            return load_hardware_from_spec(hw, overrides)
        return hw
    return load_hardware(hw, overrides)


def load_hardware_from_spec(hw: HardwareSpec, overrides: Sequence[str]) -> HardwareSpec:
    return spec_from_dict(hw.to_dict(), file=f"{hw.name} (given as a HardwareSpec)", overrides=overrides)


def make_job(hw: str | HardwareSpec, model: str | ModelSpec, request: JobRequest | None = None,
             *, hw_overrides: Sequence[str] = ()) -> tuple[Job, list[str]]:
    """Build the Job and the list of defaults that were picked (to show the user every assumption)."""
    spec = resolve_hardware(hw, hw_overrides)
    m = model if isinstance(model, ModelSpec) else load_model(model)
    req = request or JobRequest()
    assumed: list[str] = []

    def pick(name: str, value: Any, default: Any, why: str) -> Any:
        if value is None:
            assumed.append(f"{name}={default} ({why})")
            return default
        return value

    seq = pick("seq_len", req.seq_len, min(m.max_pos, DEFAULT_SEQ_CAP),
               f"the model's context, capped at {DEFAULT_SEQ_CAP}")
    mb = pick("micro_batch", req.micro_batch, 1, "smallest; raise it when memory allows")
    gb = pick("global_batch", req.global_batch, DEFAULT_SEQS_PER_GPU * spec.gpu.count * mb,
              f"{DEFAULT_SEQS_PER_GPU} sequences per GPU per step")
    default_dtype = "bf16" if "bf16" in spec.gpu.peak_flops else "fp16"
    prec = pick("precision", req.precision, default_dtype, "mixed precision with fp32 master weights")
    ckpt = pick("checkpointing", req.checkpointing, "full", "what offloading systems use")
    flash_default, flash_why = flash_attention_default(spec.gpu.model)
    flash = pick("flash_attention", req.flash_attention, flash_default, flash_why)
    early = req.checkpoint_early_stop
    if early is None and ckpt == "full":
        early = pick("checkpoint_early_stop", None, False,
                     "whole blocks recomputed, as Megatron-LM and DeepSpeed do; --checkpoint-early-stop for PyTorch's "
                     "non-reentrant checkpoint")
    config = WorkloadConfig(micro_batch=mb, seq_len=seq, global_batch=gb, precision=prec,
                            checkpointing=ckpt, flash_attention=flash, checkpoint_early_stop=bool(early))
    spec.peak_flops_for(prec)  # a clear error when the GPU has no such dtype
    trace = build_trace(m, config)
    return Job(spec, m, config, trace, tuple(assumed)), assumed


def make_plan(job: Job, policy: str, knobs: Sequence[str] | Mapping[str, Any] = (),
              step_seconds: StepSeconds | None = None, *, template: bool | None = None) -> Plan:
    """The policy's plan for ``job``, refined by the policy's ``refine`` hook (if it has one) with
    ``step_seconds`` (the simulator's seconds per step of a plan: ``simulator.simulate.step_seconds`` on
    ``job.hw``; ``planner.job.make_plan`` passes it). Without ``step_seconds`` the hook is not run and the
    plan is the policy's first one.

    ``template``: where the policy can, a rank template (``simulator.rank_template``: rank 0's tasks of a
    data- and tensor-parallel plan, which simulates exactly as the full plan at a cost independent of the rank
    count, but cannot be saved or replayed); other policies (and one rank) give the full plan. None: as the job
    asks (``Job.rank_template``)."""
    info = get_policy(policy)
    if template is not None and template != job.rank_template:
        job = replace(job, rank_template=template)
    k = parse_knobs(info, knobs)
    # a 1024-GPU plan is a million small acyclic objects: the cyclic collector is paused while the policy
    # builds it, as simulator.gc_pause does for its proof (that module is not plan vocabulary, so not imported)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        plan = info.plan(job, k)
    finally:
        if was_enabled:
            gc.enable()
    if info.refine is None or step_seconds is None:
        return plan
    return info.refine(job, k, plan, step_seconds)
