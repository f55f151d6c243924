"""``zero-offload``: ZeRO-2 with the optimizer on the CPU (Ren et al. 2021, arXiv 2101.06840; DeepSpeed).

Idea: keep fp16/bf16 parameters, forward and backward on the GPUs; move gradients, fp32 master weights, Adam's m and v,
and the Adam update itself to the CPU. Per step each rank moves its gradient partition down (2 B/param) and its updated
parameter partition up (2 B/param): the paper shows this is the unique placement with minimal traffic (4 B/param/step)
and maximal GPU memory saving.

Our reading and assumptions (see docs/reference/policies.md):
- per layer, as soon as its backward ends, gradients are reduce-scattered across ranks and each rank copies its
  partition to the CPU on its D2H copy engine, overlapped with the next layer's backward; with gradient accumulation
  this happens every micro-step and the CPU accumulates (DeepSpeed stage 2 with CPU offload does the same); the CPU-side
  accumulation cost is not modelled;
- CPU Adam (DeepSpeed's vectorised kernel) runs after the last micro-step's gradients have arrived, one chunk per layer
  in layer order, so uploading chunk k-1 overlaps updating chunk k; every rank's Adam runs on the shared host CPU (the
  ``cpu.adam`` throughput is shared); each rank then uploads its updated partition on its H2D engine and the layer is
  all-gathered across ranks;
- the next step's forward waits for the whole update (every layer's upload / all-gather): DeepSpeed's
  ``optimizer.step()`` runs CPU Adam over the whole partition and returns before the next forward starts (the CPU
  step is on the critical path, which is why the paper adds DPU); with ``delayed_update`` the forward of layer i
  waits for layer i's update of the step before (DPU, iteration time ``max(fwd+bwd, D2H + Adam + H2D)``; it
  changes training semantics on purpose);
- GPU: fp16 parameters (replicated), a transient gradient bucket per layer, activations, workspace. CPU: per rank fp32
  master partition (4 B/param), m and v (8), fp32 gradient partition (``cpu_grad_bytes``, 4 B/param in DeepSpeed's
  stage-1/2 offload path).

Knobs:
- ``delayed_update`` (bool, default False): one-step delayed parameter update (DPU).
- ``upload_bytes_per_param`` (float, default 2): bytes per parameter copied CPU->GPU after the update; DeepSpeed before
  a 2025 change copied the fp32 partition (4) and converted on the GPU, which also needs an fp32 staging buffer of the
  layer's partition on the GPU.
- ``grad_offload_bytes_per_param`` (float, default 2): bytes per parameter copied GPU->CPU per micro-step.
- ``cpu_grad_bytes`` (float, default 4): bytes per parameter of the CPU-side gradient accumulation buffer.
- ``tp`` (int, default 0 = auto): tensor-parallel degree combined with ZeRO-Offload (the paper combines it with Megatron
  model parallelism for models whose fp16 parameters do not fit one GPU). Auto picks the smallest power of two dividing
  the GPU count (and the heads) whose 1/tp share of the fp16 parameters fits in half of a GPU's usable memory, leaving
  the rest for activations and buffers.
- ``cpu_param_copy_per_rank`` (bool, default False): every rank process also holds a full fp32 copy of the model in CPU
  memory while it runs (what DeepSpeed's estimator budgets with ``4 * n_gpus`` bytes per parameter; off by default
  because a steady-state run frees it after initialisation).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies import kit
from policies.base import Job, KnobError, PlanInfeasible, PolicyInfo, gpu_pool, pow2_divisors, unified
from policies.builder import PlanBuilder
from simulator import Plan

NAME = "zero-offload"
GRAD_BUCKETS_IN_FLIGHT = 2  # gradient buckets in flight to the CPU per GPU (DeepSpeed's double-buffered ipg bucket)


@dataclass(frozen=True)
class Knobs:
    delayed_update: bool = False
    upload_bytes_per_param: float = 2.0
    grad_offload_bytes_per_param: float = 2.0
    cpu_grad_bytes: float = 4.0
    cpu_param_copy_per_rank: bool = False
    tp: int = 0

    def validate(self) -> None:
        for name in ("upload_bytes_per_param", "grad_offload_bytes_per_param"):
            if getattr(self, name) not in (2.0, 4.0):
                raise KnobError(f"{NAME}: knob '{name}' must be 2 (fp16/bf16) or 4 (fp32)")
        if self.cpu_grad_bytes not in (2.0, 4.0):
            raise KnobError(f"{NAME}: knob 'cpu_grad_bytes' must be 2 or 4")
        if self.tp < 0:
            raise KnobError(f"{NAME}: knob 'tp' must be 0 (auto) or a positive divisor of the GPU count")


def auto_tp(job: Job, fits_fraction: float = 0.5) -> int:
    """Smallest power-of-two TP degree whose fp16 parameter share fits ``fits_fraction`` of a GPU."""
    cap = gpu_pool(job).capacity_bytes
    need = job.trace.params * kit.dtype_bytes(job)
    t = 1
    while t * 2 <= job.n_gpus and job.n_gpus % (t * 2) == 0 and kit.tp_splits_model(job, t * 2) \
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


def param_ready(job: Job, lay: kit.Layout, delayed_update: bool) -> dict[int, list[str]]:
    """What the forward of each layer waits for. Without DPU, the whole update of the step before:
    DeepSpeed's ``optimizer.step()`` (``runtime/zero/stage_1_and_2.py``, ``step``: CPU Adam over the rank's
    whole flat partition, ``DeepSpeedCPUAdam.step(fp16_param_groups=...)`` copying the updated 16-bit tiles to
    the GPU as it goes, then the all-gather of every partition) returns before the next forward starts, so
    the CPU update is on the critical path (ZeRO-Offload arXiv 2101.06840 Sec. 5.2 introduces DPU to take it
    off). The last layer's upload (all-gather) stands for all of them: uploads and all-gathers run in layer
    order on in-order streams. With DPU, layer i waits for its own update two steps back."""
    n_layers = len(job.trace.layers)

    def done(i: int, back: int) -> list[str]:
        if lay.dp > 1:
            return [f"ag{i}.d{j}^{back}" for j in range(lay.tp)]
        return [f"up{i}.{g}^{back}" for g in lay.gpus()]

    if delayed_update:
        return {i: done(i, 2) for i in range(n_layers)}
    whole = done(n_layers - 1, 1)
    return {i: list(whole) for i in range(n_layers)}


def plan(job: Job, knobs: Knobs) -> Plan:
    tp = knobs.tp or auto_tp(job)
    kit.check_tp(job, tp, NAME)
    lay = kit.Layout(job.n_gpus, tp, template=kit.templated(job))
    accum = job.accumulation(lay.dp)
    db = kit.dtype_bytes(job)
    gpu_params = db * float(job.trace.params) / tp
    b = PlanBuilder(NAME, knobs, job, template=lay.rank_template)
    kit.declare_streams(b, lay, cpu_adam=True)
    staged = knobs.upload_bytes_per_param > db  # an fp32 upload needs a staging buffer per layer
    for r, g in enumerate(lay.gpus()):  # per rank: the replicated fp16 parameters, 1/n of the host states
        b.tensor(f"param16.{g}", gpu_params, "param16", home=g, persistent=True)
        for kind, nbytes in cpu_state_bytes(job, knobs).items():
            b.tensor(f"{kind}.r{r}", nbytes / lay.n, kind, home="cpu", persistent=True)
        for i, layer in enumerate(job.trace.layers if staged else ()):
            b.tensor(f"stage32_{i}.{g}", layer.params / lay.n * knobs.upload_bytes_per_param, "buffer",
                     scope="step", layer=i)
    kit.workspace(b, job, lay)
    gpool = gpu_pool(job)
    held = kit.gpu_held_bytes(job, [gpu_params])  # as the allocator rounds the tensor
    if held > gpool.capacity_bytes:
        raise PlanInfeasible(NAME, gpool.name, held, gpool.capacity_bytes, f"the fp16 parameters (tp={tp})")
    b.segment("micro-steps", accum)
    grads = kit.Grads(reduce="reduce_scatter", bucket=True, offload=True, buckets_in_flight=GRAD_BUCKETS_IN_FLIGHT,
                      offload_bytes_per_param=knobs.grad_offload_bytes_per_param)
    ready = param_ready(job, lay, knobs.delayed_update)
    kit.emit_microstep(b, job, lay, grads, gather_params=False, param_ready=ready)
    b.segment("optimizer", 1)
    kit.cpu_update_by_layer(b, job, lay, upload_bytes_per_param=knobs.upload_bytes_per_param, staged=staged,
                            first_deps={r: [f"d2h0.{g}"] for r, g in enumerate(lay.gpus())})
    notes = [f"ZeRO-2 + CPU optimizer over {lay.dp} data-parallel rank(s) x tp={lay.tp}, {accum} micro-step(s) per "
             f"step; gradients offloaded every micro-step ({knobs.grad_offload_bytes_per_param:g} B/param), "
             f"parameters uploaded once per step ({knobs.upload_bytes_per_param:g} B/param)"]
    if knobs.tp == 0 and lay.tp > 1:
        notes.append(f"tp={lay.tp} picked automatically: the fp16 parameters do not fit one GPU otherwise")
    if knobs.delayed_update:
        notes.append("delayed parameter update: step i+1 computes with the parameters of step i-1 "
                     "(training semantics change on purpose)")
    if unified(job):
        notes.append("unified memory: GPU and CPU share one pool, so offloading to the CPU frees nothing; "
                     "the copies still cost DRAM bandwidth")
    return b.build(steps=3 if knobs.delayed_update else 2, notes=notes,
                   info={"accumulation": accum, "tp": tp, "dp": lay.dp,
                         "cpu_state_bytes": cpu_state_bytes(job, knobs), "gpu_param_bytes_per_gpu": gpu_params})


POLICY = PolicyInfo(NAME, "ZeRO-2 with optimizer states, gradients and Adam on the CPU", Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"tp": (0, *pow2_divisors(n)), "delayed_update": (False, True)})
