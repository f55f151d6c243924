"""``none``: everything on the GPUs — data parallelism with ZeRO stage 0-3 (the no-offload baseline).

Idea (ZeRO, Rajbhandari et al. 2020, arXiv 1910.02054, §5): mixed-precision Adam keeps 16 bytes per
parameter (fp16/bf16 weights 2, gradients 2, fp32 master weights, Adam m and v 12). Stage 0 replicates all
of it on every rank; stage 1 partitions the optimizer states (``4 + 12/Nd`` bytes/param per GPU), stage 2
also the gradients (``2 + 14/Nd``), stage 3 also the parameters (``16/Nd``).

Our reading and assumptions:
- gradients are reduced per layer as soon as that layer's backward ends, overlapped with the next
  layer's backward (DeepSpeed ``overlap_comm``); stage 0/1 all-reduce into a persistent gradient buffer,
  stage 2/3 reduce-scatter a transient per-layer bucket into the rank's gradient partition;
- the optimizer step runs on each GPU over its partition, bounded by HBM bandwidth
  (``gpu.optimizer_bytes_per_param`` of the hardware spec); stage 1/2 then all-gather the updated
  parameters; stage 3 all-gathers each layer before its forward and again before its backward;
- activations: what the workload's checkpointing setting keeps, allocated in the forward and freed in
  the backward of each layer; a per-GPU workspace holds the largest transient working set of any layer;
- with precision fp32 there is no separate master copy (12 bytes/param of model states + 4 of grads).

Knobs:
- ``stage`` (int, default 0): ZeRO stage 0-3. Stage 0 is plain data parallelism, the fastest when memory
  allows; use 3 for the most memory-frugal no-offload run.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import Job, KnobError, PlanInfeasible, PolicyInfo
from policies.builder import PlanBuilder
from policies.dataparallel import Grads, declare_streams, dtype_bytes, emit_microstep, gpu, workspace
from simulator import Plan

NAME = "none"


@dataclass(frozen=True)
class Knobs:
    stage: int = 0

    def validate(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise KnobError(f"{NAME}: knob 'stage' must be 0, 1, 2 or 3, got {self.stage}")


def model_state_bytes(job: Job, stage: int, n: int) -> dict[str, float]:
    """Per-GPU persistent model-state bytes by kind (ZeRO §5.1 formulas, per stage)."""
    p = float(job.trace.params)
    db = dtype_bytes(job)
    master = 4.0 * p if job.config.precision != "fp32" else 0.0
    return {
        "param16": db * p / (n if stage >= 3 else 1),
        "grad": db * p / (n if stage >= 2 else 1),
        "param32": master / (n if stage >= 1 else 1),
        "optim": 8.0 * p / (n if stage >= 1 else 1),
    }


def plan(job: Job, knobs: Knobs) -> Plan:
    n = job.n_gpus
    stage = knobs.stage if n > 1 else 0
    accum = job.accumulation(n)
    b = PlanBuilder(NAME, knobs, job)
    declare_streams(b, n, cpu_adam=False)
    states = model_state_bytes(job, stage, n)
    for r in range(n):
        for kind, nbytes in states.items():
            b.tensor(f"{kind}.{gpu(r)}", nbytes, kind, home=gpu(r), persistent=True)
    workspace(b, job, n)
    layers = job.trace.layers
    cap = min(p.capacity_bytes for name, p in _gpu_pools(job).items())
    persistent = sum(states.values())
    if persistent > cap:
        raise PlanInfeasible(NAME, "gpu0", persistent, cap, f"ZeRO-{stage} model states")
    if stage >= 3:
        ready = {0: [f"opt.{gpu(r)}^1" for r in range(n)]}
    elif stage >= 1 and n > 1:
        ready = {i: ["agp^1"] for i in range(len(layers))}
    else:
        ready = {i: [f"opt.{gpu(r)}^1" for r in range(n)] for i in range(len(layers))}
    b.segment("micro-steps", accum)
    emit_microstep(b, job, n, Grads(reduce="all_reduce" if stage < 2 else "reduce_scatter",
                                     bucket=stage >= 2, offload=False),
                   gather_params=stage >= 3 and n > 1, param_ready=ready)
    b.segment("optimizer", 1)
    last_grad = "red0" if n > 1 else None
    for r in range(n):
        g = gpu(r)
        b.task(f"opt.{g}", "optimizer", f"{g}.compute", [last_grad or f"bwd0.{g}"],
               params=job.trace.params / (n if stage >= 1 else 1), tags={"phase": "optimizer", "rank": r})
    if 1 <= stage <= 2 and n > 1:
        b.task("agp", "collective", "comm.param", [f"opt.{gpu(r)}" for r in range(n)], coll="all_gather",
               bytes=job.trace.params * dtype_bytes(job), ranks=tuple(gpu(r) for r in range(n)),
               tags={"phase": "param-gather"})
    notes = [f"ZeRO stage {stage} over {n} data-parallel GPU(s), {accum} micro-step(s) per step"]
    if knobs.stage != stage:
        notes.append(f"stage {knobs.stage} requested; with one GPU every stage is stage 0")
    return b.build(steps=2, notes=notes, info={"zero_stage": stage, "accumulation": accum,
                                                "model_state_bytes_per_gpu": states})


def _gpu_pools(job: Job) -> dict:
    from hardware_models import build_topology

    topo = build_topology(job.hw)
    return {topo.pool_of[g]: topo.pools[topo.pool_of[g]] for g in topo.gpu_locations()}


POLICY = PolicyInfo(NAME, "everything on the GPUs: data parallel, ZeRO stage 0-3 (knob)", Knobs, plan, __doc__ or "")
