"""``none``: everything on the GPUs — data parallelism with ZeRO stage 0-3 (the no-offload baseline).

Idea (ZeRO, Rajbhandari et al. 2020, arXiv 1910.02054, §5): mixed-precision Adam keeps 16 bytes per parameter (fp16/bf16
weights 2, gradients 2, fp32 master weights, Adam m and v 12). Stage 0 replicates all of it on every rank; stage 1
partitions the optimizer states (``4 + 12/Nd`` bytes/param per GPU), stage 2 also the gradients (``2 + 14/Nd``), stage 3
also the parameters (``16/Nd``).

Our reading and assumptions:
- gradients are reduced per layer as soon as that layer's backward ends, overlapped with the next layer's backward
  (DeepSpeed ``overlap_comm``); stage 0/1 all-reduce into a persistent gradient buffer, stage 2/3 reduce-scatter a
  transient per-layer bucket into the rank's gradient partition;
- the optimizer step runs on each GPU over its partition, bounded by HBM bandwidth (``gpu.optimizer_bytes_per_param`` of
  the hardware spec); stage 1/2 then all-gather the updated parameters; stage 3 all-gathers each layer before its
  forward and again before its backward;
- activations: what the workload's checkpointing setting keeps, allocated in the forward and freed in the backward of
  each layer; a per-GPU workspace holds the largest transient working set of any layer;
- with precision fp32 there is no separate master copy (12 bytes/param of model states + 4 of grads).

Knobs:
- ``stage`` (int, default 0): ZeRO stage 0-3. Stage 0 is plain data parallelism, the fastest when memory allows; use 3
  for the most memory-frugal no-offload run.
- ``tp`` (int, default 1): tensor-parallel degree (Megatron-style, within NVLink-connected neighbours); the
  data-parallel degree is ``n_gpus / tp`` and the ZeRO formulas apply with ``Nd = n_gpus / tp`` to each GPU's ``1/tp``
  slice of the parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies import kit
from policies.base import Job, KnobError, PlanInfeasible, PolicyInfo, gpu_pool, pow2_divisors
from policies.builder import PlanBuilder
from simulator import Plan

NAME = "none"


@dataclass(frozen=True)
class Knobs:
    stage: int = 0
    tp: int = 1

    def validate(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise KnobError(f"{NAME}: knob 'stage' must be 0, 1, 2 or 3, got {self.stage}")


def model_state_bytes(job: Job, stage: int, n: int, tp: int = 1) -> dict[str, float]:
    """Per-GPU persistent model-state bytes by kind (ZeRO §5.1 formulas, per stage, Nd = n)."""
    p = float(job.trace.params) / tp
    master = 4.0 * p if job.config.precision != "fp32" else 0.0
    return {"param16": kit.dtype_bytes(job) * p / (n if stage >= 3 else 1),
            "grad": kit.dtype_bytes(job) * p / (n if stage >= 2 else 1),
            "param32": master / (n if stage >= 1 else 1), "optim": 8.0 * p / (n if stage >= 1 else 1)}


def param_ready(lay: kit.Layout, stage: int, n_layers: int) -> dict[int, list[str]]:
    """What makes layer i's parameters usable in the next step: the optimizer (stage 0, and stage 3's
    first gather), or the all-gather of the updated parameters (stage 1/2)."""
    opt_all = [f"opt.{g}^1" for g in lay.gpus()]
    if stage >= 3:
        return {0: opt_all}
    return {i: [f"agp.d{j}^1" for j in range(lay.tp)] if stage else opt_all for i in range(n_layers)}


def plan(job: Job, knobs: Knobs) -> Plan:
    kit.check_tp(job, knobs.tp, NAME)
    lay = kit.Layout(job.n_gpus, knobs.tp, template=kit.templated(job))
    dp = lay.dp
    stage = knobs.stage if dp > 1 else 0
    accum = job.accumulation(dp)
    b = PlanBuilder(NAME, knobs, job, template=lay.rank_template)
    kit.declare_streams(b, lay)
    states = model_state_bytes(job, stage, dp, lay.tp)
    for g in lay.gpus():
        for kind, nbytes in states.items():
            b.tensor(f"{kind}.{g}", nbytes, kind, home=g, persistent=True)
    kit.workspace(b, job, lay)
    pool = gpu_pool(job)
    held = kit.gpu_held_bytes(job, states.values())  # each state tensor as the allocator rounds it
    if held > pool.capacity_bytes:
        raise PlanInfeasible(NAME, pool.name, held, pool.capacity_bytes, f"ZeRO-{stage} model states (tp={lay.tp})")
    b.segment("micro-steps", accum)
    grads = kit.Grads(reduce="all_reduce" if stage < 2 else "reduce_scatter", bucket=stage >= 2, offload=False)
    kit.emit_microstep(b, job, lay, grads, gather_params=stage >= 3,
                       param_ready=param_ready(lay, stage, len(job.trace.layers)))
    b.segment("optimizer", 1)
    for r, g in enumerate(lay.gpus()):
        kit.gpu_step(b, f"opt.{g}", f"{g}.compute", [f"red0.d{r % lay.tp}" if dp > 1 else f"bwd0.{g}"],
                     job.trace.params / lay.tp / (dp if stage >= 1 else 1), rank=r)
    for j in lay.dp_groups() if 1 <= stage <= 2 else ():
        kit.all_gather(b, f"agp.d{j}", lay.dp_stream(j, "param"), lay.dp_group(j),
                       job.trace.params / lay.tp * kit.dtype_bytes(job), [f"opt.{g}" for g in lay.dp_group(j)])
    notes = [f"ZeRO stage {stage} over {dp} data-parallel rank(s) x tp={lay.tp}, {accum} micro-step(s) per step"]
    if knobs.stage != stage:
        notes.append(f"stage {knobs.stage} requested; with one data-parallel rank every stage is stage 0")
    return b.build(steps=2, notes=notes, info={"zero_stage": stage, "tp": lay.tp, "dp": dp, "accumulation": accum,
                                                "model_state_bytes_per_gpu": states})


POLICY = PolicyInfo(NAME, "everything on the GPUs: data parallel, ZeRO stage 0-3 (knob)", Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"stage": (0, 1, 2, 3), "tp": pow2_divisors(n)})
