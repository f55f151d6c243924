"""``none``'s decisions (the ZeRO stage's per-GPU model states, when parameters are ready) and its plan."""

from __future__ import annotations

from policies import kit
from policies.base import Job, PlanInfeasible, gpu_pool
from policies.builder import PlanBuilder
from policies.none.knobs import NAME, Knobs
from simulator import Plan


def model_state_bytes(job: Job, stage: int, n: int, tp: int = 1) -> dict[str, float]:
    """Per-GPU persistent model-state bytes by kind (ZeRO §5.1 formulas, per stage, Nd = n)."""
    p = float(job.trace.params) / tp
    db = kit.dtype_bytes(job)
    master = 4.0 * p if job.config.precision != "fp32" else 0.0
    return {
        "param16": db * p / (n if stage >= 3 else 1),
        "grad": db * p / (n if stage >= 2 else 1),
        "param32": master / (n if stage >= 1 else 1),
        "optim": 8.0 * p / (n if stage >= 1 else 1),
    }


def param_ready(lay: kit.Layout, stage: int, n_layers: int) -> dict[int, list[str]]:
    """What makes layer i's parameters usable in the next step: the optimizer (stage 0, and stage 3's
    first gather), or the all-gather of the updated parameters (stage 1/2)."""
    opt_all = [f"opt.{g}^1" for g in lay.gpus()]
    if stage >= 3:
        return {0: opt_all}
    if stage >= 1:
        return {i: [f"agp.d{j}^1" for j in range(lay.tp)] for i in range(n_layers)}
    return {i: opt_all for i in range(n_layers)}


def plan(job: Job, knobs: Knobs) -> Plan:
    kit.check_tp(job, knobs.tp, NAME)
    lay = kit.Layout(job.n_gpus, knobs.tp)
    dp = lay.dp
    stage = knobs.stage if dp > 1 else 0
    accum = job.accumulation(dp)
    b = PlanBuilder(NAME, knobs, job)
    kit.declare_streams(b, lay)
    states = model_state_bytes(job, stage, dp, lay.tp)
    for g in lay.gpus():
        for kind, nbytes in states.items():
            b.tensor(f"{kind}.{g}", nbytes, kind, home=g, persistent=True)
    kit.workspace(b, job, lay)
    pool = gpu_pool(job)
    if sum(states.values()) > pool.capacity_bytes:
        raise PlanInfeasible(NAME, pool.name, sum(states.values()), pool.capacity_bytes,
                             f"ZeRO-{stage} model states (tp={lay.tp})")
    b.segment("micro-steps", accum)
    grads = kit.Grads(reduce="all_reduce" if stage < 2 else "reduce_scatter", bucket=stage >= 2, offload=False)
    kit.emit_microstep(b, job, lay, grads, gather_params=stage >= 3,
                       param_ready=param_ready(lay, stage, len(job.trace.layers)))
    b.segment("optimizer", 1)
    for r, g in enumerate(lay.gpus()):
        kit.gpu_step(b, f"opt.{g}", f"{g}.compute", [f"red0.d{r % lay.tp}" if dp > 1 else f"bwd0.{g}"],
                     job.trace.params / lay.tp / (dp if stage >= 1 else 1), rank=r)
    if 1 <= stage <= 2:
        for j in range(lay.tp):
            grp = lay.dp_group(j)
            kit.all_gather(b, f"agp.d{j}", lay.dp_stream(j, "param"), grp,
                           job.trace.params / lay.tp * kit.dtype_bytes(job), [f"opt.{g}" for g in grp])
    notes = [f"ZeRO stage {stage} over {dp} data-parallel rank(s) x tp={lay.tp}, {accum} micro-step(s) per step"]
    if knobs.stage != stage:
        notes.append(f"stage {knobs.stage} requested; with one data-parallel rank every stage is stage 0")
    return b.build(steps=2, notes=notes, info={"zero_stage": stage, "tp": lay.tp, "dp": dp, "accumulation": accum,
                                                "model_state_bytes_per_gpu": states})
