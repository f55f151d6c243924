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
- ``tp`` (int, default 1): tensor-parallel degree (Megatron-style, within NVLink-connected neighbours);
  the data-parallel degree is ``n_gpus / tp`` and the ZeRO formulas apply with ``Nd = n_gpus / tp`` to
  each GPU's ``1/tp`` slice of the parameters.
"""

from __future__ import annotations

from policies.base import PolicyInfo, pow2_divisors
from policies.none.knobs import NAME, Knobs
from policies.none.plan import model_state_bytes, plan

POLICY = PolicyInfo(NAME, "everything on the GPUs: data parallel, ZeRO stage 0-3 (knob)", Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"stage": (0, 1, 2, 3), "tp": pow2_divisors(n)})

__all__ = ["NAME", "POLICY", "Knobs", "model_state_bytes", "plan"]
