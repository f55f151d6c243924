"""``zero-infinity``'s plan: streams, tensors at their homes, the micro-steps and the optimizer step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from policies import kit
from policies.base import Job, unified
from policies.builder import PlanBuilder
from policies.zero_infinity.knobs import NAME, Knobs
from policies.zero_infinity.microstep import MicroStep
from policies.zero_infinity.optimizer import emit_optimizer, last_optimizer_tasks
from policies.zero_infinity.sizes import (
    DS_PARAM_BUFFER_SIZE,
    DS_PARAM_BUFFERS,
    check_fit,
    model_state_bytes,
    nvme_bytes_per_step,
    offloads_ckpt,
    param_pinned_window,
    per_param_bytes,
    state_homes,
    sub_groups,
)
from simulator import Plan


def plan(job: Job, knobs: Knobs) -> Plan:
    knobs.validate()
    knobs.check_devices(job)
    n = job.n_gpus
    accum = job.accumulation(n)
    groups = sub_groups(job, n, knobs.sub_group_size)
    need = check_fit(job, knobs, n, groups)
    b = PlanBuilder(NAME, knobs, job)
    lay = kit.Layout(n, flat_comm=True)
    kit.declare_streams(b, lay, cpu_adam=True,
                        cpu_per_rank=[("owrite", "io")] * (knobs.param_nvme or knobs.optimizer_nvme)  # fp16 + states
                        + [("oread", "io")] * knobs.optimizer_nvme,                                   # swapper reads
                        shared=[("cpu.pread", "cpu", "io")] * knobs.param_nvme       # parameter reads, all ranks
                        + [("cpu.gwrite", "cpu", "io")] * knobs.optimizer_nvme,      # fp32 gradients, all ranks
                        comm_order=("param", "grad"))
    state_tensors(b, job, knobs, n)
    kit.workspace(b, job, lay)
    step_tensors(b, job, knobs, n, groups)
    last_opt = last_optimizer_tasks(knobs, n, len(groups))
    segs: list[tuple[str, int, bool]] = [("micro-steps", accum - 1, False)] if accum > 1 else []
    for name, rep, boundary in [*segs, ("last-micro-step", 1, True)]:
        b.segment(name, rep)
        prev: Callable[[str], str | None] = (lambda x: f"{x}@1") if not boundary else \
            (lambda x: x) if accum > 1 else (lambda x: None)
        MicroStep(b, job, knobs, n, ".last" if boundary else "", prev, boundary, last_opt).emit()
    b.segment("optimizer", 1)
    emit_optimizer(b, job, knobs, n, groups)
    return b.build(steps=2, notes=notes(job, knobs, n, accum, len(groups)),
                   info=info(job, knobs, n, accum, groups, need))


def state_tensors(b: PlanBuilder, job: Job, knobs: Knobs, n: int) -> None:
    """Persistent model states, per rank partition, at their homes."""
    homes = state_homes(knobs)
    for r in range(n):
        for kind, nb in per_param_bytes(job, knobs).items():
            if nb > 0:
                b.tensor(f"{kind}.r{r}", nb * job.trace.params / n, kind, home=homes[kind], persistent=True)


def step_tensors(b: PlanBuilder, job: Job, knobs: Knobs, n: int, groups: list[list[int]]) -> None:
    """Per rank: each layer's micro-step tensors, then each sub-group's optimizer staging buffers."""
    for r in range(n):
        for i in range(len(job.trace.layers)):
            layer_tensors(b, job, knobs, n, r, i)
        for k, grp in enumerate(groups):
            q = sum(job.trace.layers[i].params for i in grp) / n
            if knobs.optimizer_nvme:
                pp = per_param_bytes(job, knobs)
                b.tensor(f"osb{k}.r{r}", q * (pp["param32"] + pp["optim"] + pp["grad32"]), "buffer", scope="step")
            if knobs.param_nvme:
                b.tensor(f"pst{k}.r{r}", q * kit.dtype_bytes(job), "buffer", scope="step")


def layer_tensors(b: PlanBuilder, job: Job, knobs: Knobs, n: int, r: int, i: int) -> None:
    """Layer i's tensors of one micro-step on rank r: activations, gradient bucket and slice, the fp32
    gradient staging buffer, and per use the gathered layer, its GPU slice and its pinned CPU slice."""
    layer = job.trace.layers[i]
    g = f"gpu{r}"
    db = kit.dtype_bytes(job)
    s = layer.params / n
    ckpt_kind = "checkpoint" if job.config.checkpointing == "full" else "activation"
    b.tensor(f"act{i}.{g}", layer.activation_bytes, ckpt_kind if offloads_ckpt(job, knobs, i) else "activation",
             scope="iteration", layer=i)
    b.tensor(f"gb{i}.{g}", layer.params * db, "grad", scope="iteration", layer=i)
    if n > 1:
        b.tensor(f"gs{i}.{g}", s * knobs.grad_bytes_per_param, "grad", scope="iteration", layer=i)
    if knobs.optimizer_nvme:
        b.tensor(f"gst{i}.r{r}", s * per_param_bytes(job, knobs)["grad32"], "buffer", scope="iteration", layer=i)
    for ph in "fb":
        b.tensor(f"pg{ph}{i}.{g}", layer.params * db, "param16", scope="iteration", layer=i)
        if n > 1:
            b.tensor(f"ps{ph}{i}.{g}", s * db, "param16", scope="iteration", layer=i)
        if knobs.param_nvme:
            b.tensor(f"pin{ph}{i}.r{r}", s * db, "buffer", scope="iteration", layer=i)


def notes(job: Job, knobs: Knobs, n: int, accum: int, n_groups: int) -> list[str]:
    nv = nvme_bytes_per_step(job, knobs, accum)
    out = [f"ZeRO-Infinity: ZeRO-3 over {n} rank(s), {accum} micro-step(s) per step; parameters on "
           f"{knobs.param_device}, optimizer states on {knobs.optimizer_device}; prefetch NVMe "
           f"{knobs.nvme_prefetch} / CPU {knobs.cpu_prefetch} / gather {knobs.gather_prefetch} uses ahead; "
           f"{n_groups} optimizer sub-group(s)"]
    if nv["read"] or nv["write"]:
        out.append(f"NVMe per step: read {nv['read'] / 1e9:.1f} GB, write {nv['write'] / 1e9:.1f} GB")
    if unified(job):
        out.append("unified memory: GPU and CPU share one pool, so CPU placements free nothing; only NVMe "
                   "is a real extra tier, and CPU<->GPU copies still cost DRAM bandwidth")
    pinned_window = param_pinned_window(job, knobs, n)
    if knobs.param_nvme and pinned_window > DS_PARAM_BUFFERS * DS_PARAM_BUFFER_SIZE:
        out.append(f"the NVMe prefetch window ({pinned_window:.3g} elements per rank) exceeds DeepSpeed's "
                   f"default offload_param pool ({DS_PARAM_BUFFERS} x {DS_PARAM_BUFFER_SIZE:.0e}); raise "
                   f"buffer_count or lower nvme_prefetch")
    return out


def info(job: Job, knobs: Knobs, n: int, accum: int, groups: list[list[int]],
         need: dict[str, float]) -> dict[str, Any]:
    layers = job.trace.layers
    homes = state_homes(knobs)
    return {"dp": n, "accumulation": accum, "sub_groups": [len(grp) for grp in groups],
            "sub_group_params_per_rank": [sum(layers[i].params for i in grp) / n for grp in groups],
            "bytes_per_param": {k: {"bytes": v, "home": homes[k]} for k, v in per_param_bytes(job, knobs).items()
                                if v > 0},
            "model_state_bytes": model_state_bytes(job, knobs),
            "nvme_bytes_per_step": nvme_bytes_per_step(job, knobs, accum),
            "min_need_bytes_by_pool": need, "param_pinned_window_elements_per_rank": param_pinned_window(job, knobs, n)}
