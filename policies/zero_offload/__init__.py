"""``zero-offload``: ZeRO-2 with the optimizer on the CPU (Ren et al. 2021, arXiv 2101.06840; DeepSpeed).

Idea: keep fp16/bf16 parameters, forward and backward on the GPUs; move gradients, fp32 master weights,
Adam's m and v, and the Adam update itself to the CPU. Per step each rank moves its gradient partition
down (2 B/param) and its updated parameter partition up (2 B/param): the paper shows this is the unique
placement with minimal traffic (4 B/param/step) and maximal GPU memory saving.

Our reading and assumptions (see docs/reference/policies.md):
- per layer, as soon as its backward ends, gradients are reduce-scattered across ranks and each rank
  copies its partition to the CPU on its D2H copy engine, overlapped with the next layer's backward;
  with gradient accumulation this happens every micro-step and the CPU accumulates (DeepSpeed stage 2
  with CPU offload does the same); the CPU-side accumulation cost is not modelled;
- CPU Adam (DeepSpeed's vectorised kernel) runs after the last micro-step's gradients have arrived, one
  chunk per layer in layer order, so uploading chunk k-1 overlaps updating chunk k; every rank's Adam
  runs on the shared host CPU (the ``cpu.adam`` throughput is shared); each rank then uploads its updated
  partition on its H2D engine and the layer is all-gathered across ranks;
- the next step's forward of layer i waits for layer i's all-gather (or, with ``delayed_update``, for the
  one of the step before: DPU, iteration time ``max(fwd+bwd, D2H + Adam + H2D)``; it changes training
  semantics on purpose);
- GPU: fp16 parameters (replicated), a transient gradient bucket per layer, activations, workspace.
  CPU: per rank fp32 master partition (4 B/param), m and v (8), fp32 gradient partition
  (``cpu_grad_bytes``, 4 B/param in DeepSpeed's stage-1/2 offload path).

Knobs:
- ``delayed_update`` (bool, default False): one-step delayed parameter update (DPU).
- ``upload_bytes_per_param`` (float, default 2): bytes per parameter copied CPU->GPU after the update;
  DeepSpeed before a 2025 change copied the fp32 partition (4) and converted on the GPU, which also
  needs an fp32 staging buffer of the layer's partition on the GPU.
- ``grad_offload_bytes_per_param`` (float, default 2): bytes per parameter copied GPU->CPU per micro-step.
- ``cpu_grad_bytes`` (float, default 4): bytes per parameter of the CPU-side gradient accumulation buffer.
- ``tp`` (int, default 0 = auto): tensor-parallel degree combined with ZeRO-Offload (the paper combines
  it with Megatron model parallelism for models whose fp16 parameters do not fit one GPU). Auto picks
  the smallest power of two dividing the GPU count (and the heads) whose 1/tp share of the fp16
  parameters fits in half of a GPU's usable memory, leaving the rest for activations and buffers.
- ``cpu_param_copy_per_rank`` (bool, default False): every rank process also holds a full fp32 copy of
  the model in CPU memory while it runs (what DeepSpeed's estimator budgets with ``4 * n_gpus`` bytes
  per parameter; off by default because a steady-state run frees it after initialisation).
"""

from __future__ import annotations

from policies.base import PolicyInfo, pow2_divisors
from policies.zero_offload.knobs import NAME, Knobs
from policies.zero_offload.plan import GRAD_BUCKETS_IN_FLIGHT, auto_tp, cpu_state_bytes, plan

POLICY = PolicyInfo(NAME, "ZeRO-2 with optimizer states, gradients and Adam on the CPU", Knobs, plan,
                    __doc__ or "",
                    search_grid=lambda n: {"tp": (0, *pow2_divisors(n)), "delayed_update": (False, True)})

__all__ = ["GRAD_BUCKETS_IN_FLIGHT", "NAME", "POLICY", "Knobs", "auto_tp", "cpu_state_bytes", "plan"]
