"""``zero-offload``'s decisions (the automatic TP degree, host state sizes, when parameters are ready)
and its plan."""

from __future__ import annotations

from policies import kit
from policies.base import Job, PlanInfeasible, gpu_pool, unified
from policies.builder import PlanBuilder
from policies.zero_offload.knobs import NAME, Knobs
from simulator import Plan

GRAD_BUCKETS_IN_FLIGHT = 2  # gradient buckets in flight to the CPU per GPU (DeepSpeed's double-buffered ipg bucket)


def auto_tp(job: Job, fits_fraction: float = 0.5) -> int:
    """Smallest power-of-two TP degree whose fp16 parameter share fits ``fits_fraction`` of a GPU."""
    cap = gpu_pool(job).capacity_bytes
    need = job.trace.params * kit.dtype_bytes(job)
    t = 1
    while t * 2 <= job.n_gpus and job.n_gpus % (t * 2) == 0 and job.model.n_heads % (t * 2) == 0 \
            and need / t > fits_fraction * cap:
        t *= 2
    return t


def cpu_state_bytes(job: Job, knobs: Knobs) -> dict[str, float]:
    """Host bytes of the whole machine's model states, by kind."""
    p = float(job.trace.params)
    out = {"param32": 4.0 * p, "optim": 8.0 * p, "grad32": knobs.cpu_grad_bytes * p}
    if knobs.cpu_param_copy_per_rank:
        out["buffer"] = 4.0 * p * job.n_gpus
    return out


def declare_tensors(b: PlanBuilder, job: Job, knobs: Knobs, lay: kit.Layout, staged: bool) -> None:
    """Per rank: the replicated fp16 parameters (1/tp) on its GPU, its 1/n of the host states, and (when
    the upload is fp32) a staging buffer per layer; then the workspace."""
    db = kit.dtype_bytes(job)
    for r, g in enumerate(lay.gpus()):
        b.tensor(f"param16.{g}", db * float(job.trace.params) / lay.tp, "param16", home=g, persistent=True)
        for kind, nbytes in cpu_state_bytes(job, knobs).items():
            b.tensor(f"{kind}.r{r}", nbytes / lay.n, kind, home="cpu", persistent=True)
        for i, layer in enumerate(job.trace.layers):
            if staged:
                b.tensor(f"stage32_{i}.{g}", layer.params / lay.n * knobs.upload_bytes_per_param, "buffer",
                         scope="step", layer=i)
    kit.workspace(b, job, lay)


def param_ready(lay: kit.Layout, n_layers: int, delayed_update: bool) -> dict[int, list[str]]:
    """Layer i's forward waits for its all-gather (or upload) of the previous step, or with the delayed
    update (DPU) of the step before."""
    back = 2 if delayed_update else 1
    if lay.dp > 1:
        return {i: [f"ag{i}.d{j}^{back}" for j in range(lay.tp)] for i in range(n_layers)}
    return {i: [f"up{i}.{g}^{back}" for g in lay.gpus()] for i in range(n_layers)}


def notes(job: Job, knobs: Knobs, lay: kit.Layout, accum: int) -> list[str]:
    out = [f"ZeRO-2 + CPU optimizer over {lay.dp} data-parallel rank(s) x tp={lay.tp}, {accum} micro-step(s) per "
           f"step; gradients offloaded every micro-step ({knobs.grad_offload_bytes_per_param:g} B/param), "
           f"parameters uploaded once per step ({knobs.upload_bytes_per_param:g} B/param)"]
    if knobs.tp == 0 and lay.tp > 1:
        out.append(f"tp={lay.tp} picked automatically: the fp16 parameters do not fit one GPU otherwise")
    if knobs.delayed_update:
        out.append("delayed parameter update: step i+1 computes with the parameters of step i-1 "
                   "(training semantics change on purpose)")
    if unified(job):
        out.append("unified memory: GPU and CPU share one pool, so offloading to the CPU frees nothing; "
                   "the copies still cost DRAM bandwidth")
    return out


def plan(job: Job, knobs: Knobs) -> Plan:
    tp = knobs.tp or auto_tp(job)
    kit.check_tp(job, tp, NAME)
    lay = kit.Layout(job.n_gpus, tp)
    accum = job.accumulation(lay.dp)
    db = kit.dtype_bytes(job)
    gpu_params = db * float(job.trace.params) / tp
    b = PlanBuilder(NAME, knobs, job)
    kit.declare_streams(b, lay, cpu_adam=True)
    staged = knobs.upload_bytes_per_param > db
    declare_tensors(b, job, knobs, lay, staged)
    gpool = gpu_pool(job)
    if gpu_params > gpool.capacity_bytes:
        raise PlanInfeasible(NAME, gpool.name, gpu_params, gpool.capacity_bytes, f"the fp16 parameters (tp={tp})")
    b.segment("micro-steps", accum)
    grads = kit.Grads(reduce="reduce_scatter", bucket=True, offload=True,
                      offload_bytes_per_param=knobs.grad_offload_bytes_per_param,
                      buckets_in_flight=GRAD_BUCKETS_IN_FLIGHT)
    kit.emit_microstep(b, job, lay, grads, gather_params=False,
                       param_ready=param_ready(lay, len(job.trace.layers), knobs.delayed_update))
    b.segment("optimizer", 1)
    kit.cpu_update_by_layer(b, job, lay, upload_bytes_per_param=knobs.upload_bytes_per_param, staged=staged,
                            first_deps={r: [f"d2h0.{g}"] for r, g in enumerate(lay.gpus())})
    return b.build(steps=3 if knobs.delayed_update else 2, notes=notes(job, knobs, lay, accum),
                   info={"accumulation": accum, "tp": tp, "dp": lay.dp,
                         "cpu_state_bytes": cpu_state_bytes(job, knobs), "gpu_param_bytes_per_gpu": gpu_params})
